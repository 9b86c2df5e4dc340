"""Transfers: uploads and downloads that run beside the notebook.

A ``Transfer`` is the handle ``pw.persist`` (and checkpoint saves) return: it
runs on a small dedicated executor, counts the bytes moved so far (progress
bars read that), and when it ends emits one ``transfer`` event with bytes,
duration and throughput, or what failed. The kernel's main thread only
starts it; the bulk bytes are moved by tensorstore's own threads, which do not
hold the GIL, so the notebook stays responsive.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pathways_kernel.core import sessions
from pathways_kernel.core.errors import StorageError, one_line
from pathways_kernel.core.eventlog import EventLog, format_bytes
from pathways_kernel.core.subscribers import Subscribers

if TYPE_CHECKING:
    import jax
    from jax.sharding import Sharding

# Two workers: a restore can run while a persist is still uploading. The
# workers mostly wait on tensorstore futures, so more would not be faster.
_WORKERS = 2
_EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="pathways-storage")
#: Transfers started and not yet ended (queued or running): past ``_WORKERS``, a new one queues.
_active = 0
_active_lock = threading.Lock()


def _ended() -> None:
    global _active
    with _active_lock:
        _active -= 1


class TransferStarts(Subscribers["Transfer"]):
    """A session's listeners of its transfers as each starts, on the starting thread
    (the notebook's progress bars): ``session.component(TransferStarts).subscribe(f)``."""


class Transfer:
    """One upload or download in flight; see the module doc.

    Attributes:
      kind: ``"persist"``, ``"restore"``, ``"checkpoint save"``, ...
      what: a short description (snapshot name and URL).
      total: bytes to move (0 when unknown yet).
      done_bytes: bytes moved so far.
    """

    def __init__(self, kind: str, what: str, total: int = 0, events: EventLog | None = None):
        self.kind = kind
        self.what = what
        self.total = total
        self.done_bytes = 0
        self.started = time.time()
        self.duration_s: float | None = None
        self.events = events
        self._lock = threading.Lock()
        self._future: concurrent.futures.Future[Any] | None = None
        self._checked = threading.Event()
        #: What the job raised, set before ``_checked`` wakes a waiter (the future is done later).
        self._failure: BaseException | None = None
        self._queued = False
        self._running = threading.Event()

    # -- worker side ----------------------------------------------------------
    def advance(self, nbytes: int) -> None:
        with self._lock:
            self.done_bytes += nbytes

    def checked(self) -> None:
        """Called by the job once its quick checks (bucket, duplicate) passed."""
        self._checked.set()

    def start(self, job: Callable[[Transfer], Any]) -> Transfer:
        global _active
        with _active_lock:
            # Behind as many transfers as there are workers: its checks run when it starts.
            self._queued = _active >= _WORKERS
            _active += 1
        try:
            self._future = _EXECUTOR.submit(self._run, job)
        except BaseException:
            _ended()
            raise
        if (running := sessions.current()) is not None:
            running.component(TransferStarts).notify(self)
        return self

    def _run(self, job: Callable[[Transfer], Any]) -> Any:
        self._running.set()
        self.started = time.time()
        start = time.perf_counter()
        try:
            result = job(self)
        except BaseException as exc:
            self._failure = exc
            self._finish(start, f"FAILED: {one_line(exc)}")
            raise
        finally:
            _ended()
        self._finish(start, f"({self.throughput()})")
        return result

    def _finish(self, start: float, outcome: str) -> None:
        """Record the duration, release waiters on the check, emit the ``transfer`` event."""
        self.duration_s = time.perf_counter() - start
        self._checked.set()
        if self.events is not None:
            self.events.emit(
                "transfer",
                bytes=self.done_bytes,
                duration_s=self.duration_s,
                detail=f"{self.kind} {self.what} {outcome}",
            )

    # -- caller side ----------------------------------------------------------
    def wait_checked(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the quick checks; raise what they raised.

        Lets ``persist`` report a missing bucket or a duplicate id at once,
        as one line, while the bulk upload continues in the background. A
        transfer queued behind others is not waited for: its checks run
        when it starts, and their failure shows in its progress and events.
        A job signals ``checked()`` only once its checks passed; a failure
        is recorded before waiters wake, however loaded the machine.
        """
        if not self._queued:
            self._checked.wait(timeout)
        if self._failure is not None:
            raise self._failure

    def done(self) -> bool:
        return self._future is not None and self._future.done()

    def ok(self) -> bool:
        return self.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        assert self._future is not None
        return self._future.exception() if self._future.done() else None

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the transfer ends; returns its result or raises its error."""
        assert self._future is not None
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise StorageError(
                f"{self.kind} {self.what} still running after {timeout} s; wait longer or check the network"
            ) from None

    result = wait

    def elapsed_s(self) -> float:
        return self.duration_s if self.duration_s is not None else time.time() - self.started

    def throughput(self) -> str:
        elapsed = self.elapsed_s()
        return f"{format_bytes(self.done_bytes / elapsed)}/s" if elapsed > 0 else "-"

    def summary(self) -> str:
        if not self._running.is_set():
            return f"{self.kind} {self.what}: queued behind other transfers"
        if not self.done():
            pct = f" {100 * self.done_bytes / self.total:.0f}%" if self.total else ""
            return f"{self.kind} {self.what}: running{pct}, {format_bytes(self.done_bytes)} in {self.elapsed_s():.1f} s"
        exc = self.exception()
        if exc is not None:
            return f"{self.kind} {self.what}: FAILED: {one_line(exc)}"
        return f"{self.kind} {self.what}: done, {format_bytes(self.done_bytes)} in {self.elapsed_s():.2f} s ({self.throughput()})"

    def __repr__(self) -> str:
        return f"<{self.summary()}>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.summary())


def reshard(arrays: Sequence[jax.Array], shardings: Sequence[Sharding]) -> list[jax.Array]:
    """``jax.device_put(arrays, shardings)``, waited for, done by the server where the
    backend can: through JAX's proxy client, ``device_put`` to a sharding of another shape
    (a mesh that lost or gained a slice) reads the array into this process and uploads it
    again, while IFRT's reshard (``pathwaysutils.reshard``) asks the server to move it.
    A server that does not serve it is remembered and gets ``device_put``."""
    import jax
    import pathwaysutils

    arrays, shardings = list(arrays), list(shardings)
    if arrays and not _RESHARD_UNSERVED and pathwaysutils.is_pathways_backend_used():
        from pathwaysutils import reshard as pathways_reshard

        try:
            moved: list[jax.Array] = jax.block_until_ready(list(pathways_reshard.reshard(arrays, shardings)))
            return moved
        except jax.errors.JaxRuntimeError as error:
            if "UNIMPLEMENTED" not in str(error):
                raise
            _RESHARD_UNSERVED.append(one_line(error))
    put: list[jax.Array] = jax.block_until_ready(list(jax.device_put(arrays, shardings)))
    return put


#: Why the backend's server does not reshard (set once it said so).
_RESHARD_UNSERVED: list[str] = []


def run_sync(kind: str, what: str, job: Callable[[Transfer], Any], events: EventLog | None, total: int = 0) -> Any:
    """Run ``job`` as a transfer on the executor and wait for it.

    Downloads are synchronous for the caller (it needs the data), but they
    still run on the executor so that a progress bar can update meanwhile.
    """
    return Transfer(kind, what, total, events).start(job).wait()
