"""Chaos: seeded random slice failures and repairs on the embedded backend.

Each slice that is up fails after an exponentially distributed time (mean
``mtbf`` seconds, its mean time between failures) and, once down, is repaired
after an exponentially distributed time (mean ``mttr``). The schedule is a
pure function of the slices, their starting states, ``mtbf``, ``mttr`` and the
seed: the same seed replays the same failures at the same offsets. At least
``min_up`` slices stay up: a failure that would take one more away is skipped
and that slice draws its next failure time.

Off by default. ``chaos(...)`` starts a daemon timer thread that applies the
schedule through ``faults`` (so every transition is a ``slice_down`` /
``slice_up`` event with detail ``chaos``); ``chaos_off()`` stops it and leaves
the slices as they are.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import numbers
import random
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.sessions import Session
from pathways_kernel.core.sessions import session as current
from pathways_kernel.core.text import count
from pathways_kernel.core.threads import ExitStop
from pathways_kernel.emulator import faults


@dataclasses.dataclass(frozen=True)
class ChaosEvent:
    """One scheduled transition, ``at`` seconds after chaos started."""

    at: float
    action: str  # "fail" | "repair"
    slice_index: int


#: The times chaos accepts, in seconds: below 10 ms it is a storm, not a
#: schedule (each transition costs milliseconds); above about 116 days
#: nothing would ever happen (and waits that long overflow).
MIN_SECONDS = 0.01
MAX_SECONDS = 1e7


def schedule(
    slices: Sequence[int],
    mtbf: float,
    mttr: float,
    seed: int,
    down: Sequence[int] = (),
    min_up: int = 1,
) -> Iterator[ChaosEvent]:
    """The endless, deterministic failure/repair schedule; see the module doc.

    Raises:
      PathwaysError: times outside ``MIN_SECONDS..MAX_SECONDS`` (or not numbers),
        a seed that is not a non-negative integer, or a ``min_up`` that is not
        an integer leaving a slice to fail.
    """
    _check_seconds("--mtbf", mtbf)
    _check_seconds("--mttr", mttr)
    if not _is_int(seed) or seed < 0:
        # random.Random ignores a seed's sign: -3 would replay seed 3.
        raise PathwaysError(f"chaos --seed must be a non-negative integer, got {seed!r}")
    if not _is_int(min_up) or not 0 <= min_up < len(slices):
        raise PathwaysError(
            f"chaos with {len(slices)} slices and --min-up {min_up!r} could never fail a slice; "
            f"use an integer from 0 to {len(slices) - 1}"
        )
    return _schedule(sorted(slices), float(mtbf), float(mttr), int(seed), set(down), int(min_up))


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_seconds(flag: str, value: Any) -> None:
    if (
        not isinstance(value, numbers.Real)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not MIN_SECONDS <= float(value) <= MAX_SECONDS
    ):
        raise PathwaysError(f"chaos {flag} must be seconds from {MIN_SECONDS:g} to {MAX_SECONDS:g}, got {value!r}")


def _schedule(
    slices: list[int], mtbf: float, mttr: float, seed: int, down: set[int], min_up: int
) -> Iterator[ChaosEvent]:
    rng = random.Random(seed)
    up = {i: i not in down for i in slices}
    next_at = {i: rng.expovariate(1 / (mtbf if up[i] else mttr)) for i in slices}
    while True:
        index = min(slices, key=lambda i: (next_at[i], i))
        at = next_at[index]
        if up[index]:
            next_at[index] = at + rng.expovariate(1 / mtbf)
            if sum(up.values()) - 1 < min_up:
                continue
            up[index] = False
            next_at[index] = at + rng.expovariate(1 / mttr)
            yield ChaosEvent(at, "fail", index)
        else:
            up[index] = True
            next_at[index] = at + rng.expovariate(1 / mtbf)
            yield ChaosEvent(at, "repair", index)


@dataclasses.dataclass(frozen=True)
class ChaosStatus(TextDisplay):
    """What ``%pathways chaos`` shows."""

    running: bool
    mtbf: float | None = None
    mttr: float | None = None
    seed: int | None = None
    min_up: int = 1
    applied: int = 0
    down: tuple[int, ...] = ()
    error: str = ""

    def to_text(self) -> str:
        down = f"; slices down now: {', '.join(map(str, self.down))}" if self.down else ""
        if self.running:
            return (
                f"chaos on (seed {self.seed}): each slice fails every ~{self.mtbf:g} s and is repaired after "
                f"~{self.mttr:g} s; at least {self.min_up} slice(s) stay up{down}. %pathways chaos --off to stop"
            )
        error = f" (stopped by an error: {self.error})" if self.error else ""
        done = f" after {count(self.applied, 'transition')}" if self.applied else ""
        return f"chaos off{done}{error}{down}"


class Chaos:
    """The session's chaos thread (session extension ``"chaos"``)."""

    def __init__(self, session: Session):
        self.session = session
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._params: dict[str, Any] = {}
        #: transitions applied by the current/last run, newest last (bounded).
        self.applied: collections.deque[ChaosEvent] = collections.deque(maxlen=1000)
        self.error = ""
        session.on_close(self.stop)
        # Stopped before the interpreter ends while it runs: a daemon thread caught inside
        # jaxlib during finalization aborts the process.
        self._exit_stop = ExitStop(self, Chaos.stop)

    def start(self, mtbf: float, mttr: float, seed: int, min_up: int = 1) -> ChaosStatus:
        faults.require_fault_injection(self.session, "chaos")
        topology = self.session.topology
        events = schedule(
            [s.index for s in topology.slices],
            mtbf,
            mttr,
            seed,
            down=[s.index for s in topology.slices if not s.up],
            min_up=min_up,
        )
        self.stop()
        with self._lock:
            self._stop = threading.Event()
            self._params = dict(mtbf=mtbf, mttr=mttr, seed=seed, min_up=min_up)
            self.applied.clear()
            self.error = ""
            self._thread = threading.Thread(
                target=self._run, args=(events, self._stop, seed), name="pathways-chaos", daemon=True
            )
            self._exit_stop.arm()
            self._thread.start()
        return self.status()

    def stop(self) -> ChaosStatus:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
            self._exit_stop.disarm()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        return self.status()

    def status(self) -> ChaosStatus:
        running = self._thread is not None and self._thread.is_alive()
        down = tuple(s.index for s in self.session.topology.slices if not s.up)
        return (
            ChaosStatus(running, **self._params, applied=len(self.applied), down=down, error=self.error)
            if self._params
            else ChaosStatus(False, down=down)
        )

    def _run(self, events: Iterator[ChaosEvent], stop: threading.Event, seed: int) -> None:
        start = time.monotonic()
        injector = faults.injector(self.session)
        try:
            for event in events:
                if stop.wait(max(0.0, start + event.at - time.monotonic())):
                    return
                if event.action == "fail":
                    injector.fail(event.slice_index, detail=f"chaos (seed {seed})")
                else:
                    injector.repair(event.slice_index, detail=f"chaos (seed {seed})")
                self.applied.append(event)
        except Exception as exc:  # a dying timer thread must say why
            self.error = f"{type(exc).__name__}: {exc}"


