"""Elastic training loops on real JAX CPU devices (local:2x4) with faults injected by pathways_kernel.emulator.faults."""

from __future__ import annotations

import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from kernels import SERVER

import pathways_kernel as pw
from pathways_kernel.emulator import chaosmonkey, faults
from pathways_kernel.state import host_copy, snapshots

# Kernels run on the product default, a local Pathways server (conftest._backend).
KERNEL_BACKEND = SERVER

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
            (faults.fail_slice if action == "fail" else faults.repair_slice)(index)
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
    # The newest snapshot, or the one before if the loss struck while the newest was still copying.
    resumed = [r.resumed_at for r in report.recoveries]
    assert len(resumed) == 3 and all(
        at in (snap, snap - every) for at, snap in zip(resumed, (10, 35, 50), strict=True)
    ), resumed
    assert all(r.steps_lost <= 2 * every for r in report.recoveries)
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(final[key]), expected[key], rtol=1e-5, atol=1e-6)
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
    # The first recovery's snapshot (step 10, or 5 if the loss struck while 10 was still copying).
    assert reshard.slices_before == (0, 1) and reshard.slices_after == (0,) and reshard.step == resumed[0]
    assert reshard.bytes == (FEATURES + 1) * OUTPUTS * 4 and reshard.duration_s is not None


HIDDEN = 16


def init_mlp(mesh):
    # Biases start at zero and stay near it: relative error alone means nothing there.
    rng = np.random.default_rng(1)

    def put(value, spec):
        return jax.device_put(value.astype(np.float32), NamedSharding(mesh, spec))

    return {
        "w1": put(rng.normal(size=(FEATURES, HIDDEN)) / np.sqrt(FEATURES), P(None, "model")),
        "b1": put(np.zeros(HIDDEN), P("model")),
        "w2": put(rng.normal(size=(HIDDEN, OUTPUTS)) / np.sqrt(HIDDEN), P("model", None)),
        "b2": put(np.zeros(OUTPUTS), P()),
    }


@jax.jit
def mlp_update(params, x, y):
    def loss(p):
        hidden = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((hidden @ p["w2"] + p["b2"] - y) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)


