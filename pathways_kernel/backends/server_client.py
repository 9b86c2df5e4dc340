"""The kernel's side of the local Pathways server: start it as a child process, reachable only by
this user, and talk to its control channel. The server's own modules (``pathways_kernel/server/``,
its process) are never imported here: the two sides share only ``core/server_protocol.py``.

    server = start(2, 4)            # grpc://unix:/tmp/pathways-local-XXXX/server.sock
    os.environ["JAX_BACKEND_TARGET"] = server.target
    fail(server.target, 1)
    server.stop()

The server listens on a Unix domain socket in a fresh 0700 directory, so no
other user can connect; ``stop`` ends it by its pid and removes the directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from pathways_kernel.core.errors import BackendError
from pathways_kernel.core.server_protocol import (
    DEVICES_LINE,
    METRICS_LINE,
    PARENT_ENV,
    PROCESS_LINE,
    SERVING_LINE,
    control_call,
)


def client_env(target: str, connect_timeout_s: int = 30) -> dict[str, str]:
    """This process's environment for a JAX process that is a proxy client of ``target``,
    as a Pathways user's is (``pathwaysutils.initialize()`` is up to it); this process's
    own ``JAX_*``/``XLA_*`` settings are left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update(
        JAX_PLATFORMS="proxy",
        JAX_BACKEND_TARGET=target,
        IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS="true",
        PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS=str(connect_timeout_s),
    )
    return env


#: How often the server's output files are read for new lines (its first line, its prints).
_POLL_S = 0.05
#: The last lines of the server's stderr a report keeps; at most this many bytes are read for them.
_LAST_LINES = 200
_TAIL_BYTES = 64 * 1024


class Output:
    """What the server writes to stdout or stderr: an unlinked temporary file, never a pipe.

    A pipe needs a reader here, and a reader here is a Python thread, which needs the GIL.
    JAX's proxy client holds the GIL while it waits for the server (``Array.is_deleted()``
    is a blocking request), so a server that filled a pipe (64 KiB of log lines) while the
    kernel waited for it would wait for a reader waiting for the kernel: both hung (a decode
    loop's read, while the server logged each failed destruct; docs/architecture.md, trap 10).
    A file never makes the server wait.
    """

    def __init__(self) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (open as long as the server runs)
        self._offset = 0  # what ``new_lines`` has read
        self._partial = b""
        self._lock = threading.Lock()

    def new_lines(self) -> list[str]:
        """The complete lines written since the last call."""
        with self._lock:
            try:
                size = os.fstat(self.file.fileno()).st_size
                data = os.pread(self.file.fileno(), size - self._offset, self._offset) if size > self._offset else b""
            except (OSError, ValueError):  # closed: the server was stopped
                return []
            self._offset += len(data)
            *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode(errors="replace").rstrip("\r") for line in lines]

    def last_lines(self, count: int = _LAST_LINES) -> list[str]:
        """Its last ``count`` lines (read from at most its last 64 KiB)."""
        try:
            size = os.fstat(self.file.fileno()).st_size
            start = max(size - _TAIL_BYTES, 0)
            data = os.pread(self.file.fileno(), size - start, start)
        except (OSError, ValueError):
            return []
        lines = data.decode(errors="replace").splitlines()
        return lines[1:][-count:] if start and lines else lines[-count:]


