"""Goodput: where the accelerator time of each run, and of the session, went.

This module is the ledger: a run's ``Account`` and the session's ``Ledger``.
What the thread's run is doing (runs begin, time spent by cause, bare loader
loops, compiles from ``jax.monitoring``, the notebook's cells) is
``accounting.py``; MFU ``mfu.py``; ``pw.goodput()`` and its report
``goodput_report.py``; the ml-goodput-measurement adapter ``goodput_field.py``.

Every ``@pw.elastic`` / ``%%pathways elastic`` run, bare ``pw.loader`` loop
and ``pw.steps(...)`` loop keeps an ``Account``: a ledger that splits the
run's wall time, with nothing counted twice and nothing left out, into
productive step time and badput by cause:

    compile          tracing and compiling on the run's thread (first step, after a reshard)
    data_wait        the loop waited for its next batch
    snapshot_stall   the loop waited on a host snapshot (issuing or finishing its copy)
    checkpoint_save  the blocking part of a checkpoint save
    recovery         loss detected -> training again: mesh rebuild, restore, recompile
    redone           steps computed again after a rollback (and the step the loss cut short)
    slice_wait       no slice was up: waiting for one to come back
    scale_up         moving the live state onto the larger mesh when slices return
    other            the loop's own work between steps (boundary checks, setup)

The ledger always has one current category; entering another closes the
current segment. Work measured inside a segment from elsewhere (a compile
reported by ``jax.monitoring``) is moved out of it, so the figures still add
up to the wall time. A rollback moves the productive time of the steps it
discards into ``redone``.

The session also counts the notebook's own badput: time between cells while
it holds slices (``idle``), kept apart from the training figures.

The attempts of a function pathwaysutils' ``Manager().elastic_retry`` retries
are one run, with the time between them by cause (``goodput_jobs``).

Each run is recorded, too, through ``ml-goodput-measurement``'s
``ElasticGoodputRecorder`` into an in-memory log, and ``Account.field()``
computes the figure MaxText users see with its ``ElasticGoodputCalculator``;
see the README ("Goodput") for where the two models differ.

MFU: ``flops(jitted, *args)`` reads a step's FLOPs from the compiled step's
``cost_analysis()`` and gives them to the run in progress; the peak per chip
comes from ``PEAK_BF16_FLOPS`` for TPUs and, on the embedded backend, from a
matmul measured once on its CPU devices.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import sys
import threading
import time
from array import array
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_kernel.core import runs, sessions
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.training import goodput_timeline
from pathways_kernel.training.goodput_field import FieldLog
from pathways_kernel.training.mfu import peak_flops_per_chip

if TYPE_CHECKING:
    from pathways_kernel.core.eventlog import Event
    from pathways_kernel.core.sessions import Session

PRODUCTIVE = "productive"
OTHER = "other"
BADPUT = (
    "compile",
    "data_wait",
    "snapshot_stall",
    "checkpoint_save",
    "recovery",
    "redone",
    "slice_wait",
    "scale_up",
    OTHER,
)
CATEGORIES = (PRODUCTIVE, *BADPUT)
_INDEX = {category: i for i, category in enumerate(CATEGORIES)}

#: Finished runs a session keeps for pw.goodput() (the session figure is over these).
MAX_RUNS = 100
#: Per-step productive times kept for rollbacks (steps older than this are settled).
MAX_STEPS_KEPT = 100_000

#: The field library's names for our categories, as custom badput events.
_FIELD_CUSTOM = ("data_wait", "snapshot_stall", "checkpoint_save")


# -- the ledger ------------------------------------------------------------------
class Account:
    """The wall time of one run, split into productive time and badput."""

    def __init__(self, name: str, kind: str, session: Session, began: float | None = None):
        self.name = name
        self.kind = kind
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.steps = 0  # steps completed and kept (not redone)
        self.steps_redone = 0
        self.recoveries = 0
        self.flops_per_step: float | None = None
        # For progress views: the step numbers the run goes through (stop unknown
        # for an open-ended loop), whether to show it, the latest pw.log values.
        self.first_step = 0
        self.stop_step: int | None = None
        self.progress = True
        self.metrics: dict[str, Any] = {}
        self.ended = False
        self._session = session
        self._lock = threading.Lock()
        self._state = OTHER
        self._moved: dict[str, float] = {}
        self._recovering = False
        self._between: str | None = None  # why the job's last attempt ended (goodput_jobs)
        self._source: Any = None
        self._output: Any = None
        self._open_step: int | None = None
        self._open_productive = 0.0
        self._done: collections.OrderedDict[int, float] = collections.OrderedDict()
        #: The slices the run may use (``None``: all): its MFU counts their chips only.
        self.slices: frozenset[int] | None = None
        self._chips: int | None = None
        self._chip_seconds = 0.0
        self._unsubscribe = session.events.subscribe(self._on_event)
        self._field = FieldLog(name, session)
        # Goodput over time: the ledger's segments and step starts, appended here and
        # folded only when asked for (goodput_timeline).
        self._log = array("d")  # flat records of four floats (goodput_timeline.fold reads them)
        self._moves: list[goodput_timeline.Move] = []
        self._timeline = goodput_timeline.Timeline(CATEGORIES)
        self._open_began = 0.0
        self.attempts = 1
        self._published: Any = None  # its goodput_intervals message, once it ended
        self.cell = _cell_number()
        # ``began``: when the run started, if before now (the setup until now is the loop's own)
        now = time.perf_counter()
        self._since = self._began = now if began is None else min(began, now)
        self.started = time.time() - (now - self._began)
        self._field.job_start()

    # -- transitions ----------------------------------------------------------
    def _close_segment(self, now: float) -> None:
        """Count ``now - since`` in the current category, less what was moved out of it."""
        segment = now - self._since
        moved = sum(self._moved.values())
        scale = segment / moved if moved > segment else 1.0
        for category, seconds in self._moved.items():
            self.seconds[category] += seconds * scale
            self._log.extend((self._since, now, _INDEX[category], seconds * scale))
        own = segment - moved * scale
        self.seconds[self._state] += own
        self._log.extend((self._since, now, _INDEX[self._state], own))
        if self._state == PRODUCTIVE and self._open_step is not None:
            self._open_productive += own
            self._chip_seconds += own * self.chips()
        self._moved.clear()
        self._since = now

    def _switch(self, category: str, step: int | None = None) -> str:
        """Close the current segment and count from now as ``category``; ``step``: a step starts now."""
        with self._lock:
            previous = self._state
            self._close_segment(time.perf_counter())
            self._state = category
            if step is not None:  # under the lock: a fold elsewhere swaps the log under it
                self._log.extend((self._since, self._since, goodput_timeline.STEP, step))
            return previous

    def enter(self, category: str) -> str:
        """Count the time from now as ``category``; returns the category it leaves."""
        return self._switch(category)

    @contextlib.contextmanager
    def spent(self, category: str) -> Iterator[None]:
        """Count the time inside the block as ``category``."""
        previous = self._switch(category)
        if category in _FIELD_CUSTOM:
            self._field.custom(category, True)
        elif category in ("slice_wait", "scale_up"):
            self._field.elastic_wait(category, True)
        try:
            yield
        finally:
            self._switch(previous)
            if category in _FIELD_CUSTOM:
                self._field.custom(category, False)
            elif category in ("slice_wait", "scale_up"):
                self._field.elastic_wait(category, False)

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """Count the block as productive: the host waits for device work of
        steps already dispatched (steps return before the device is done)."""
        previous = self._switch(PRODUCTIVE)
        started = time.perf_counter()
        try:
            yield
        finally:
            self._switch(previous)
            with self._lock:
                self._add_to_last_step(time.perf_counter() - started)

    def snapshot_source(self, tree: Any) -> None:
        """The loop started a snapshot of ``tree``: waiting for it first waits for
        the device to compute ``tree`` (productive), then for the copy (a stall)."""
        self._source = tree

    @contextlib.contextmanager
    def snapshot_wait(self) -> Iterator[None]:
        source, self._source = self._source, None
        had_source = source is not None
        if had_source:
            import jax

            with self.computing():
                jax.block_until_ready(source)
        # The loop waits on a snapshot with the next step already dispatched: if
        # that step is still computing when the wait ends, the device was busy
        # all along and the wait stalled nothing. (If it is done, when it got
        # done is unknown: all of the wait counts as a stall.)
        started = time.perf_counter()
        stalled = self.seconds["snapshot_stall"]
        with self.spent("snapshot_stall"):
            yield
        waited = time.perf_counter() - started
        stalled = self.seconds["snapshot_stall"] - stalled  # what the wait counted (less a compile moved out)
        if had_source:
            # The copy is done and let go of the source: dropping it here frees the
            # old state's buffers, the steps' own cost (a plain loop pays it when it
            # rebinds its state), not the loop's overhead.
            with self.computing():
                del source
        busy = stalled if had_source and self._output is not None and not _is_ready(self._output) else 0.0
        if busy > 0:
            with self._lock:
                self.seconds["snapshot_stall"] -= busy
                self.seconds[PRODUCTIVE] += busy
                self._add_to_last_step(busy)
                self._move(started, started + waited, "snapshot_stall", PRODUCTIVE, busy)

    # -- steps ----------------------------------------------------------------
    def step_begin(self, step: int) -> None:
        self._credit_overlap()
        self._switch(PRODUCTIVE, step)
        self._open_step, self._open_productive = step, 0.0
        self._open_began = self._since
        self._field.step(step)

    def step_end(self, output: Any = None) -> None:
        """The step is done (dispatched); ``output``, its result, tells later
        waits whether the device is still computing it."""
        # Dropping the previous output may wait for the device to release its
        # buffers: the step's own time, as when the loop itself rebinds it.
        self._output = output
        self._switch(OTHER)
        with self._lock:
            if self._open_step is None:
                return
            self._done[self._open_step] = self._open_productive
            self._done.move_to_end(self._open_step)
            if len(self._done) > MAX_STEPS_KEPT:
                self._done.popitem(last=False)
            self.steps += 1
            self._open_step = None
            self._recovering = False
            if len(self._log) > 4 * goodput_timeline.FOLD_AT:
                self._fold()

    def _credit_overlap(self) -> None:
        """The loop's own work since the last step ended ran while the device was
        still computing that step (steps return once dispatched): if the step is
        still computing now, the device idled for none of it, and the time is
        that step's, as a wait for it at a sync point would be."""
        output = self._output
        if output is None or self._state != OTHER or _is_ready(output):
            return
        with self._lock:
            if self._state != OTHER:
                return
            before = self.seconds[PRODUCTIVE]
            self._state = PRODUCTIVE
            self._close_segment(time.perf_counter())
            self._state = OTHER
            self._add_to_last_step(self.seconds[PRODUCTIVE] - before)

    def _add_to_last_step(self, seconds: float) -> None:
        """Productive time found after the last step ended is that step's (a rollback
        past it moves it to ``redone``); under ``_lock``."""
        if self._done and self._open_step is None:
            self._done[next(reversed(self._done))] += seconds

    # -- losses ---------------------------------------------------------------
    def recovery_begin(self) -> None:
        """A loss was detected: the step it cut short is redone, recovery starts."""
        self._switch("recovery")
        with self._lock:
            if self._open_step is not None:
                self._redo(self._open_productive)
                self._move(self._open_began, self._since, PRODUCTIVE, "redone", self._open_productive)
                self._open_step = None
            self._recovering = True
            self.recoveries += 1
        self._field.reinit(True)

    def recovery_end(self, resumed_at: int) -> None:
        """Recovery done, training resumes at ``resumed_at``: steps from there on are redone.

        Compiles until the first step after it completes still count as recovery.
        """
        self._switch(OTHER)
        with self._lock:
            self._rollback(resumed_at)
        self._field.reinit(False)

    def _rollback(self, resumed_at: int) -> None:
        """Steps from ``resumed_at`` on are computed again: theirs is redone time; under ``_lock``."""
        redone = [s for s in self._done if s >= resumed_at]
        seconds = 0.0
        for step in redone:
            seconds += self._done.pop(step)
            self.steps -= 1
            self.steps_redone += 1
        if redone:
            self._redo(seconds)
            self._move(self._since, self._since, PRODUCTIVE, "redone", seconds, min(redone))

    def _redo(self, seconds: float) -> None:
        self.seconds[PRODUCTIVE] -= seconds
        self.seconds["redone"] += seconds

    # -- attempts of one retried job (goodput_jobs) ----------------------------
    def between_attempts(self, cause: str) -> None:
        """An attempt of the job ended: until the next one's steps begin, the
        time is ``cause``'s (``recovery`` after a slice loss, ``scale_up``)."""
        if cause == "recovery":
            self.recovery_begin()
        else:
            self._switch(cause)
            with self._lock:
                if self._open_step is not None:  # the step the signal cut short did nothing
                    self.seconds[PRODUCTIVE] -= self._open_productive
                    self.seconds[cause] += self._open_productive
                    self._move(self._open_began, self._since, PRODUCTIVE, cause, self._open_productive)
                    self._open_step = None
            self._field.elastic_wait(cause, True)
        self._between = cause

    def next_attempt(self, start: int) -> None:
        """The job's steps go on from ``start``: steps from there on are redone."""
        cause, self._between = self._between, None
        self.attempts += 1
        if cause == "recovery":
            self.recovery_end(start)
            return
        self.step_end(self._output)  # a step a break left open is done
        if cause is not None:
            self._field.elastic_wait(cause, False)
        with self._lock:
            self._rollback(start)

    def loop_left(self) -> None:
        """The job's steps loop was left (a break, an error, its end): the
        loop's own time from here, unless the attempt already ended."""
        if self._between is None:
            self._switch(OTHER)

    def count_earlier(self, category: str, seconds: float) -> None:
        """``seconds`` of the segment in progress were ``category``'s (measured before the ledger began)."""
        with self._lock:
            self._moved[category] = self._moved.get(category, 0.0) + seconds

    # -- chips, for MFU -------------------------------------------------------
    def _on_event(self, event: Event) -> None:
        if event.kind in ("slice_down", "slice_up", "connect"):
            self._chips = None

    def devices(self) -> list[Any]:
        """The live chips the run may use: those of its ``slices`` (all live ones when ``None``)."""
        live = self._session.live_devices()
        if self.slices is None:
            return live
        ids = {d.id for sl in self._session.topology.slices if sl.index in self.slices for d in sl.devices}
        return [d for d in live if d.id in ids]

    def chips(self) -> int:
        """How many chips the run computes on (its MFU's): the live ones of its slices, as of its last step."""
        if self._chips is None:
            self._chips = len(self.devices()) or 1
        return self._chips

    def peak(self) -> tuple[float, str]:
        """Peak FLOP/s of one of the run's chips, and where the figure comes from."""
        return peak_flops_per_chip(self._session, self.devices())

    # -- compiles (jax.monitoring, on this thread) ----------------------------
    def compiled(self, seconds: float) -> None:
        with self._lock:
            if self._state == "slice_wait":
                return  # what a wait for slices compiles (pathwaysutils' health probes, each poll) is the wait
            if self._state == "recovery" or (self._recovering and self._state in (PRODUCTIVE, OTHER)):
                category = "recovery"
            else:
                category = "compile"
            if category != self._state:
                self._moved[category] = self._moved.get(category, 0.0) + seconds

    # -- the end --------------------------------------------------------------
    def end(self) -> Account:
        """Close the ledger, emit a ``goodput`` event; idempotent."""
        if self.ended:
            return self
        self.step_end(self._output)  # the last step's output, for the goodput event's listeners (its loss)
        with self._lock:
            self._close_segment(time.perf_counter())
            self.ended = True
            self._ended_at = self._since
            self._fold()
        self._unsubscribe()
        stack = runs.stack()
        if self in stack:
            stack.remove(self)
        self._field.job_end()
        ledger(self._session).finished(self)
        self._session.events.emit("goodput", duration_s=self.wall_s, step=self.steps, detail=self.summary())
        self._output = None  # an ended run (the ledger keeps 100) holds no device buffers
        return self

    # -- figures --------------------------------------------------------------
    def snapshot(self) -> dict[str, float]:
        """Seconds per category, up to now for a run in progress."""
        with self._lock:
            seconds = dict(self.seconds)
            if not self.ended:
                seconds[self._state] += time.perf_counter() - self._since
            return seconds

    @property
    def wall_s(self) -> float:
        return (self._ended_at if self.ended else time.perf_counter()) - self._began

    @property
    def goodput(self) -> float:
        wall = self.wall_s
        return self.snapshot()[PRODUCTIVE] / wall if wall > 0 else 0.0

    def mfu(self) -> float | None:
        """Model FLOPs utilization over the productive step time, or None without ``flops``."""
        if not self.flops_per_step or self._chip_seconds <= 0:
            return None
        peak, _how = self.peak()
        return self.flops_per_step * self.steps / (self._chip_seconds * peak)

    def field(self) -> dict[str, Any]:
        """Goodput and badput as ``ml-goodput-measurement`` computes them from this run's log."""
        return self._field.compute()

    # -- over time (goodput_timeline), computed when asked --------------------
    def _fold(self) -> None:
        """Fold the log into the timeline; under ``_lock``."""
        log, self._log = self._log, array("d")
        moves, self._moves = self._moves, []
        self._timeline.fold(log, moves, self._began)

    def _move(
        self, t0: float, t1: float, source: str, target: str, seconds: float, from_step: int | None = None
    ) -> None:
        """``seconds`` of ``source`` spent in ``[t0, t1]`` (from ``from_step``'s start if given)
        are ``target``'s after all: a correction the timeline makes when folded; under ``_lock``."""
        self._log.extend((t0, t1, goodput_timeline.MOVE, len(self._moves)))
        self._moves.append((source, target, seconds, from_step))

    def over_time(self, intervals: int | None = None, window_s: float | None = None) -> Any:
        """The run split into ``intervals`` equal intervals (default 20) or windows of
        ``window_s`` seconds: a pandas DataFrame, one row per interval."""
        import pandas as pd

        with self._lock:
            self._fold()
            wall = (self._ended_at if self.ended else time.perf_counter()) - self._began
            open_segment = None
            if not self.ended:
                now = self._began + wall
                open_segment = (self._since - self._began, wall, self._state, now - self._since)
        edges = goodput_timeline.edges_for(wall, intervals, window_s, self.name)
        seconds = self._timeline.intervals(wall, edges, open_segment)
        step, start, step_s = self._timeline.steps()
        frame = pd.DataFrame({"start_s": edges[:-1], "end_s": edges[1:]})
        spans = np.diff(edges)
        frame["goodput"] = np.divide(seconds[:, 0], spans, out=np.zeros(len(spans)), where=spans > 0)
        for i, category in enumerate(CATEGORIES):
            frame[category] = seconds[:, i]
        which = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, len(spans) - 1)
        frame["steps"] = np.bincount(which, minlength=len(spans)) if len(step_s) else 0
        means, stds = np.full(len(spans), np.nan), np.full(len(spans), np.nan)
        for i in range(len(spans)):
            times = step_s[which == i]
            if len(times):
                means[i], stds[i] = times.mean(), times.std()
        frame["step_time_mean_s"], frame["step_time_std_s"] = means, stds
        frame.attrs.update(
            run=self.name,
            kind=self.kind,
            header=self.header(),
            step_time=goodput_timeline.step_time_stats(step, step_s),
        )
        return frame

    def step_times(self) -> dict[str, Any]:
        """Median, mean, standard deviation and slowest of the run's step times."""
        with self._lock:
            self._fold()
        return goodput_timeline.step_time_stats(*self._timeline.steps()[::2])

    def header(self) -> str:
        """What the run is: its name, kind, cell, attempts and wall-clock span."""
        begin = datetime.datetime.fromtimestamp(self.started, datetime.UTC)
        end = datetime.datetime.fromtimestamp(self.started + self.wall_s, datetime.UTC)
        cell = f"cell [{self.cell}]" if self.cell is not None else "outside a cell"
        attempts = f"{self.attempts} attempt" + ("s" if self.attempts != 1 else "")
        status = "" if self.ended else ", running"
        span = f"{begin:%H:%M:%S.%f}"[:-3] + "-" + f"{end:%H:%M:%S.%f}"[:-3]
        return f"run '{self.name}' ({self.kind}, {cell}, {attempts}, {span} UTC, {self.wall_s:.1f} s{status})"

    def summary(self) -> str:
        seconds = self.snapshot()
        wall = self.wall_s or 1.0
        worst = sorted(((v, k) for k, v in seconds.items() if k != PRODUCTIVE and v > 0.0005 * wall), reverse=True)
        parts = ", ".join(f"{k} {100 * v / wall:.1f}%" for v, k in worst[:4])
        return (
            f"{self.kind} '{self.name}': goodput {100 * seconds[PRODUCTIVE] / wall:.1f}% of {wall:.1f} s, "
            f"{self.steps} steps"
            + (f" ({self.steps_redone} redone)" if self.steps_redone else "")
            + (f"; badput {parts}" if parts else "")
        )


