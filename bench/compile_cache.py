"""Persistent compilation cache in a bucket: cold against warm, in fresh processes.

A medium model (an unrolled stack of residual MLP blocks, forward and
backward, jitted) is compiled in a new Python process with the cache pointed
at an empty prefix of a local fake-gcs-server (cold: compile, then write),
then in another new process against the same prefix (warm: read). Each
process times ``jit(...).lower(...).compile()``, the part the cache can save
(tracing and lowering happen either way; their times are printed too).

Prints warm/cold compile time last (goal <= 0.2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

LAYERS = 24
WIDTH = 256


def child(url: str) -> None:
    import jax
    import jax.numpy as jnp

    from pathways_kernel.state import compile_cache

    compile_cache.enable(url, min_compile_s=0.0)
    jax.config.update("jax_raise_persistent_cache_errors", True)

    def block(x, p):
        h = (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-5) * p["g"]
        return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]

    def loss(params, x):
        for p in params:  # unrolled on purpose: that is what makes compiling slow
            x = block(x, p)
        return jnp.mean(x**2)

    params = [
        {
            "g": jnp.ones(WIDTH),
            "w1": jnp.full((WIDTH, 4 * WIDTH), 0.01 * (i + 1)),
            "w2": jnp.full((4 * WIDTH, WIDTH), 0.01),
        }
        for i in range(LAYERS)
    ]
    x = jnp.ones((32, WIDTH))
    step = jax.jit(jax.value_and_grad(loss))
    start = time.perf_counter()
    lowered = step.lower(params, x)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    value, _ = compiled(params, x)
    float(value)
    status = compile_cache.status()
    print(
        json.dumps(
            {
                "lower_s": lowered_at - start,
                "compile_s": compiled_at - lowered_at,
                "hits": status.hits,
                "misses": status.misses,
            }
        )
    )


def run_child(url: str, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", url], env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return

    from gcs import GcsServer

    with tempfile.TemporaryDirectory(prefix="bench-gcs-") as tmp:
        server = GcsServer(Path(tmp))
        server.start()
        try:
            server.make_bucket("jax-cache")
            env = {**os.environ, **server.env, "JAX_PLATFORMS": "cpu"}
            ratios = []
            for r in range(args.rounds):
                url = f"gs://jax-cache/round{r}"
                cold = run_child(url, env)
                warm = run_child(url, env)
                assert cold["misses"] >= 1 and warm["hits"] >= 1, (cold, warm)
                ratios.append(warm["compile_s"] / cold["compile_s"])
                print(
                    f"round {r}: cold compile {cold['compile_s']:.2f} s ({cold['misses']} misses), "
                    f"warm {warm['compile_s']:.2f} s ({warm['hits']} hits); lowering {cold['lower_s']:.2f} / {warm['lower_s']:.2f} s"
                )
            print(
                f"model: {LAYERS} residual MLP blocks of width {WIDTH}, forward + backward; cache at {server.url} (fake-gcs-server)"
            )
            print(f"warm/cold compile time: {statistics.median(ratios):.2f} (goal <= 0.2)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
