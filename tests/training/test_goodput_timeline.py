"""The timeline's folding on its own (no JAX): a correction the ledger makes after the fact
never leaves an interval with negative seconds, and the intervals still add up to the ledger."""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from pathways_kernel.training.goodput_timeline import MOVE, STEP, Timeline

CATS = ("productive", "redone", "snapshot_stall")


def _fold(records: list[tuple[float, float, float, float]], moves: list) -> Timeline:
    timeline = Timeline(CATS)
    timeline.fold(array("d", [x for r in records for x in r]), moves, began=0.0)
    return timeline


@pytest.mark.parametrize("excess", [1e-9, 2e-5, 0.004])
def test_a_rollback_a_little_larger_than_its_steps_window_leaves_no_interval_negative(excess):
    # Steps 0..9 of 10 ms each; the rollback to step 5 redoes their productive time,
    # and the ledger's figure reads a little more than the window holds (its clock read
    # just before step 5's mark: the CI failure read productive < 0 in one interval).
    records: list[tuple[float, float, float, float]] = []
    for step in range(10):
        t = step * 0.01
        records += [(t, t, STEP, step), (t, t + 0.01, 0, 0.01)]
    redone = 0.05 + excess
    records.append((0.1, 0.1, MOVE, 0))
    timeline = _fold(records, [("productive", "redone", redone, 5)])

    edges = np.linspace(0.0, 0.1, 11)
    seconds = timeline.intervals(0.1, edges, None)
    assert (seconds >= -1e-12).all(), seconds
    assert seconds[:, 0].sum() == pytest.approx(0.1 - redone, abs=1e-12)
    assert seconds[:, 1].sum() == pytest.approx(redone, abs=1e-12)
    # The redone time sits where steps 5..9 first ran, the excess just before them.
    assert seconds[5:, 1] == pytest.approx(np.full(5, 0.01), abs=1e-12)
    assert seconds[:5, 1].sum() == pytest.approx(excess, abs=1e-12)
