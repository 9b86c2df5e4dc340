"""Goodput over time, step time and the report's header, on real JAX CPU slices (local:2x4):
the intervals say when the badput happened, add up to the ledger, and bad requests are one line."""

from __future__ import annotations

import math
import re
import time

import jax
import jax.numpy as jnp

# The field library is imported on a run's first use; do it now, outside the timed runs.
import ml_goodput_measurement.src.goodput_elastic  # noqa: F401
import numpy as np
import pandas as pd
import pytest

import pathways_kernel as pw
from pathways_kernel.emulator import chaosmonkey, faults
from pathways_kernel.training import goodput, goodput_report

# Accounting ratios of loops timed in wall seconds: run with the machine to themselves.
pytestmark = pytest.mark.serial

STEP_S = 0.01


@pytest.fixture(autouse=True)
def all_slices_up(local_session):
    chaosmonkey.chaos_off()
    yield local_session
    chaosmonkey.chaos_off()


@jax.jit
def matmul(w, x):
    return jnp.tanh(x @ w)


@pytest.fixture
def w(all_slices_up):
    w = jnp.ones((64, 64))
    matmul(w, jnp.ones((8, 64))).block_until_ready()
    return w


def _adds_up_to_the_ledger(frame: pd.DataFrame, name: str) -> None:
    seconds = pw.goodput(name, field=False).seconds
    for category in goodput.CATEGORIES:
        assert frame[category].sum() == pytest.approx(seconds[category], abs=1e-6), category
    # Each interval holds its own span (within a bucket's rounding at the run's end).
    spans = frame["end_s"] - frame["start_s"]
    parts = frame[list(goodput.CATEGORIES)].sum(axis=1)
    assert np.allclose(parts[:-1], spans[:-1], atol=0.01 * spans.max()), (list(parts), list(spans))
    assert (frame[list(goodput.CATEGORIES)] >= -1e-9).all().all(), frame


def test_a_slow_stretch_of_data_shows_in_the_intervals_it_happened_in(w):
    slow = []

    def batches():
        for i in range(90):
            if i in (40, 50):
                slow.append(time.perf_counter())
            if 40 <= i < 50:
                time.sleep(0.06)  # ten steps in the middle wait for data
            yield jnp.ones((8, 64))

    for x in pw.steps(batches(), name="stretch"):
        matmul(w, x).block_until_ready()
        time.sleep(STEP_S)

    frame = pw.goodput_over_time("stretch", intervals=10)
    assert isinstance(frame, pd.DataFrame) and len(frame) == 10
    _adds_up_to_the_ledger(frame, "stretch")
    share = frame["data_wait"] / (frame["end_s"] - frame["start_s"])
    began = goodput.ledger().find("stretch")._began  # the run's time 0 (perf_counter)
    lo, hi = slow[0] - began, slow[1] - began
    # The waits show in the intervals they happened in, and nowhere else.
    assert share.max() > 0.5, list(share)
    inside = (frame["end_s"] > lo) & (frame["start_s"] < hi)
    assert inside.any() and (share[~inside] < 0.25).all(), (lo, hi, list(share))
    assert frame["goodput"][share > 0.5].max() < frame["goodput"][~inside].min(), frame

    windows = pw.goodput_over_time("stretch", window_s=0.25)
    assert (windows["end_s"] - windows["start_s"]).iloc[:-1].round(6).eq(0.25).all()
    assert windows["end_s"].iloc[-1] == pytest.approx(frame["end_s"].iloc[-1])
    _adds_up_to_the_ledger(windows, "stretch")
    # Step times per interval: the slow stretch's steps take longer.
    slow = windows.loc[windows["data_wait"] / 0.25 > 0.5, "step_time_mean_s"]
    fast = windows.loc[windows["data_wait"] / 0.25 < 0.1, "step_time_mean_s"].dropna()
    assert len(slow) and len(fast), windows
    assert slow.max() > fast.max() + 0.03, windows


def test_redone_steps_sit_where_they_were_first_run_and_no_interval_goes_negative(w):
    failed = []

    def step_fn(st, step, mesh):
        if step == 25 and not failed:
            failed.append(step)
            faults.fail_slice(1)
        time.sleep(STEP_S)
        return jax.tree.map(lambda a: a * 0.999, st)

    train = pw.elastic(step_fn, snapshot_every=10, name="over-time-loss")
    mesh = pw.session().mesh()
    state = {"w": jax.device_put(jnp.ones((64, 64)), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))}
    train(state, steps=60)
    faults.repair_slice(1)

    frame = pw.goodput_over_time("over-time-loss", intervals=12)
    _adds_up_to_the_ledger(frame, "over-time-loss")
    redone = frame[frame["redone"] > 0.002]
    recovery = frame[frame["recovery"] > 0.002]
    assert len(redone) and len(recovery), frame
    # Steps 20..25 were redone: their first run came before the recovery, not at the end of the run.
    assert redone["start_s"].min() <= recovery["start_s"].min(), frame
    assert frame["redone"].iloc[-1] < 0.002, frame


