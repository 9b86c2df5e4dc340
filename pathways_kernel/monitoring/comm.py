"""Serve protocol v1 on comm target ``pathways.monitor`` from the telemetry hub.

Each open comm is a ``Connection``: it subscribes to the session's hub and
sends ``topology``, ``event``, ``metrics`` and ``reply`` messages from its own
sender thread, so they flow while a cell runs. Two things make frontend
requests work during a busy cell (docs/architecture.md, traps 1 and 2):

* The frontend opens the comm on a kernel subshell, so ``comm_open`` and later
  ``comm_msg``s are handled on that subshell's thread, not the busy main shell.
* ipykernel routes each incoming ``comm_msg`` to the subshell of the parent of
  the comm's *last outgoing* message. A plain thread sends with the main
  shell's parent, which would send requests back to the busy main shell. So the
  sender thread runs inside ``contextvars.copy_context()`` taken in the
  ``comm_open`` handler: every message it sends carries the subshell's parent.

Page reloads never close kernel comms, so connections are collected: one not
heard from (any request, ``ping`` included) for ``STALE_AFTER_S`` is closed,
and at most ``MAX_COMMS`` live at once (opening one more closes the one heard
from least recently).

What waits to be sent is bounded by what may be dropped: only the newest
metrics frame and the newest topology wait; events beyond ``MAX_QUEUED_EVENTS``
drop the oldest (the log keeps them all); replies are never dropped: while
``MAX_PENDING_REPLIES`` wait, handling the next request waits for the sender.

A kernel without a backend (its proxy target unreachable at start) keeps the
comm open and says why (``no_backend``); the topology follows once a backend
connects.

Every request keeps its busy/idle pair; an idle published off the main shell
while it runs a cell is followed by that cell's busy (``keep_the_cell_busy``:
JupyterLab and jupyter_server take every IOPub status as the kernel's, whatever
request it answers). Frontends keep their comms with a ``comm_info_request``,
whose status neither takes as the kernel's (``hear_comm_info``).

Over 700 lines for now: encoding, transport, the comm target and the kernel
status patch are its seams, to be split in issue #21's structure round.
"""

from __future__ import annotations

import atexit
import collections
import contextvars
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from pathways_kernel.core.errors import PathwaysError, one_line
from pathways_kernel.core.eventlog import Event
from pathways_kernel.core.slices import Topology
from pathways_kernel.monitoring import protocol, telemetry
from pathways_kernel.monitoring.history import MAX_BYTES as MAX_HISTORY_BYTES
from pathways_kernel.monitoring.history import SLICE_HISTORY_S
from pathways_kernel.training import goodput_report
from pathways_kernel.training.metric_log import metric_log

MAX_COMMS = 8
STALE_AFTER_S = float(protocol.STALE_AFTER_S)
#: Events replayed to a new connection.
REPLAY_EVENTS = 50
#: Events waiting per connection beyond which the oldest are dropped.
MAX_QUEUED_EVENTS = 1000
#: Replies waiting per connection beyond which request handling waits for the sender.
MAX_PENDING_REPLIES = 256

log = logging.getLogger("pathways_kernel.monitoring")


# -- telemetry -> protocol -----------------------------------------------------


def topology_message(topology: Topology, topology_seq: int, backend: Any) -> protocol.TopologyMessage:
    chips = topology.chips
    n = len(chips)
    coords = np.zeros((n, 3), np.uint16)
    for p, chip in enumerate(chips):
        c = chip.coords[:3]
        coords[p, : len(c)] = c
    slices, offset = [], 0
    for s in topology.slices:
        shape = tuple(s.shape)
        slices.append(protocol.SliceInfo(s.index, s.state, s.kind, shape, offset, len(s.chips)))
        offset += len(s.chips)
    return protocol.TopologyMessage(
        topology_seq=topology_seq,
        backend=backend.spec,
        target=backend.target,
        platform=topology.platform,
        supports_fault_injection=bool(backend.supports_fault_injection),
        slices=tuple(slices),
        chip_id=np.fromiter((c.id for c in chips), np.int32, n),
        chip_slice=np.fromiter((c.slice_index for c in chips), np.uint16, n),
        chip_coords=coords,
    )


