"""Goodput over time: a run's ledger split into fixed windows, and its step times.

The run's thread only appends to a log (``Account._log``): each closed ledger
segment ``(t0, t1, category, seconds)``, each step start ``(t, step)``, and
the rare corrections the ledger makes after the fact (a rollback's steps
become ``redone``, a snapshot wait the device did not notice becomes
productive) as ``("move", ...)``. Everything else happens when someone asks
(``pw.goodput_over_time``, ``%pathways goodput --over-time``, the end of a
run for the monitor): the log is folded into ``TIMELINE_BUCKETS`` buckets of
seconds per category (a long run doubles the bucket width and merges
neighbours, so memory stays bounded) and the buckets into the intervals
asked for. Inside a bucket time is taken as spread evenly, so interval
figures are exact to one bucket's width, and the intervals always add up to
the ledger's totals.

Step time is the library's (``ml-goodput-measurement``'s ``_get_step_times``):
from one step's start to the next one's, for consecutive step numbers.
"""

from __future__ import annotations

import html
import math
import threading
from array import array
from typing import Any, TypeAlias

import numpy as np

from pathways_kernel.core.errors import PathwaysError

#: A correction the ledger makes after the fact: ``(source, target, seconds, from_step)``.
Move: TypeAlias = tuple[str, str, float, int | None]
#: The ledger's segment still open: ``(t0, t1, category, seconds)``.
Segment: TypeAlias = tuple[float, float, str, float]

#: Buckets a run's timeline keeps (seconds per category each); a longer run widens them.
TIMELINE_BUCKETS = 1024
#: Width of a bucket when the run starts (seconds).
FIRST_WIDTH_S = 0.001
#: Most intervals one request may split a run into.
MAX_INTERVALS = 1000
#: Steps whose times a run keeps (the newest).
MAX_STEP_TIMES = 100_000
#: Unfolded log entries after which the run's own thread folds them (bounds memory).
FOLD_AT = 50_000
#: Slowest steps the report names.
SLOWEST = 3
#: What a log record is when it is no segment: a step start, a correction.
STEP = -1.0
MOVE = -2.0


