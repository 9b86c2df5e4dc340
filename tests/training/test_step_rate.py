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