def _cell_number() -> int | None:
    """The IPython cell (``In [n]``) running now, if any."""
    ipython = sys.modules.get("IPython")  # never imported for this: outside a notebook there is no cell
    if ipython is None:
        return None
    shell = ipython.get_ipython()
    count = getattr(shell, "execution_count", None)
    # IPython counts the cell before running it: In [n] runs with execution_count n + 1
    # (ipykernel's execute reply says ``shell.execution_count - 1`` for the same reason).
    return count - 1 if isinstance(count, int) else None


def _is_ready(tree: Any) -> bool:
    import jax

    try:
        # is_ready is on JAX's array implementation, not declared on the jax.Array interface.
        return all(leaf.is_ready() for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array))  # type: ignore[attr-defined]
    except Exception:  # an array on a lost slice: nothing left to compute
        return True


# -- the session's ledger -------------------------------------------------------
class Ledger:
    """Runs of one session, and the notebook's idle time between cells."""

    def __init__(self, session: Session):
        self._session = session
        self._lock = threading.Lock()
        self.active: list[Account] = []
        self.runs: collections.deque[Account] = collections.deque(maxlen=MAX_RUNS)
        self.idle_s = 0.0
        self.since = time.perf_counter()
        self._idle_since: float | None = None

    def started(self, account: Account) -> None:
        with self._lock:
            self.active.append(account)

    def finished(self, account: Account) -> None:
        with self._lock:
            if account in self.active:
                self.active.remove(account)
            self.runs.append(account)

    # -- between cells (IPython pre_run_cell / post_run_cell) ---------------------
    def cell_started(self, *_args: Any) -> None:
        now = time.perf_counter()
        with self._lock:
            try:
                live = self._idle_since is not None and self._session.live_devices()
            except PathwaysError:  # e.g. devices changed behind the session: pw calls say so in one line
                live = False
            if live and self._idle_since is not None:
                self.idle_s += now - self._idle_since
            self._idle_since = None

    def cell_finished(self, *_args: Any) -> None:
        with self._lock:
            self._idle_since = time.perf_counter()

    def idle_now_s(self) -> float:
        with self._lock:
            extra = time.perf_counter() - self._idle_since if self._idle_since is not None else 0.0
            return self.idle_s + extra

    def find(self, name: str) -> Account | None:
        with self._lock:
            for account in [*self.active[::-1], *reversed(self.runs)]:
                if account.name == name:
                    return account
        return None


def ledger(session: Session | None = None) -> Ledger:
    return (session or sessions.session()).component(Ledger)