class Timeline:
    """Seconds per category in buckets from the run's start, and the run's step times."""

    def __init__(self, categories: tuple[str, ...]):
        self.categories = categories
        self._index = {c: i for i, c in enumerate(categories)}
        self.width = FIRST_WIDTH_S
        self.buckets = np.zeros((0, len(categories)))
        self.step = array("q")
        self.step_start = array("d")
        self.step_s = array("d")
        self._last: tuple[int, float] | None = None
        self._lock = threading.Lock()

    # -- folding the run's log -------------------------------------------------------
    def fold(self, log: array[float], moves: list[Move], began: float) -> None:
        """Fold the run's log: records of four floats ``(t0, t1, what, value)`` (perf_counter
        times; ``began`` is the run's time 0): a segment (``what`` its category's index,
        ``value`` its seconds), a step start (``STEP``, the step) or a correction (``MOVE``,
        its index in ``moves``: ``(source, target, seconds, from_step)``), in order."""
        if not log:
            return
        records = np.frombuffer(log, dtype=np.float64).reshape(-1, 4)
        what = records[:, 2]
        with self._lock:
            marks = records[what == STEP]
            self._steps(marks[:, 0] - began, marks[:, 3].astype(np.int64))
            at = 0
            # Segments up to each correction, then the correction: the order they happened in.
            for i in [*np.flatnonzero(what == MOVE), len(records)]:
                chunk = records[at:i]
                chunk = chunk[chunk[:, 2] >= 0]
                if len(chunk):
                    self._add_many(chunk[:, 0] - began, chunk[:, 1] - began, chunk[:, 2].astype(np.intp), chunk[:, 3])
                if i < len(records):
                    t0, t1, _, index = records[i]
                    source, target, seconds, from_step = moves[int(index)]
                    if from_step is not None:
                        t0 = self._start_of(from_step, t1 - began) + began
                    self._move(t0 - began, t1 - began, source, target, seconds)
                at = i + 1

    def _add_many(self, t0: np.ndarray, t1: np.ndarray, cat: np.ndarray, seconds: np.ndarray) -> None:
        """Spread each segment's seconds evenly over ``[t0, t1]``'s buckets."""
        t0 = np.maximum(t0, 0.0)
        t1 = np.maximum(t1, t0)
        self._grow(int(t1.max() / self.width))
        w = self.width
        first = (t0 / w).astype(np.intp)
        last = (t1 / w).astype(np.intp)
        buckets = self.buckets
        one = first == last
        np.add.at(buckets, (last[one], cat[one]), seconds[one])
        many = ~one
        if not many.any():
            return
        t0, t1, cat, seconds, first, last = t0[many], t1[many], cat[many], seconds[many], first[many], last[many]
        rate = seconds / (t1 - t0)
        np.add.at(buckets, (first, cat), rate * ((first + 1) * w - t0))
        np.add.at(buckets, (last, cat), rate * (t1 - last * w))
        # Whole buckets between: a difference array over buckets, summed per category.
        inner = last - first > 1
        if inner.any():
            diff = np.zeros((len(buckets) + 1, buckets.shape[1]))
            np.add.at(diff, (first[inner] + 1, cat[inner]), rate[inner] * w)
            np.add.at(diff, (last[inner], cat[inner]), -rate[inner] * w)
            buckets += np.cumsum(diff, axis=0)[:-1]

    def _grow(self, last: int) -> int:
        """Buckets up to index ``last`` exist (widening first if needed); returns ``last`` in the final width."""
        while last >= TIMELINE_BUCKETS:
            n = len(self.buckets)
            if n % 2:
                self.buckets = np.vstack([self.buckets, np.zeros((1, len(self.categories)))])
            self.buckets = self.buckets.reshape(-1, 2, len(self.categories)).sum(axis=1)
            self.width *= 2
            last //= 2
        if last >= len(self.buckets):
            grow = max(last + 1, min(TIMELINE_BUCKETS, 2 * len(self.buckets) + 16)) - len(self.buckets)
            self.buckets = np.vstack([self.buckets, np.zeros((grow, len(self.categories)))])
        return last

    def _span(self, t0: float, t1: float) -> tuple[int, int]:
        t0 = max(t0, 0.0)
        t1 = max(t1, t0)
        self._grow(int(t1 / self.width))
        return int(t0 / self.width), int(t1 / self.width)

    def _weights(self, t0: float, t1: float) -> tuple[int, np.ndarray]:
        first, last = self._span(t0, t1)
        if first == last or t1 <= t0:
            return last, np.ones(1)
        edges = np.arange(first, last + 2) * self.width
        overlap = np.minimum(edges[1:], t1) - np.maximum(edges[:-1], t0)
        overlap = np.clip(overlap, 0.0, None)
        total = overlap.sum()
        return first, overlap / total if total > 0 else np.full(len(overlap), 1.0 / len(overlap))

    def _add(self, t0: float, t1: float, category: str, seconds: float) -> None:
        if seconds == 0.0:
            return
        last = int(t1 / self.width) if t1 > 0 else 0
        if last < len(self.buckets) and (int(t0 / self.width) if t0 > 0 else 0) == last:
            self.buckets[last, self._index[category]] += seconds  # most segments: inside one bucket
            return
        first, weights = self._weights(t0, t1)
        self.buckets[first : first + len(weights), self._index[category]] += seconds * weights

    def _move(self, t0: float, t1: float, source: str, target: str, seconds: float) -> None:
        """``seconds`` of ``source`` spent in ``[t0, t1]`` were ``target``'s, in proportion to where they lie.

        What the window lacks (the ledger's clock read a little outside it, a compile
        reported late moved some out) lay just before it: taken from the nearest earlier
        buckets first, so no bucket goes negative and the intervals add up to the ledger.
        """
        if seconds <= 0.0:
            return
        first, last = self._span(t0, t1)
        src, dst = self._index[source], self._index[target]
        rows = self.buckets[first : last + 1]
        available = max(rows[:, src].sum(), 0.0)
        if available > 0.0:
            moved = np.clip(rows[:, src], 0.0, None) * min(1.0, seconds / available)
            rows[:, src] -= moved
            rows[:, dst] += moved
            seconds -= moved.sum()
        if seconds > 1e-12 and first > 0:
            earlier = np.clip(self.buckets[:first, src][::-1], 0.0, None)
            take = np.minimum(earlier, np.clip(seconds - (np.cumsum(earlier) - earlier), 0.0, None))[::-1]
            self.buckets[:first, src] -= take
            self.buckets[:first, dst] += take
            seconds -= take.sum()
        if seconds > 1e-12:  # nothing of it left anywhere (a correction of a correction): keep the totals right
            rows[-1, src] -= seconds
            rows[-1, dst] += seconds

    def _steps(self, t: np.ndarray, step: np.ndarray) -> None:
        """Step starts, in order: a step's time runs to the next one's start when that is step + 1."""
        if not len(t):
            return
        if self._last is not None:
            t = np.concatenate([[self._last[1]], t])
            step = np.concatenate([[self._last[0]], step])
        self._last = (int(step[-1]), float(t[-1]))
        follows = np.flatnonzero(step[1:] == step[:-1] + 1)
        self.step.extend(step[follows].tolist())
        self.step_start.extend(t[follows].tolist())
        self.step_s.extend((t[follows + 1] - t[follows]).tolist())
        if len(self.step) > MAX_STEP_TIMES:
            keep = MAX_STEP_TIMES // 2
            self.step, self.step_start, self.step_s = self.step[-keep:], self.step_start[-keep:], self.step_s[-keep:]

    def _start_of(self, step: int, before: float) -> float:
        """When ``step`` last started before ``before`` (run time), from the step times kept."""
        if self._last is not None and self._last[0] == step and self._last[1] <= before:
            return self._last[1]
        for i in range(len(self.step) - 1, -1, -1):
            if self.step[i] == step and self.step_start[i] <= before:
                return self.step_start[i]
        return before

    # -- figures -------------------------------------------------------------------
    def intervals(self, wall_s: float, edges: np.ndarray, open_segment: Segment | None) -> np.ndarray:
        """Seconds per category in each ``[edges[i], edges[i+1])``: rows x categories."""
        with self._lock:
            buckets = self.buckets.copy()
            width = self.width
        if open_segment is not None:
            t0, t1, category, seconds = open_segment
            extra = Timeline(self.categories)
            extra.width = width
            extra.buckets = buckets
            extra._add(t0, t1, category, seconds)
            buckets, width = extra.buckets, extra.width
        starts = np.arange(len(buckets)) * width
        out = np.zeros((len(edges) - 1, len(self.categories)))
        for i in range(len(edges) - 1):
            lo, hi = edges[i], edges[i + 1]
            overlap = np.clip(np.minimum(starts + width, hi) - np.maximum(starts, lo), 0.0, None) / width
            out[i] = overlap @ buckets
        # The last interval takes what lies past the run's end (a bucket's rounding).
        beyond = np.clip(starts + width - max(edges[-1], wall_s), 0.0, None) / width
        out[-1] += beyond @ buckets
        return out

    def steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with self._lock:
            return (
                np.frombuffer(self.step, dtype=np.int64).copy(),
                np.frombuffer(self.step_start, dtype=np.float64).copy(),
                np.frombuffer(self.step_s, dtype=np.float64).copy(),
            )


