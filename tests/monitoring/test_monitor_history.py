"""Monitor history through a real `pathways` kernel: a view that comes back sees the past at once.

Acts as the panel (tests/monitoring/test_monitor_kernel.py's Frontend): one comm watches a
slice fill with data and go down, closes (the user switches notebook tabs),
and a comm opened later gets the kernel's history right after the topology,
then asks for per-chip series on demand.
"""

from __future__ import annotations

import time

import monitor_frontend
import numpy as np
from comm_frontend import Frontend
from comm_frontend import is_comm_msg as _is


def _first_after(frontend: Frontend, comm: str, kind: str, timeout: float = 30) -> dict:
    msg = frontend.wait_for(lambda m: _is(m, comm, kind), timeout=timeout)
    assert msg is not None, f"no {kind} on comm {comm}"
    return msg


def test_a_view_that_comes_back_gets_the_history_right_after_the_topology(kernel):
    frontend = Frontend(kernel)
    first = frontend.open()
    _first_after(frontend, first, "metrics")
    assert (
        kernel.run(
            "import jax, jax.numpy as jnp\n"
            "import pathways_kernel as pw\n"
            "held = jax.device_put(jnp.ones((4 << 20,), jnp.float32), pw.topology().slices[1].chips[0].device)\n"
            "held.block_until_ready()"
        ).status
        == "ok"
    )
    time.sleep(2.5)
    before_loss = time.time()
    request_id = frontend.request(first, "fail_slice", slice=1)
    assert frontend.reply_to(first, request_id, timeout=30)["ok"]
    time.sleep(2.5)
    # The user switches to another tab: the panel closes its comm.
    frontend._send("comm_close", {"comm_id": first, "data": {}})
    time.sleep(2.5)

    mark = len(frontend.inbox)
    opened = time.time()
    second = frontend.open()
    mine = lambda m: m["content"].get("comm_id") == second and m["header"]["msg_type"] == "comm_msg"  # noqa: E731
    frontend.wait_for(lambda m: _is(m, second, "history"), timeout=30, since=mark)
    kinds = [m["content"]["data"]["type"] for m in frontend.inbox[mark:] if mine(m)]
    assert kinds[:2] == ["topology", "history"], kinds

    msg = next(m for m in frontend.inbox[mark:] if _is(m, second, "history"))
    history = monitor_frontend.decode_history(msg["content"]["data"], msg["buffers"])
    assert history.slices == (0, 1)
    assert history.time[0] < before_loss - 2, "the history reaches back before the slice was lost"
    assert history.time[-1] > opened - 1.5, "the hub kept sampling while no view was open"
    up = history.up[:, 1]
    assert up[0] and not up[-1], "slice 1 was up, then down"
    assert np.all(np.diff(up.astype(int)) <= 0), "down from its loss on only, never before"
    assert history.memory_bytes[up, 1].max() >= 16 << 20, "the 16 MiB array on slice 1 shows before the loss"
    assert np.all(history.utilization[~up, 1] == 0)

    request_id = frontend.request(second, "chip_history", start=4, stop=8)
    reply = frontend.wait_for(
        lambda m: _is(m, second, "reply") and m["content"]["data"]["request_id"] == request_id, timeout=30
    )
    chips = monitor_frontend.decode_chip_history(reply["content"]["data"], reply["buffers"])
    assert chips.points >= 5 and chips.utilization.shape == (chips.points, 4)
    assert int(chips.memory[:, 0].max()) * chips.memory_unit >= 16 << 20, "chip 4 held the array"
    assert np.all(np.diff(chips.time) >= 0.9), "one point a second"

    request_id = frontend.request(second, "chip_history", start=4, stop=9)
    refused = frontend.reply_to(second, request_id, timeout=30)
    assert refused["ok"] is False and "topology has 8" in refused["error"] and "\n" not in refused["error"]
    request_id = frontend.request(second, "repair_slice", slice=1)
    assert frontend.reply_to(second, request_id, timeout=30)["ok"]


def test_arrays_lost_with_a_slice_count_for_no_memory_after_it_is_restored(local_session):
    """Defect: slice 1 showed 32 MiB in use after fail + restore, with nothing usable on it."""
    import jax
    import jax.numpy as jnp

    from pathways_kernel.emulator.faults import fail_slice, repair_slice
    from pathways_kernel.monitoring import telemetry

    # The source the hub samples with: the backend's leftovers (keepers of a lost slice's buffers
    # for readers still in flight, which earlier tests in this process may have left) count nowhere.
    source = telemetry.ClientSource(local_session.backend.is_leftover)
    chip = local_session.topology.slices[1].chips[0].device
    lost = jax.device_put(jnp.ones((4 << 20,), jnp.float32), chip).block_until_ready()

    def slice1_bytes() -> int:
        layout = telemetry.Layout.of(local_session.topology)
        return int(source.sample(layout).memory[4:].sum())

    before = slice1_bytes()
    assert before >= 16 << 20
    fail_slice(1)
    repair_slice(1)
    after = slice1_bytes()
    try:
        lost.block_until_ready()
        read = "reads fine"
    except Exception as error:
        read = f"raises {type(error).__name__}"
    assert after <= before - (16 << 20), (
        f"{after:,} bytes still counted on slice 1 after its loss (the lost array {read}; "
        f"slice 1 is devices {[c.device.id for c in local_session.topology.slices[1].chips]})"
    )
    fresh = jax.device_put(jnp.ones((1 << 20,), jnp.float32), chip).block_until_ready()
    assert slice1_bytes() == after + (4 << 20), "a new array on the restored slice counts"
    del lost, fresh