@dataclass
class LocalServer:
    """A running server: its target (for ``JAX_BACKEND_TARGET``), pid and process."""

    target: str
    process: subprocess.Popen[str]
    directory: str | None = None
    #: ``localhost:PORT`` where the runtime metric service is served alone (``metrics_port``), for tpu-info.
    metrics_address: str | None = None
    stdout: Output = field(default_factory=Output)
    stderr: Output = field(default_factory=Output)

    @property
    def stderr_lines(self) -> list[str]:
        """Its last 200 stderr lines: its last words are what a crash report needs (the kernel
        keeps none of it in memory, however long the server logs)."""
        return self.stderr.last_lines()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def forward(self) -> None:
        """Passes on what the server printed since the last call to this process's own stderr.

        Once it serves, what the server prints is its users' code (a colocated function's
        print): it goes to a kernel's log, as a Pathways sidecar's goes to its log."""
        lines = self.stdout.new_lines()
        if lines and sys.__stderr__ is not None:
            sys.__stderr__.write("".join(f"pathways-local: {line}\n" for line in lines))
            sys.__stderr__.flush()

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the server (SIGTERM, then SIGKILL after ``timeout``) and removes its socket directory."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.target:
            self.forward()  # its last prints
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def _forward_while_alive(server: LocalServer) -> None:
    """Forwards the server's prints every ``_POLL_S`` until it ends (then once more)."""
    while server.process.poll() is None:
        server.forward()
        time.sleep(_POLL_S)
    server.forward()


@dataclass
class _Early:
    """A server started ahead of its ``start`` call (``start_early``)."""

    slices: int | str
    chips: int
    env: dict[str, str]
    socket_path: str
    directory: str
    process: subprocess.Popen[str]
    stdout: Output
    stderr: Output
    started: float  # time.monotonic() at its spawn

    def server(self) -> LocalServer:
        return LocalServer("", self.process, self.directory, stdout=self.stdout, stderr=self.stderr)


_early: _Early | None = None
_early_lock = threading.Lock()


def kernel_env() -> dict[str, str]:
    """What a kernel adds to the environment of the server it starts: the server goes when the kernel
    does (also when it is killed without closing its session), and its devices are CPU devices, also in
    a kernel started with the Pathways variables (``JAX_PLATFORMS=proxy``) it would otherwise inherit."""
    return {PARENT_ENV: str(os.getpid()), "JAX_PLATFORMS": "cpu"}


def start_early(slices: int | str, chips: int, env: dict[str, str] | None = None) -> None:
    """Starts the server that ``start(slices, chips, env=env)`` will ask for, without waiting for it.

    A kernel calls it first thing, so that the server's start (Python, JAX, its devices) runs
    beside the kernel's own imports instead of after them; ``start`` adopts it, and
    ``discard_early`` stops it if nothing did.
    """
    global _early
    directory = tempfile.mkdtemp(prefix="pathways-local-")  # mkdtemp makes it 0700
    socket_path = os.path.join(directory, "server.sock")
    stdout, stderr = Output(), Output()
    started = time.monotonic()
    process = _spawn([*_serve_command(slices, chips), "--socket", socket_path], env, stdout, stderr)
    with _early_lock:
        previous, _early = (
            _early,
            _Early(slices, chips, dict(env or {}), socket_path, directory, process, stdout, stderr, started),
        )
    if previous is not None:
        previous.server().stop()


def early_started() -> float | None:
    """When (``time.monotonic()``) the server ``start_early`` started was spawned, None without one."""
    with _early_lock:
        return _early.started if _early is not None else None


def discard_early() -> None:
    """Stops the server ``start_early`` started if no ``start`` adopted it (the session chose another backend)."""
    early = _take_early(None, None, None)
    if early is not None:
        early.server().stop()


def _take_early(slices: int | str | None, chips: int | None, env: dict[str, str] | None) -> _Early | None:
    """The early server, if it is alive and what ``start`` asks for (any, with ``slices`` None)."""
    global _early
    with _early_lock:
        early = _early
        if early is None or (
            slices is not None and (early.slices, early.chips, early.env) != (slices, chips, env or {})
        ):
            return None
        _early = None
    if slices is not None and early.process.poll() is not None:
        # It died before it was asked for (its reason is in its stderr, unread): start a fresh one.
        early.server().stop()
        return None
    return early


def _serve_command(slices: int | str, chips: int) -> list[str]:
    body = slices if isinstance(slices, str) else f"{slices}x{chips}"  # a spec: v5p:2x2x1*2,v6e:2x2
    return [sys.executable, "-m", "pathways_kernel.server", "serve", "--slices", body, "--progress"]