def test_an_mlp_trained_through_failures_matches_the_fault_free_run_on_every_parameter():
    steps = 40
    xs, ys = make_data(steps, seed=7)

    def mlp_step(actions):
        actions = dict(actions)

        def step_fn(params, step, mesh):
            for action, index in actions.pop(step, ()):
                (faults.fail_slice if action == "fail" else faults.repair_slice)(index)
            batch = NamedSharding(mesh, P("data"))
            return mlp_update(params, jax.device_put(xs[step], batch), jax.device_put(ys[step], batch))

        return step_fn

    expected = jax.device_get(
        pw.elastic(mlp_step({}), name="mlp-reference")(init_mlp(pw.session().mesh()), steps=steps)
    )
    train = pw.elastic(
        mlp_step({12: [("fail", 1)], 20: [("restore", 1)], 27: [("fail", 0)], 33: [("restore", 0)]}),
        snapshot_every=5,
        name="mlp",
    )
    final = jax.device_get(train(init_mlp(pw.session().mesh()), steps=steps))
    assert train.last_run.retries == 2 and train.last_run.scale_ups == 2
    assert sorted(final) == ["b1", "b2", "w1", "w2"]
    for key in final:
        # The guarantee README states: both tolerances at once, on every entry.
        np.testing.assert_allclose(final[key], expected[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert np.abs(expected["b1"]).min() < 1e-3  # near-zero entries are among those compared


def test_on_restore_callbacks_get_the_step_and_the_new_mesh():
    data = make_data(20)
    calls = []
    unregister = pw.on_restore(lambda step, mesh: calls.append((step, dict(mesh.shape))))
    try:
        train = pw.elastic(make_step(data, {7: [("fail", 1)], 9: [("restore", 1)]}), snapshot_every=4)
        train(init_state(pw.session().mesh()), steps=20)
    finally:
        unregister()
    # The snapshot of step 4, or of step 0 if the loss struck while step 4's was still copying.
    [rollback] = train.last_run.recoveries
    assert rollback.resumed_at in (0, 4)
    assert calls == [(rollback.resumed_at, {"data": 1, "model": 4}), (10, {"data": 2, "model": 4})]


def test_on_restore_callbacks_belong_to_the_session_they_were_registered_in():
    earlier, current = [], []
    unregister_earlier = pw.on_restore(lambda step, mesh: earlier.append(step))
    pw.connect("embedded:2x4", force=True)
    unregister_current = pw.on_restore(lambda step, mesh: current.append(step))
    try:
        train = pw.elastic(counting({3: [("fail", 1)]}), snapshot_every=2)
        train(sharded(0.0), steps=5)
    finally:
        unregister_earlier()
        unregister_current()
    assert earlier == [] and current == [r.resumed_at for r in train.last_run.recoveries] and len(current) == 1


def test_a_slice_lost_before_the_first_step_goes_back_to_the_state_as_given(monkeypatch):
    # The loss lands after the run began but before it built its mesh (a kernel's first run
    # spends seconds importing there): the mesh is the survivors', the state still spans both
    # slices. The first step failed on it ("incompatible devices"), with no retry.
    from pathways_kernel.training.elastic_loop import Elastic

    steps = 12
    data = make_data(steps, seed=5)
    expected = reference(steps, data)
    build = Elastic._mesh
    lost: list[int] = []

    def mesh_after_a_loss(self, s):
        if not lost:
            lost.append(1)
            faults.fail_slice(1)
        return build(self, s)

    monkeypatch.setattr(Elastic, "_mesh", mesh_after_a_loss)
    train = pw.elastic(make_step(data), snapshot_every=4, name="lost-at-start")
    final = train(init_state(pw.session().mesh()), steps=steps)
    faults.repair_slice(1)

    report = train.last_run
    assert lost and report.steps == steps and report.retries == 1, report
    assert [r.resumed_at for r in report.recoveries] == [0]
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(final[key]), expected[key], rtol=1e-5, atol=1e-6)


@pytest.mark.serial  # timing: the retry within 1 s of the loss
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
        if fails >= 50 and event.action == "repair":
            break
    steps = last + 5
    data = make_data(steps, seed=3)
    expected = reference(steps, data)
    store = pw.snapshot_store()
    peak = [0]
    seq = pw.session().events.last(1)[0].seq
    peak_watch = pw.session().events.subscribe(
        lambda e: e.kind == "snapshot" and peak.__setitem__(0, max(peak[0], store.nbytes))
    )
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
    # At most `every` once the newest snapshot is copied; a loss during its copy goes back to the one before.
    assert max(r.steps_lost for r in report.recoveries) <= 2 * every
    state_bytes = (FEATURES + 1) * OUTPUTS * 4
    kept = [s for s in store.list() if s.name == "elastic:chaos"]
    assert len(kept) <= snapshots.DEFAULT_KEEP + 1
    assert (
        peak[0] - sum(s.nbytes for s in store.list() if s.name != "elastic:chaos")
        <= (snapshots.DEFAULT_KEEP + 1) * state_bytes
    )
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(final[key]), expected[key], rtol=1e-5, atol=1e-6)


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
        np.testing.assert_allclose(np.asarray(final[key]), expected[key], rtol=1e-5, atol=1e-6)


def test_gives_up_after_max_retries_with_one_line():
    mesh = pw.session().mesh()
    lost = jax.device_put(np.ones(4, np.float32), NamedSharding(mesh, P("data")))
    faults.fail_slice(1)
    faults.repair_slice(1)

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


@pytest.mark.parametrize(
    "options, message",
    [
        ({"snapshot_every": 0}, "snapshot_every must be a whole number of at least 1, got 0"),
        ({"snapshot_every": -1}, "snapshot_every must be a whole number of at least 1, got -1"),
        ({"snapshot_every": float("nan")}, "snapshot_every must be a whole number of at least 1, got nan"),
        ({"snapshot_every": 2.5}, "snapshot_every must be a whole number of at least 1, got 2.5"),
        ({"max_retries": -1}, "max_retries must be a whole number of at least 1, got -1"),
        ({"max_retries": 0}, "max_retries must be a whole number of at least 1, got 0"),
        ({"wait_s": float("nan")}, "wait_s must be a number of seconds, at least 0, got nan"),
    ],
)
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(pw.PathwaysError, match=f"^{re.escape(message)}$"):
        pw.elastic(lambda s, i, m: s, **options)


