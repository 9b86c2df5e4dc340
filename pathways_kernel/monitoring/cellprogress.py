"""Per-cell progress under the cell, sparkmonitor-style, for every run the goodput ledger sees.

A view over ``training.goodput``: each run that starts on the kernel's main
thread inside a cell (``@pw.elastic``, ``%%pathways elastic``, ``pw.steps``,
a bare ``pw.loader`` loop) gets one output under that cell:

* while it runs, text/html + text/plain that a daemon thread updates in place
  (``update_display``) at most ``1 / INTERVAL_S`` times a second, and only
  when its text changed: steps n/N, steps/s, ETA, the newest computed loss
  (a scalar ``loss`` in an elastic run's state, or any value given to
  ``pw.log``, as ``training.metric_log`` reads them off the devices),
  recoveries and reshards, drawn as markers on the bar at the step where
  they happened;
* when it ends, the same output replaced by the static summary: steps done,
  time, recoveries, reshards, goodput. That is what the saved notebook keeps,
  so nbconvert and a reopened file show it without a kernel.

Plain display updates rather than a widget: an output saved or orphaned
mid-run (the kernel died, the notebook was saved) still reads as the last
progress shown, never as a widget whose model is gone, and nothing is left
in the notebook's widget state.

Nothing is shown outside an IPython kernel, for a run nested in another one
(its parent has the display), past ``MAX_PER_CELL`` runs in one cell, or for
a run started with ``progress=False`` (``--no-progress``).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import html
import threading
import time
from collections.abc import Callable
from typing import Any

from pathways_kernel.core.eventlog import Event
from pathways_kernel.core.sessions import Session
from pathways_kernel.core.text import count, plural
from pathways_kernel.state.progress import _in_kernel
from pathways_kernel.training import accounting, goodput
from pathways_kernel.training.metric_log import metric_log

#: Seconds between refreshes of a live view: at most 4 updates a second.
INTERVAL_S = 0.25
#: Steps/s is measured over this trailing window (s), so a recovery shows up in it.
RATE_WINDOW_S = 5.0
#: Progress displays one cell may open; later runs of that cell run without one.
MAX_PER_CELL = 10
#: Markers drawn on one bar (the summary counts them all).
MAX_MARKERS = 50
#: What a run of each kind counts, where it is not steps: an elastic_map job's are its batches.
UNITS = {"elastic_map": "batch"}

_per_cell: dict[int, int] = {}


def follow(session: Session) -> Callable[[], None]:
    """Show the progress of ``session``'s runs started inside this IPython kernel; returns the undo."""
    return session.component(accounting.RunStarts).subscribe(_watch)


def _watch(account: goodput.Account) -> None:
    if not account.progress or threading.current_thread() is not threading.main_thread() or not _in_kernel():
        return
    if accounting.current() is not None:
        return  # nested in a run that already shows its progress
    from IPython import get_ipython

    cell = get_ipython().execution_count
    shown = _per_cell.get(cell, 0)
    if shown >= MAX_PER_CELL:
        return
    _per_cell.clear()
    _per_cell[cell] = shown + 1
    CellProgress(account).start()