def _spawn(command: list[str], env: dict[str, str] | None, stdout: Output, stderr: Output) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        stdout=stdout.file,
        stderr=stderr.file,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # an interrupt in the parent does not reach the server
    )


def start(
    slices: int | str,
    chips: int = 0,
    *,
    socket_path: str | None = None,
    host: str | None = None,
    port: int = 0,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    metrics_port: int | None = None,
    on_step: Callable[[str], None] | None = None,
) -> LocalServer:
    """Starts ``pathways-local serve`` for ``slices`` x ``chips`` (or the slices ``slices`` names,
    ``"v5p:2x2x1*2,v6e:2x2"``: ``core/tpu_kinds.py``) and waits until it says it serves.

    Without ``host`` it listens on a Unix socket (``socket_path``, or one in a new 0700
    directory). With ``metrics_port`` (0: a free one) it also serves libtpu's runtime metrics
    alone on that loopback port (``metric_service.py``). ``on_step`` is called with each step of
    the server's start as its output tells it: ``process up``, ``devices``, ``listening``
    (``core/startup.py``'s ``LOCAL_SERVER_STEPS``). Raises BackendError with the server's own last
    line if it does not start.
    """
    step = on_step or (lambda _: None)
    directory = None
    early = _take_early(slices, chips, env) if (socket_path, host, metrics_port) == (None, None, None) else None
    if early is not None:
        socket_path, directory = early.socket_path, early.directory
    command = _serve_command(slices, chips)
    if host is not None:
        command += ["--host", host, "--port", str(port)]
    else:
        if socket_path is None:
            directory = tempfile.mkdtemp(prefix="pathways-local-")  # mkdtemp makes it 0700
            socket_path = os.path.join(directory, "server.sock")
        command += ["--socket", socket_path]
    if metrics_port is not None:
        command += ["--metrics-port", str(metrics_port)]
    if early is not None:
        server = early.server()
    else:
        stdout, stderr = Output(), Output()
        server = LocalServer("", _spawn(command, env, stdout, stderr), directory, stdout=stdout, stderr=stderr)
    # Waits for the server's serving line, polling its stdout file, at most ``timeout`` seconds.
    deadline = time.monotonic() + timeout
    while True:
        for line in server.stdout.new_lines():
            if line.startswith(PROCESS_LINE):
                step("process up")
            if line.startswith(DEVICES_LINE):
                step("devices")
            if line.startswith(METRICS_LINE):
                server.metrics_address = line.rsplit(" ", 1)[1]
            if line.startswith(SERVING_LINE):
                server.target = line.rsplit(" ", 1)[1]
                step("listening")
        if server.target:
            threading.Thread(
                target=_forward_while_alive, args=(server,), name="pathways-local-output", daemon=True
            ).start()
            return server
        if server.process.poll() is not None or time.monotonic() > deadline:
            server.stop()  # its stderr file has all it wrote once it has ended
            said = next((s for s in reversed(server.stderr_lines) if s.strip()), "no output")
            raise BackendError(f"the local Pathways server did not start: {said}")
        time.sleep(_POLL_S)


# -- the control channel: fail, repair and inspect the server's slices, cancel queued work --
def fail(target: str, slice_index: int, timeout: float = 30.0) -> dict[str, Any]:
    """Loses slice ``slice_index`` on the server at ``target``; returns its status."""
    return control_call(target, "Fail", {"slice": slice_index}, timeout)


def repair(target: str, slice_index: int, timeout: float = 30.0) -> dict[str, Any]:
    """Brings slice ``slice_index`` back (empty); returns the server's status."""
    return control_call(target, "Repair", {"slice": slice_index}, timeout)


def cancel(target: str, timeout: float = 5.0) -> dict[str, Any]:
    """Drops the executions the server has not started (the client was interrupted); returns
    ``running``, the most executions still running on one device."""
    return control_call(target, "Cancel", {}, timeout)


def status(target: str, timeout: float = 30.0) -> dict[str, Any]:
    """The server's slices, which are down, and bytes held on each device."""
    return control_call(target, "Status", {}, timeout)
