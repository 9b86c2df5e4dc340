"""Every value ``pw.log`` records, and the loss an elastic run finds in its state, kept per run and step.

    for batch in pw.steps(batches, name="train"):
        state, loss = update(state, batch)
        pw.log(loss=loss)                      # a device scalar: read once computed
    pw.metrics("train")                        # run, step, time, elapsed_s, loss

A value may be a device array still being computed: ``pw.log`` only queues
it. One reader thread per session starts its copy to the host
(``copy_to_host_async``) and takes it once ``is_ready()``, in the order
logged, so the loop never waits for it. Steps are dispatched ahead of the
devices, so the newest value logged is seldom computed yet: views show the
newest one that is (``latest``). ``flush()`` (``pw.metrics()``, a run's
summary) waits for the rest.

Points go to the session's ``MetricLog`` (the newest ``MAX_POINTS``) and, as
batches, to its listeners: the session log's ``metrics.jsonl`` (``core/sessionlog.py``),
the TensorBoard writer, and the monitor (each point's ``to_dict()``: run, step,
time, elapsed_s, name, value, cell, earlier). A restarted kernel reads the
earlier kernels' points back from that file (``earlier``: True) before any of
its own, and numbers its runs after theirs.
"""

from __future__ import annotations

import collections
import dataclasses
import numbers
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pathways_kernel.core import sessionlog
from pathways_kernel.core.sessions import session as current_session
from pathways_kernel.core.subscribers import Subscribers
from pathways_kernel.core.threads import ExitStop
from pathways_kernel.training.run_events import StepFollower

if TYPE_CHECKING:
    from pathways_kernel.core.sessions import Session

#: Points one session keeps (the oldest drop off).
MAX_POINTS = 200_000
#: The session log's file of points (``core/sessionlog.py``), read back after a kernel restart.
FILE = "metrics.jsonl"
#: Seconds between the reader's looks at values still being computed.
POLL_S = 0.1
#: The reader thread ends after this long with nothing to read (the next value starts it again).
IDLE_S = 30.0

_NOT_YET = object()


@dataclasses.dataclass(frozen=True)
class Point:
    """One metric value of one step of one run."""

    seq: int
    run: str  # the run's name and its number among the session's runs of that name: "train #2"
    step: int
    time: float  # wall clock (time.time()) when it was logged
    elapsed_s: float  # since the run started
    name: str
    value: float
    cell: int | None = None  # the notebook cell (``In [n]``) the run started in, if any
    earlier: bool = False  # logged by an earlier kernel of this session (read back after a restart)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Pending:
    run: str
    step: int
    time: float
    elapsed_s: float
    name: str
    value: Any
    account: Any
    copying: bool = False