def test_step_time_names_the_median_the_spread_and_the_slowest_steps(w):
    for step in pw.steps(range(30), name="one-slow-step"):
        matmul(w, jnp.ones((8, 64))).block_until_ready()
        time.sleep(0.25 if step == 7 else STEP_S)

    stats = pw.goodput_over_time("one-slow-step", intervals=3).attrs["step_time"]
    assert stats["steps"] == 29
    assert stats["slowest"][0][0] == 7 and stats["slowest"][0][1] >= 0.25
    assert STEP_S <= stats["median_s"] < 0.1 < stats["mean_s"] * 10
    assert stats["std_s"] > 0.03  # one 250 ms step among 10 ms ones
    assert stats["mean_s"] > stats["median_s"]
    text = pw.goodput("one-slow-step", field=False).to_text()
    assert re.search(
        r"step time: median [\d.]+ ms, mean [\d.]+ ms, std [\d.]+ ms over 29 steps; slowest: step 7 2\d\d\.\d ms", text
    ), text


def test_the_report_header_says_which_run_it_is(w):
    before = time.time()
    for x in pw.steps([jnp.ones((8, 64))] * 5, name="headed"):
        matmul(w, x).block_until_ready()
    text = pw.goodput("headed", field=False).to_text()
    first = text.splitlines()[0]
    m = re.match(
        r"run 'headed' \(steps, outside a cell, 1 attempt, (\d\d:\d\d:\d\d\.\d{3})-(\d\d:\d\d:\d\d\.\d{3}) UTC, [\d.]+ s\): goodput [\d.]+%$",
        first,
    )
    assert m, first
    started = time.strftime("%H:%M:%S", time.gmtime(before))
    assert m.group(1)[:8] >= started or started == "23:59:59"
    session = pw.goodput(field=False).to_text().splitlines()
    assert re.match(r"session, \d+ runs?: goodput", session[0]), session[0]
    assert any(line.strip().startswith("run 'headed' (steps") for line in session), session


def test_the_chart_is_a_theme_aware_stacked_svg_with_a_text_fallback(w):
    for x in pw.steps([jnp.ones((8, 64))] * 10, name="charted"):
        matmul(w, x).block_until_ready()
        time.sleep(STEP_S)
    shown = goodput_report.OverTime(pw.goodput_over_time("charted", intervals=8))
    html = shown._repr_html_()
    assert html.count("<svg") == 1 and "var(--jp-ui-font-color1)" in html and "var(--jp-success-color1" in html
    assert "<title>" in html and "productive steps" in html  # a tooltip per segment, a legend
    bars = {m for m in re.findall(r'<rect x="([\d.]+)"', html)}
    assert len(bars) == 8, bars
    text = shown.to_text().splitlines()
    assert text[0].startswith("run 'charted' (steps") and text[0].endswith("goodput over 8 intervals")
    assert len([line for line in text if re.match(r"\s+\d+\.\d\d-\s*\d+\.\d\d s", line)]) == 8
    assert text[-1].strip().startswith("step time: median")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"intervals": 0}, "intervals must be from 1 to 1000, got 0"),
        ({"intervals": -3}, "intervals must be from 1 to 1000, got -3"),
        ({"intervals": 10**9}, "intervals must be from 1 to 1000"),
        ({"intervals": 2.5}, "intervals must be a whole number"),
        ({"window_s": 0}, "window_s must be a finite number of seconds above 0, got 0"),
        ({"window_s": -1.0}, "above 0, got -1.0"),
        ({"window_s": math.nan}, "above 0, got nan"),
        ({"window_s": math.inf}, "above 0, got inf"),
        ({"window_s": 1e9}, "window 1e+09 s is longer than run 'bad-input'"),
        ({"window_s": 1e-9}, "intervals, more than 1000: give at least"),
        ({"intervals": 4, "window_s": 0.1}, "give intervals or window_s, not both"),
        ({"run": "nope"}, "no run named 'nope' in this session; runs: "),
    ],
)
def test_bad_requests_are_one_line(w, kwargs, message):
    if goodput.ledger().find("bad-input") is None:
        for x in pw.steps([jnp.ones((8, 64))] * 3, name="bad-input"):
            matmul(w, x).block_until_ready()
    kwargs = {"run": "bad-input", **kwargs}
    with pytest.raises(pw.PathwaysError) as error:
        pw.goodput_over_time(**kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_asking_for_intervals_while_a_run_goes_on_in_another_thread_leaves_the_run_alone(w):
    import threading

    errors: list[BaseException] = []

    def train():
        try:
            for x in pw.steps([jnp.ones((8, 64))] * 400, name="asked-during"):
                matmul(w, x).block_until_ready()
        except BaseException as error:  # the test reports it
            errors.append(error)

    runner = threading.Thread(target=train)
    runner.start()
    asked = 0
    while runner.is_alive():
        if goodput.ledger().find("asked-during") is not None:
            frame = pw.goodput_over_time("asked-during", intervals=5)
            assert (frame[list(goodput.CATEGORIES)] >= -1e-9).all().all()
            asked += 1
    runner.join()
    assert not errors, errors
    assert asked > 0
    frame = pw.goodput_over_time("asked-during", intervals=5)
    _adds_up_to_the_ledger(frame, "asked-during")
    assert frame.attrs["step_time"]["steps"] == 399
