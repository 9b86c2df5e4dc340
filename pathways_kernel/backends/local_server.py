"""The local backend, the default: ``local:SxC`` (also ``local-server:SxC``, ``--server``).

The session starts ``pathways-local serve`` as a child (``backends/server_client.py``:
a Unix socket in a 0700 directory) and connects to it exactly as a GKE user
connects to Pathways: ``JAX_PLATFORMS=proxy``, pathwaysutils, JAX's own IFRT
proxy client, after a pre-flight check of the server's ``GetVersion`` (all of
it ``ProxyBackend``'s). The devices carry ``slice_index`` and ``coords`` from
the server, so the topology, pathwaysutils and MaxText-style code read them
directly, with no patch in this process's JAX.

Slices are lost where Pathways loses them, on the server (``server_client.fail``):
``pw.fail_slice`` and everything routed through the fault injector
(``%pathways fail``, chaos, the monitor) reach the server through
``lose_slice``/``restore_slice`` here, instead of swapping buffers in process.

Telling loss (``pw.is_lost``): the client caches an array's readiness, so
``block_until_ready`` of an array the server has since dropped still succeeds;
only a read sees the server's ``DATA_LOSS``. The server poisons every array
with a shard on a slice at the moment it is lost, and refuses work placed on a
down slice. So right after the server has lost a slice, this process's live
arrays with a shard on it are exactly the ones it dropped: they are recorded
(weakly) as lost. An array with a shard on a slice that is down now is lost
(made before the loss, or placed there since). Limit: an array computed after
``repair_slice`` from a lost input is lost on the server (reading it raises
``DATA_LOSS``) while ``is_lost`` says False until it is read.

The server's life: it is stopped by pid when the session closes (switching
backend, kernel shutdown) and at interpreter exit. If it dies, a watcher
emits a ``disconnect`` event naming its pid and exit status (the monitor's
timeline and the one-line notice before the next cell, ``connection.NOTICE``);
``%pathways connect local:SxC --force`` or ``%pathways reconnect``
starts a new server and a new client in the same kernel.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import select
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from pathways_kernel.backends import preflight as preflight_lib
from pathways_kernel.backends.proxy import ProxyBackend, device_slice
from pathways_kernel.core import heap, jaxcompat, lost_clients, startup
from pathways_kernel.core.backend import ChipMetrics
from pathways_kernel.core.errors import BackendError
from pathways_kernel.core.sessions import COPIES
from pathways_kernel.core.threads import ExitStop
from pathways_kernel.emulator.faults import InjectedFaults

SPEC_PREFIX = "local"
_log = logging.getLogger("pathways_kernel")
#: JAX's proxy client assembles each read in small heap blocks that glibc keeps once freed (256 MiB
#: read, then deleted: +264 MiB held): this gives them back (core/heap.py), for the whole process.
_HEAP_TRIMMER = heap.HeapTrimmer()
#: The one command that recovers from a dead server, wherever its death is told.
RECONNECT = "Run `%pathways reconnect` (pw.reconnect())"
#: Seconds a dead server's last stderr lines may take to reach the kernel.
_LAST_WORDS_S = 1.0
#: Seconds an injected loss waits for a host copy's reads to reach the server before it strikes anyway.
_BARRIER_S = 10.0
#: Seconds to reap a server known to have exited (its watcher may not be scheduled yet, under load).
_REAP_S = 5.0


@dataclasses.dataclass(frozen=True)
class SocketTarget:
    """A server's Unix-socket target, shaped as ``preflight.Target`` where the proxy backend reads it."""

    url: str  # grpc://unix:/dir/server.sock

    @property
    def authority(self) -> str:
        return self.url.removeprefix("grpc://")