def step_time_stats(step: np.ndarray, seconds: np.ndarray) -> dict[str, Any]:
    """Median, mean, standard deviation and the slowest steps; ``ideal`` and the
    deviation from it as ``ml-goodput-measurement`` computes them (mean of the
    steps within median + 3 MAD), without its floor of 1 s per step."""
    if len(seconds) == 0:
        return {"steps": 0}
    median = float(np.median(seconds))
    mad = float(np.median(np.abs(seconds - median)))
    normal = seconds[seconds <= median + 3 * mad]
    ideal = float(normal.mean()) if len(normal) else median
    order = np.argsort(seconds)[::-1][:SLOWEST]
    return {
        "steps": int(len(seconds)),
        "median_s": median,
        "mean_s": float(seconds.mean()),
        "std_s": float(seconds.std()),
        "ideal_s": ideal,
        "deviation_s": float(np.abs(seconds - ideal).mean()),
        "slowest": [(int(step[i]), float(seconds[i])) for i in order],
    }


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"


def step_time_text(stats: dict[str, Any]) -> str:
    if not stats.get("steps"):
        return "step time: no two consecutive steps yet"
    slowest = ", ".join(f"step {s} {_ms(t)}" for s, t in stats["slowest"])
    return (
        f"step time: median {_ms(stats['median_s'])}, mean {_ms(stats['mean_s'])}, "
        f"std {_ms(stats['std_s'])} over {stats['steps']} steps; slowest: {slowest}"
    )