@pytest.mark.parametrize(
    "steps, start, message",
    [
        (-5, 0, "steps must be a whole number of at least 1, got -5"),
        (0, 0, "steps must be a whole number of at least 1, got 0"),
        (3, -3, "start must be a step from 0 to 2 (steps 3 is the step the run stops before), got -3"),
        (3, 3, "start must be a step from 0 to 2 (steps 3 is the step the run stops before), got 3"),
        (2.5, 0, "steps must be a whole number of at least 1, got 2.5"),
    ],
)
def test_bad_step_ranges_are_one_line_errors_and_nothing_runs(steps, start, message):
    ran = []
    train = pw.elastic(lambda s, i, m: ran.append(i) or s, name="ranges")
    seq = pw.session().events.last(1)[0].seq
    with pytest.raises(pw.PathwaysError, match=f"^{re.escape(message)}$"):
        train(sharded(0.0), steps=steps, start=start)
    assert ran == [] and not [e for e in pw.session().events.since(seq) if e.kind == "snapshot"]


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


# -- a run resumes only from its own snapshots ----------------------------------
def counting(actions=None):
    """A step adding 1 to the state; ``actions`` as in make_step."""
    actions = dict(actions or {})

    def step_fn(state, step, mesh):
        for action, index in actions.pop(step, ()):
            (faults.fail_slice if action == "fail" else faults.repair_slice)(index)
        return state + 1

    return step_fn


def sharded(value: float):
    return jax.device_put(np.full(8, value, np.float32), NamedSharding(pw.session().mesh(), P("data")))


def interrupted_at(at: int):
    def step_fn(state, step, mesh):
        if step == at:
            raise KeyboardInterrupt
        return state + 1

    return step_fn


@pytest.mark.parametrize("earlier", ["one run", "99 runs", "an interrupted run"])
def test_a_run_whose_state_was_lost_before_it_began_says_so_instead_of_resuming_an_earlier_run(earlier):
    train = pw.elastic(counting(), snapshot_every=10, name="stale")
    state = sharded(0.0)
    if earlier == "an interrupted run":
        with pytest.raises(KeyboardInterrupt):
            pw.elastic(interrupted_at(45), snapshot_every=10, name="stale")(state, steps=50)
    for _ in range({"one run": 1, "99 runs": 99}.get(earlier, 0)):
        state = train(state, steps=50)
    fresh = state * 0 + 1000  # the user's new state; the store holds the earlier run's snapshots of steps 30 and 40
    faults.fail_slice(1)
    with pytest.raises(
        pw.ElasticError, match=r"no snapshot of the state of 'stale' from this run .*already lost when the run began"
    ):
        train(fresh, steps=5)
    assert train.last_run.recoveries == []


def test_a_run_losing_a_slice_before_its_second_snapshot_goes_back_to_its_first():
    with pytest.raises(KeyboardInterrupt):
        pw.elastic(interrupted_at(45), snapshot_every=10, name="again")(sharded(0.0), steps=50)
    train = pw.elastic(counting({3: [("fail", 1)]}), snapshot_every=10, name="again")
    final = train(sharded(1000.0), steps=5)
    np.testing.assert_array_equal(np.asarray(final), np.full(8, 1005.0, np.float32))
    assert [(r.failed_at, r.resumed_at) for r in train.last_run.recoveries] == [(4, 0)]
    assert (
        "5 steps in" in train.last_run.summary()
        and "1 recovery, 4 steps redone, 0 scale-ups" in train.last_run.summary()
    )


@pytest.mark.parametrize(
    "options, message",
    [
        (
            "--start=-3 --steps 3",
            "PathwaysError: --start must be a step from 0 to 2 (--steps 3 is the step the run stops before), got -3",
        ),
        ("--steps=-5", "PathwaysError: --steps must be a whole number of at least 1, got -5"),
        ("--steps 5 --snapshot-every 0", "PathwaysError: --snapshot-every must be a whole number of at least 1, got 0"),
        (
            "--steps 5 --snapshot-every -1",
            "PathwaysError: --snapshot-every must be a whole number of at least 1, got -1",
        ),
        ("--steps 5 --snapshot-every nan", "--snapshot-every"),
        ("--steps 5 --max-retries -1", "PathwaysError: --max-retries must be a whole number of at least 1, got -1"),
    ],
)
def test_elastic_cell_magic_refuses_bad_step_options_in_one_line_and_runs_nothing(kernel, options, message):
    assert kernel.run("import jax.numpy as jnp\nticks = jnp.zeros(())").status == "ok"
    reply = kernel.run(f"%%pathways elastic {options} --state ticks\nticks = ticks + 1")
    assert reply.status == "error"
    lines = reply.error.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], reply.error
    assert kernel.run("print(int(ticks), pw.snapshot_store().latest('elastic:ticks'))").text.strip() == "0 None"


