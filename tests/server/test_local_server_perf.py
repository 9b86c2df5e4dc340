"""What the local Pathways server does to save its client time, driven by JAX's own proxy client.

A program compiled again (JAX's caches cleared, as a restarted job or a recovery
that clears them does) is not compiled again on the server: it keeps what it
compiled, as Pathways keeps its own compilation cache.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import proxy_clients

from pathways_kernel.backends import server_client

HERE = __file__


def client_compile_twice(target: str) -> dict:
    import jax
    import jax.numpy as jnp

    x = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    results, hits = [], []
    for _ in range(2):
        step = jax.jit(lambda a: jnp.tanh(a @ a.T) + 1.0)  # a new function: JAX lowers and compiles it again
        results.append(np.asarray(step(x)).tolist())
        hits.append(server_client.status(target)["counts"].get("compile_cache_hits", 0))
        jax.clear_caches()
    return {"results": results, "hits": hits}


def test_a_program_compiled_again_is_the_one_the_server_compiled_before():
    server = server_client.start(2, 4)
    try:
        got = proxy_clients.run_client(HERE, server.target, server.target)
    finally:
        server.stop()

    x = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    for result in got["results"]:
        np.testing.assert_allclose(result, np.tanh(x @ x.T) + 1.0, rtol=1e-5)
    assert got["hits"][1] >= got["hits"][0] + 1, got


if __name__ == "__main__":
    import pathwaysutils

    pathwaysutils.initialize()
    print(json.dumps(client_compile_twice(sys.argv[1])), flush=True)