class LocalServerBackend(InjectedFaults, ProxyBackend):
    """S slices of C CPU devices owned by a ``pathways-local`` server this session started."""

    name: ClassVar[str] = "local"
    supports_fault_injection: ClassVar[bool] = True

    def __init__(self, num_slices: int, chips_per_slice: int, timeout: float | None = None, kinds: str | None = None):
        super().__init__(preflight_lib.Target("localhost", 1), timeout, insecure=True)
        self.num_slices = num_slices
        self.chips_per_slice = chips_per_slice
        #: Slices of TPU generations, as the server's --slices names them (``v5p:2x2x1*2,v6e:2x2``), or None.
        self.kinds = kinds
        self.server: Any = None  # server_client.LocalServer while started
        # id -> array, for arrays the server dropped (jax arrays are not hashable).
        self._lost: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._closing = False
        self._gone: str | None = None  # why the server ended, once seen (``gone``)
        self._gone_lock = threading.Lock()
        # The server's pidfd: readable once it exits, seen without reaping it (``gone``).
        self._pidfd: int | None = None
        #: Set while the slices are bound to a Slurm job (``slurm_binding``): the job's id and time left.
        self.job_label: Callable[[], str] | None = None
        # The server is stopped at interpreter exit while it runs, if its session was not closed.
        self._exit_stop = ExitStop(self, _stop_at_exit)

    @property
    def spec(self) -> str:
        return f"{SPEC_PREFIX}:{self.kinds or f'{self.num_slices}x{self.chips_per_slice}'}"

    @property
    def target(self) -> str:
        if self.job_label is not None:
            return self.job_label()
        if self.server is None:
            return "local Pathways server (not started)"
        return f"{self.server.target} (local Pathways server, pid {self.server.pid})"

    # -- connecting -----------------------------------------------------------
    def preflight(self) -> preflight_lib.Report | None:
        """Nothing to check before the server exists; ``activate`` starts it and checks it."""
        if self.server is None:
            return None
        return self._check_server()

    def _check_server(self) -> preflight_lib.Report:
        start = time.monotonic()
        deadline = start + self.timeout
        address = SocketTarget(self.server.target)

        def fail(step: str, what: str, fix: str) -> preflight_lib.ConnectError:
            return preflight_lib.ConnectError(address.url, step, what, fix, time.monotonic() - start)

        # The pre-flight's own gRPC step: the IFRT proxy's GetVersion, on the server's socket.
        preflight_lib._check_grpc(address, lambda: max(deadline - time.monotonic(), 0.0), fail)
        self.report = preflight_lib.Report(
            address, address.authority, False, "pathways-proxy", time.monotonic() - start
        )
        return self.report

    def activate(self) -> None:
        from pathways_kernel.backends import server_client

        jaxcompat.set_cpp_min_log_level(3)
        # The server the kernel started before its imports (``start_server_early``), if it is this one.
        self.server = server_client.start(
            self.kinds or self.num_slices, self.chips_per_slice, env=server_client.kernel_env(), on_step=startup.advance
        )
        self._exit_stop.arm()
        self._pidfd = _open_pidfd(self.server.pid)
        self.address = SocketTarget(self.server.target)  # type: ignore[assignment]
        try:
            self._check_server()
            super().activate()
            startup.advance("connected")
        except BackendError as exc:
            server = self.server
            said = next((line for line in reversed(server.stderr_lines) if line.strip()), "") if server else ""
            self._stop_server()
            # The proxy backend's advice (pod logs, --insecure) is for a remote proxy, not this child.
            reason = str(exc).split(". Check the proxy pod's logs")[0]
            raise BackendError(
                f"{reason}{f' (the local Pathways server said: {said[:300]})' if said else ''}. "
                f"Run `%pathways connect {self.spec} --force` (pw.connect('{self.spec}', force=True)) to start a new server"
            ) from None
        except BaseException:
            self._stop_server()
            raise
        threading.Thread(
            target=self._watch, args=(self.server,), name="pathways-local-server-watch", daemon=True
        ).start()
        _HEAP_TRIMMER.start()

    def close(self) -> None:
        self.gone()  # a server that died before its session closed: its arrays are lost for that reason
        self._closing = True
        try:
            super().close()
        finally:
            self._stop_server()

    def _stop_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            self._closing = True
            server.stop()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._exit_stop.disarm()

    def _watch(self, server: Any) -> None:
        """Report the server's death (one ``disconnect`` event), unless the session stopped it."""
        server.process.wait()
        self.gone(None)

    def gone(self, wait_s: float | None = 0.0) -> str | None:
        """Why the server is gone (its pid, how it ended, its last words), or None while it serves.

        Waits up to ``wait_s`` seconds (``None``: until it ends) for it to end. The first caller
        to see it gone reports it, once: a ``disconnect`` event (the monitor's timeline, the
        notice under the next cell), and every array of its client lost (``lost_clients``).
        """
        server = self.server
        if server is None or not _exited(self._pidfd, server, wait_s):
            return None
        # It has exited: the watcher's wait reaps it at once (bounded, for a watcher not yet scheduled).
        code = server.process.wait(_REAP_S)
        with self._gone_lock:
            if self._gone is None:
                _settle(server.stderr_lines)
                self._gone = _died(server.pid, code, server.stderr_lines)
                if self.client is not None:
                    lost_clients.mark_lost(self.client, self._gone)
                if not self._closing and self.events is not None:
                    self.events.emit("disconnect", detail=f"{server.target}: {self._gone}")
            return self._gone

    def _on_disconnect(self, status: Any) -> None:
        # The client reports a dead server too; the watcher says it better (pid, signal), once.
        if self.gone(1.0) is None:
            super()._on_disconnect(status)

    def gone_message(self, wait_s: float = 0.0) -> str | None:
        """The one line for work that met the dead server (``None`` while it serves)."""
        why = self.gone(wait_s)
        if why is None:
            return None
        return (
            f"the local Pathways server ({self.spec}) is gone: {why}; its arrays and compiled functions are lost. "
            f"{RECONNECT} for a new server: variables with a snapshot come back on it"
        )

    def check(self) -> None:
        """Raise ``BackendError`` in one line once the server is gone."""
        if (message := self.gone_message()) is not None:
            raise BackendError(message)

    # -- devices --------------------------------------------------------------
    def devices(self) -> Sequence[Any]:
        self.check()
        return super().devices()

    # -- faults, on the server ------------------------------------------------
    def lose_slice(self, index: int) -> tuple[int, int]:
        """Loses slice ``index`` on the server; returns (arrays lost here, their bytes)."""
        import jax

        from pathways_kernel.backends import server_client

        self.check()
        with COPIES.lock:
            if COPIES:
                self._reads_reach_server(index)
            server_client.fail(self.server.target, index)
        lost = [
            array
            for array in jax.live_arrays()
            if not array.is_deleted() and any(device_slice(d) == index for d in array.sharding.device_set)
        ]
        self._lost.update((id(array), array) for array in lost)
        return len(lost), sum(array.nbytes for array in lost)

    def _reads_reach_server(self, index: int) -> None:
        """Wait until the server has taken every request this client sent so far (host copies'
        reads among them), by a round trip behind them: the session serves its requests in order."""
        import jax
        import numpy as np

        on_slice = next((d for d in jax.devices() if device_slice(d) == index), None)
        if on_slice is None:
            return
        reached = threading.Event()

        def round_trip() -> None:
            try:
                jax.device_put(np.zeros((), np.float32), on_slice).block_until_ready()
            finally:
                reached.set()

        threading.Thread(target=round_trip, name="pathways-local-loss-barrier", daemon=True).start()
        if not reached.wait(_BARRIER_S):
            _log.warning(
                "pathways: the reads of a host copy in flight did not reach the local server in %.0f s; "
                "slice %d is lost anyway (that copy may fail)",
                _BARRIER_S,
                index,
            )

    def restore_slice(self, index: int) -> None:
        """Brings slice ``index`` back on the server, empty."""
        from pathways_kernel.backends import server_client

        self.check()
        server_client.repair(self.server.target, index)

    def is_lost(self, array: Any, wait: bool = True) -> bool:
        """Whether reading ``array`` raises the server's ``DATA_LOSS`` (see the module doc)."""
        import jax

        if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer) or array.is_deleted():
            return False
        if self._lost.get(id(array)) is array:
            return True
        from pathways_kernel.core.sessions import current

        session = current()
        if session is None or session.backend is not self:
            return False
        down = {s.index for s in session.topology.slices if not s.up}
        return bool(down) and any(device_slice(d) in down for d in array.sharding.device_set)

    # -- telemetry ------------------------------------------------------------
    def chip_metrics(self) -> ChipMetrics | None:
        """The server's runtime metric service, on its socket: what tpu-info reads of a TPU host."""
        from pathways_kernel.backends.runtime_metrics import RuntimeMetrics
        from pathways_kernel.core.server_protocol import METRIC_WINDOW_S

        server = self.server
        if server is None:
            return None
        return RuntimeMetrics(
            server.target.removeprefix("grpc://"), METRIC_WINDOW_S, name="runtime metrics (pathways-local)"
        )