def metrics_message(m: telemetry.Metrics) -> protocol.MetricsMessage:
    unit = protocol.memory_unit_for(int(m.memory.max()) if m.memory.size else 0)
    return protocol.MetricsMessage(
        seq=m.seq,
        time=m.time,
        topology_seq=m.topology_seq,
        source=m.source,
        window_s=m.window_s if m.window_s > 0 else 1e-3,
        memory_unit=unit,
        slices=m.slices,
        utilization=m.total_utilization,
        memory_bytes=m.memory_bytes,
        chip_utilization=protocol.quantize_utilization(m.utilization),
        chip_memory=protocol.quantize_memory(m.memory, unit),
    )


def history_message(hub: telemetry.TelemetryHub) -> protocol.HistoryMessage:
    """The hub's per-slice history of the current layout (empty before its first sample)."""
    history = hub.history()
    slices = tuple(s.index for s in hub.layout.topology.slices)
    if history is None or history.slices != len(slices):
        series = {
            "time": np.zeros(0),
            "util": np.zeros((0, len(slices)), np.float32),
            "bytes": np.zeros((0, len(slices))),
            "up": np.zeros((0, len(slices)), np.bool_),
        }
    else:
        series = history.slice_series()
    return protocol.HistoryMessage(
        topology_seq=hub.topology_seq,
        slices=slices,
        window_s=float(SLICE_HISTORY_S),
        time=series["time"],
        utilization=series["util"],
        memory_bytes=series["bytes"],
        up=series["up"],
    )


def chip_history(hub: telemetry.TelemetryHub, start: int, stop: int) -> protocol.ChipHistory:
    """Per-chip series of chip positions ``start:stop`` from the hub's history.

    Raises:
      PathwaysError: positions past the last chip, or a layout too large for per-chip history.
    """
    chips = hub.layout.chips
    if stop > chips:
        raise PathwaysError(f"chip_history: chips {start}:{stop} asked for, but the topology has {chips}")
    history = hub.history()
    if history is not None and not history.keeps_chips:
        raise PathwaysError(
            f"chip_history: {chips} chips are too many to keep per-chip history within "
            f"{MAX_HISTORY_BYTES >> 20} MiB; per-slice history is kept"
        )
    if history is None or history.chips != chips:
        series = {
            "time": np.zeros(0),
            "util": np.zeros((0, stop - start), np.uint8),
            "memory": np.zeros((0, stop - start), np.uint8),
        }
        unit = 1
    else:
        series = history.chip_series(start, stop)
        unit = history.memory_unit
    return protocol.ChipHistory(hub.topology_seq, start, stop, unit, series["time"], series["util"], series["memory"])