ELASTIC_50 = "%%pathways elastic --steps 50 --state params --snapshot-every 10\nparams = params + 1"
EARLIER = {
    "second run": f"get_ipython().run_cell_magic('pathways', {ELASTIC_50.splitlines()[0][11:]!r}, 'params = params + 1')",
    "hundredth run": (
        "for _ in range(99):\n"
        f"    get_ipython().run_cell_magic('pathways', {ELASTIC_50.splitlines()[0][11:]!r}, 'params = params + 1')"
    ),
    "run after an interrupted one": (
        f"get_ipython().run_cell_magic('pathways', {ELASTIC_50.splitlines()[0][11:]!r},"
        " 'if step == 45: raise KeyboardInterrupt\\nparams = params + 1')"
    ),
}


@pytest.mark.parametrize("which", list(EARLIER))
def test_an_elastic_cell_whose_state_was_lost_never_resumes_an_earlier_cells_snapshot(kernel, which):
    setup = "import jax, numpy as np\nfrom jax.sharding import NamedSharding, PartitionSpec as P\nparams = jax.device_put(np.zeros(8, np.float32), NamedSharding(pw.mesh(), P('data')))"
    assert kernel.run(setup).status == "ok"
    reply = kernel.run(EARLIER[which])
    assert reply.status == "ok" or "KeyboardInterrupt" in reply.error, reply.error
    reached = {"second run": 50, "hundredth run": 99 * 50, "run after an interrupted one": 45}[which]
    kept = kernel.run(
        "print(float(params[0]), sorted(s.step for s in pw.snapshot_store().list() if s.name == 'elastic:params'))"
    )
    # A run that returned also snapshotted what it returned; an interrupted one did not.
    steps = "[30, 40]" if which == "run after an interrupted one" else "[40, 50]"
    assert kept.text.strip() == f"{reached:.1f} {steps}", kept.error
    assert kernel.run("params = params * 0 + 1000").status == "ok"
    try:
        healing = kernel.run("%pathways fail 1").text
        # `params` no longer holds what the earlier run left in it: its snapshots are of something else.
        assert "no snapshot, now unusable (DATA_LOSS): params" in healing and "elastic 'params'" not in healing
        reply = kernel.run("%%pathways elastic --steps 5 --state params --snapshot-every 2\nparams = params + 1")
        assert reply.status == "error"
        assert reply.error.strip().splitlines() == [
            "ElasticError: elastic 'params': a slice was lost and there is no snapshot of params from this run to go back to "
            "(it was already lost when the run began); recompute params or restore it from a snapshot (%pathways snapshots), "
            "then run again"
        ]
        assert kernel.run("print(pw.is_lost(params))").text.strip() == "True"
    finally:
        kernel.run("%pathways repair 1")
    assert (
        kernel.run(
            "params = jax.device_put(np.full(8, 1000.0, np.float32), NamedSharding(pw.mesh(), P('data')))"
        ).status
        == "ok"
    )
    reply = kernel.run(
        "%%pathways elastic --steps 5 --state params --snapshot-every 2\nparams = params + 1\nif step == 3: pw.fail_slice(1)"
    )
    try:
        assert reply.status == "ok", reply.error
        assert "5 steps" in reply.text and "1 recovery, " in reply.text
        assert kernel.run("print(float(params[0]))").text.strip() == "1005.0"
    finally:
        kernel.run("%pathways repair 1")


# -- snapshots copy while the steps run -------------------------------------------
def hold_copier(release: threading.Event) -> None:
    """Occupy every thread of the snapshot copier until ``release``: copies queue
    behind, as a copy slower than the steps would. Released after 10 s at most."""
    for _ in range(host_copy._COPIER._max_workers):
        host_copy._COPIER.submit(release.wait, 10.0)


