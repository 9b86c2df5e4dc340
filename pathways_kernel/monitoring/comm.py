"""Serve protocol v1 on comm target ``pathways.monitor`` from the telemetry hub.

``MonitorServer`` is the target: each ``comm_open`` starts a ``Connection``
(``monitoring/connection.py``: its sender thread, hub subscription and request
queue), whose requests it carries out here. Messages are made from telemetry in
``monitoring/encoding.py`` and encoded by ``monitoring/protocol.py``.

Page reloads never close kernel comms, so connections are collected: one not
heard from (any request, ``ping`` included) for ``STALE_AFTER_S`` is closed,
and at most ``MAX_COMMS`` live at once (opening one more closes the one heard
from least recently).

Every request keeps its busy/idle pair; an idle published off the main shell
while it runs a cell is followed by that cell's busy
(``monitoring/ipykernel_compat.py``: JupyterLab and jupyter_server take every
IOPub status as the kernel's, whatever request it answers). Frontends keep
their comms with a ``comm_info_request``, whose status neither takes as the
kernel's (``hear_comm_info``).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any

from pathways_kernel.core import shellhooks
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.monitoring import protocol, telemetry
from pathways_kernel.monitoring.connection import Comm, Connection, JupyterMessage, Result
from pathways_kernel.monitoring.encoding import chip_history
from pathways_kernel.monitoring.ipykernel_compat import before_shell_handler, keep_the_cell_busy

MAX_COMMS = 8
STALE_AFTER_S = float(protocol.STALE_AFTER_S)


# -- the comm target ---------------------------------------------------------------


class MonitorServer:
    """The kernel's ``pathways.monitor`` target: live connections and request handling."""

    def __init__(self, max_comms: int = MAX_COMMS, stale_after_s: float = STALE_AFTER_S):
        self.max_comms = max_comms
        self.stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._connections: list[Connection] = []
        #: The request the main shell runs, between its busy and its idle (``keep_the_cell_busy``).
        self.main_shell_parent: dict[str, Any] | None = None

    @property
    def main_shell_busy(self) -> bool:
        return self.main_shell_parent is not None

    @property
    def connections(self) -> list[Connection]:
        with self._lock:
            return [c for c in self._connections if not c.closed]

    def open(self, comm: Comm, open_msg: JupyterMessage) -> None:
        """comm_open handler: evict what is over the cap, start the connection's sender."""
        context = contextvars.copy_context()
        header = open_msg.get("header") or {}
        conn = Connection(comm, self, header.get("subshell_id"), header.get("session"))
        now = time.monotonic()
        with self._lock:
            live = [c for c in self._connections if not c.closed]
            stale = [c for c in live if c.stale(now)]
            fresh = sorted((c for c in live if c not in stale), key=lambda c: c.last_heard)
            evict = fresh[: max(0, len(fresh) - self.max_comms + 1)]
            self._connections = [conn, *(c for c in fresh if c not in evict)]
        for c in stale:
            c.close("stale")
        for c in evict:
            c.close("evicted")
        conn.start(context)

    def forget(self, conn: Connection) -> None:
        """Drop a closed connection (its ``_detach``)."""
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def close_all(self, timeout: float = 5.0) -> None:
        """Close every comm ("shutdown") and wait for their senders to finish."""
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            conn.close("shutdown")
        deadline = time.monotonic() + timeout
        for conn in conns:
            conn.join(max(0.0, deadline - time.monotonic()))

    def heard_from(self, client: str | None) -> None:
        """The frontend connection ``client`` is there: its comms are not stale."""
        now = time.monotonic()
        for conn in self.connections:
            if client is not None and conn.client == client:
                conn.last_heard = now

    def handle(self, conn: Connection, request: protocol.Request) -> Result:
        """Carry out a validated request; returns the reply's ``result`` (or the chip history it carries)."""
        if conn.no_backend is not None and request.type not in ("ping", "subscribe", "latest_profile"):
            raise PathwaysError(f"{request.type}: {no_backend_advice(conn.no_backend)}")
        handler: Callable[[Connection, protocol.Request], Result] = getattr(self, f"_do_{request.type}")
        return handler(conn, request)

    def _do_subscribe(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        return {"rate": conn.set_rate(request.rate or 0.0)}

    def _do_ping(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        return {}

    def _do_fail_slice(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        return _set_slice(request, "down")

    def _do_repair_slice(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        return _set_slice(request, "up")

    def _do_chip_history(self, conn: Connection, request: protocol.Request) -> protocol.ChipHistory:
        return chip_history(telemetry.hub(), request.start or 0, request.stop or 0)

    def _do_latest_profile(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        from pathways_kernel.profiling import capture

        return capture.latest_for_xprof()

    def _do_snapshot(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        try:
            from pathways_kernel.state.snapshots import snapshot_variables
        except ImportError:
            raise PathwaysError("snapshots are not available in this version of pathways-kernel") from None
        snaps = snapshot_variables(None)
        if not snaps:
            raise PathwaysError("the notebook holds no jax arrays to snapshot; create some first")
        return {
            "name": ",".join(s.name for s in snaps),
            "leaves": sum(len(s.leaves) for s in snaps),
            "nbytes": sum(int(s.nbytes) for s in snaps),
        }


def no_backend_advice(reason: str) -> str:
    """What a user sees when the kernel has no backend: why, and what to do."""
    return f"no backend: {reason}; run %pathways connect local:2x4 or fix the target"


def _set_slice(request: protocol.Request, state: str) -> dict[str, Any]:
    from pathways_kernel.core.sessions import session

    index = request.slice
    assert index is not None, "decode_request gives fail_slice and repair_slice their slice"
    s = session()
    # The session's backend loses the slice (monitoring never reaches into emulator/, .importlinter).
    report = s.fail_slice(index) if state == "down" else s.repair_slice(index)
    return {"slice": index, "changed": bool(report.changed)}


# -- registration ------------------------------------------------------------------

_server: MonitorServer | None = None


def server() -> MonitorServer:
    """The process's comm target handler (created on first use)."""
    global _server
    if _server is None:
        _server = MonitorServer()
    return _server


def register(shell: Any) -> bool:
    """Register ``pathways.monitor`` with the kernel's comm manager (once); False outside a kernel.

    Through the shell's ``ShellHooks``: ``shellhooks.remove(shell)`` unregisters the
    target and gives the kernel its own handlers back.
    """
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return False
    shellhooks.of(shell).component(MonitorServer, lambda hooks: _register(hooks, kernel))
    return True


def _register(hooks: shellhooks.ShellHooks, kernel: Any) -> MonitorServer:
    import comm

    manager = comm.get_comm_manager()
    manager.register_target(protocol.TARGET, server().open)

    def unregister() -> None:
        manager.unregister_target(protocol.TARGET, server().open)

    hooks.on_close(unregister)
    hooks.on_close(hear_comm_info(kernel))
    hooks.on_close(keep_the_cell_busy(kernel, server()))
    return server()


# -- liveness ------------------------------------------------------------------------


def hear_comm_info(kernel: Any) -> Callable[[], None]:
    """Count a ``comm_info_request`` for ``pathways.monitor`` as hearing from the sender's comms.

    It is how frontends keep their comms (docs/protocol.md, Lifecycle 5): JupyterLab and
    jupyter_server take no status of a ``comm_info_request`` as the kernel's (their
    ``untracked_message_types``), so a liveness message every 15 s shows nothing, keeps its
    own busy/idle pair, and does not count as activity for the server's idle culler.
    """

    def comm_info_request(parent: dict[str, Any]) -> None:
        if (parent.get("content") or {}).get("target_name") == protocol.TARGET:
            server().heard_from((parent.get("header") or {}).get("session"))

    return before_shell_handler(kernel, "comm_info_request", comm_info_request)