def _chaos(session: Session | None = None) -> Chaos:
    if session is None:
        session = current()
    return session.component(Chaos)


def chaos(mtbf: float, mttr: float, seed: int = 0, min_up: int = 1) -> ChaosStatus:
    """Start random slice failures and repairs (embedded ``local`` backend only).

    Args:
      mtbf: mean seconds a slice stays up before it fails.
      mttr: mean seconds a failed slice stays down before it is repaired.
      seed: the schedule's seed; the same seed gives the same schedule.
      min_up: slices that always stay up (default 1).

    Raises:
      NotSupportedError: the session's backend is not ``local``, or jax/jaxlib
        are outside the range fault injection was tested with.
      PathwaysError: times outside ``MIN_SECONDS..MAX_SECONDS``, a negative
        or non-integer seed, or a ``min_up`` leaving no slice to fail.
    """
    return _chaos().start(mtbf, mttr, seed, min_up)


def chaos_status() -> ChaosStatus:
    """Whether chaos is running, with its parameters and the slices down now."""
    return _chaos().status()


def chaos_off() -> ChaosStatus:
    """Stop chaos; slices stay as they are (``repair_slice`` brings one back).

    Raises:
      NotSupportedError: the session's backend is not ``local``.
    """
    runner = _chaos()
    faults.require_fault_injection(runner.session, "chaos")
    return runner.stop()