def test_steps_run_while_the_newest_snapshot_copies_and_the_loop_waits_for_it_only_when_the_next_is_due():
    release = threading.Event()
    store = pw.snapshot_store()
    copying: list[list[int]] = []

    def step_fn(state, step, mesh):
        if step == 4:
            hold_copier(release)  # the snapshot of step 5 will queue behind
        copying.append([s.step for s in store.list() if s.name == "elastic:overlap" and not s.done()])
        if step == 8:
            threading.Timer(0.3, release.set).start()
        return state + 1

    final = pw.elastic(step_fn, snapshot_every=5, name="overlap")(sharded(0.0), steps=15)
    np.testing.assert_array_equal(np.asarray(final), np.full(8, 15.0, np.float32))
    # The copy of the state the run was given was done before its first step.
    assert copying[:5] == [[]] * 5
    # Steps 5-8 ran while the snapshot of step 5 was still copying; by step 10 it was waited for.
    assert copying[5:9] == [[5]] * 4
    assert all(5 not in pending for pending in copying[10:])


def test_a_loss_while_the_newest_snapshot_copies_goes_back_to_the_snapshot_before():
    release = threading.Event()
    store = pw.snapshot_store()
    failed = []

    def step_fn(state, step, mesh):
        if step == 9:
            store.latest("elastic:mid-copy")  # the snapshot of step 5 is done
            hold_copier(release)  # the snapshot of step 10 will queue behind
        if step == 12 and not failed:
            failed.append(step)
            faults.fail_slice(1)  # before the copy of step 10 read the state
            release.set()
        return state + 1

    train = pw.elastic(step_fn, snapshot_every=5, name="mid-copy")
    final = train(sharded(0.0), steps=20)
    np.testing.assert_array_equal(np.asarray(final), np.full(8, 20.0, np.float32))
    assert [(r.failed_at, r.resumed_at) for r in train.last_run.recoveries] == [(13, 5)]


@pytest.mark.parametrize("lost", [0, 1])
def test_a_step_compiled_ahead_is_the_one_a_recovery_runs(lost):
    # As optax's: a step count made on one device (JAX's default, on slice 0), laid out on the mesh by the step.
    @jax.jit
    def counted(state, x):
        return {"w": state["w"] - 0.01 * x.mean(axis=0)[:, None], "count": state["count"] + 1}

    xs, _ys = make_data(12)
    at = [0]

    def step_fn(state, step, mesh):
        at[0] = step
        out = counted(state, jax.device_put(xs[step], NamedSharding(mesh, P("data"))))
        # After the step is dispatched, as a loss seen at the next boundary strikes.
        if step == 6 and mesh.shape["data"] == 2:
            train.prepared.wait()
            faults.fail_slice(lost)  # slice 0 holds JAX's default device: the loss moves it
        if step == 9 and mesh.shape["data"] == 1:
            faults.repair_slice(lost)
        return out

    def prepare(mesh):
        x = jax.ShapeDtypeStruct(xs[0].shape, xs.dtype, sharding=NamedSharding(mesh, P("data")))
        counted.lower(pw.elastic.abstract(state, mesh), x).compile()

    compiled_at = []

    def on_duration(event, seconds, **_kwargs):
        if (
            event == "/jax/core/compile/backend_compile_duration"
            and threading.current_thread() is threading.main_thread()
        ):
            compiled_at.append(at[0])

    state = {"w": init_state(pw.session().mesh())["w"], "count": jnp.zeros((), jnp.int32)}
    train = pw.elastic(step_fn, snapshot_every=4, name=f"ahead-{lost}", prepare=prepare)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        final = train(state, steps=12)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
    assert int(final["count"]) == 12 and train.last_run.retries == 1 and train.last_run.scale_ups == 1
    # The first steps compile for the state as given and as the step lays it out; the recovery compiles nothing.
    assert all(step < 2 for step in compiled_at), compiled_at


# -- a run can always go back to where it began, and heals to where it ended ------
SLOW_STEP = """
import threading, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
w = jax.device_put(np.zeros((64, 64), np.float32), NamedSharding(pw.mesh(), P('data')))

@jax.jit
def slow_step(x):  # hundreds of ops: seconds to trace and compile, for w + 1
    for _ in range(300):
        x = x + jnp.sin(x) * 0.0
    return x + 1
"""