#: What JAX's proxy client says, before asking the server, when a program has a host callback
#: and the platform is ``cpu`` (``jax.debug.print``, ``pure_callback``, ``io_callback``).
HOST_CALLBACK_REFUSED = "Unsupported host callback type"


def error_line(error: BaseException) -> str | None:
    """The one line for a JAX error whose own message does not say what to do, else None.

    A host callback the proxy client refused: where callbacks work. Work that met a lost
    slice while every slice is down (the server names only one): how to bring one back,
    as the embedded backend says it.
    """
    from pathways_kernel.core.errors import one_line, slice_down_error
    from pathways_kernel.core.sessions import current
    from pathways_kernel.emulator.fault_report import no_slice_up_message

    session = current()
    if HOST_CALLBACK_REFUSED in str(error):
        spec = session.backend.spec if session is not None else "this backend"
        return (
            f"{type(error).__name__}: host callbacks (jax.debug.print, jax.pure_callback, io_callback) do not run on "
            f"{spec}: JAX's Pathways proxy client refuses them on a cpu platform ({HOST_CALLBACK_REFUSED}). "
            "Run them on the embedded backend (`%pathways connect embedded:2x4`), which runs the slices in this process"
        )
    if session is not None and "DATA_LOSS" in str(error) and isinstance(session.backend, LocalServerBackend):
        slices = session.topology.slices
        if slices and not any(s.up for s in slices):
            return one_line(slice_down_error(no_slice_up_message(s.index for s in slices)))
    return None


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: ``_exited`` polls instead
        return None


