"""Elastic training loops on real JAX CPU devices (local:2x4) with faults injected by pathways_kernel.emulator.faults."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pathways_kernel as pw
from pathways_kernel.emulator import chaosmonkey
from pathways_kernel.emulator import faults
from pathways_kernel.state import snapshots

GLOBAL_BATCH = 16
FEATURES, OUTPUTS = 32, 8


@pytest.fixture(autouse=True)
def all_slices_up(local_session):
    chaosmonkey.chaos_off()
    yield local_session
    chaosmonkey.chaos_off()


def make_data(steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(steps, GLOBAL_BATCH, FEATURES)).astype(np.float32),
        rng.normal(size=(steps, GLOBAL_BATCH, OUTPUTS)).astype(np.float32),
    )


def init_state(mesh):
    # Parameters away from zero, so that rtol compares every entry meaningfully.
    w = np.linspace(1.0, 2.0, FEATURES * OUTPUTS, dtype=np.float32).reshape(FEATURES, OUTPUTS)
    return {
        "w": jax.device_put(w, NamedSharding(mesh, P(None, "model"))),
        "b": jax.device_put(np.ones(OUTPUTS, np.float32), NamedSharding(mesh, P())),
    }


@jax.jit
def update(state, x, y):
    def loss(p):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    grads = jax.grad(loss)(state)
    return jax.tree.map(lambda p, g: p - 0.01 * g, state, grads)


def make_step(data, actions=None, seen=None):
    """A training step whose global batch is split over the live slices (the mesh's data axis)."""
    xs, ys = data
    actions = dict(actions or {})

    def step_fn(state, step, mesh):
        for action, index in actions.pop(step, ()):
            (faults.fail_slice if action == "fail" else faults.restore_slice)(index)
        if seen is not None:
            seen.append((step, mesh.shape["data"]))
        batch = NamedSharding(mesh, P("data"))
        return update(state, jax.device_put(xs[step], batch), jax.device_put(ys[step], batch))

    return step_fn


def reference(steps: int, data):
    train = pw.elastic(make_step(data), snapshot_every=1000, name="reference")
    return jax.device_get(train(init_state(pw.session().mesh()), steps=steps))


def test_failures_and_repairs_at_fixed_steps_give_the_fault_free_result():
    steps, every = 60, 5
    data = make_data(steps)
    expected = reference(steps, data)
    seen: list[tuple[int, int]] = []
    actions = {12: [("fail", 1)], 23: [("restore", 1)], 37: [("fail", 0)], 41: [("restore", 0)], 52: [("fail", 1)]}
    train = pw.elastic(make_step(data, actions, seen), snapshot_every=every, name="fixed")
    seq = pw.session().events.last(1)[0].seq
    final = train(init_state(pw.session().mesh()), steps=steps)

    report = train.last_run
    assert report.steps == steps
    assert report.retries == 3 and report.scale_ups == 2
    assert [r.resumed_at for r in report.recoveries] == [10, 35, 50]
    assert all(r.steps_lost <= every + 1 for r in report.recoveries)
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(final[key]), expected[key], rtol=1e-5)
    # The data-parallel split follows the live slices: the data axis is 2, then 1 after a loss.
    first: dict[int, int] = {}
    for step, width in seen:
        first.setdefault(step, width)
    last = dict(seen)
    assert first[11] == 2 and first[12] == 2 and last[11] == 1 and last[12] == 1
    assert last[24] == 2 and last[40] == 1 and last[41] == 1 and last[42] == 2 and last[59] == 1
    assert final["w"].sharding.spec == P(None, "model")
    kinds = [e.kind for e in pw.session().events.since(seq)]
    for kind in ("slice_down", "retry", "restore", "reshard", "slice_up", "scale_up", "snapshot"):
        assert kind in kinds, kind
    assert kinds.index("slice_down") < kinds.index("retry") < kinds.index("restore") < kinds.index("reshard")
    reshard = next(e for e in pw.session().events.since(seq) if e.kind == "reshard")
    assert reshard.slices_before == (0, 1) and reshard.slices_after == (0,) and reshard.step == 10
    assert reshard.bytes == (FEATURES + 1) * OUTPUTS * 4 and reshard.duration_s is not None


def test_on_restore_callbacks_get_the_step_and_the_new_mesh():
    data = make_data(20)
    calls = []
    unregister = pw.on_restore(lambda step, mesh: calls.append((step, dict(mesh.shape))))
    try:
        train = pw.elastic(make_step(data, {7: [("fail", 1)], 9: [("restore", 1)]}), snapshot_every=4)
        train(init_state(pw.session().mesh()), steps=20)
    finally:
        unregister()
    assert calls == [(4, {"data": 1, "model": 4}), (10, {"data": 2, "model": 4})]


def test_a_loss_is_detected_at_the_next_step_boundary_not_by_polling():
    data = make_data(40)
    xs, ys = data

    def slow_step(state, step, mesh):
        time.sleep(0.05)
        batch = NamedSharding(mesh, P("data"))
        return update(state, jax.device_put(xs[step], batch), jax.device_put(ys[step], batch))

    threading.Timer(0.5, faults.fail_slice, args=(1,)).start()
    seq = pw.session().events.last(1)[0].seq
    train = pw.elastic(slow_step, snapshot_every=5)
    train(init_state(pw.session().mesh()), steps=40)
    events = pw.session().events.since(seq)
    down = next(e for e in events if e.kind == "slice_down")
    retry = next(e for e in events if e.kind == "retry")
    # One step is 50 ms; a poll-based health check would take seconds.
    assert retry.time - down.time < 1.0
    assert train.last_run.steps == 40 and train.last_run.retries == 1


