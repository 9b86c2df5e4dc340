"""Elastic inference and elastic RL on the local Pathways server: a kernel of local:2x4 (JAX's proxy client,
the slices' CPU devices in the server's process), slices lost and repaired with pw.fail_slice/pw.repair_slice
while the work runs. The same code as the in-process tests (tests/training/test_elastic_batch.py,
test_elastic_rl.py), run where users run it."""

from __future__ import annotations

import os

import pytest
from kernels import SERVER

KERNEL_BACKEND = SERVER
TRAINING = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training")


def test_on_the_local_server_a_loss_mid_batch_redoes_only_that_batch_and_equals_a_fault_free_run(kernel):
    setup = (
        "import threading, time, jax, jax.numpy as jnp, numpy as np\n"
        "params = np.linspace(-1, 1, 64 * 16, dtype=np.float32).reshape(64, 16)\n"
        "reqs = np.random.default_rng(0).normal(size=(24, 64)).astype(np.float32)\n"
        "gen = jax.jit(lambda p, x: jnp.argmax(jnp.tanh(x @ p) @ p.T @ p, axis=1))\n"
        "def slice_of(mesh):\n"
        "    ids = {d.id for d in mesh.devices.flat}\n"
        "    return next(sl.index for sl in pw.session().topology.slices if {d.id for d in sl.devices} == ids)\n"
        "seen, lock = {}, threading.Lock()\n"
        "def fn(p, batch, mesh):\n"
        "    out, index = gen(p, batch), slice_of(mesh)\n"
        "    with lock:\n"
        "        nth = seen[index] = seen.get(index, 0) + 1\n"
        "    if FAULTS and (index, nth) == (1, 2):\n"
        "        pw.fail_slice(1)\n"
        "    if FAULTS and (index, nth) == (0, 3):  # slice 1 runs its second batch under any load\n"
        "        deadline = time.monotonic() + 60\n"
        "        while not pw.elastic_map.last_run.losses and time.monotonic() < deadline:\n"
        "            time.sleep(0.05)\n"
        "    return out\n"
        "FAULTS = False\n"
        "expected = pw.elastic_map(fn, reqs, params, batch_size=3)\n"
        "seen.clear(); FAULTS = True\n"
    )
    reply = kernel.run(setup, timeout=240)
    assert reply.status == "ok", reply.error
    try:
        reply = kernel.run(
            "out = pw.elastic_map(fn, reqs, params, batch_size=3)\n"
            "r = pw.elastic_map.last_run\n"
            "print(np.array_equal(out, expected), r.losses, len(r.redone), r.slices[1].batches, sum(seen.values()))",
            timeout=240,
        )
        assert reply.status == "ok", reply.error
        # Equal to the fault-free run; one loss, one batch redone; slice 1 kept its first; 8 batches + 1 redone ran.
        assert reply.text.strip().splitlines()[-1].split() == ["True", "1", "1", "1", "9"], reply.text
        events = kernel.run("%pathways events").text
        assert "slice 1 lost mid-batch, batch" in events and "redone on slices [0]" in events, events
    finally:
        kernel.run("import rl_jobs\nrl_jobs.repair_if_down(1)")


@pytest.mark.parametrize("lost", [0, 1], ids=["trainer", "rollout"])
def test_on_the_local_server_losing_either_rl_roles_slice_then_repairing_it_equals_a_fault_free_run(kernel, lost):
    # The trainer (pw.elastic, slices=[0]) and the rollout (pw.elastic_map, slices=[1]) of test_elastic_rl.
    setup = (
        "import sys, threading, numpy as np, rl_jobs\n"
        f"sys.path.insert(0, {TRAINING!r})\n"
        "import test_elastic_rl as rl\n"
        "rl.TRAINER, rl.ROLLOUT = [0], [1]\n"
        "if 'expected' not in globals() or not isinstance(expected, tuple):\n"
        "    rewards = {}\n"
        "    expected = (rl.run(rewards=rewards)[0], rewards)\n"
    )
    reply = kernel.run(setup, timeout=300)
    assert reply.status == "ok", reply.error
    try:
        reply = kernel.run(
            f"repairer = threading.Thread(target=rl_jobs.repair_once_down, args=({lost},)); repairer.start()\n"
            "rewards, seq = {}, pw.session().events.last(1)[0].seq\n"
            f"final, report = rl.run({{3: [('fail', {lost})]}}, rewards)\n"
            "repairer.join(120)\n"
            "same = all(np.allclose(final['params'][k], expected[0]['params'][k], rtol=1e-5, atol=1e-6)"
            " for k in final['params'])\n"
            "redone = sum('lost mid-batch' in e.detail for e in pw.session().events.since(seq))\n"
            "print(same, rewards == expected[1], report.retries, redone, pw.elastic_map.last_run.slices[1].batches)",
            timeout=300,
        )
        assert reply.status == "ok", reply.error
        same, rewards_equal, retries, redone, last_batches = reply.text.strip().splitlines()[-1].split()
        assert (same, rewards_equal) == ("True", "True"), reply.text
        # A trainer loss is one recovery of the elastic loop; a rollout loss none: the rollout redoes its batch.
        assert (retries, redone) == (("1", "0") if lost == 0 else ("0", "1")), reply.text
        assert last_batches == "4", reply.text  # the last step rolled out on slice 1, repaired
    finally:
        kernel.run(f"rl_jobs.repair_if_down({lost})")
