"""What sidecars did, per session: the counters the monitor and ``%pathways sidecar`` show.

Every sidecar call (``sidecars.py``) and every loader block (``data_loader.py``)
is recorded in the session's ``Activity`` (session extension ``"sidecar"``):
calls, bytes produced, busy time, errors and timeouts per slice, and each live
loader's state (its queue depth) through a probe it registers.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.text import count

if TYPE_CHECKING:
    from IPython.lib.pretty import RepresentationPrinter

    from pathways_kernel.core.sessions import Session


@dataclasses.dataclass
class SliceActivity:
    calls: int = 0
    bytes: int = 0
    busy_s: float = 0.0
    errors: int = 0
    timeouts: int = 0


class Activity:
    """Per-session counters of sidecar work (session extension ``"sidecar"``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[int, SliceActivity] = {}
        self._queues: dict[str, Callable[[], dict[str, Any]]] = {}

    def record(
        self, slice_index: int, nbytes: int = 0, busy_s: float = 0.0, error: bool = False, timeout: bool = False
    ) -> None:
        with self._lock:
            s = self._slices.setdefault(slice_index, SliceActivity())
            s.calls += 1
            s.bytes += nbytes
            s.busy_s += busy_s
            s.errors += int(error)
            s.timeouts += int(timeout)

    def watch_queue(self, name: str, probe: Callable[[], dict[str, Any]]) -> Callable[[], None]:
        """Report a loader's state (``probe()`` -> dict with ``queue_depth``); returns unwatch.

        A second live loader of the same name is listed as ``name#2``, and so on.
        """
        with self._lock:
            base, n = name, 1
            while name in self._queues:
                n += 1
                name = f"{base}#{n}"
            self._queues[name] = probe

        def unwatch() -> None:
            with self._lock:
                if self._queues.get(name) is probe:
                    del self._queues[name]

        return unwatch

    def stats(self) -> dict[str, Any]:
        """Totals, per-slice counters and per-loader state, as plain JSON-able data."""
        with self._lock:
            slices = {i: dataclasses.asdict(s) for i, s in sorted(self._slices.items())}
            probes = dict(self._queues)
        loaders = {name: probe() for name, probe in probes.items()}
        totals = {
            key: sum(s[key] for s in slices.values()) for key in ("calls", "bytes", "busy_s", "errors", "timeouts")
        }
        totals["queue_depth"] = sum(state.get("queue_depth", 0) for state in loaders.values())
        return {**totals, "slices": slices, "loaders": loaders}


def activity(session: Session | None = None) -> Activity:
    """The session's sidecar ``Activity``."""
    from pathways_kernel.core.sessions import session as current

    return (session or current()).component(Activity, lambda _s: Activity())


def stats() -> dict[str, Any]:
    """Sidecar counters for the monitor: calls, bytes, busy_s, errors, timeouts, queue_depth, slices, loaders."""
    return activity().stats()


class ActivityTable:
    """``stats()`` rendered for ``%pathways sidecar`` (text)."""

    def __init__(self, data: dict[str, Any]):
        self.data = data

    def __repr__(self) -> str:
        d = self.data
        lines = [
            f"sidecar calls {d['calls']}  produced {format_bytes(d['bytes'])}  busy {d['busy_s']:.2f} s  "
            f"errors {d['errors']}  timeouts {d['timeouts']}  queue depth {d['queue_depth']}"
        ]
        for index, s in d["slices"].items():
            lines.append(
                f"  slice {index}: {count(s['calls'], 'call')}, {format_bytes(s['bytes'])}, {s['busy_s']:.2f} s busy, "
                f"{count(s['errors'], 'error')}, {count(s['timeouts'], 'timeout')}"
            )
        for name, state in d["loaders"].items():
            lines.append("  loader " + name + ": " + ", ".join(f"{k} {v}" for k, v in state.items()))
        return "\n".join(lines)

    def _repr_pretty_(self, p: RepresentationPrinter, cycle: bool) -> None:
        p.text(repr(self))
