"""The session's event log: every transition a user may want to see.

Kinds used across the project are ``KINDS``. Thread-safe; listeners (the
telemetry hub, the notebook widget) are called on the appending thread and
must not block. Times read to the millisecond (``HH:MM:SS.mmm``): a
recovery's events fall within one second.
"""

from __future__ import annotations

import collections
import dataclasses
import html
import threading
import time
from collections.abc import Callable
from typing import Any

from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.subscribers import Subscribers

#: Events kept in memory; older ones drop off.
MAX_EVENTS = 10_000

#: The kinds the project emits (a log may hold others: any kind it holds is known too).
KINDS = (
    "connect",
    "disconnect",
    "connection_update",
    "slice_down",
    "slice_up",
    "reshard",
    "snapshot",
    "restore",
    "retry",
    "scale_up",
    "transfer",
    "compile",
    "sidecar",
    "goodput",
    "profile",
    "job_submitted",
    "job_pending",
    "job_running",
    "job_bound",
    "job_time_limit",
    "job_preempted",
    "job_requeued",
    "job_ended",
    "job_error",
)


def clock(t: float) -> str:
    """``t`` (time.time()) as local ``HH:MM:SS.mmm``."""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


@dataclasses.dataclass(frozen=True)
class Event:
    """One transition. Fields not relevant to a kind stay ``None``."""

    seq: int
    time: float
    kind: str
    slices_before: tuple[int, ...] | None = None
    slices_after: tuple[int, ...] | None = None
    bytes: int | None = None
    duration_s: float | None = None
    step: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_text(self, mark: str = "") -> str:
        """One line: time, kind, ``mark`` if given ("earlier kernel · "), then what else the event holds."""
        parts = [clock(self.time), f"{self.kind:<12}"]
        if mark:
            parts.append(mark.rstrip(" ·"))
        if self.slices_before is not None or self.slices_after is not None:
            parts.append(f"slices {_slices(self.slices_before)} -> {_slices(self.slices_after)}")
        if self.step is not None:
            parts.append(f"step {self.step}")
        if self.bytes is not None:
            parts.append(format_bytes(self.bytes))
        if self.duration_s is not None:
            parts.append(f"{self.duration_s * 1000:.0f} ms")
        if self.detail:
            parts.append(self.detail)
        return "  ".join(parts)


def _slices(indices: tuple[int, ...] | None) -> str:
    return "-" if indices is None else "[" + ",".join(map(str, indices)) + "]"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class EventLog:
    """An append-only, bounded, thread-safe log of ``Event``s."""

    def __init__(self, maxlen: int = MAX_EVENTS):
        self._events: collections.deque[Event] = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._seq = 0
        self._subscribers: Subscribers[Event] = Subscribers()
        self._kept: Subscribers[Event] = Subscribers()
        #: Events of earlier kernels of this notebook session, read back after a restart
        #: (``keep_events``): shown in event tables, apart from this log's own, which
        #: ``last`` and ``since`` return (a view acting on events never sees them).
        self.earlier: list[Event] = []

    def emit(self, kind: str, **fields: Any) -> Event:
        """Record an event now and notify listeners; returns it."""
        return self._notify(kind, fields, keep=True)

    def publish(self, kind: str, **fields: Any) -> Event:
        """Notify listeners of a passing event (a periodic reading) without recording it.

        For streams such as a loop's step rate: live views chart them, but
        they would push the events that matter (a slice loss) out of the
        bounded log and of what a reconnecting view is replayed.
        """
        return self._notify(kind, fields, keep=False)

    def _notify(self, kind: str, fields: dict[str, Any], keep: bool) -> Event:
        with self._lock:
            self._seq += 1
            event = Event(self._seq, time.time(), kind, **fields)
            if keep:
                self._events.append(event)
        self._subscribers.notify(event)
        if keep:
            self._kept.notify(event)
        return event

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` for each new event; returns an unsubscribe function."""
        return self._subscribers.subscribe(listener)

    def subscribe_kept(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` for each new event the log keeps (not those only published)."""
        return self._kept.subscribe(listener)

    def last(self, n: int | None = None, kind: str | None = None) -> list[Event]:
        """The last ``n`` events (all: None), of ``kind`` only if given, oldest first.

        Raises:
          PathwaysError: ``kind`` is none of ``KINDS`` nor of the log's kinds (names those).
        """
        if kind is not None and kind not in KINDS:
            with self._lock:
                seen = {e.kind for e in self._events}
            if kind not in seen:
                known = ", ".join(sorted(seen.union(KINDS)))
                raise PathwaysError(f"no event kind '{kind}'; the kinds are: {known}")
        with self._lock:
            events = [e for e in self._events if kind is None or e.kind == kind]
        return events if n is None else events[-n:] if n > 0 else []

    def since(self, seq: int) -> list[Event]:
        with self._lock:
            return [e for e in self._events if e.seq > seq]

    def __len__(self) -> int:
        return len(self._events)


#: Kinds that come in runs (a snapshot every few steps, the client's connect lines): consecutive
#: ones fold into one row with a count and a range, until an event of another kind breaks the run.
ROUTINE_KINDS = frozenset({"snapshot", "steps", "connection_update", "compile", "transfer", "sidecar"})


def fold(events: list[Event]) -> list[list[Event]]:
    """``events`` (oldest first) as rows, oldest first: routine kinds folded.

    Events of a routine kind with the same slices join one row while no event of another,
    non-routine kind comes between (a slice loss splits the snapshots before and after it);
    routine kinds interleaved with each other (snapshots and compiles) fold each into its
    own row. A row stands where its newest event does.
    """
    rows: list[list[Event]] = []
    newest: dict[int, int] = {}  # id(row) -> index of its newest event
    open_rows: dict[tuple[Any, ...], list[Event]] = {}
    for i, e in enumerate(events):
        if e.kind not in ROUTINE_KINDS:
            open_rows.clear()
            row = [e]
            rows.append(row)
        else:
            key = (e.kind, e.slices_before, e.slices_after)
            row = open_rows.get(key) or open_rows.setdefault(key, [])
            if not row:
                rows.append(row)
            row.append(e)
        newest[id(row)] = i
    return sorted(rows, key=lambda r: newest[id(r)])


class EventTable:
    """A list of events rendered as text or an HTML table (newest last), routine runs folded.

    ``kind`` given: every event of that kind on its own row. ``last``: the newest rows shown.
    """

    def __init__(
        self,
        events: list[Event],
        kind: str | None = None,
        last: int | None = None,
        earlier: list[Event] | None = None,
    ):
        self.events = events
        before = earlier or []
        split = (lambda es: [[e] for e in es]) if kind else fold
        self.rows = split(before) + split(events)
        self._earlier_rows = len(self.rows) - len(split(events))
        if last is not None:
            shown = min(max(last, 0), len(self.rows))
            self._earlier_rows = max(0, self._earlier_rows - (len(self.rows) - shown))
            self.rows = self.rows[len(self.rows) - shown :]
        self._empty = f"no {kind} events yet" if kind else "no events yet"

    def _marks(self) -> list[str]:
        """Each row's mark: "earlier kernel · " on the rows an earlier kernel of the session logged."""
        return [EARLIER if i < self._earlier_rows else "" for i in range(len(self.rows))]

    def __repr__(self) -> str:
        if not self.rows:
            return self._empty
        return "\n".join(row_text(r, mark) for r, mark in zip(self.rows, self._marks(), strict=True))

    def _repr_html_(self) -> str:
        if not self.rows:
            return f"<i>{html.escape(self._empty)}</i>"
        left = "text-align:left;vertical-align:top;padding:2px 8px"
        short = f"{left};white-space:nowrap"
        # Three columns, read left to right: when, what, and the rest on one line that wraps
        # ("slices [0,1] → [0] · step 0–60 · 4 B · 2 ms · detail"): in a notebook's ~580 px, a
        # column each for slices, step, bytes and duration left the detail ~130 px.
        body = "".join(
            f'<tr><td style="{short}">{html.escape(c[0])}</td><td style="{short}">{html.escape(c[1])}</td>'
            f'<td style="{left}">{html.escape(mark + _details(c))}</td></tr>'
            for c, mark in zip((_row(r) for r in self.rows), self._marks(), strict=True)
        )
        head = "".join(f'<th style="{left}">{h}</th>' for h in ("time", "kind", "details"))
        # JupyterLab lays tables out fixed and right-aligned, which cut the detail column off.
        return (
            '<table class="pathways-events" style="table-layout:auto;width:100%">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )


def _details(cells: list[str]) -> str:
    """A row's slices, step, bytes, duration and detail as one line: "slices [0,1] → [0] · step 40 · ..."."""
    slices, step, size, duration, detail = cells[2:]
    parts = [f"slices {slices}" if slices else "", f"step {step}" if step else "", size, duration, detail]
    return " · ".join(p for p in parts if p)


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.{2 if seconds < 10 else 1}f} s"