def test_seeded_chaos_of_fifty_cycles_loses_no_more_than_the_snapshot_interval():
    every = 4
    # A's seeded schedule, read in steps instead of seconds: deterministic at step boundaries.
    events = chaosmonkey.schedule([0, 1], mtbf=6.0, mttr=3.0, seed=11, min_up=1)
    actions: dict[int, list[tuple[str, int]]] = {}
    fails = 0
    last = 0
    for event in events:
        at = max(int(event.at) + 1, last)
        actions.setdefault(at, []).append((event.action, event.slice_index))
        last = at
        fails += event.action == "fail"
        if fails >= 50 and event.action == "restore":
            break
    steps = last + 5
    data = make_data(steps, seed=3)
    expected = reference(steps, data)
    store = pw.snapshot_store()
    peak = [0]
    seq = pw.session().events.last(1)[0].seq
    peak_watch = pw.session().events.subscribe(lambda e: e.kind == "snapshot" and peak.__setitem__(0, max(peak[0], store.nbytes)))
    try:
        train = pw.elastic(make_step(data, actions), snapshot_every=every, max_retries=5, name="chaos")
        final = train(init_state(pw.session().mesh()), steps=steps)
    finally:
        peak_watch()
    report = train.last_run
    assert report.steps == steps
    downs = [e for e in pw.session().events.since(seq) if e.kind == "slice_down"]
    assert len(downs) >= 50
    # Losses in the same step, or of a slice back but not yet rejoined, need no recovery of their own.
    assert report.retries >= 40
    assert max(r.steps_lost for r in report.recoveries) <= every + 1
    state_bytes = (FEATURES + 1) * OUTPUTS * 4
    kept = [s for s in store.list() if s.name == "elastic:chaos"]
    assert len(kept) <= snapshots.DEFAULT_KEEP + 1
    assert peak[0] - sum(s.nbytes for s in store.list() if s.name != "elastic:chaos") <= (snapshots.DEFAULT_KEEP + 1) * state_bytes
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(final[key]), expected[key], rtol=1e-5)


def test_chaos_thread_during_training_completes_every_step():
    steps = 150
    data = make_data(steps, seed=5)
    expected = reference(steps, data)
    xs, ys = data

    def step_fn(state, step, mesh):
        if step == steps - 1:
            # Chaos ends inside the loop, so that the loop sees any loss of the final state.
            chaosmonkey.chaos_off()
        time.sleep(0.01)
        batch = NamedSharding(mesh, P("data"))
        return update(state, jax.device_put(xs[step], batch), jax.device_put(ys[step], batch))

    seq = pw.session().events.last(1)[0].seq
    pw.chaos(mtbf=0.5, mttr=0.3, seed=4)
    try:
        train = pw.elastic(step_fn, snapshot_every=5, max_retries=20)
        final = train(init_state(pw.session().mesh()), steps=steps)
    finally:
        chaosmonkey.chaos_off()
    downs = [e for e in pw.session().events.since(seq) if e.kind == "slice_down"]
    assert downs and train.last_run.steps == steps
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(final[key]), expected[key], rtol=1e-5)


def test_gives_up_after_max_retries_with_one_line():
    mesh = pw.session().mesh()
    lost = jax.device_put(np.ones(4, np.float32), NamedSharding(mesh, P("data")))
    faults.fail_slice(1)
    faults.restore_slice(1)

    def reads_lost_data(state, step, mesh):
        return state + lost  # `lost` had a shard on slice 1: every attempt fails

    train = pw.elastic(reads_lost_data, max_retries=3, snapshot_every=2)
    with pytest.raises(pw.ElasticError, match="gave up after 3 consecutive slice losses"):
        train(jax.device_put(np.zeros(4, np.float32), NamedSharding(mesh, P("data"))), steps=5)


def test_other_errors_propagate_unchanged():
    def broken(state, step, mesh):
        if step == 3:
            raise ValueError("bad batch")
        return state + 1

    with pytest.raises(ValueError, match="bad batch"):
        pw.elastic(broken)(jnp.zeros(()), steps=5)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(pw.PathwaysError, match="snapshot_every must be at least 1"):
        pw.elastic(lambda s, i, m: s, snapshot_every=0)


def test_elastic_cell_magic_errors_are_one_line(kernel):
    reply = kernel.run("%%pathways elastic --steps 3 --state nothing_here\nnothing_here = 1")
    assert reply.status == "error"
    assert reply.error.strip().splitlines()[-1] == (
        "NamespaceError: --state nothing_here is not defined; create the initial state in an earlier cell"
    )
    reply = kernel.run("%%pathways elastic --state x\nx = 1")
    assert reply.status == "error" and "--steps" in reply.error
    reply = kernel.run("import jax.numpy as jnp\ncounter = jnp.zeros(())")
    reply = kernel.run("%%pathways elastic --steps 7 --state counter --snapshot-every 3\ncounter = counter + 1")
    assert reply.status == "ok", reply.error
    assert "elastic 'counter': 7 steps" in reply.text
    assert kernel.run("print(int(counter))").text.strip() == "7"