def test_a_loss_during_a_kernels_first_elastic_run_goes_back_to_the_state_it_was_given(fresh_kernel):
    assert fresh_kernel.run(SLOW_STEP).status == "ok"
    # The kernel's first elastic run imports for a while before its first step;
    # slice 1 goes down 0.5 s into the cell, while the first step compiles.
    reply = fresh_kernel.run(
        "threading.Timer(0.5, pw.fail_slice, (1,)).start()\n"
        "get_ipython().run_cell_magic('pathways', 'elastic --steps 20 --state w --snapshot-every 5', 'w = slow_step(w)')"
    )
    try:
        assert reply.status == "ok", reply.error
        assert "elastic 'w': 20 steps" in reply.text and "1 recovery" in reply.text, reply.text
        assert (
            fresh_kernel.run("print(float(w.min()), float(w.max()), pw.is_lost(w))").text.strip() == "20.0 20.0 False"
        )
    finally:
        fresh_kernel.run("%pathways repair 1")


def test_a_loss_while_a_run_copies_the_state_it_was_given_is_not_blamed_on_the_user():
    release = threading.Event()
    hold_copier(release)  # the copy of the given state queues behind
    threading.Timer(0.3, lambda: (faults.fail_slice(1), release.set())).start()
    train = pw.elastic(counting(), snapshot_every=5, name="copying-start")
    with pytest.raises(pw.ElasticError) as raised:
        train(sharded(0.0), steps=20)
    assert "the slice went down while the run copied the state it was given, before its first step" in str(raised.value)
    assert "already lost when the run began" not in str(raised.value)


def test_a_finished_run_heals_to_the_state_it_returned(kernel):
    setup = (
        "import jax, numpy as np\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n"
        "weights = jax.device_put(np.zeros(8, np.float32), NamedSharding(pw.mesh(), P('data')))"
    )
    assert kernel.run(setup).status == "ok"
    reply = kernel.run("%%pathways elastic --steps 20 --state weights --snapshot-every 5\nweights = weights + 1")
    assert reply.status == "ok", reply.error
    # The snapshot of the run's end copies after the cell; the store waits for it.
    assert kernel.run("print(pw.snapshot_store().latest('elastic:weights').step)").text.strip() == "20"
    try:
        healing = kernel.run("%pathways fail 1")
        assert healing.status == "ok", healing.error
        assert "step 20 of elastic 'weights'" in healing.text, healing.text
        assert kernel.run("print(float(weights[0]), pw.is_lost(weights))").text.strip() == "20.0 False"
    finally:
        kernel.run("%pathways repair 1")


def test_a_runs_snapshot_copied_after_its_final_one_does_not_become_the_newest():
    store = snapshots.SnapshotStore()
    for step in (10, 20, 15):  # the copy of step 15 finished after the final one's
        host = {"w": np.full(4, float(step), np.float32)}
        snap = snapshots.Snapshot.from_host(host, name="elastic:order", step=step, created=1000.0 + step)
        snap.run = 7
        store.add(snap)
    assert sorted(s.step for s in store.list() if s.name == "elastic:order") == [15, 20]
    assert store.latest("elastic:order", run=7).step == 20


def test_an_interrupted_elastic_cell_leaves_its_state_readable_though_its_queued_steps_were_cancelled(kernel):
    # Each step is ~tens of ms of device work that the loop never reads, so at the interrupt
    # (step 24) the server holds more queued steps than it runs (8 per device); the kernel then
    # drops what has not started. The variable the run leaves bound must not be one of those.
    setup = (
        "import jax, jax.numpy as jnp, numpy as np\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "slow = jax.jit(lambda p: jax.lax.fori_loop(0, 6, lambda i, q: jnp.tanh(q @ q) * 1e-6 + q, p) + 1)\n"
        "params = jax.device_put(np.zeros((512, 512), np.float32), NamedSharding(pw.mesh(), P('data')))\n"
        "slow(params).block_until_ready()"
    )
    assert kernel.run(setup).status == "ok"
    reply = kernel.run(
        "%%pathways elastic --steps 200 --state params --snapshot-every 100 --no-progress\n"
        "if step == 24: raise KeyboardInterrupt\n"
        "params = slow(params)"
    )
    assert "KeyboardInterrupt" in reply.error, reply.error
    kept = kernel.run("print(round(float(params[0, 0])))")
    assert (kept.status, kept.text.strip()) == ("ok", "24"), kept.error
