"""The telemetry hub: per-chip utilization and memory, sampled on a background thread.

One hub per session (``session.component(TelemetryHub, ...)``). A
``MetricsSource`` samples every chip; the hub averages utilization over a
window, aggregates by slice, and hands ``Metrics`` to its subscriptions (the
monitor comms, the notebook widget) at each one's rate, together with the
session's events and topology changes. It samples only once someone has
subscribed; after the last subscriber leaves it goes on sampling once a
second to keep the metrics history (``monitoring/history.py``: 15 minutes
per slice, 5 per chip, bounded), so a view that comes back shows the past.

The sources (``monitoring/sources.py``): ``ChipSource`` shows the figures of a backend's
chip service (``Backend.chip_metrics``: libtpu's runtime metric service, which the local
server serves too; Cloud Monitoring) as they are; ``ClientSource`` measures from the client
alone, on every backend, and while that service does not answer. If a sample costs more
than ``MAX_DUTY`` of the sampling period in CPU, the hub samples less often.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from pathways_kernel.core.backend import Backend
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.eventlog import Event
from pathways_kernel.core.sessions import Session
from pathways_kernel.core.sessions import session as current
from pathways_kernel.core.slices import Topology
from pathways_kernel.core.threads import ExitStop
from pathways_kernel.monitoring.history import History
from pathways_kernel.monitoring.sources import ChipSource, ClientSource, Layout, MetricsSource
from pathways_kernel.monitoring.sources import Sample as Sample  # views and tests name it here
from pathways_kernel.training.step_rate import StepRate

DEFAULT_SAMPLE_HZ = 4.0
DEFAULT_PUBLISH_HZ = 2.0
DEFAULT_WINDOW_S = 2.0
#: Most of the sampling period a sample may cost before the hub backs off.
MAX_DUTY = 0.05


@dataclasses.dataclass(frozen=True)
class SliceMetrics:
    index: int
    state: str
    utilization: float
    memory_bytes: int
    memory_limit_bytes: int | None


@dataclasses.dataclass(frozen=True)
class Metrics:
    """One published sample: per chip (layout order) and per slice."""

    seq: int
    time: float
    topology_seq: int
    source: str
    window_s: float
    utilization: np.ndarray  # float32 [N] in [0, 1]
    memory: np.ndarray  # int64 [N] bytes
    memory_limit: np.ndarray | None
    slices: tuple[SliceMetrics, ...]
    #: Mean over the chips of up slices.
    total_utilization: float

    @property
    def memory_bytes(self) -> int:
        return int(self.memory.sum())


def aggregate(
    layout: Layout,
    topology_seq: int,
    seq: int,
    source: str,
    window_s: float,
    utilization: np.ndarray,
    memory: np.ndarray,
    memory_limit: np.ndarray | None,
) -> Metrics:
    """Zero the chips of down slices and sum/average by slice (``np.add.reduceat``)."""
    utilization = np.where(layout.up, utilization, 0.0).astype(np.float32)
    memory = np.where(layout.up, memory, 0).astype(np.int64)
    nonempty = layout.counts > 0
    util_sum = np.zeros(len(layout.counts))
    mem_sum = np.zeros(len(layout.counts), np.int64)
    lim_sum = np.zeros(len(layout.counts), np.int64)
    if nonempty.any():
        starts = layout.offsets[nonempty]
        util_sum[nonempty] = np.add.reduceat(utilization.astype(np.float64), starts)
        mem_sum[nonempty] = np.add.reduceat(memory, starts)
        if memory_limit is not None:
            lim_sum[nonempty] = np.add.reduceat(memory_limit.astype(np.int64), starts)
    slices = tuple(
        SliceMetrics(
            s.index,
            s.state,
            float(util_sum[i] / layout.counts[i]) if layout.counts[i] and s.up else 0.0,
            int(mem_sum[i]),
            int(lim_sum[i]) if memory_limit is not None else None,
        )
        for i, s in enumerate(layout.topology.slices)
    )
    up_chips = int(layout.up.sum())
    total = float(utilization.sum(dtype=np.float64) / up_chips) if up_chips else 0.0
    return Metrics(seq, time.time(), topology_seq, source, window_s, utilization, memory, memory_limit, slices, total)


class Subscription:
    """One consumer of the hub; callbacks run on the hub thread and must not block."""

    def __init__(
        self,
        hub: TelemetryHub,
        rate: float,
        on_metrics: Callable[[Metrics], None] | None,
        on_event: Callable[[Event], None] | None,
        on_topology: Callable[[Topology, int], None] | None,
        on_close: Callable[[], None] | None,
    ):
        self.hub = hub
        self.rate = rate
        self.on_metrics = on_metrics
        self.on_event = on_event
        self.on_topology = on_topology
        self.on_close = on_close
        self.next_due = 0.0
        self.closed = False

    def set_rate(self, rate: float) -> float:
        """Metrics per second for this consumer (0 pauses); returns the effective rate."""
        self.rate = max(0.0, float(rate))
        self.next_due = 0.0
        return self.effective_rate

    @property
    def effective_rate(self) -> float:
        return min(self.rate, self.hub.sample_hz)

    def close(self) -> None:
        self.hub._unsubscribe(self)


class TelemetryHub:
    """Samples the session's chips on a background thread while it has subscribers."""

    def __init__(
        self,
        session: Session,
        source: MetricsSource | None = None,
        sample_hz: float = DEFAULT_SAMPLE_HZ,
        publish_hz: float = DEFAULT_PUBLISH_HZ,
        window_s: float = DEFAULT_WINDOW_S,
    ):
        self.session = session
        self.sample_hz = float(sample_hz)
        self.publish_hz = float(publish_hz)
        self.window_s = float(window_s)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._subs: list[Subscription] = []
        self._events: collections.deque[Event] = collections.deque(maxlen=1000)
        self._closed = False
        self._thread: threading.Thread | None = None
        # A sample reads arrays in jaxlib: the thread is stopped at exit while it runs.
        self._exit_stop = ExitStop(self, TelemetryHub.close)
        self._topology_seq = 1
        self._layout = Layout.of(session.topology)
        self._target = session.backend.target
        self._source = source or _source_for(session.backend)
        self._seq = 0
        self._latest: Metrics | None = None
        self._history: History | None = None
        self._next_history = 0.0
        self._reset_window()
        self._unlisten = session.events.subscribe(self._on_event)
        #: Step time and throughput of running loops, as ``steps`` events (views chart them).
        self._step_rate = StepRate(session)
        #: Wall seconds the last sample took; CPU seconds of all samples so far (the hub's own cost).
        self.last_sample_s = 0.0
        self.sample_cpu_s = 0.0

    # -- configuration --------------------------------------------------------
    def configure(
        self, sample_hz: float | None = None, publish_hz: float | None = None, window_s: float | None = None
    ) -> None:
        """Change rates; applies from the next sample."""
        with self._lock:
            if sample_hz is not None:
                if not 0 < sample_hz <= 100:
                    raise PathwaysError(f"sample rate must be within (0, 100] Hz, got {sample_hz}")
                self.sample_hz = float(sample_hz)
            if publish_hz is not None:
                if not 0 <= publish_hz <= 100:
                    raise PathwaysError(f"publish rate must be within [0, 100] Hz, got {publish_hz}")
                self.publish_hz = float(publish_hz)
            if window_s is not None:
                if window_s <= 0:
                    raise PathwaysError(f"utilization window must be > 0 s, got {window_s}")
                self.window_s = float(window_s)
            self._reset_window()
            self._wake.notify_all()

    @property
    def source(self) -> MetricsSource:
        return self._source

    def use_source(self, source: MetricsSource) -> None:
        """Sample through ``source`` from the next sample on; the previous source is closed."""
        with self._lock:
            previous, self._source = self._source, source
            self._reset_window()
        previous.close()

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def topology_seq(self) -> int:
        return self._topology_seq

    def latest(self) -> Metrics | None:
        """The last published metrics, or ``None`` before the first sample."""
        return self._latest

    def history(self) -> History | None:
        """The metrics history of the current layout, or ``None`` before the first sample."""
        return self._history

    # -- subscriptions --------------------------------------------------------
    def subscribe(
        self,
        on_metrics: Callable[[Metrics], None] | None = None,
        on_event: Callable[[Event], None] | None = None,
        on_topology: Callable[[Topology, int], None] | None = None,
        on_close: Callable[[], None] | None = None,
        rate: float | None = None,
    ) -> Subscription:
        """Receive metrics at ``rate`` Hz (default: the hub's publish rate), events and topology changes."""
        sub = Subscription(self, self.publish_hz if rate is None else rate, on_metrics, on_event, on_topology, on_close)
        with self._lock:
            if self._closed:
                raise RuntimeError("the telemetry hub is closed (the session was replaced)")
            self._subs.append(sub)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pathways-telemetry", daemon=True)
                self._thread.start()
                self._exit_stop.arm()
            self._wake.notify_all()
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            sub.closed = True
            if sub in self._subs:
                self._subs.remove(sub)

    def recent_step_events(self) -> list[Event]:
        """The newest ``steps`` events (``step_rate.StepRate.recent``), oldest first: a new view's catch-up."""
        return list(self._step_rate.recent)

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def close(self) -> None:
        """Stop the thread and tell every subscription (the session is going away)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            subs, self._subs = self._subs, []
            self._wake.notify_all()
        self._unlisten()
        for sub in subs:
            sub.closed = True
            if sub.on_close:
                _call(sub.on_close)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self._source.close()
        self._exit_stop.disarm()

    # -- the thread -----------------------------------------------------------
    def _on_event(self, event: Event) -> None:
        # Called on the emitting thread: only queue and wake.
        with self._lock:
            self._events.append(event)
            self._wake.notify_all()

    def _reset_window(self) -> None:
        n = self._layout.chips
        self._window = np.zeros((max(1, round(self.window_s * self.sample_hz)), n), np.float32)
        self._window_sum = np.zeros(n, np.float64)
        self._window_pos = 0
        self._window_filled = 0

    def _run(self) -> None:
        next_sample = time.monotonic()
        while True:
            with self._lock:
                # With no subscriber, sample once a second for the history only.
                while not self._closed and not self._events and time.monotonic() < next_sample:
                    self._wake.wait(max(0.0, next_sample - time.monotonic()))
                if self._closed:
                    return
                events = list(self._events)
                self._events.clear()
                subs = list(self._subs)
            self._deliver_events(events, subs)
            now = time.monotonic()
            if now >= next_sample:
                started, cpu_started = time.perf_counter(), time.thread_time()
                try:
                    metrics = self._sample()
                except Exception:
                    # E.g. the backend being torn down under us by a connect: skip this sample.
                    _log().warning("telemetry sample failed", exc_info=True)
                    next_sample = now + 1.0
                    _call(self._step_rate.poll)  # a loop's step rate is the ledger's, not the chips'
                    continue
                self.last_sample_s = time.perf_counter() - started
                cpu = time.thread_time() - cpu_started
                self.sample_cpu_s += cpu
                period = 1.0 / self.sample_hz if subs else 1.0
                # Backs off by what a sample costs the process (CPU), not by its wall time: a chip
                # service's answer waited for on a loaded machine (280 ms at load 18) costs nothing.
                next_sample = now + max(period, cpu / MAX_DUTY)
                self._record(metrics, now)
                _call(self._step_rate.poll)
                now = time.monotonic()
                for sub in subs:
                    rate = sub.effective_rate
                    if sub.on_metrics is None or rate <= 0 or now < sub.next_due:
                        continue
                    # Slack of half a sample period so 2 Hz on 4 Hz samples is every other one.
                    sub.next_due = max(sub.next_due + 1.0 / rate, now + 1.0 / rate - 0.5 * period)
                    _call(sub.on_metrics, metrics)

    def _record(self, metrics: Metrics, now: float) -> None:
        """Add ``metrics`` to the history at the publish rate (a new history for a new chip count)."""
        if now < self._next_history:
            return
        self._next_history = now + 1.0 / max(self.publish_hz, 1.0) - 0.5 / self.sample_hz
        history = self._history
        if history is None or history.chips != len(metrics.utilization) or history.slices != len(metrics.slices):
            history = self._history = History(
                len(metrics.slices),
                len(metrics.utilization),
                self.publish_hz,
                int(np.max(metrics.memory)) if len(metrics.memory) else 0,
            )
        history.record(metrics)

    def _deliver_events(self, events: list[Event], subs: list[Subscription]) -> None:
        # The topology message carries the target, which can change with no event (a Slurm job's time left).
        target = self.session.backend.target
        if target != self._target or any(e.kind in ("slice_up", "slice_down") for e in events):
            with self._lock:
                self._target = target
                self._layout = Layout.of(self.session.topology)
                self._topology_seq += 1
                topology, seq = self._layout.topology, self._topology_seq
            for sub in subs:
                if sub.on_topology:
                    _call(sub.on_topology, topology, seq)
        for event in events:
            for sub in subs:
                if sub.on_event:
                    _call(sub.on_event, event)

    def _sample(self) -> Metrics:
        layout = self._layout
        sample = self._source.sample(layout)
        with self._lock:
            if self._window.shape[1] != layout.chips:
                self._reset_window()
            if sample.window_s is None:
                row = self._window[self._window_pos]
                self._window_sum += sample.busy - row
                row[:] = sample.busy
                self._window_pos = (self._window_pos + 1) % len(self._window)
                self._window_filled = min(self._window_filled + 1, len(self._window))
                utilization = (self._window_sum / self._window_filled).astype(np.float32)
                window = self._window_filled / self.sample_hz
            else:  # a duty cycle the source measured: shown as it is
                utilization, window = sample.busy, sample.window_s
            self._seq += 1
            seq, topology_seq = self._seq, self._topology_seq
        memory = sample.memory if sample.memory is not None else np.zeros(layout.chips, np.int64)
        metrics = aggregate(
            layout,
            topology_seq,
            seq,
            self._source.name,
            window,
            np.clip(utilization, 0, 1),
            memory,
            sample.memory_limit,
        )
        self._latest = metrics
        return metrics


def _call(fn: Callable[..., object], *args: object) -> None:
    # One consumer's bug must not stop the hub for the others.
    try:
        fn(*args)
    except Exception:
        _log().exception("telemetry subscriber failed")


def _log() -> logging.Logger:
    return logging.getLogger("pathways_kernel.monitoring.telemetry")


def _source_for(backend: Backend) -> MetricsSource:
    metrics = backend.chip_metrics()
    if metrics is not None:
        return ChipSource(backend, metrics)
    return ClientSource(backend.is_leftover)


def hub(session: Session | None = None) -> TelemetryHub:
    """The session's telemetry hub (created on first use, closed with the session)."""
    if session is None:
        session = current()

    def make(s: Session) -> TelemetryHub:
        h = TelemetryHub(s)
        s.on_close(h.close)
        return h

    return session.component(TelemetryHub, make)


def configure(
    sample_hz: float | None = None, publish_hz: float | None = None, window_s: float | None = None
) -> TelemetryHub:
    """Set the session hub's sampling rate, default publish rate and utilization window."""
    h = hub()
    h.configure(sample_hz, publish_hz, window_s)
    return h
