"""A plain training loop that never blocks survives on the embedded backend.

XLA's CPU client used to abort the kernel (exit -6) on this machine once more
than 32 steps with collectives were in flight; see ``_client_threads`` in
``emulator/local.py``. The kernels here get XLA's collective timeouts cut from
40 s to 10 s, so that a deadlock fails the test in seconds, not minutes.
"""

from __future__ import annotations

import queue
import time

import pytest
from kernels import Kernel

pytestmark = pytest.mark.kernel

FAST_DEADLOCK = {
    "XLA_FLAGS": "--xla_cpu_collective_call_warn_stuck_timeout_seconds=5 "
    "--xla_cpu_collective_call_terminate_timeout_seconds=10 --xla_cpu_collective_timeout_seconds=10"
}

UNBLOCKED_TRAINING = """
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = pw.mesh()
batch = NamedSharding(mesh, P(("data", "model")))  # over both slices: grads are averaged across them
replicated = NamedSharding(mesh, P())
opt = optax.adam(1e-3)

def loss_fn(p, x, y):
    h = jnp.tanh(x @ p["w1"])
    h = jnp.tanh(h @ p["w2"])
    return jnp.mean((h @ p["w3"] - y) ** 2)

@jax.jit
def step(p, s, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    updates, s = opt.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss

rng = np.random.default_rng(0)
x = jax.device_put(rng.random((512, 64), np.float32), batch)
y = jax.device_put(rng.random((512, 1), np.float32), batch)
losses = []
for run in range(3):
    keys = jax.random.split(jax.random.key(run), 3)
    p = jax.device_put({"w1": jax.random.normal(keys[0], (64, 256)) * 0.1,
                        "w2": jax.random.normal(keys[1], (256, 256)) * 0.1,
                        "w3": jax.random.normal(keys[2], (256, 1)) * 0.1}, replicated)
    s = opt.init(p)
    first = None
    for i in range(200):
        p, s, loss = step(p, s, x, y)  # never blocked: up to 200 steps in flight
        first = loss if first is None else first
    losses.append((float(first), float(loss)))
"""


def test_unblocked_training_loop_with_collectives_survives_in_a_kernel():
    kernel = Kernel("pathways", env=FAST_DEADLOCK)
    try:
        msg_id = kernel.kc.execute(UNBLOCKED_TRAINING)
        deadline = time.monotonic() + 300
        while True:
            try:
                reply = kernel.kc.get_shell_msg(timeout=1)
            except queue.Empty:
                assert kernel.km.is_alive(), "the kernel died during the loop"
                assert time.monotonic() < deadline, "the loop did not finish in 300 s"
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["status"] == "ok", reply["content"]
        losses = eval(kernel.run("print(losses)").text.strip())
        assert len(losses) == 3 and all(last < first for first, last in losses)
    finally:
        exit_code = kernel.shutdown()
    assert exit_code == 0
