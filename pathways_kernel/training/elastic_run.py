"""What an elastic run takes and reports, and the session's restore hooks.

The argument checks of ``pw.elastic`` and ``%%pathways elastic`` (``check_count``,
``check_steps``), what a run went through (``RunReport``, one ``Rollback`` per
recovery: ``elastic(...).last_run``), and ``on_restore``: callbacks a session's
elastic runs call after every reshard or rollback, so that data loaders follow
the new mesh. The loop itself is ``elastic_loop.py``.
"""

from __future__ import annotations

import dataclasses
import numbers
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.sessions import Session, session
from pathways_kernel.core.text import count

if TYPE_CHECKING:
    from jax.sharding import Mesh


# -- restore callbacks (loaders follow the mesh) -------------------------------
class _RestoreHooks:
    """A session's ``on_restore`` callbacks (a session component): a new session starts with none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[int, Mesh], None]] = []

    def add(self, callback: Callable[[int, Mesh], None]) -> Callable[[], None]:
        with self._lock:
            self._callbacks.append(callback)

        def unregister() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unregister

    def notify(self, step: int, mesh: Mesh) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback(step, mesh)


def restore_hooks(s: Session) -> _RestoreHooks:
    return s.component(_RestoreHooks, lambda _s: _RestoreHooks())


def on_restore(callback: Callable[[int, Mesh], None], session_: Session | None = None) -> Callable[[], None]:
    """Call ``callback(step, mesh)`` after every reshard or rollback of an
    elastic run in this session (or ``session_``).

    ``step`` is the next step the loop will run; ``mesh`` the mesh it runs
    on. Returns a function that unregisters the callback.
    """
    return restore_hooks(session_ if session_ is not None else session()).add(callback)


# -- arguments ------------------------------------------------------------------
def check_count(value: Any, name: str, least: int) -> int:
    """``value`` if it is a whole number of at least ``least``; else a one-line ``PathwaysError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise PathwaysError(f"{name} must be a whole number of at least {least}, got {value!r}")
    return int(value)


def check_steps(steps: Any, start: Any, names: tuple[str, str] = ("steps", "start")) -> tuple[int, int]:
    """Steps ``start..steps-1``, checked: ``steps`` is the step to stop before, not a count."""
    steps = check_count(steps, names[0], 1)
    if isinstance(start, bool) or not isinstance(start, numbers.Integral) or not 0 <= int(start) < steps:
        raise PathwaysError(
            f"{names[1]} must be a step from 0 to {steps - 1} ({names[0]} {steps} is the step the run stops before), got {start!r}"
        )
    return steps, int(start)


# -- what a run did ------------------------------------------------------------
@dataclasses.dataclass
class Rollback:
    """One recovery: the loop was at ``failed_at`` and resumed at ``resumed_at``."""

    failed_at: int
    resumed_at: int
    slices_before: tuple[int, ...]
    slices_after: tuple[int, ...]
    duration_s: float

    @property
    def steps_lost(self) -> int:
        return self.failed_at - self.resumed_at


@dataclasses.dataclass
class RunReport:
    """What an elastic run went through; ``elastic(...).last_run``."""

    name: str
    run: int = 0  # the run number its snapshots carry
    steps: int = 0
    steps_executed: int = 0  # including steps redone after a rollback
    recoveries: list[Rollback] = dataclasses.field(default_factory=list)
    scale_ups: int = 0
    snapshots: int = 0
    duration_s: float = 0.0
    slices: tuple[int, ...] = ()

    @property
    def retries(self) -> int:
        return len(self.recoveries)

    @property
    def steps_lost(self) -> int:
        return sum(r.steps_lost for r in self.recoveries)

    def summary(self) -> str:
        lost = f", {count(self.steps_lost, 'step')} redone" if self.recoveries else ""
        return (
            f"elastic '{self.name}': {count(self.steps, 'step')} in {self.duration_s:.1f} s on slices "
            f"{list(self.slices)}; {count(self.retries, 'recovery')}{lost}, {count(self.scale_ups, 'scale-up')}, "
            f"{count(self.snapshots, 'snapshot')}"
        )

    def __repr__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.summary())
