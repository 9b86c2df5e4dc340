"""The local Pathways server under load: what a user's unblocked training loop asks of it.

A loop that never reads its loss leaves many executions in flight on the server. XLA's CPU
client aborts a process whose collectives starve for threads (a rendezvous that waits 40 s),
which on a loaded 2-core machine took the server, and the user's session, down within a
minute (issue #27 item 1). The server must bound what it has in flight so that never happens.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import proxy_clients
from load import cpu_hogs

from pathways_kernel.backends import server_client

HERE = __file__
STEPS, RUNS = 200, 3


def client_adam_steps(runs: int, steps: int) -> dict:
    """``runs`` x ``steps`` Adam steps of a 256x256 two-matmul model on a batch sharded over all 8 devices (their gradient is
    an all-reduce over both slices), never reading a step until the end."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("slice", "chip"))
    data, replicated = NamedSharding(mesh, P(("slice", "chip"))), NamedSharding(mesh, P())
    optimizer = optax.adam(1e-3)

    def loss_fn(params, x, y):
        h = jnp.tanh(x @ params["w1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    @jax.jit
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((256, 256), dtype=np.float32), data)
    y = jax.device_put(rng.standard_normal((256, 256), dtype=np.float32), data)
    finals = []
    for _ in range(runs):
        params = jax.device_put(
            {"w1": np.full((256, 256), 0.01, np.float32), "w2": np.full((256, 256), 0.01, np.float32)}, replicated
        )
        state = optimizer.init(params)
        losses = []
        for _ in range(steps):
            params, state, loss = step(params, state, x, y)
            losses.append(loss)
        finals.append([float(v) for v in (losses[0], losses[-1])])
    return {"losses": finals}


def test_unblocked_adam_steps_on_both_slices_complete_under_load():
    """3 x 200 Adam steps, none read until its run ends, with two CPU hogs running: before
    the server bounded its executions in flight, XLA aborted it ('Expected 4 threads to join
    the rendezvous, but only 3 of them arrived') and the client saw 'Socket closed'."""
    server = server_client.start(2, 4)
    try:
        with cpu_hogs():
            got = proxy_clients.run_client(HERE, server.target, str(RUNS), str(STEPS), timeout=600)
        assert server.alive(), "\n".join(list(server.stderr_lines)[-5:])
    finally:
        server.stop()
    assert len(got["losses"]) == RUNS
    for first, last in got["losses"]:
        assert np.isfinite(last) and last < first


if __name__ == "__main__":
    import pathwaysutils

    pathwaysutils.initialize()
    print(json.dumps(client_adam_steps(int(sys.argv[1]), int(sys.argv[2]))), flush=True)
