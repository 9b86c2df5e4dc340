"""Step time and throughput of a running loop reach views as ``steps`` events (training/step_rate.py)."""

from __future__ import annotations

import re
import time

import pytest

import pathways_kernel as pw
from pathways_kernel.monitoring import telemetry

# Steps per second and step time within bounds: run with the machine to itself.
pytestmark = pytest.mark.serial


def test_a_running_loop_reports_its_step_rate_once_a_second(local_session):
    hub = telemetry.hub(local_session)
    seen = []
    unlisten = local_session.events.subscribe(seen.append)
    sub = hub.subscribe(rate=2)  # the dashboard's comm: the hub samples while someone watches
    try:
        began = time.monotonic()
        for _ in pw.steps(range(250), name="rate-test"):
            time.sleep(0.01)
        wall = time.monotonic() - began
    finally:
        sub.close()
        unlisten()
    events = [e for e in seen if e.kind == "steps" and "'rate-test'" in e.detail]
    assert len(events) >= 2, [e.to_text() for e in events]
    assert len(events) <= wall + 1, "at most one steps event per second"
    steps = [e.step for e in events]
    assert steps == sorted(steps) and steps[-1] <= 250
    for e in events:
        assert e.detail.startswith("steps 'rate-test': ")
        rate = float(re.search(r": ([0-9.e+]+) steps/s$", e.detail).group(1))
        # Each step sleeps 10 ms: under 100 steps/s, and most of the wall time is steps.
        assert 40 <= rate <= 100, e.detail
        assert 0.009 <= e.duration_s <= 0.03, e.to_text()
    assert all(b.time - a.time >= 0.9 for a, b in zip(events, events[1:], strict=False))
    # A periodic reading reaches live views but is not kept: the log keeps the events that matter.
    assert not [e for e in local_session.events.last() if e.kind == "steps"]


def test_live_step_time_is_wall_time_per_step_as_the_goodput_intervals_read_it(local_session):
    """Issue #31 item 4: the live chart read productive seconds per step (<= 300 ms) where
    "Mean step time per interval" read the steps' wall time (> 2,000 ms) for the same run;
    a loop that waits for its data is where the two part: 30 ms of waiting, 10 ms of step."""
    hub = telemetry.hub(local_session)
    seen = []
    unlisten = local_session.events.subscribe(seen.append)
    sub = hub.subscribe(rate=2)

    def slow_batches():
        for i in range(100):
            time.sleep(0.03)
            yield i

    try:
        for _ in pw.steps(slow_batches(), name="rate-wait"):
            time.sleep(0.01)
    finally:
        sub.close()
        unlisten()
    events = [e for e in seen if e.kind == "steps" and "'rate-wait'" in e.detail]
    assert len(events) >= 2, [e.to_text() for e in events]
    intervals = pw.goodput_over_time("rate-wait", intervals=1)
    mean = float(intervals["step_time_mean_s"].iloc[0])
    for e in events:
        rate = float(re.search(r": ([0-9.e+]+) steps/s$", e.detail).group(1))
        assert e.duration_s * rate == pytest.approx(1.0, rel=0.01), e.to_text()  # step time is 1 / throughput
    # On the intervals' scale: the live points' median within the run's mean step time (a loaded
    # machine's stall may lengthen one interval, not the middle of them).
    median = sorted(e.duration_s for e in events)[len(events) // 2]
    assert 0.7 * mean <= median <= 1.5 * mean, ([e.to_text() for e in events], mean)


def test_a_view_that_opens_after_a_loop_ran_is_replayed_its_step_rate():
    """Issue #31 item 4: a dashboard opened while an elastic cell ran on local:2x4 showed the run's loss and
    goodput (both replayed) and no step time at all: steps events are published, never logged, so a view
    that subscribed mid-run (or again) had none from before it."""
    from comm_frontend import Frontend, is_comm_msg
    from kernels import Kernel

    k = Kernel()
    try:
        frontend = Frontend(k)
        panel = frontend.open()  # the panel's comm: the kernel's telemetry runs while it is open
        assert frontend.wait_for(lambda m: is_comm_msg(m, panel, "topology"), timeout=60) is not None
        reply = k.run("import time\nfor _ in pw.steps(range(60), name='before'):\n    time.sleep(0.05)\nprint('ran')")
        assert "ran" in reply.text, reply.error
        comm = frontend.open()  # the dashboard, opened after the loop ran
        assert frontend.wait_for(lambda m: is_comm_msg(m, comm, "topology"), timeout=60) is not None

        def is_steps(m):
            return is_comm_msg(m, comm, "event") and m["content"]["data"]["event"]["kind"] == "steps"

        assert frontend.wait_for(is_steps, timeout=20) is not None, "no step rate replayed"
        frontend.wait_for(lambda m: is_comm_msg(m, comm, "metrics"), timeout=20)  # the replay is sent before metrics
        steps = [m["content"]["data"]["event"] for m in frontend.inbox if is_steps(m)]
        assert steps and all("steps 'before'" in e["detail"] for e in steps), steps
        assert steps[-1]["step"] <= 60 and steps[-1]["duration_s"] >= 0.05
    finally:
        k.km.shutdown_kernel(now=True)
