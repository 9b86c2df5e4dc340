"""Memory kinds on the local server: JAX's own host-offload examples give what in-process CPU JAX gives.

A TPU device offers ``device`` and ``pinned_host`` memories (host offload, orbax's Pathways
snapshots keep replicas there); a stock CPU device also ``unpinned_host``. The examples are
those of JAX's memory-kind docs: placing an array in host memory and back, a jitted function
whose output lives in host memory, one that reads host memory, and activation offloading with
``save_and_offload_only_these_names``. Each runs in a client of a real server and in a stock
CPU JAX process, and both must say the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import proxy_clients

from pathways_kernel.backends import server_client

HERE = os.path.abspath(__file__)
EXPECTED = {
    "memories": ["device", "pinned_host", "unpinned_host"],
    "default memory": "device",
    "device_put pinned_host": ["pinned_host", True],
    "device_put unpinned_host": ["unpinned_host", True],
    "pinned_host back to device": ["device", True],
    "jit out_shardings pinned_host": ["pinned_host", True],
    "jit in_shardings pinned_host": ["device", True],
    "remat offloads to pinned_host": True,
}


def examples() -> dict:
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if os.environ.get("JAX_PLATFORMS") == "proxy":
        import pathwaysutils

        pathwaysutils.initialize()
    device = jax.devices()[0]
    s = NamedSharding(Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y")), P("x", "y"))
    host = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    x = jax.device_put(host, s)

    def placed(array: jax.Array, expected: np.ndarray) -> list:
        return [array.sharding.memory_kind, bool((np.asarray(array) == expected).all())]

    def offload() -> bool:
        policy = jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=["h"],
            offload_src="device",
            offload_dst="pinned_host",
        )

        def f(w: jax.Array, a: jax.Array) -> jax.Array:
            h = checkpoint_name(jnp.sin(a @ w), "h")
            return jnp.sum(h * h)

        w = jnp.ones((8, 8)) * 0.1
        offloaded = jax.jit(jax.grad(jax.checkpoint(f, policy=policy)))(w, x)
        return bool(np.allclose(np.asarray(offloaded), np.asarray(jax.grad(f)(w, x)), atol=1e-5))

    pinned = jax.device_put(x, s.with_memory_kind("pinned_host"))
    return {
        "memories": sorted(m.kind for m in device.addressable_memories()),
        "default memory": device.default_memory().kind,
        "device_put pinned_host": placed(pinned, host),
        "device_put unpinned_host": placed(jax.device_put(x, s.with_memory_kind("unpinned_host")), host),
        "pinned_host back to device": placed(jax.device_put(pinned, s.with_memory_kind("device")), host),
        "jit out_shardings pinned_host": placed(
            jax.jit(lambda a: a * 2, out_shardings=s.with_memory_kind("pinned_host"))(x), host * 2
        ),
        "jit in_shardings pinned_host": placed(
            jax.jit(lambda a: a + 1, in_shardings=s.with_memory_kind("pinned_host"), out_shardings=s)(pinned), host + 1
        ),
        "remat offloads to pinned_host": offload(),
    }


def test_memory_kind_examples_match_in_process_jax():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    stock = subprocess.run(
        [sys.executable, HERE],
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"},
    )
    assert stock.returncode == 0, stock.stderr[-3000:]
    assert json.loads(stock.stdout.splitlines()[-1]) == EXPECTED
    server = server_client.start(2, 4)
    try:
        assert proxy_clients.run_client(HERE, server.target) == EXPECTED
    finally:
        server.stop()


if __name__ == "__main__":
    print(json.dumps(examples()), flush=True)
