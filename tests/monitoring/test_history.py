"""The kernel's bounded metrics history: what a view that opens late is shown."""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest
from waiting import wait_until

from pathways_kernel.emulator.faults import fail_slice, repair_slice
from pathways_kernel.monitoring import history, telemetry
from pathways_kernel.monitoring.quantize import quantize_utilization


def frame(t: float, util: np.ndarray, memory: np.ndarray, states: tuple[str, ...], per_slice: int):
    slices = tuple(
        telemetry.SliceMetrics(
            i,
            state,
            float(util[i * per_slice : (i + 1) * per_slice].mean()),
            int(memory[i * per_slice : (i + 1) * per_slice].sum()),
            None,
        )
        for i, state in enumerate(states)
    )
    return telemetry.Metrics(int(t * 10), t, 1, "test", 2.0, util, memory, None, slices, float(util.mean()))


def test_rings_keep_the_last_minutes_oldest_first_with_each_points_slice_state():
    h = history.History(slices=2, chips=8, publish_hz=2.0)
    memory = np.full(8, 1 << 20, np.int64)
    points = history.SLICE_HISTORY_S * 2 + 50  # more than fits: the oldest 50 go
    for i in range(points):
        util = np.full(8, (i % 100) / 100, np.float32)
        states = ("up", "down") if i >= points - 10 else ("up", "up")
        h.record(frame(1000.0 + i / 2, util, memory, states, 4))
    series = h.slice_series()
    assert len(series["time"]) == history.SLICE_HISTORY_S * 2
    assert series["time"][0] == 1000.0 + 50 / 2 and np.all(np.diff(series["time"]) > 0)
    # Slice 1 is down only for the last 10 points, not over its whole history.
    assert series["up"][:, 1].sum() == len(series["time"]) - 10 and series["up"][:, 0].all()
    np.testing.assert_allclose(series["util"][-1], ((points - 1) % 100) / 100)
    # Chips: one point a second for 5 minutes, quantized as the protocol sends them.
    chips = h.chip_series(4, 8)
    assert len(chips["time"]) == history.CHIP_HISTORY_S and chips["util"].shape == (history.CHIP_HISTORY_S, 4)
    assert np.all(np.diff(chips["time"]) >= 0.95)
    last = round((chips["time"][-1] - 1000.0) * 2)  # the frame the last chip point came from
    np.testing.assert_array_equal(chips["util"][-1], quantize_utilization(np.full(4, (last % 100) / 100)))
    assert len(h.slice_series(since=series["time"][-3])["time"]) == 3


def test_memory_is_bounded_by_the_stated_formula_at_65536_chips():
    h = history.History(slices=64, chips=65_536, publish_hz=2.0)
    assert h.keeps_chips
    assert h.nbytes == history.bytes_for(64, 65_536, 2.0) <= history.MAX_BYTES
    assert 40e6 < h.nbytes < 42e6  # 1.5 MB per slice series + 39.3 MB per chip, as the module docstring says
    # A layout that would not fit keeps slice history only, never more than the bound.
    huge = history.History(slices=256, chips=1 << 20, publish_hz=2.0)
    assert not huge.keeps_chips and huge.nbytes <= history.MAX_BYTES
    assert huge.chip_series()["util"].size == 0


def test_a_frame_of_another_layout_is_ignored():
    h = history.History(slices=2, chips=8, publish_hz=2.0)
    h.record(frame(1.0, np.zeros(4, np.float32), np.zeros(4, np.int64), ("up",), 4))
    assert len(h) == 0


def test_the_hub_keeps_history_after_its_last_subscriber_leaves(local_session):
    hub = telemetry.hub(local_session)
    x = jax.device_put(np.ones((8, 128), np.float32), local_session.devices()[0])
    sub = hub.subscribe(on_metrics=lambda m: None)
    wait_until(lambda: hub.history() is not None and len(hub.history()) >= 2, 10)
    sub.close()
    before = len(hub.history())
    time.sleep(2.5)  # nobody subscribed: the hub samples once a second for the history
    after = hub.history().slice_series()
    assert len(after["time"]) >= before + 2, (before, len(after["time"]))
    assert after["bytes"][-1, 0] >= x.nbytes  # slice 0 holds x
    del x


def test_a_lost_slice_is_down_in_history_only_from_its_loss(local_session):
    hub = telemetry.hub(local_session)
    # The session's hub keeps earlier tests' samples (a slice they failed): this test reads its own.
    started = time.time()
    sub = hub.subscribe(on_metrics=lambda m: None)
    try:
        time.sleep(1.2)
        lost_at = time.time()
        fail_slice(1)
        time.sleep(1.5)
        series = hub.history().slice_series()
        before = (series["time"] > started) & (series["time"] < lost_at - 0.3)
        after = series["time"] > lost_at + 0.6
        assert before.any() and after.any()
        assert series["up"][before, 1].all() and not series["up"][after, 1].any()
        assert series["up"][:, 0].all()
    finally:
        sub.close()
        repair_slice(1)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
