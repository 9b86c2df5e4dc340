"""pw.loader: per-slice sidecars producing one globally sharded batch per step.

Sample ids make correctness visible: global batch ``step`` holds samples
``step * B .. step * B + B - 1``, so over N committed steps every sample must
appear exactly once and in order, whatever happened to the slices.
"""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_kernel as pw
from pathways_kernel.colocated.activity import stats
from pathways_kernel.emulator.faults import fail_slice, repair_slice
from pathways_kernel.training.elastic_loop import elastic

B = 16  # global batch: rows per step


def samples(step, shard, num_shards):
    """Block `shard` of `num_shards` of global batch `step`: sample ids and features."""
    rows = B // num_shards
    ids = step * B + shard * rows + np.arange(rows)
    return {"ids": ids.astype(np.int32), "x": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}


def slice_devices(s, index):
    return set(s.topology.slice(index).devices)


def test_every_sample_once_in_order_and_each_slice_holds_its_block(local_session):
    with pw.loader(samples, mesh=pw.mesh(), spec=P("data"), prefetch=2) as batches:
        seen = []
        for step, batch in zip(range(6), batches, strict=False):  # batches never ends
            assert batch["ids"].shape == (B,) and batch["x"].shape == (B, 3)
            assert batch["ids"].sharding.spec == P("data")
            seen.extend(np.asarray(batch["ids"]).tolist())
            for shard in batch["ids"].addressable_shards:
                rows = np.asarray(shard.data)
                # slice 0 holds rows 0..7 of the step, slice 1 rows 8..15
                expected_slice = 0 if rows[0] - step * B < B // 2 else 1
                assert shard.device in slice_devices(local_session, expected_slice)
    assert seen == list(range(6 * B))


def run_committed(batches, steps, events=None):
    """A minimal training loop: `commit[step]` = the ids its step consumed; state sums x.

    `events(step)` may fail/repair slices and return a step to roll back to.
    """
    state = np.zeros(3)
    snapshots = {0: state}
    commit = {}
    step = 0
    while step < steps:
        rollback = events(step) if events else None
        if rollback is not None:
            step = rollback
            state = snapshots[step]
            continue
        batch = batches.batch(step)
        state = state + np.asarray(batch["x"].sum(axis=0))
        commit[step] = np.asarray(batch["ids"]).tolist()
        step += 1
        if step % 3 == 0:
            snapshots[step] = state
    return np.asarray(state), commit


def test_failure_and_repair_replays_exactly_the_fault_free_samples(local_session):
    """Drives the reshard through the loader's own reset API and the mesh of live slices."""
    with pw.loader(samples, spec=P("data"), prefetch=3) as batches:
        expected_state, expected = run_committed(batches, 12)

    fired = set()

    def chaos(step):
        if step == 5 and "down" not in fired:
            fired.add("down")
            fail_slice(1)
            batches.reset(3, pw.mesh())  # roll back to the snapshot of step 3 on slice 0 alone
            return 3
        if step == 8 and "up" not in fired:
            fired.add("up")
            repair_slice(1)
            batches.reset(8, pw.mesh())  # scale back up; nothing lost
        return None

    with pw.loader(samples, spec=P("data"), prefetch=3) as batches:
        state, commit = run_committed(batches, 12, chaos)
        assert batches.state()["slices"] == [0, 1]
    assert commit == expected
    assert sum(commit.values(), []) == list(range(12 * B))
    np.testing.assert_allclose(state, expected_state)
    details = [e.detail for e in pw.events(kind="sidecar")]
    assert "loader samples: replay from step 3 on 1 shard" in details
    assert "loader samples: replay from step 8 on 2 shards" in details