class _EncodedOnce:
    """The newest message encoded, and what it was encoded from: each hub sample or
    topology is encoded once, however many comms send it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[Any, ...] | None = None
        self._message: protocol.Message | None = None

    def get(self, key: tuple[Any, ...], encode: Callable[[], protocol.Message]) -> protocol.Message:
        # The key holds its objects (not their ids), so a freed one's id cannot match a new one;
        # numbers compare by value, objects by identity (a topology's == would walk every chip).
        with self._lock:
            old = self._key
            if old is None or len(old) != len(key) or not all(map(_same, old, key)):
                self._message = encode()
                self._key = key
            return self._message  # type: ignore[return-value]


def _same(a: Any, b: Any) -> bool:
    return a == b if isinstance(a, int) else a is b


_encoded_metrics = _EncodedOnce()
#: 65,536 chips take 35 ms to encode: a dashboard opened beside the panel reuses the panel's.
_encoded_topology = _EncodedOnce()


def encoded_metrics(m: telemetry.Metrics) -> protocol.Message:
    return _encoded_metrics.get((m, m.seq), lambda: protocol.encode_metrics(metrics_message(m)))


def encoded_topology(topology: Topology, topology_seq: int, backend: Any) -> protocol.Message:
    return _encoded_topology.get(
        (topology, topology_seq, backend),
        lambda: protocol.encode_topology(topology_message(topology, topology_seq, backend)),
    )


# -- one comm --------------------------------------------------------------------


class Connection:
    """One frontend's comm: a sender thread, a hub subscription, request handling."""

    def __init__(self, comm: Any, server: MonitorServer, subshell_id: str | None = None, client: str | None = None):
        self.comm = comm
        self.server = server
        #: The subshell the frontend opened the comm on; None: the main shell.
        self.subshell_id = subshell_id
        #: The frontend's kernel connection (its messages' ``header.session``).
        self.client = client
        self.opened = time.monotonic()
        self.last_heard = self.opened
        self.rate: float | None = None  # None: the hub's publish rate
        self.closed = False
        #: Why the kernel has no backend (one line), while it has none.
        self.no_backend: str | None = None
        self._cond = threading.Condition()
        # Only the newest topology and metrics wait; they supersede older ones.
        self._topology: protocol.Message | None = None
        #: The history, sent once right after the topology of a new subscription.
        self._history: protocol.Message | None = None
        self._metrics: telemetry.Metrics | None = None
        self._events: collections.deque[protocol.Message] = collections.deque(maxlen=MAX_QUEUED_EVENTS)
        self._replies: collections.deque[protocol.Message] = collections.deque()
        # Training metric points: the catch-up sent once per subscription, then live batches after it.
        self._points_replay: list[Any] | None = None  # encoded when sent, after the history
        self._points: collections.deque[Any] = collections.deque(maxlen=protocol.MAX_REPLAY_POINTS)
        self._points_after = 0  # seq of the newest replayed point: live points up to it are in the replay
        self._unsubscribe_points: Callable[[], None] | None = None
        self._sub: telemetry.Subscription | None = None
        self._close_reason: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def comm_id(self) -> str | None:
        return getattr(self.comm, "comm_id", None)

    # Called in the comm_open handler, so copy_context() holds the subshell's parent.
    def start(self, context: contextvars.Context) -> None:
        self.comm.on_msg(self._on_msg)
        self.comm.on_close(self._on_frontend_close)
        self._thread = threading.Thread(
            target=context.run, args=(self._send_loop,), name="pathways-monitor-send", daemon=True
        )
        self._thread.start()
        _sending.add(self)

    # -- hub callbacks (hub thread; never block) --------------------------------
    def _on_metrics(self, m: telemetry.Metrics) -> None:
        with self._cond:
            self._metrics = m
            self._cond.notify_all()

    def _on_event(self, event: Event) -> None:
        message = protocol.encode_event(event)
        hub = self._sub.hub if self._sub else None
        intervals = _goodput_intervals(hub.session) if event.kind == "goodput" and hub is not None else None
        with self._cond:
            self._events.append(message)
            if intervals is not None:  # the run that just ended, over time
                self._events.append(intervals)
            self._cond.notify_all()

    def _on_topology(self, topology: Topology, seq: int) -> None:
        hub = self._sub.hub if self._sub else None
        if hub is not None:
            message = encoded_topology(topology, seq, hub.session.backend)
            with self._cond:
                self._topology = message
                self._cond.notify_all()

    def _on_points(self, points: list[Any]) -> None:
        with self._cond:
            self._points.extend(points)
            self._cond.notify_all()

    def _on_hub_close(self) -> None:
        # The session was replaced: the send loop resubscribes to the new one.
        self._stop_points()
        with self._cond:
            self._sub = None
            self._cond.notify_all()

    def _on_connect(self, event: Event) -> None:
        # Without a backend the send loop waits for one; any connect may be it.
        if event.kind == "connect":
            with self._cond:
                self.no_backend = None
                self._cond.notify_all()

    # -- sending ----------------------------------------------------------------
    def _subscribe(self) -> None:
        for attempt in range(3):
            try:
                hub = telemetry.hub()
                sub = hub.subscribe(
                    self._on_metrics, self._on_event, self._on_topology, self._on_hub_close, rate=self.rate
                )
                break
            except PathwaysError as exc:
                self._wait_for_backend(one_line(exc))
                return
            except RuntimeError:  # the session closed between hub() and subscribe()
                if attempt == 2:
                    raise
                time.sleep(0.1)
        topology = hub.layout.topology
        replay = [protocol.encode_event(event) for event in hub.session.events.last(REPLAY_EVENTS)]
        intervals = _goodput_intervals(hub.session)
        if intervals is not None:
            replay.append(intervals)
        history = protocol.encode_history(history_message(hub))
        self._stop_points()
        log = metric_log(hub.session)
        self._unsubscribe_points = log.subscribe(self._on_points)
        kept = log.points()[-protocol.MAX_REPLAY_POINTS :]
        with self._cond:
            self._points_replay = kept
            self._points_after = kept[-1].seq if kept else 0
            self._sub = sub
            self._topology = encoded_topology(topology, hub.topology_seq, hub.session.backend)
            self._history = history
            self._events.extendleft(reversed(replay))

    def _wait_for_backend(self, reason: str) -> None:
        """Say why there is no backend, then answer requests until one connects (or the comm ends)."""
        from pathways_kernel.core.sessions import EVENTS

        with self._cond:
            self.no_backend = reason
        unsubscribe = EVENTS.subscribe(self._on_connect)
        try:
            self.comm.send(*protocol.encode_no_backend(reason))
            while True:
                with self._cond:
                    if self.no_backend is None or self.closed or self.stale(time.monotonic()):
                        return
                    if not self._replies:
                        self._cond.wait(1.0)
                    replies = self._take_replies()
                for data, buffers in replies:
                    self.comm.send(data, buffers=buffers or None)
        finally:
            unsubscribe()

    def _take_replies(self) -> list[protocol.Message]:
        """The waiting replies, oldest first; call holding ``_cond``."""
        replies = list(self._replies)
        self._replies.clear()
        self._cond.notify_all()  # request handlers waiting for room
        return replies

    def _send_loop(self) -> None:
        try:
            while True:
                if self._sub is None and not self.closed:
                    self._subscribe()
                    if self._sub is None:  # no backend: _subscribe waited for one to connect
                        if not self.closed and self.stale(time.monotonic()):
                            self.close("stale")
                        if self.closed:
                            return
                        continue
                with self._cond:
                    deadline = self.last_heard + self.server.stale_after_s
                    while (
                        not self.closed
                        and self._topology is None
                        and self._history is None
                        and not self._events
                        and not self._replies
                        and self._metrics is None
                        and self._points_replay is None
                        and not self._points
                        and self._sub is not None
                    ):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(min(remaining, 5.0))
                        deadline = self.last_heard + self.server.stale_after_s
                    if self.closed:
                        return
                    self._excuse_busy_main_shell()
                    topology, self._topology = self._topology, None
                    history, self._history = self._history, None
                    events = list(self._events)
                    self._events.clear()
                    replies = self._take_replies()
                    metrics, self._metrics = self._metrics, None
                    points_replay, self._points_replay = self._points_replay, None
                    points = [p for p in self._points if p.seq > self._points_after]
                    self._points.clear()
                if topology is not None:
                    self.comm.send(topology[0], buffers=topology[1])
                if history is not None:
                    self.comm.send(history[0], buffers=history[1])
                if points_replay is not None:
                    self.comm.send(protocol.encode_metric_points(points_replay, replay=True)[0])
                if points:
                    self.comm.send(protocol.encode_metric_points(points, replay=False)[0])
                for data, buffers in events + replies:
                    self.comm.send(data, buffers=buffers or None)
                if metrics is not None:
                    data, buffers = encoded_metrics(metrics)
                    self.comm.send(data, buffers=buffers)
                if self.stale(time.monotonic()):
                    self.close("stale")
                    return
        except Exception:
            log.exception("pathways monitor: sender stopped")
            self.close("shutdown")
        finally:
            self._flush_close()

    def _excuse_busy_main_shell(self) -> None:
        # Requests on a main-shell comm wait for the running cell: a long cell is not a dead page.
        if self.subshell_id is None and self.server.main_shell_busy:
            self.last_heard = time.monotonic()

    def stale(self, now: float) -> bool:
        self._excuse_busy_main_shell()
        return now - self.last_heard > self.server.stale_after_s

    def _flush_close(self) -> None:
        # Close from the sender thread, inside the comm_open context, after the last message.
        reason = self._close_reason
        if reason is not None and not getattr(self.comm, "_closed", False):
            try:
                self.comm.close(data=protocol.close_data(reason))
            except Exception:
                log.exception("pathways monitor: closing the comm failed")

    # -- requests (the thread that handles the comm_msg: a subshell's) ---------------
    def _on_msg(self, msg: dict[str, Any]) -> None:
        self.last_heard = time.monotonic()
        content = msg.get("content") or {}
        data = content.get("data")
        buffers = msg.get("buffers") or []
        try:
            request = protocol.decode_request(data, buffers)
        except protocol.ProtocolError as exc:
            self._reply(exc.request_id, False, str(exc))
            return
        try:
            result = self.server.handle(self, request)
        except PathwaysError as exc:
            self._reply(request.request_id, False, protocol.request_failed(request.type, exc))
        except Exception as exc:  # a bug: keep the kernel up, tell the frontend, keep the traceback in the log
            log.exception("pathways monitor: %s request failed", request.type)
            self._reply(request.request_id, False, f"{request.type} failed: {protocol.quote(one_line(exc))}")
        else:
            if isinstance(result, protocol.ChipHistory):
                self._queue_reply(protocol.encode_chip_history_reply(request.request_id, result))
            else:
                self._reply(request.request_id, True, None, result)

    def _reply(self, request_id: str | None, ok: bool, error: str | None, result: dict | None = None) -> None:
        self._queue_reply(protocol.encode_reply(request_id, ok, error, result))

    def _queue_reply(self, message: protocol.Message) -> None:
        with self._cond:
            # Backpressure, not loss: a flood of requests waits here for the sender to catch up.
            while len(self._replies) >= MAX_PENDING_REPLIES and not self.closed:
                self._cond.wait(1.0)
            if not self.closed:
                self._replies.append(message)
                self._cond.notify_all()

    def set_rate(self, rate: float) -> float:
        self.rate = rate
        sub = self._sub
        if sub is None:
            # Before the hub (or without a backend) the rate waits for the subscription.
            return min(rate, telemetry.DEFAULT_SAMPLE_HZ)
        return sub.set_rate(rate)

    # -- lifecycle ------------------------------------------------------------------
    def close(self, reason: str) -> None:
        """Close from the kernel side; the frontend gets ``{"type": "closed", reason}``."""
        with self._cond:
            if self.closed:
                return
            self.closed = True
            self._close_reason = reason
            self._cond.notify_all()
        self._detach()
        if self._thread is None or not self._thread.is_alive():
            self._flush_close()

    def join(self, timeout: float) -> None:
        """Wait until the sender thread has sent its last message (after ``close``)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _on_frontend_close(self, msg: dict[str, Any]) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        self._detach()

    def _stop_points(self) -> None:
        unsubscribe, self._unsubscribe_points = self._unsubscribe_points, None
        if unsubscribe is not None:
            unsubscribe()

    def _detach(self) -> None:
        self._stop_points()
        sub, self._sub = self._sub, None
        if sub is not None:
            sub.close()
        self.server._forget(self)


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

    def open(self, comm: Any, open_msg: dict[str, Any]) -> None:
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

    def _forget(self, conn: Connection) -> None:
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

    def handle(self, conn: Connection, request: protocol.Request) -> dict[str, Any] | protocol.ChipHistory:
        """Carry out a validated request; returns the reply's ``result`` (or the chip history it carries)."""
        if conn.no_backend is not None and request.type not in ("ping", "subscribe", "latest_profile"):
            raise PathwaysError(f"{request.type}: {no_backend_advice(conn.no_backend)}")
        handler: Callable[[Connection, protocol.Request], Any] = getattr(self, f"_do_{request.type}")
        return handler(conn, request)

    def _do_subscribe(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        return {"rate": conn.set_rate(request.rate or 0.0)}

    def _do_ping(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        return {}

    def _do_fail_slice(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        return _set_slice(request.slice, "down")

    def _do_repair_slice(self, conn: Connection, request: protocol.Request) -> dict[str, Any]:
        return _set_slice(request.slice, "up")

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


def _goodput_intervals(session: Any) -> protocol.Message | None:
    """The newest finished run's ``goodput_intervals``, or None (none yet, or it failed: logged)."""
    try:
        return goodput_report.intervals_message(session, protocol.GOODPUT_INTERVALS, protocol.encode_goodput_intervals)
    except Exception:
        log.exception("pathways monitor: goodput intervals failed")
        return None


def no_backend_advice(reason: str) -> str:
    """What a user sees when the kernel has no backend: why, and what to do."""
    return f"no backend: {reason}; run %pathways connect local:2x4 or fix the target"


def _set_slice(index: int | None, state: str) -> dict[str, Any]:
    from pathways_kernel.core.sessions import session

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


#: Connections whose sender thread was started (any server's), closed at exit.
_sending: weakref.WeakSet[Connection] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    # Registered after telemetry's, so it runs before the hubs close: a sender must not
    # resubscribe to a closing hub, nor be inside the process's native code when the
    # interpreter stops its daemon threads (jaxlib then aborts: "exception not rethrown").
    conns = list(_sending)
    for conn in conns:
        conn.close("shutdown")
    deadline = time.monotonic() + 5.0
    for conn in conns:
        conn.join(max(0.0, deadline - time.monotonic()))


def register(shell: Any) -> bool:
    """Register ``pathways.monitor`` with the kernel's comm manager; False outside a kernel."""
    if getattr(shell, "kernel", None) is None:
        return False
    import comm

    comm.get_comm_manager().register_target(protocol.TARGET, server().open)
    hear_comm_info(shell.kernel)
    keep_the_cell_busy(shell.kernel)
    return True


# -- liveness ------------------------------------------------------------------------


def hear_comm_info(kernel: Any) -> None:
    """Count a ``comm_info_request`` for ``pathways.monitor`` as hearing from the sender's comms.

    It is how frontends keep their comms (docs/protocol.md, Lifecycle 5): JupyterLab and
    jupyter_server take no status of a ``comm_info_request`` as the kernel's (their
    ``untracked_message_types``), so a liveness message every 15 s shows nothing, keeps its
    own busy/idle pair, and does not count as activity for the server's idle culler.
    """
    if getattr(kernel, "_pathways_comm_info", False):
        return
    handler = kernel.shell_handlers["comm_info_request"]

    def comm_info_request(stream: Any, ident: Any, parent: dict[str, Any]) -> Any:
        if (parent.get("content") or {}).get("target_name") == protocol.TARGET:
            server().heard_from((parent.get("header") or {}).get("session"))
        return handler(stream, ident, parent)

    kernel.shell_handlers["comm_info_request"] = comm_info_request
    kernel._pathways_comm_info = True


# -- kernel status -------------------------------------------------------------------

#: Requests whose status JupyterLab and jupyter_server do not take as the kernel's
#: (jupyter_server's default ``untracked_message_types`` that reach a kernel).
_UNTRACKED = frozenset(
    {"comm_info_request", "kernel_info_request", "debug_request", "shutdown_request", "interrupt_request"}
)
#: Orders a re-asserted busy before the running cell's own idle.
_status_lock = threading.Lock()


def keep_the_cell_busy(kernel: Any) -> None:
    """After an idle published off the main shell while it runs a cell, publish the cell's busy again.

    Every request keeps its own busy/idle pair. But JupyterLab (services 7.6,
    ``_handleMessage``) and jupyter_server take every IOPub status as the kernel's,
    whatever request it answers: the idle of a monitor request handled on its subshell
    (a click on "fail" while a cell runs), of the control channel creating that subshell
    (a panel attaching mid-cell) or of a widget's comm would show the kernel Idle while
    the cell still runs. A busy whose parent is the running request follows such an idle
    at once, so the last status is the truth again.

    The main shell's own busy and idle say whether it runs a request (and which one).
    """
    if getattr(kernel, "_pathways_status", False):
        return
    publish = kernel._publish_status

    def _publish_status(status: str, channel: str, parent: dict | None = None) -> None:
        parent = parent or kernel.get_parent(channel)
        on_main = threading.current_thread() is threading.main_thread()
        with _status_lock:
            publish(status, channel, parent)
            s = server()
            if on_main and channel == "shell" and status in ("busy", "idle"):
                s.main_shell_parent = parent if status == "busy" else None
            elif (
                status == "idle"
                and not on_main
                and s.main_shell_parent
                and (parent.get("header") or {}).get("msg_type") not in _UNTRACKED
            ):
                publish("busy", "shell", s.main_shell_parent)

    kernel._publish_status = _publish_status
    kernel._pathways_status = True
