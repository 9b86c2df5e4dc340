"""Throughput cost of the embedded backend's thread pools against stock JAX.

The embedded backend creates XLA's CPU client with pools of twice the devices
(``PJRT_NPROC``; see ``_client_threads`` in ``emulator/local.py``), so that an
unblocked loop cannot deadlock its collectives. Stock JAX on this machine
(pools of max(cores, devices)) aborts such a loop after 32 steps in flight,
so the side-by-side loop reads its loss every ``--every`` (16) steps, which
both survive: an optax Adam MLP (64-256-256-1) on a ``(data=2, model=4)`` mesh
over 8 CPU devices, batch sharded over both slices (grads averaged across
them), ``--steps`` steps per repetition after a warm-up, in fresh processes,
alternating stock and embedded ``--pairs`` times. The embedded loop that never
blocks is timed too (stock cannot run it).

Prints ms/step for each and ``embedded/stock time per step`` last (goal <= 1.05).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def child(kind: str, steps: int, every: int, reps: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    if kind == "stock":
        jax.config.update("jax_num_cpu_devices", 8)
        mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    else:
        import pathways_kernel as pw

        mesh = pw.mesh()
    batch = NamedSharding(mesh, P(("data", "model")))
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
    keys = jax.random.split(jax.random.key(0), 3)
    p = jax.device_put({"w1": jax.random.normal(keys[0], (64, 256)) * 0.1,
                        "w2": jax.random.normal(keys[1], (256, 256)) * 0.1,
                        "w3": jax.random.normal(keys[2], (256, 1)) * 0.1}, replicated)
    s = opt.init(p)

    def run(n: int) -> float:
        nonlocal p, s
        start = time.perf_counter()
        for i in range(n):
            p, s, loss = step(p, s, x, y)
            if every and (i + 1) % every == 0:
                float(loss)
        float(loss)
        return time.perf_counter() - start

    run(every or 16)  # compile
    print(json.dumps([run(steps) / steps for _ in range(reps)]))


def measure(kind: str, steps: int, every: int, reps: int) -> list[float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--steps", str(steps), "--every", str(every), "--reps", str(reps)],
        capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(f"{kind} (every {every}) exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("stock", "embedded"))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.every, args.reps)
        return
    stock: list[float] = []
    embedded: list[float] = []
    for _ in range(args.pairs):
        stock += measure("stock", args.steps, args.every, args.reps)
        embedded += measure("embedded", args.steps, args.every, args.reps)
    unblocked = measure("embedded", args.steps, 0, args.reps)

    def ms(xs: list[float]) -> str:
        return f"median {statistics.median(xs) * 1e3:.2f} (min {min(xs) * 1e3:.2f}, max {max(xs) * 1e3:.2f})"

    print(f"stock JAX, loss read every {args.every}   {ms(stock)} ms/step ({len(stock)} reps of {args.steps} steps)")
    print(f"embedded, loss read every {args.every}    {ms(embedded)} ms/step")
    print(f"embedded, never blocked         {ms(unblocked)} ms/step (stock aborts this loop)")
    ratio = statistics.median(embedded) / statistics.median(stock)
    print(f"embedded/stock time per step    {ratio:.3f}  (same loop, alternating processes; goal <= 1.05)")


if __name__ == "__main__":
    main()