class CellProgress:
    """The live view of one run, then its static summary, in one output of the cell."""

    def __init__(self, account: goodput.Account):
        self.account = account
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._markers: list[tuple[int, str, str]] = []  # (step, kind, what happened)
        self._reshards = 0
        self._shown = ""
        self._handle: Any = None
        self._unsubscribe = account._session.events.subscribe(self._on_event)

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Reserve the cell's output (on the run's thread: nothing slower than one message)."""
        from IPython.display import display

        text, page = self.render()
        self._shown = page
        self._handle = display({"text/plain": text, "text/html": page}, raw=True, display_id=True)
        # The cell's context goes with the thread, so its updates carry that cell as their parent.
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(self._follow,), name="pathways-cell-progress", daemon=True).start()

    def _follow(self) -> None:
        while not self._done.wait(INTERVAL_S):
            if self.account.ended:
                self.finish()
                return
            text, page = self.render()
            with self._lock:
                if page != self._shown and not self._done.is_set():
                    self._shown = page
                    self._handle.update({"text/plain": text, "text/html": page}, raw=True)

    def finish(self) -> None:
        """Replace the live view by the run's static summary (idempotent)."""
        with self._lock:
            if self._done.is_set():
                return
            self._done.set()
        self._unsubscribe()
        text, page = self.render(final=True)
        self._handle.update({"text/plain": text, "text/html": page}, raw=True)

    def _on_event(self, event: Event) -> None:
        # Called on the emitting thread, inside the run's own emit: never raise, never block.
        with contextlib.suppress(Exception):  # a view must not break the run it shows
            self._record(event)

    def _record(self, event: Event) -> None:
        account = self.account
        if event.kind == "goodput" and account.ended:
            self.finish()
            return
        at = account.first_step + account.steps
        name = f"'{account.name}'"
        if event.kind == "slice_down":
            lost = sorted(set(event.slices_before or ()) - set(event.slices_after or ()))
            what = f"slice {', '.join(map(str, lost))} down" if lost else "slice down"
        elif event.kind == "slice_up":
            back = sorted(set(event.slices_after or ()) - set(event.slices_before or ()))
            what = f"slice {', '.join(map(str, back))} back" if back else "slice back"
        elif event.kind == "reshard" and event.detail.startswith(name):
            after = list(event.slices_after or ())
            source = event.detail[len(name) :].strip()
            at = event.step if event.step is not None else at
            what = f"reshard onto slices {after} {source}".rstrip()
            with self._lock:
                self._reshards += 1
        else:
            return
        with self._lock:
            self._markers.append((max(0, at), event.kind, what))

    # -- figures --------------------------------------------------------------
    def _rate(self, now: float, executed: int) -> float | None:
        samples = self._samples
        if samples and executed < samples[-1][1]:
            samples.clear()
        samples.append((now, executed))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW_S:
            samples.popleft()
        first_t, first_n = samples[0]
        return (executed - first_n) / (now - first_t) if now > first_t and executed > first_n else None

    def _read_values(self, final: bool) -> dict[str, float]:
        # The newest values the metric log has read off the devices; the summary waits for the rest.
        log = metric_log(self.account._session)
        if final:
            log.flush()
        return log.latest(self.account)

    def render(self, final: bool = False) -> tuple[str, str]:
        """The view now: (text/plain, text/html)."""
        account = self.account
        now = time.perf_counter()
        first, total = account.first_step, account.stop_step
        done = first + account.steps
        executed = account.steps + account.steps_redone
        values = self._read_values(final)
        with self._lock:
            markers = list(self._markers)
            reshards = self._reshards
        head = f"{account.kind} '{account.name.removeprefix(account.kind + ' ')}'"
        unit = UNITS.get(account.kind, "step")
        if final:
            wall = account.wall_s
            steps = f"{unit} {done}/{total}" if total else f"{unit} {done}"
            stopped = " (stopped early)" if total and done < total else ""
            # In seconds up to 10 minutes, as the run's own report (an elastic cell's result) gives it.
            parts = [f"{steps}{stopped}: {count(account.steps, unit)} in {_duration(wall, seconds_below=600)}"]
            if wall > 0 and executed:
                parts.append(f"{executed / wall:.3g} {plural(unit, 2)}/s")
        else:
            rate = self._rate(now, executed)
            parts = [f"{unit} {done}/{total}" if total else f"{unit} {done}"]
            parts.append(f"{rate:.3g} {plural(unit, 2)}/s" if rate else "starting")
            if rate and total and done < total:
                parts.append(f"ETA {_duration((total - done) / rate)}")
        parts += [f"{name} {value:.4g}" for name, value in values.items()]
        # An elastic run's summary says it lost nothing; other loops cannot recover.
        elastic = final and account.kind == "elastic"
        if account.recoveries or elastic:
            redone = f" ({account.steps_redone} redone)" if account.steps_redone else ""
            parts.append(count(account.recoveries, "recovery") + redone)
        if reshards or elastic:
            parts.append(count(reshards, "reshard"))
        if final:
            parts.append(f"goodput {100 * account.goodput:.1f}%")
        line = f"{head}: " + " · ".join(parts)
        events = [f"{unit} {step}: {what}" for step, _kind, what in markers]
        text = "\n".join([line, *("  " + e for e in events)])
        fraction = min(1.0, done / total) if total else (1.0 if final else 0.0)
        at = (lambda step: min(1.0, step / total)) if total else (lambda step: 1.0)
        page = (
            '<div class="pathways-cell-progress" style="font-family:var(--jp-code-font-family,monospace);'
            'font-size:var(--jp-code-font-size,12px);line-height:1.5">'
            + _bar(fraction, [(at(s), k, w) for s, k, w in markers[:MAX_MARKERS]], final)
            + f"<div>{html.escape(line)}</div>"
            + "".join(f'<div style="opacity:0.8">{html.escape(e)}</div>' for e in events[:MAX_MARKERS])
            + "</div>"
        )
        return text, page


_COLORS = {
    "slice_down": "var(--jp-error-color1,#d32f2f)",
    "slice_up": "var(--jp-success-color1,#388e3c)",
    "reshard": "var(--jp-warn-color1,#f57c00)",
}


def _bar(fraction: float, markers: list[tuple[float, str, str]], final: bool) -> str:
    fill = "var(--jp-success-color1,#388e3c)" if final else "var(--jp-brand-color1,#1976d2)"
    # Slice events tick above the bar, reshards below: at the same step both stay visible.
    ticks = "".join(
        f'<span title="{html.escape(what)}" style="position:absolute;left:{100 * min(1.0, x):.2f}%;'
        f'top:{2 if kind == "reshard" else -5}px;width:2px;height:11px;background:{_COLORS.get(kind, fill)}"></span>'
        for x, kind, what in markers
    )
    return (
        '<div style="position:relative;width:24em;max-width:100%;height:8px;margin:7px 0;'
        'background:var(--jp-layout-color3,#ddd);border-radius:2px">'
        f'<div style="width:{100 * fraction:.1f}%;height:100%;background:{fill};border-radius:2px"></div>'
        f"{ticks}</div>"
    )


def _duration(seconds: float, seconds_below: float = 60) -> str:
    if seconds < seconds_below:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


__all__ = ["INTERVAL_S", "MAX_PER_CELL", "CellProgress", "follow"]
