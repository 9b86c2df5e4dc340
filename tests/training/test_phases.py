"""A loop's phases by role (``pw.phase``, training/phases.py): to the dashboard and into ``%pathways goodput``."""

from __future__ import annotations

import re

import pytest
from comm_frontend import Frontend, is_comm_msg
from kernels import Kernel
from load import cpu_hogs

from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.monitoring import protocol
from pathways_kernel.training import phases
from pathways_kernel.training.phases import Span


def _span(role: str, phase: str, start: float, end: float) -> Span:
    return Span(1, "rl", phase, role, "", (), start, end, None)


def test_each_role_is_busy_in_its_phases_and_waits_while_only_the_other_works():
    spans = [
        _span("rollout", "rollout", 0, 6),
        _span("rollout", "reward", 6, 7),
        _span("trainer", "update", 7, 9),
        _span("trainer", "sync", 9, 10),
    ]
    split = phases.role_split(spans, 0, 10)
    trainer, rollout = split["trainer"], split["rollout"]
    assert trainer.busy_s == pytest.approx(3) and trainer.waited_s == {"rollout": pytest.approx(7)}
    assert rollout.busy_s == pytest.approx(7) and rollout.waited_s == {"trainer": pytest.approx(3)}
    assert trainer.phases == {"update": pytest.approx(2), "sync": pytest.approx(1)}
    assert (
        "trainer: busy 30.0% (update 20.0%, sync 10.0%) · waited for rollout 70.0% · neither 0.0%" in trainer.to_text()
    )
    # Overlapping phases (rollout and training at once on disjoint slices) are nobody's wait.
    overlapped = phases.role_split([_span("rollout", "rollout", 0, 6), _span("trainer", "update", 2, 8)], 0, 10)
    assert overlapped["trainer"].waited_s["rollout"] == pytest.approx(2)
    assert overlapped["rollout"].waited_s["trainer"] == pytest.approx(2)
    assert overlapped["rollout"].idle_s == pytest.approx(2)


def test_a_phase_without_a_role_its_name_does_not_say_is_one_line(local_session):
    with (
        pytest.raises(PathwaysError, match=r"pw.phase\('think'\): say whose time it is with role="),
        phases.phase("think"),
    ):
        pass


LOOP = """
import time
import numpy as np
from jax.sharding import Mesh
import pathways_kernel as pw

slices = pw.session().topology
trainer_mesh = Mesh(np.array(slices.slice(0).devices), ("x",))
rollout_mesh = Mesh(np.array(slices.slice(1).devices), ("x",))
for step in pw.steps(range(4), name="rl"):
    with pw.phase("rollout", mesh=rollout_mesh):
        time.sleep(0.3)
    with pw.phase("reward", mesh=rollout_mesh):
        time.sleep(0.05)
    with pw.phase("update", mesh=trainer_mesh):
        time.sleep(0.1)
    with pw.phase("sync", mesh=trainer_mesh):
        time.sleep(0.05)
print("done")
"""


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    yield k
    k.km.shutdown_kernel(now=True)


def test_phases_reach_the_dashboard_and_goodput_splits_the_run_by_role(kernel):
    frontend = Frontend(kernel)
    comm = frontend.open()
    assert frontend.wait_for(lambda m: is_comm_msg(m, comm, "topology"), timeout=60) is not None
    with cpu_hogs(2):
        # Live spans arrive while the loop runs: read them as the dashboard does, beside the cell.
        cell = frontend.kc.execute(LOOP)
        spans: list[dict] = []
        seen = 0
        while len(spans) < 16:
            msg = frontend.wait_for(lambda m: is_comm_msg(m, comm, "phases"), timeout=60, since=seen)
            assert msg is not None, f"{len(spans)} spans reached the frontend"
            seen = frontend.inbox.index(msg) + 1
            spans += protocol_spans(msg)
        idle = frontend.wait_for(lambda m: False, timeout=0) or _idle(frontend, cell)
    assert idle, "the loop's cell did not finish"
    assert [s["phase"] for s in spans[:4]] == ["rollout", "reward", "update", "sync"]
    assert {s["role"] for s in spans} == {"rollout", "trainer"}
    assert {s["mesh"] for s in spans if s["role"] == "rollout"} == {"slice 1"}
    assert {s["slices"][0] for s in spans if s["role"] == "trainer"} == {0}
    assert [s["step"] for s in spans[::4]] == [0, 1, 2, 3] and all(s["run"] == "rl" for s in spans)
    assert all(s["end"] - s["start"] >= 0.04 for s in spans)

    text = kernel.run("%pathways goodput --run rl --no-field").text
    trainer = re.search(r"trainer \(slice 0\): busy ([\d.]+)% .* waited for rollout ([\d.]+)%", text)
    rollout = re.search(r"rollout \(slice 1\): busy ([\d.]+)% .* waited for trainer ([\d.]+)%", text)
    assert trainer and rollout, text
    # The rollout phases take 0.35 s of each 0.5 s step, the trainer's 0.15 s (sleeps; more under load).
    busy_t, waited_t = float(trainer[1]), float(trainer[2])
    busy_r, waited_r = float(rollout[1]), float(rollout[2])
    assert waited_t > 2 * busy_t and busy_r > 2 * waited_r, text
    assert busy_t == pytest.approx(waited_r, abs=0.2) and busy_r == pytest.approx(waited_t, abs=0.2), text

    # A view that opens later is replayed the spans so far.
    late = frontend.open()
    msg = frontend.wait_for(lambda m: is_comm_msg(m, late, "phases"), timeout=30)
    assert msg is not None and msg["content"]["data"]["replay"] and len(protocol_spans(msg)) == 16


def _idle(frontend: Frontend, msg_id: str) -> bool:
    """Wait (60 s at most) for the cell ``msg_id`` to finish."""

    def done() -> bool:
        return any(
            m["parent_header"].get("msg_id") == msg_id and m["content"]["execution_state"] == "idle"
            for m in frontend.statuses
        )

    for _ in range(600):
        if done():
            return True
        frontend.pump(0.1)
    return done()


def protocol_spans(msg: dict) -> list[dict]:
    import monitor_frontend

    return monitor_frontend.decode_phases(msg["content"]["data"], msg.get("buffers", []))["spans"]


def test_the_replay_is_bounded_as_the_log_is():
    assert phases.MAX_SPANS == protocol.MAX_REPLAY_SPANS