class MetricLog:
    """One session's metric points (a session component: ``metric_log()``)."""

    def __init__(self, session: Session | None = None):
        self._points: collections.deque[Point] = collections.deque(maxlen=MAX_POINTS)
        self._pending: collections.deque[_Pending] = collections.deque()
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # one reader at a time keeps each run's points in order
        self._work = threading.Event()
        self._thread: threading.Thread | None = None
        # The reader reads arrays in jaxlib: stopped at exit while it runs.
        self._exit_stop = ExitStop(self, MetricLog.close)
        self._seq = 0
        self._labels: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._runs_named: collections.Counter[str] = collections.Counter()
        self._latest: weakref.WeakKeyDictionary[Any, dict[str, float]] = weakref.WeakKeyDictionary()
        self._subscribers: Subscribers[list[Point]] = Subscribers()
        self._closed = False
        #: Why some of the earlier kernels' points could not be read back, in one line ("" if none).
        self.reload_note = ""
        self._file = sessionlog.session_file(FILE) if session is not None else None
        if self._file is not None:
            self._reload(self._file)
            self._subscribers.subscribe(self._keep)

    # -- the session's file (kept across a kernel restart) --------------------
    def _reload(self, file: sessionlog.JsonLines) -> None:
        """The points earlier kernels of this session logged, before any of this one's;
        this kernel's runs are numbered after theirs ("train #3" after their "train #2")."""
        records, self.reload_note = file.read()
        points = []
        for r in records[-MAX_POINTS:]:
            name, _, number = str(r.get("run")).rpartition(" #")
            if number.isdigit():  # this kernel's earlier sessions (a reconnect) number runs too
                self._runs_named[name] = max(self._runs_named[name], int(number))
            if not sessionlog.earlier(r):
                continue
            try:
                cell = r.get("cell")
                fields = (str(r["run"]), int(r["step"]), float(r["time"]), float(r["elapsed_s"]), str(r["name"]))
                value, cell = float(r["value"]), int(cell) if cell is not None else None
            except (KeyError, TypeError, ValueError):
                continue
            self._seq += 1
            points.append(Point(self._seq, *fields, value, cell, earlier=True))
        self._points.extend(points)
        if self.reload_note:
            print(self.reload_note, file=sys.stderr)

    def _keep(self, points: list[Point]) -> None:
        file = self._file
        if file is not None:
            file.append({k: v for k, v in p.__dict__.items() if k not in ("seq", "earlier")} for p in points)

    # -- recording (on the run's thread: queue and return) --------------------
    def log(self, account: Any, metrics: Mapping[str, Any]) -> None:
        """Queue ``metrics`` as the values of ``account``'s current step."""
        step = account._open_step if account._open_step is not None else account.first_step + account.steps
        now, elapsed = time.time(), account.wall_s
        run = self._label(account)
        for name, value in metrics.items():
            self._pending.append(_Pending(run, step, now, elapsed, name, value, account))
        self._wake()

    def step_output(self, account: Any, step: int, output: Any) -> None:
        """An elastic step's output: its ``loss``, unless the run gives one to ``pw.log``."""
        if "loss" in account.metrics:
            return
        loss = loss_of(output)
        if loss is not None:
            self._pending.append(
                _Pending(self._label(account), step, time.time(), account.wall_s, "loss", loss, account)
            )
            self._wake()

    def _label(self, account: Any) -> str:
        label = self._labels.get(account)
        if label is None:
            with self._lock:
                label = self._labels.get(account)
                if label is None:
                    self._runs_named[account.name] += 1
                    label = self._labels[account] = f"{account.name} #{self._runs_named[account.name]}"
        return label

    def _wake(self) -> None:
        if not self._work.is_set():
            self._work.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(target=self._run, name="pathways-metrics", daemon=True)
                    self._exit_stop.arm()
                    self._thread.start()

    # -- reading (the reader thread, or a flush) ------------------------------
    def _run(self) -> None:
        while True:
            if not self._work.wait(IDLE_S) or self._closed:
                with self._lock:
                    if not self._pending or self._closed:
                        self._thread = None
                        self._exit_stop.disarm()
                        return
                continue
            self._read(wait=False)
            if not self._pending:
                self._work.clear()
                if self._pending or self._closed:  # queued, or closed, between the check and the clear
                    self._work.set()
                continue
            time.sleep(POLL_S)

    def close(self) -> None:
        """Stop the reader thread (values still queued stay unread)."""
        self._closed = True
        self._work.set()
        if self._file is not None:
            self._file.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._exit_stop.disarm()

    def flush(self) -> None:
        """Read every value queued so far, waiting for those still being computed."""
        self._read(wait=True)

    def _read(self, wait: bool) -> None:
        points: list[Point] = []
        accounts: list[Any] = []
        with self._reading:
            while self._pending:
                item = self._pending[0]
                value = _read(item.value, wait)
                if value is _NOT_YET:
                    # The devices are behind: start the host copies of what is queued,
                    # so that each value is on the host when it is computed.
                    for queued in list(self._pending):
                        if not queued.copying:
                            queued.copying = True
                            _copy_to_host(queued.value)
                    break
                self._pending.popleft()
                if value is not None:
                    self._seq += 1  # only readers (under _reading) number points
                    accounts.append(item.account)
                    points.append(
                        Point(
                            self._seq,
                            item.run,
                            item.step,
                            item.time,
                            item.elapsed_s,
                            item.name,
                            value,
                            getattr(item.account, "cell", None),
                        )
                    )
            with self._lock:
                self._points.extend(points)
                for point, account in zip(points, accounts, strict=True):
                    self._latest.setdefault(account, {})[point.name] = point.value
        if points:
            for listener in self._subscribers.listeners():
                try:
                    listener(points)
                except Exception:  # a listener must not stop the reading
                    import logging

                    logging.getLogger(__name__).exception("metric listener failed")

    # -- views ----------------------------------------------------------------
    def latest(self, account: Any) -> dict[str, float]:
        """The newest computed value of each of ``account``'s metrics, in the order first logged."""
        with self._lock:
            return dict(self._latest.get(account, {}))

    def points(self, run: str | None = None) -> list[Point]:
        """The points kept, oldest first; ``run``: a label ("train #2") or a name (its every run)."""
        with self._lock:
            points = list(self._points)
        if run is None:
            return points
        return [p for p in points if p.run == run or p.run.rsplit(" #", 1)[0] == run]

    def runs(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(p.run for p in self._points))

    def subscribe(self, listener: Callable[[list[Point]], None]) -> Callable[[], None]:
        """Call ``listener(points)`` with each batch of new points (on the reader's thread; never block)."""
        return self._subscribers.subscribe(listener)


class LossFollower(StepFollower):
    """The session's metric log following a run's step events: the loss in each step's output."""

    def __init__(self, log: MetricLog, account: Any):
        self.log, self.account = log, account

    def step_end(self, step: int, output: Any) -> None:
        self.log.step_output(self.account, step, output)


def metric_log(session: Session | None = None) -> MetricLog:
    """The session's metric log."""
    return (session or current_session()).component(MetricLog)


def loss_of(output: Any) -> Any:
    """A value named ``loss`` in a step's output, at its top or one level down
    (the state of ``%%pathways elastic`` is a dict of the ``--state`` variables)."""
    found = _named(output, "loss")
    if found is None and isinstance(output, Mapping):
        for value in output.values():
            found = _named(value, "loss")
            if found is not None:
                break
    return found


def _named(value: Any, name: str) -> Any:
    if value is None:
        return None
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


def _copy_to_host(value: Any) -> None:
    try:
        if getattr(value, "size", None) == 1 and hasattr(value, "copy_to_host_async") and not value.is_deleted():
            value.copy_to_host_async()
    except Exception:  # lost or donated: _read drops it
        pass


def _read(value: Any, wait: bool) -> Any:
    """``value`` as a float; ``_NOT_YET`` while a device value is computing
    (unless ``wait``); None for anything that is not a scalar, or is lost."""
    if isinstance(value, numbers.Real):
        return float(value)
    try:
        if getattr(value, "size", None) != 1:
            return None
        if hasattr(value, "is_ready"):
            if value.is_deleted():
                return None
            if not wait and not value.is_ready():
                return _NOT_YET
        return float(value)
    except Exception:  # on a lost slice, or donated: nothing to show
        return None


__all__ = ["MAX_POINTS", "MetricLog", "Point", "loss_of", "metric_log"]