@pytest.mark.parametrize("prefetch", [0, 2])
def test_elastic_loop_with_a_lost_and_restored_slice_commits_the_fault_free_samples(local_session, prefetch):
    """The elastic loop rolls back to a snapshot on slice 0 alone, then scales up; the loader follows.

    With prefetch 0 the lost step's block is produced after the loss, so the
    sidecar itself meets DATA_LOSS: it must reach the loop as the runtime's
    error, which the loop recognises, not as a SidecarError.
    """
    batches = pw.loader(samples, spec=P("data"), prefetch=prefetch)
    consumed = {}
    chaos = {5: "down", 9: "up"}

    def train(state, step, mesh):
        if chaos.get(step) == "down":
            del chaos[step]
            fail_slice(1)
        elif chaos.get(step) == "up":
            del chaos[step]
            repair_slice(1)
        batch = batches.batch(step, mesh)
        assert batch["ids"].sharding.mesh == mesh
        consumed[step] = np.asarray(batch["ids"]).tolist()
        return {"sum": state["sum"] + batch["x"].sum(axis=0)}

    loop = elastic(train, snapshot_every=3)
    state = loop({"sum": jnp.zeros(3)}, steps=14)
    batches.close()
    report = loop.last_run
    assert report.recoveries, "the loss of slice 1 was not seen by the elastic loop"
    assert sum((consumed[s] for s in range(14)), []) == list(range(14 * B))
    expected = np.repeat(np.arange(14 * B).sum(), 3).astype(np.float32)
    np.testing.assert_allclose(np.asarray(state["sum"]), expected)


def test_a_failing_producer_names_the_slice_when_its_step_is_consumed(local_session):
    def flaky(step, shard, num_shards):
        if step == 3 and shard == 1:
            raise OSError(f"cannot read shard file {shard} for step {step}")
        return samples(step, shard, num_shards)

    with pw.loader(flaky, prefetch=4) as batches:
        for _ in range(3):
            next(batches)  # step 3 is already failing in the background; not reported early
        with pytest.raises(pw.SidecarError) as caught:
            next(batches)
    message = str(caught.value)
    assert message == "sidecar 'flaky' failed on slice 1: OSError: cannot read shard file 1 for step 3"


def test_a_hanging_producer_times_out_cleanly(local_session):
    def stalls(step, shard, num_shards):
        if step == 1 and shard == 0:
            time.sleep(6)
        return samples(step, shard, num_shards)

    with pw.loader(stalls, prefetch=1, timeout=1.0) as batches:
        next(batches)
        started = time.monotonic()
        with pytest.raises(pw.SidecarTimeout, match="sidecar 'stalls' on slice 0 did not finish within 1 s"):
            next(batches)
        assert time.monotonic() - started < 10
        # Fresh workers take over: later steps still load.
        assert np.asarray(batches.batch(2)["ids"]).tolist() == list(range(2 * B, 3 * B))


def test_prefetch_keeps_batches_ready_and_reports_queue_depth(local_session):
    with pw.loader(samples, prefetch=3, name="ahead") as batches:
        next(batches)
        deadline = time.monotonic() + 10
        while batches.state()["queue_depth"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert batches.state()["queue_depth"] == 3
        loaders = stats()["loaders"]
        assert loaders["ahead"]["queue_depth"] == 3
        assert stats()["queue_depth"] >= 3
    assert "ahead" not in stats()["loaders"]


def test_meshes_that_do_not_split_by_slice_are_refused(local_session):
    mesh = pw.mesh(axes=("data", "model"), dcn=(1, 2), ici=(4, 1))
    with pytest.raises(pw.PathwaysError, match="only the batch dimension"):
        pw.loader(samples, mesh=mesh, spec=P("data", "model"))


def test_a_dropped_loader_is_collected_and_stops(local_session):
    import gc

    batches = pw.loader(samples, prefetch=2, name="dropped")
    next(batches)
    assert "dropped" in stats()["loaders"]
    del batches
    gc.collect()
    assert "dropped" not in stats()["loaders"]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_bare_loop_after_a_loss_says_how_to_follow_the_live_slices(local_session, prefetch):
    """Issue 22.6: every next() after a loss failed with `DATA_LOSS: slice 1 is down; device_put
    placed data on it` and no hint. Prefetched steps were on the lost slice too."""
    from pathwaysutils.elastic.elastic import is_error_due_to_slice_down

    with pw.loader(samples, prefetch=prefetch) as batches:
        next(batches)
        fail_slice(1)
        for _ in range(2):  # every next() says it, not only the first
            with pytest.raises(pw.PathwaysError) as caught:
                next(batches)
            message = str(caught.value)
            assert "\n" not in message
            assert message.startswith("loader samples: slice 1 is down"), message
            assert "loader.reset(1, pw.mesh())" in message and "pw.elastic" in message, message
            # Still the runtime's slice-loss error, which an elastic loop recovers from.
            assert is_error_due_to_slice_down(caught.value, log_traceback=False)
        batches.reset(1, pw.mesh())  # what it says to do
        assert np.asarray(next(batches)["ids"]).tolist() == list(range(B, 2 * B))