def _durations(seconds: list[float]) -> str:
    """ "12 ms", or the shortest and the longest of a folded run: "3 ms–1.20 s"."""
    if not seconds:
        return ""
    low, high = _duration(min(seconds)), _duration(max(seconds))
    return low if low == high else f"{low}–{high}"


def _span(values: list[str]) -> str:
    """One value when all agree ("4 B"), else the first and the last ("0–60")."""
    shown = [v for v in values if v]
    if not shown:
        return ""
    return shown[0] if len(set(shown)) == 1 else f"{shown[0]}–{shown[-1]}"


#: How an event table marks a row an earlier kernel of the session logged (read back after a restart).
EARLIER = "earlier kernel · "


def row_text(row: list[Event], mark: str = "") -> str:
    """One row (an event, or a folded run of them) as a line of text, ``mark`` before its details."""
    if len(row) == 1:
        return row[0].to_text(mark)
    c = _row(row)
    parts = [c[0], f"{c[1]:<12}", mark.rstrip(" ·")] if mark else [c[0], f"{c[1]:<12}"]
    if c[2]:
        parts.append(f"slices {c[2]}")
    if c[3]:
        parts.append(f"step {c[3]}")
    parts.extend(p for p in c[4:] if p)
    return "  ".join(parts)


def _row(events: list[Event]) -> list[str]:
    """A row's cells: time, kind, slices, step, bytes, duration, detail; a folded run's as counts and ranges."""
    e, n = events[-1], len(events)
    slices = (
        ""
        if e.slices_before is None and e.slices_after is None
        else f"{_slices(e.slices_before)} → {_slices(e.slices_after)}"
    )
    first, newest = clock(events[0].time), clock(e.time)
    # A folded run's time range, the newest without the hours and minutes it shares: "10:01:02.500–09.750".
    shared = 6 if first[:6] == newest[:6] else 3 if first[:3] == newest[:3] else 0
    time_ = first if n == 1 else f"{first}–{newest[shared:]}"
    detail = e.detail if n == 1 or not e.detail else f"newest: {e.detail}"
    return [
        time_,
        e.kind if n == 1 else f"{e.kind} ×{n}",
        slices,
        _span(["" if x.step is None else str(x.step) for x in events]),
        _span(["" if x.bytes is None else format_bytes(x.bytes) for x in events]),
        _durations([x.duration_s for x in events if x.duration_s is not None]),
        detail,
    ]