def _exited(pidfd: int | None, server: Any, wait_s: float | None) -> bool:
    """Whether ``server`` has exited, waiting up to ``wait_s`` seconds (``None``: until it does).

    Not ``Popen.poll``: while the watcher thread waits for the process, ``poll`` and
    ``wait(timeout)`` cannot take its lock and say it runs, dead or not (under load, for as
    long as the watcher is not scheduled). A pidfd turns readable at the exit, lock-free.
    """
    if pidfd is None:
        try:
            server.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        readable, _, _ = select.select([pidfd], [], [], wait_s)
    except (OSError, ValueError):  # closed meanwhile: the session stopped it, which is no death
        return False
    return bool(readable)


def _settle(lines: Sequence[str]) -> None:
    """Wait, at most ``_LAST_WORDS_S``, for a dead server's last stderr lines: they reach
    ``lines`` (its stderr pump) a moment after its exit; done once none came for 0.1 s."""
    deadline = time.monotonic() + _LAST_WORDS_S

    def last() -> tuple[int, str | None]:
        return len(lines), lines[-1] if lines else None

    seen: tuple[int, str | None] | None = None
    while last() != seen and time.monotonic() < deadline:
        seen = last()
        time.sleep(0.1)


def _died(pid: int, code: int | None, stderr: Iterable[str] = ()) -> str:
    """How the server ended, with its last words when it ended itself (an abort, an exit)."""
    by_itself = code is None or code >= 0 or -code not in _KILLED_FROM_OUTSIDE
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with status {code}"
    said = _last_words(stderr) if by_itself else ""
    return f"server pid {pid} {how}" + (f": {said}" if said else "")


#: Signals another process sends (kill -9, the out-of-memory killer, a stop): the signal is the reason.
_KILLED_FROM_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
#: A glog line of severity FATAL or ERROR (``F1204 12:00:00.000000  123 rendezvous.cc:161] ...``).
_GLOG_ERROR = re.compile(r"^[FE]\d{4} ")


def _last_words(stderr: Iterable[str]) -> str:
    """The server's last line that says why it ended: its last fatal/error log line, else its last line."""
    said = [line.strip() for line in stderr if line.strip()]
    why = [line for line in said if _GLOG_ERROR.match(line) or "Check failed" in line]
    line = (why or said or [""])[-1]
    return line if len(line) <= 300 else line[:297] + "..."


def _stop_at_exit(backend: LocalServerBackend) -> None:
    from pathways_kernel.backends.proxy import _EXIT_GUARD

    # The client first, then its server: a client whose server dies calls back into
    # Python, which aborts the process if it is finalizing by then.
    backend.close()
    _EXIT_GUARD.touch()
    _EXIT_GUARD.wait()
