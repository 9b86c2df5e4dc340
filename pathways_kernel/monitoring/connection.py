"""One frontend's comm on ``pathways.monitor``: its sender thread, hub subscription and requests.

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

What waits to be sent is bounded by what may be dropped: only the newest
metrics frame and the newest topology wait; events beyond ``MAX_QUEUED_EVENTS``
drop the oldest (the log keeps them all); replies are never dropped: while
``MAX_PENDING_REPLIES`` wait, handling the next request waits for the sender.

While the backend starts (a fresh kernel's local server), the comm first says how
far it is (``starting``, from ``core/startup.py``). A kernel without a backend (its proxy target unreachable at start) keeps the
comm open and says why (``no_backend``); the topology follows once a backend
connects. The comm target that opens connections and carries out their
requests is ``monitoring/comm.py``.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from pathways_kernel.core.errors import PathwaysError, one_line
from pathways_kernel.core.eventlog import Event
from pathways_kernel.core.sessions import Session
from pathways_kernel.core.slices import Topology
from pathways_kernel.core.threads import ExitStop
from pathways_kernel.monitoring import protocol, telemetry
from pathways_kernel.monitoring.encoding import encoded_metrics, encoded_topology, history_message
from pathways_kernel.training import goodput_report
from pathways_kernel.training.metric_log import Point, metric_log
from pathways_kernel.training.phases import Span, phase_log

#: Events replayed to a new connection.
REPLAY_EVENTS = 50
#: Events waiting per connection beyond which the oldest are dropped.
MAX_QUEUED_EVENTS = 1000
#: Replies waiting per connection beyond which request handling waits for the sender.
MAX_PENDING_REPLIES = 256
#: Seconds between the ``starting`` messages of a backend start that takes no step meanwhile.
_START_TICK_S = 1.0

log = logging.getLogger("pathways_kernel.monitoring")

#: A Jupyter message as ipykernel hands it to comm callbacks (JSON).
JupyterMessage = dict[str, Any]
#: What a request returns: the reply's ``result``, or the chip history a ``chip_history`` reply carries.
Result = dict[str, Any] | protocol.ChipHistory


class Comm(Protocol):
    """The kernel side of one comm (``comm.base_comm.BaseComm``), as a connection uses it."""

    def on_msg(self, callback: Callable[[JupyterMessage], None]) -> None: ...

    def on_close(self, callback: Callable[[JupyterMessage], None]) -> None: ...

    def send(
        self, data: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None, buffers: Any = None
    ) -> None: ...

    def close(
        self, data: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None, buffers: Any = None
    ) -> None: ...


class CommTarget(Protocol):
    """What a connection needs of the comm target that opened it (``comm.MonitorServer``)."""

    #: Seconds a comm may go unheard before it is closed.
    stale_after_s: float

    @property
    def main_shell_busy(self) -> bool:
        """Whether the main shell runs a request (a cell) now."""
        ...

    def handle(self, conn: Connection, request: protocol.Request) -> Result:
        """Carry out a validated request."""
        ...

    def forget(self, conn: Connection) -> None:
        """Drop a closed connection."""
        ...


# -- one comm --------------------------------------------------------------------


class Connection:
    """One frontend's comm: a sender thread, a hub subscription, request handling."""

    def __init__(self, comm: Comm, server: CommTarget, subshell_id: str | None = None, client: str | None = None):
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
        self._points_replay: list[Point] | None = None  # encoded when sent, after the history
        self._points: collections.deque[Point] = collections.deque(maxlen=protocol.MAX_REPLAY_POINTS)
        self._points_after = 0  # seq of the newest replayed point: live points up to it are in the replay
        self._unsubscribe_points: Callable[[], None] | None = None
        # Phases a loop marks (pw.phase), the same way: the catch-up once, then live batches.
        self._spans_replay: list[Span] | None = None
        self._spans: collections.deque[Span] = collections.deque(maxlen=protocol.MAX_REPLAY_SPANS)
        self._spans_after = 0
        self._unsubscribe_spans: Callable[[], None] | None = None
        self._sub: telemetry.Subscription | None = None
        self._close_reason: str | None = None
        self._thread: threading.Thread | None = None
        self._exit_stop = ExitStop(self, _close_at_exit)

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
        self._exit_stop.arm()
        self._thread.start()

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

    def _on_points(self, points: list[Point]) -> None:
        with self._cond:
            self._points.extend(points)
            self._cond.notify_all()

    def _on_spans(self, spans: list[Span]) -> None:
        with self._cond:
            self._spans.extend(spans)
            self._cond.notify_all()

    def _on_hub_close(self) -> None:
        # The session was replaced: the send loop resubscribes to the new one.
        self._stop_points()
        with self._cond:
            self._sub = None
            self._cond.notify_all()

    def _on_session(self, _: object) -> None:
        # Without a backend the send loop waits for one; any new session may be it.
        with self._cond:
            self.no_backend = None
            self._cond.notify_all()

    # -- sending ----------------------------------------------------------------
    def _report_start(self) -> None:
        """While the backend starts, say how far it is (``starting``: at each step and once a second,
        then once more when it ends), answering requests meanwhile; returns once it has ended."""
        from pathways_kernel.core import startup

        def changed(_: startup.Progress) -> None:
            with self._cond:
                self._cond.notify_all()

        unsubscribe = startup.subscribe(changed)
        try:
            sent: startup.Progress | None = None
            sent_at = 0.0
            while not self.closed:
                progress = startup.current()
                if progress is None:
                    return
                if progress is not sent or time.monotonic() - sent_at >= _START_TICK_S:
                    data, _ = protocol.encode_starting(
                        progress.what, progress.steps, progress.done, progress.state, progress.error, progress.elapsed_s
                    )
                    self.comm.send(data)
                    sent, sent_at = progress, time.monotonic()
                if progress.state != startup.STARTING:
                    return
                with self._cond:
                    if not self._replies and startup.current() is progress:
                        self._cond.wait(max(0.0, sent_at + _START_TICK_S - time.monotonic()))
                    replies = self._take_replies()
                for data, buffers in replies:
                    self.comm.send(data, buffers=buffers or None)
        finally:
            unsubscribe()

    def _subscribe(self) -> None:
        from pathways_kernel.core import startup

        if startup.starting():
            self._report_start()
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
        # The log's events and the step rates published so far (never logged), in their order.
        logged = [*hub.session.events.last(REPLAY_EVENTS), *hub.recent_step_events()]
        replay = [protocol.encode_event(event) for event in sorted(logged, key=lambda e: e.seq)]
        intervals = _goodput_intervals(hub.session)
        if intervals is not None:
            replay.append(intervals)
        history = protocol.encode_history(history_message(hub))
        self._stop_points()
        log = metric_log(hub.session)
        self._unsubscribe_points = log.subscribe(self._on_points)
        kept = log.points()[-protocol.MAX_REPLAY_POINTS :]
        phases = phase_log(hub.session)
        self._unsubscribe_spans = phases.subscribe(self._on_spans)
        spans = phases.spans()[-protocol.MAX_REPLAY_SPANS :]
        with self._cond:
            self._points_replay = kept
            self._points_after = kept[-1].seq if kept else 0
            self._spans_replay = spans
            self._spans_after = spans[-1].seq if spans else 0
            self._sub = sub
            self._topology = encoded_topology(topology, hub.topology_seq, hub.session.backend)
            self._history = history
            self._events.extendleft(reversed(replay))
        # Armed again after the hub's (it may have just started): at exit the sender stops first.
        self._exit_stop.arm()

    def _wait_for_backend(self, reason: str) -> None:
        """Say why there is no backend, then answer requests until one connects (or the comm ends)."""
        from pathways_kernel.core import sessions

        with self._cond:
            self.no_backend = reason
        unsubscribe = sessions.on_start(self._on_session)
        try:
            data, buffers = protocol.encode_no_backend(reason)
            self.comm.send(data, buffers=buffers or None)
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
                        and self._spans_replay is None
                        and not self._spans
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
                    spans_replay, self._spans_replay = self._spans_replay, None
                    spans = [x for x in self._spans if x.seq > self._spans_after]
                    self._spans.clear()
                if topology is not None:
                    self.comm.send(topology[0], buffers=topology[1])
                if history is not None:
                    self.comm.send(history[0], buffers=history[1])
                if points_replay is not None:
                    self.comm.send(protocol.encode_metric_points(points_replay, replay=True)[0])
                if points:
                    self.comm.send(protocol.encode_metric_points(points, replay=False)[0])
                if spans_replay is not None:
                    self.comm.send(protocol.encode_phases(spans_replay, replay=True)[0])
                if spans:
                    self.comm.send(protocol.encode_phases(spans, replay=False)[0])
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
            self._exit_stop.disarm()

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
    def _on_msg(self, msg: JupyterMessage) -> None:
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

    def _reply(self, request_id: str | None, ok: bool, error: str | None, result: dict[str, Any] | None = None) -> None:
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

    def _on_frontend_close(self, msg: JupyterMessage) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        self._detach()

    def _stop_points(self) -> None:
        unsubscribe, self._unsubscribe_points = self._unsubscribe_points, None
        if unsubscribe is not None:
            unsubscribe()
        unsubscribe, self._unsubscribe_spans = self._unsubscribe_spans, None
        if unsubscribe is not None:
            unsubscribe()

    def _detach(self) -> None:
        self._stop_points()
        sub, self._sub = self._sub, None
        if sub is not None:
            sub.close()
        self.server.forget(self)


def _goodput_intervals(session: Session) -> protocol.Message | None:
    """The newest finished run's ``goodput_intervals``, or None (none yet, or it failed: logged)."""
    try:
        message: protocol.Message | None = goodput_report.intervals_message(
            session, protocol.GOODPUT_INTERVALS, protocol.encode_goodput_intervals
        )
    except Exception:
        log.exception("pathways monitor: goodput intervals failed")
        return None
    return message


def _close_at_exit(conn: Connection) -> None:
    # Before the hub it reads closes (ExitStop's order): a sender must not resubscribe to a
    # closing hub, nor be inside the process's native code when the interpreter stops its
    # daemon threads (jaxlib then aborts: "exception not rethrown").
    conn.close("shutdown")
    conn.join(5.0)