def edges_for(wall_s: float, intervals: int | None, window_s: float | None, name: str) -> np.ndarray:
    """Interval edges over ``[0, wall_s]``: ``intervals`` equal ones, or windows of ``window_s``."""
    if intervals is not None and window_s is not None:
        raise PathwaysError("give intervals or window_s, not both")
    if window_s is not None:
        try:
            window = float(window_s)
        except (TypeError, ValueError):
            raise PathwaysError(f"window_s must be a number of seconds, got {window_s!r}") from None
        if not math.isfinite(window) or window <= 0:
            raise PathwaysError(f"window_s must be a finite number of seconds above 0, got {window_s!r}")
        if window > wall_s:
            raise PathwaysError(
                f"window {window:g} s is longer than run '{name}' ({wall_s:.2f} s): give at most {wall_s:.2f} s"
            )
        count = math.ceil(wall_s / window - 1e-9)
        if count > MAX_INTERVALS:
            raise PathwaysError(
                f"window {window:g} s splits run '{name}' ({wall_s:.2f} s) into {count} intervals, "
                f"more than {MAX_INTERVALS}: give at least {wall_s / MAX_INTERVALS:.3g} s"
            )
        edges = np.arange(count + 1) * window
        edges[-1] = wall_s
        return edges
    count = 20 if intervals is None else intervals
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise PathwaysError(f"intervals must be a whole number from 1 to {MAX_INTERVALS}, got {count!r}")
    if not 1 <= count <= MAX_INTERVALS:
        raise PathwaysError(f"intervals must be from 1 to {MAX_INTERVALS}, got {count}")
    return np.linspace(0.0, wall_s, int(count) + 1)


# -- the notebook's chart ---------------------------------------------------------
#: Colours per category: JupyterLab's theme variables (fallbacks outside JupyterLab).
COLORS = {
    "productive": "var(--jp-success-color1, #388e3c)",
    "compile": "var(--jp-brand-color1, #1976d2)",
    "data_wait": "var(--jp-warn-color1, #f57c00)",
    "snapshot_stall": "var(--jp-info-color1, #0097a7)",
    "checkpoint_save": "var(--jp-brand-color3, #90caf9)",
    "recovery": "var(--jp-error-color1, #d32f2f)",
    "redone": "var(--jp-error-color3, #ef9a9a)",
    "slice_wait": "var(--jp-warn-color3, #ffcc80)",
    "scale_up": "var(--jp-info-color3, #80deea)",
    "other": "var(--jp-layout-color4, #9e9e9e)",
}


def chart_html(frame: Any, title: str, labels: dict[str, str], steps_line: str) -> str:
    """A stacked column per interval (its share of each category), theme-aware inline SVG."""
    width, height, pad = 600, 120, 2
    n = len(frame)
    cats = [c for c in COLORS if c in frame.columns and float(frame[c].sum()) > 0]
    bar = (width - pad) / max(n, 1)
    rects = []
    for i, row in enumerate(frame.itertuples(index=False)):
        span = row.end_s - row.start_s
        y = float(height)
        for c in cats:
            share = getattr(row, c) / span if span > 0 else 0.0
            h = max(0.0, share * height)
            if h <= 0:
                continue
            y -= h
            tip = f"{row.start_s:.2f}-{row.end_s:.2f} s: {labels.get(c, c)} {100 * share:.1f}%"
            rects.append(
                f'<rect x="{i * bar + pad / 2:.2f}" y="{y:.2f}" width="{max(bar - pad, 0.5):.2f}" '
                f'height="{h:.2f}" style="fill:{COLORS[c]}"><title>{html.escape(tip)}</title></rect>'
            )
    legend = " ".join(
        f'<span style="white-space:nowrap"><span style="display:inline-block;width:0.8em;height:0.8em;'
        f'background:{COLORS[c]};margin-right:0.3em"></span>{html.escape(labels.get(c, c))}</span>'
        for c in cats
    )
    end = float(frame["end_s"].iloc[-1]) if n else 0.0
    return (
        '<div class="pathways-goodput-over-time" style="color:var(--jp-ui-font-color1);'
        'font-family:var(--jp-ui-font-family);font-size:var(--jp-ui-font-size1, 12px)">'
        f"<div>{html.escape(title)}</div>"
        f'<svg role="img" aria-label="{html.escape(title)}" viewBox="0 0 {width} {height}" '
        f'preserveAspectRatio="none" style="width:100%;max-width:{width}px;height:{height}px;'
        'background:var(--jp-layout-color2, transparent)">' + "".join(rects) + "</svg>"
        f'<div style="display:flex;justify-content:space-between;max-width:{width}px;'
        f'color:var(--jp-ui-font-color2)"><span>0 s</span><span>{end:.1f} s</span></div>'
        f"<div>{legend}</div>"
        f'<div style="color:var(--jp-ui-font-color2)">{html.escape(steps_line)}</div>'
        "</div>"
    )
