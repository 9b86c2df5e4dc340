"""Step time and throughput of the training loops in progress, as ``steps`` events.

The goodput ledger knows, for every run in progress (``@pw.elastic``,
``%%pathways elastic``, ``pw.steps``, a bare ``pw.loader`` loop), how many
steps it has kept and how much productive time they took. A view that charts
step time and throughput needs those figures while the run goes on, not only
the ``goodput`` event at its end, so the telemetry hub calls ``poll`` on each
sample and a run that advanced publishes (to live views; not kept in the
event log, where once a second per run would crowd out the events that
matter), at most once per ``PERIOD_S``::

    steps  step=<steps kept so far>
           duration_s=<productive seconds per step over the interval>
           detail="<kind> '<name>': <steps per wall second over the interval> steps/s"

A rollback (steps redone after a loss) makes the count go back; the next
interval starts from there.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING

from pathways_kernel.training import goodput

if TYPE_CHECKING:
    from pathways_kernel.core.sessions import Session

#: Shortest interval a ``steps`` event covers (s): at most one per run per second.
PERIOD_S = 1.0


class StepRate:
    """Turns the ledger's runs in progress into ``steps`` events of ``session``."""

    def __init__(self, session: Session, period_s: float = PERIOD_S):
        self._session = session
        self.period_s = period_s
        # Per run: (perf_counter, steps kept, productive seconds) at the start of its interval.
        self._since: weakref.WeakKeyDictionary[goodput.Account, tuple[float, int, float]] = weakref.WeakKeyDictionary()

    def poll(self) -> None:
        """Emit a ``steps`` event for each run whose interval is over and that advanced in it."""
        if not hasattr(self._session, "component"):
            return  # a benchmark's stand-in session: it has no ledger, so no runs
        now = time.perf_counter()
        for account in list(goodput.ledger(self._session).active):
            steps, productive = account.steps, account.snapshot()[goodput.PRODUCTIVE]
            since = self._since.get(account)
            if since is None or steps < since[1]:
                self._since[account] = (now, steps, productive)
                continue
            started, steps_before, productive_before = since
            if now - started < self.period_s or steps == steps_before:
                continue
            self._since[account] = (now, steps, productive)
            done = steps - steps_before
            self._session.events.publish(
                "steps",
                step=steps,
                duration_s=max(0.0, productive - productive_before) / done,
                detail=f"{account.kind} '{account.name}': {done / (now - started):.4g} steps/s",
            )


__all__ = ["PERIOD_S", "StepRate"]
