"""Training metrics reach the monitor: a new comm catches up with the session's points, then gets each new batch."""

from __future__ import annotations

import pytest
from comm_frontend import Frontend
from comm_frontend import is_comm_msg as _is

from pathways_kernel.monitoring import protocol as p

LOG = """for i in pw.steps(range({steps}), name="{name}", progress=False):
    pw.log(loss=1.0 / (i + 1), acc=float(i))
pw.metrics()
print("logged")"""


@pytest.fixture(scope="module")
def frontend(kernel):
    assert kernel.run("x = 1").status == "ok"
    return Frontend(kernel)


def points_of(msg) -> list[dict]:
    data = msg["content"]["data"]
    assert msg["buffers"] == [] and set(data) == {"v", "type", "replay", "points"}
    for point in data["points"]:
        assert tuple(point) == p.METRIC_POINT_FIELDS
    return data["points"]


def test_a_new_comm_gets_the_runs_so_far_then_live_points(frontend, kernel):
    assert "logged" in kernel.run(LOG.format(steps=5, name="first")).text
    comm = frontend.open()
    msg = frontend.wait_for(lambda m: _is(m, comm, "metric_points"), timeout=30)
    assert msg is not None, "no metric_points after comm_open"
    assert msg["content"]["data"]["replay"] is True
    replayed = [pt for pt in points_of(msg) if pt["run"].startswith("first")]
    assert [(pt["step"], pt["name"]) for pt in replayed if pt["name"] == "loss"] == [(s, "loss") for s in range(5)]
    assert replayed[0]["value"] == 1.0 and replayed[-1]["name"] == "acc" and replayed[-1]["value"] == 4.0

    since = len(frontend.inbox)
    frontend.kc.execute(LOG.format(steps=3, name="second"))  # not kernel.run: it would take the comm messages
    live: list[dict] = []

    def got_all(m) -> bool:
        if _is(m, comm, "metric_points"):
            assert m["content"]["data"]["replay"] is False
            live.extend(points_of(m))
        return len(live) >= 6

    assert frontend.wait_for(got_all, timeout=30, since=since) is not None, live
    assert {pt["run"] for pt in live} == {"second #1"}
    assert min(pt["seq"] for pt in live) > max(pt["seq"] for pt in replayed)
    frontend.wait_for(lambda m: False, timeout=2)  # the cell's own output, before the next test runs code


def test_non_finite_values_travel_as_null():
    data, buffers = p.encode_metric_points(
        [{"seq": 1, "run": "r #1", "step": 0, "time": 1.0, "elapsed_s": 0.0, "name": "loss", "value": float("nan")}],
        replay=False,
    )
    assert buffers == [] and data["points"][0]["value"] is None
