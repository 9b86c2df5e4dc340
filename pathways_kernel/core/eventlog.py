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

    def to_text(self) -> str:
        parts = [clock(self.time), f"{self.kind:<12}"]
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
        return event

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` for each new event; returns an unsubscribe function."""
        return self._subscribers.subscribe(listener)

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


class EventTable:
    """A list of events rendered as text or an HTML table (newest last)."""

    def __init__(self, events: list[Event], kind: str | None = None):
        self.events = events
        self._empty = f"no {kind} events yet" if kind else "no events yet"

    def __repr__(self) -> str:
        return "\n".join(e.to_text() for e in self.events) if self.events else self._empty

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        if not self.events:
            return f"<i>{html.escape(self._empty)}</i>"
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in _row(e)) + "</tr>" for e in self.events
        )
        head = "".join(f"<th>{h}</th>" for h in ("time", "kind", "slices", "step", "bytes", "duration", "detail"))
        return f'<table class="pathways-events"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _row(e: Event) -> list[str]:
    slices = (
        ""
        if e.slices_before is None and e.slices_after is None
        else f"{_slices(e.slices_before)} → {_slices(e.slices_after)}"
    )
    return [
        clock(e.time),
        e.kind,
        slices,
        "" if e.step is None else str(e.step),
        "" if e.bytes is None else format_bytes(e.bytes),
        "" if e.duration_s is None else f"{e.duration_s * 1000:.0f} ms",
        e.detail,
    ]
