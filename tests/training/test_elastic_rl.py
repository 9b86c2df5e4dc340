"""Elastic RL on real JAX CPU devices (embedded:4x2): the trainer is a pw.elastic loop on slices 0 and 1, the
rollout a pw.elastic_map on slices 2 and 3 inside each step, the policy's weights copied to the rollout slices
every step. Losing either role's slice mid-run, then repairing it, ends equal to a fault-free run."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from kernels import EMBEDDED
from waiting import wait_until

import pathways_kernel as pw
from pathways_kernel.emulator import chaosmonkey, faults

SPEC = "embedded:4x2"  # as many devices as embedded:2x4, so the process's JAX serves both
TRAINER, ROLLOUT = [0, 1], [2, 3]
VOCAB, WIDTH, PROMPT, NEW, GROUP, PROMPTS, TARGET = 12, 32, 3, 5, 4, 4, 7
STEPS, EVERY = 8, 2


@pytest.fixture(autouse=True)
def four_slices():
    chaosmonkey.chaos_off()
    s = pw.connect(SPEC, force=True)
    yield s
    for sl in s.topology.down_slices:
        faults.repair_slice(sl.index)
    pw.connect(EMBEDDED, force=True)


def init_state(mesh):
    rng = np.random.default_rng(0)
    params = {
        "embed": rng.normal(size=(VOCAB, WIDTH)).astype(np.float32) * 0.3,
        "out": rng.normal(size=(WIDTH, VOCAB)).astype(np.float32) / WIDTH**0.5,
    }
    return jax.device_put({"params": params}, NamedSharding(mesh, P()))


def logits(params, tokens):
    return jnp.tanh(params["embed"][tokens]) @ params["out"]


@jax.jit
def generate(params, prompts, seeds):
    """GROUP-sampled continuations, each request with a key of its own seed: a function of the request."""

    def one(prompt, seed):
        def step(carry, _):
            token, key = carry
            key, sub = jax.random.split(key)
            nxt = jax.random.categorical(sub, logits(params, token)).astype(jnp.int32)
            return (nxt, key), nxt

        _, new = jax.lax.scan(step, (prompt[-1], jax.random.key(seed)), None, length=NEW)
        return jnp.concatenate([prompt, new])

    return jax.vmap(one)(prompts, seeds)


@jax.jit
def update(state, sequences, advantages):
    def loss(params):
        logp = jax.nn.log_softmax(logits(params, sequences[:, :-1]))
        taken = jnp.take_along_axis(logp, sequences[:, 1:, None], axis=-1)[..., 0][:, PROMPT - 1 :]
        return -jnp.mean(advantages[:, None] * taken)

    grads = jax.grad(loss)(state["params"])
    return {"params": jax.tree.map(lambda p, g: p - 0.5 * g, state["params"], grads)}


def requests(step):
    rng = np.random.default_rng(step)
    prompts = np.repeat(rng.integers(0, VOCAB, size=(PROMPTS, PROMPT)), GROUP, axis=0)
    seeds = step * PROMPTS * GROUP + np.arange(PROMPTS * GROUP)
    return np.concatenate([prompts, seeds[:, None]], axis=1).astype(np.int32)


def make_rl(actions=None, rewards=None):
    """One GRPO step as a pw.elastic step function. ``actions``: {step: [(fail|repair, slice)]}: a trainer
    slice is lost after the update is dispatched, a rollout slice in the middle of its first batch."""
    actions = dict(actions or {})
    lock = threading.Lock()

    def step_fn(state, step, mesh):
        todo = actions.pop(step, [])
        mid_rollout = [a for a in todo if a == ("fail", ROLLOUT[-1])]

        def rollout(params, batch, rollout_mesh):
            out = generate(params, batch[:, :PROMPT], batch[:, PROMPT])
            with lock:
                here = {d.id for d in rollout_mesh.devices.flat} <= {
                    d.id for d in pw.session().topology.slices[ROLLOUT[-1]].devices
                }
                fail = mid_rollout.pop() if mid_rollout and here else None
            if fail:
                faults.fail_slice(fail[1])
            elif mid_rollout:  # slice 2 waits for the loss: slice 3 runs a batch of this step under any load
                assert wait_until(lambda: pw.elastic_map.last_run.losses, timeout=60)
            return out

        sequences = pw.elastic_map(rollout, requests(step), state["params"], batch_size=4, slices=ROLLOUT)
        r = (sequences[:, PROMPT:] == TARGET).mean(axis=1).astype(np.float32)
        grouped = r.reshape(PROMPTS, GROUP)
        advantages = ((grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, keepdims=True) + 1e-6)).reshape(-1)
        if rewards is not None:
            rewards[step] = float(r.mean())
        batch = jax.device_put((sequences, advantages), NamedSharding(mesh, P()))
        state = update(state, *batch)
        for action, index in todo:
            if (action, index) != ("fail", ROLLOUT[-1]):
                (faults.fail_slice if action == "fail" else faults.repair_slice)(index)
        return state

    return step_fn


def run(actions=None, rewards=None):
    train = pw.elastic(make_rl(actions, rewards), snapshot_every=EVERY, slices=TRAINER, name="grpo")
    mesh = train._mesh(pw.session())
    final = train(init_state(mesh), steps=STEPS)
    return jax.device_get(final), train.last_run


_FAULT_FREE: list = []


def fault_free():
    """The fault-free run's final state and rewards (one run for the module's tests)."""
    if not _FAULT_FREE:
        rewards: dict[int, float] = {}
        final, _ = run(rewards=rewards)
        _FAULT_FREE.append((final, rewards))
    return _FAULT_FREE[0]


@pytest.mark.parametrize("lost", [TRAINER[-1], ROLLOUT[-1]], ids=["trainer", "rollout"])
def test_losing_either_roles_slice_then_repairing_it_ends_equal_to_a_fault_free_run(lost):
    expected, expected_rewards = fault_free()
    seq = pw.session().events.last(1)[0].seq
    rewards: dict[int, float] = {}
    final, report = run({3: [("fail", lost)], 6: [("repair", lost)]}, rewards)
    for key in expected["params"]:
        np.testing.assert_allclose(final["params"][key], expected["params"][key], rtol=1e-5, atol=1e-6)
    assert rewards == expected_rewards  # every step's rollouts sampled the same tokens
    events = pw.session().events.since(seq)
    if lost in TRAINER:
        # The trainer went back to its snapshot on slice 0 alone, and scaled up again after the repair.
        assert report.retries == 1 and report.scale_ups == 1 and report.slices == tuple(TRAINER)
        assert not [e for e in events if e.kind == "retry" and e.detail.startswith("'rollout'")]
    else:
        # The trainer never noticed; the rollout redid the lost slice's batch on slice 2, and slice 3 rejoined.
        assert report.retries == 0 and report.scale_ups == 0
        retries = [e for e in events if e.kind == "retry"]
        assert len(retries) == 1 and f"slice {lost} lost mid-batch" in retries[0].detail
        assert pw.elastic_map.last_run.slices.keys() == set(ROLLOUT)  # the last step rolled out on both again
    assert all("\n" not in e.to_text() for e in events)


@pytest.mark.parametrize("slices", [[], [-1], ["0"], [True]])
def test_bad_role_slices_are_one_line(slices):
    with pytest.raises(pw.PathwaysError, match=r"^slices must be slice indices \(at least one\), got ") as info:
        pw.elastic(make_rl(), slices=slices)
    assert "\n" not in str(info.value)
