"""A run's step events: the elastic loop publishes what happens, its followers make of it what they need.

The loop says that a step begins and ends, that a loss was detected and that
it trains again, that a snapshot started, that time goes to a phase (waiting
for a slice, scaling up, stalling on a snapshot), that it waits for the
steps' device work or a snapshot's copy, and that the run ended. The
goodput ledger follows a run (``accounting.LedgerFollower``: where its time
goes) and so does the session's metric log (``metric_log.LossFollower``: the
loss in each step's output); the loop keeps no accounts of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class StepFollower:
    """What a follower hears of a run; each event does nothing unless a follower overrides it."""

    def step_begin(self, step: int) -> None:
        """Step ``step`` begins."""

    def step_end(self, step: int, output: Any) -> None:
        """Step ``step`` returned ``output`` (its device work may still run)."""

    def recovery_begin(self) -> None:
        """A slice loss was detected: recovery starts."""

    def recovery_end(self, step: int) -> None:
        """Training again from ``step``: steps from there on are redone."""

    def snapshot_started(self, state: Any) -> None:
        """A snapshot of ``state`` is copying while the next steps run."""

    def phase(self, category: str) -> contextlib.AbstractContextManager[Any]:
        """The time inside the block goes to ``category`` (a goodput badput category)."""
        return contextlib.nullcontext()

    def device_wait(self) -> contextlib.AbstractContextManager[Any]:
        """Inside the block the loop waits for the steps' device work."""
        return contextlib.nullcontext()

    def snapshot_wait(self) -> contextlib.AbstractContextManager[Any]:
        """Inside the block the loop waits for a snapshot's copy."""
        return contextlib.nullcontext()

    def end(self) -> None:
        """The run ended, however it did."""


class RunEvents:
    """One run's step events, told to its followers in the order they were given."""

    def __init__(self, *followers: StepFollower) -> None:
        self.followers = list(followers)

    def step_begin(self, step: int) -> None:
        for follower in self.followers:
            follower.step_begin(step)

    def step_end(self, step: int, output: Any) -> None:
        for follower in self.followers:
            follower.step_end(step, output)

    def recovery_begin(self) -> None:
        for follower in self.followers:
            follower.recovery_begin()

    def recovery_end(self, step: int) -> None:
        for follower in self.followers:
            follower.recovery_end(step)

    def snapshot_started(self, state: Any) -> None:
        for follower in self.followers:
            follower.snapshot_started(state)

    @contextlib.contextmanager
    def phase(self, category: str) -> Iterator[None]:
        with contextlib.ExitStack() as blocks:
            for follower in self.followers:
                blocks.enter_context(follower.phase(category))
            yield

    @contextlib.contextmanager
    def device_wait(self) -> Iterator[None]:
        with contextlib.ExitStack() as blocks:
            for follower in self.followers:
                blocks.enter_context(follower.device_wait())
            yield

    @contextlib.contextmanager
    def snapshot_wait(self) -> Iterator[None]:
        with contextlib.ExitStack() as blocks:
            for follower in self.followers:
                blocks.enter_context(follower.snapshot_wait())
            yield

    def end(self) -> None:
        for follower in self.followers:
            follower.end()
