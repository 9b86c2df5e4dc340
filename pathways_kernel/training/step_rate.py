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
           duration_s=<wall seconds per step over the interval>
           detail="<kind> '<name>': <steps per wall second over the interval> steps/s"

Step time is wall time per step, as the goodput chart's "mean step time per
interval" is (one step's start to the next one's, ``goodput_timeline``), so
the two agree, and step time is one over throughput. It once was productive
seconds per step: the time a loaded run spent between steps (waiting for data,
snapshots, a recovery) was then in neither chart's reading of the live one,
which read <= 300 ms where the intervals read > 2,000 ms (issue #31 item 4).
The first interval starts with the run (its compile is in it, as in the
goodput intervals). A rollback (steps redone after a loss) makes the count go
back; the next interval starts from there. The newest ``MAX_RECENT`` events are
kept here (``recent``) for a view that subscribes mid-run or after it: it is
replayed them with the log's events, else it charted no step time for the run
so far (a dashboard opened while a cell ran showed its loss and goodput, and no
step time, issue #31 item 4).
"""

from __future__ import annotations

import collections
import time
import weakref
from typing import TYPE_CHECKING

from pathways_kernel.training import goodput

if TYPE_CHECKING:
    from pathways_kernel.core.eventlog import Event
    from pathways_kernel.core.sessions import Session

#: Shortest interval a ``steps`` event covers (s): at most one per run per second.
PERIOD_S = 1.0
#: ``steps`` events kept for views that subscribe later (15 minutes of two runs).
MAX_RECENT = 1800


class StepRate:
    """Turns the ledger's runs in progress into ``steps`` events of ``session``."""

    def __init__(self, session: Session, period_s: float = PERIOD_S):
        self._session = session
        self.period_s = period_s
        # Per run: (perf_counter, steps kept) at the start of its interval.
        self._since: weakref.WeakKeyDictionary[goodput.Account, tuple[float, int]] = weakref.WeakKeyDictionary()
        #: The newest ``steps`` events, oldest first (appended on the telemetry thread only).
        self.recent: collections.deque[Event] = collections.deque(maxlen=MAX_RECENT)

    def poll(self) -> None:
        """Emit a ``steps`` event for each run whose interval is over and that advanced in it."""
        if not hasattr(self._session, "component"):
            return  # a benchmark's stand-in session: it has no ledger, so no runs
        now = time.perf_counter()
        for account in list(goodput.ledger(self._session).active):
            steps = account.steps
            since = self._since.get(account)
            if since is None:
                since = self._since[account] = (now - account.wall_s, 0)  # from the run's start
            if steps < since[1]:
                self._since[account] = (now, steps)
                continue
            started, steps_before = since
            if now - started < self.period_s or steps == steps_before:
                continue
            self._since[account] = (now, steps)
            done = steps - steps_before
            event = self._session.events.publish(
                "steps",
                step=steps,
                duration_s=(now - started) / done,
                detail=f"{account.kind} '{account.name}': {done / (now - started):.4g} steps/s",
            )
            self.recent.append(event)


__all__ = ["MAX_RECENT", "PERIOD_S", "StepRate"]
