"""A training loop fed by pw.loader vs the same loop fed by precomputed on-device batches.

Two emulated slices (local:2x4). The step is a jitted two-layer MLP update on
a global batch sharded over the mesh's ``data`` axis (one entry per slice);
each slice's sidecar produces its half of every batch, ``--prefetch`` steps
ahead. The floor is the same loop over batches built before the clock starts
and already on the devices. Each step ends with ``block_until_ready`` (as a
loop that logs its loss does). Rounds alternate loader and floor so machine
noise hits both alike, and compares median step times (robust to the
bursts of a shared machine).

Prints the producer's time per batch alone (goal: below a step), the whole
loader's time per batch without prefetch or training, both step times, and
last the ratio of median step times, loader / floor (goal <= 1.10).

Note: here the sidecars share the CPU cores that also run the step (on TPUs
the step runs on the chips and sidecars on the hosts), so on a busy machine
the sidecars' CPU time per batch adds to the step almost one for one:
expect a ratio near 1 + (loader alone) / step. The default step (hidden
4096, ~40 ms here) keeps that share under 10%; ``--hidden 2048`` (~15 ms
steps) shows the contention.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=256, help="global batch (rows)")
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument(
        "--producer", choices=("read", "synth"), default="read", help="what make_batches does (see the code)"
    )
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pathways_kernel as pw

    pw.connect("local:2x4")
    mesh = pw.mesh()
    batch_rows, features = args.batch, args.features

    # "read": rows gathered from a dataset already in host memory (a page-cached shard
    # file), then normalized, as a loader that reads prepared records does.
    # "synth": rows generated with numpy's RNG, a CPU-heavy producer.
    dataset = np.random.default_rng(0).standard_normal((64 * batch_rows, features), dtype=np.float32)

    def make_batches(step, shard, num_shards):
        rows = batch_rows // num_shards
        if args.producer == "read":
            start = (step * batch_rows + shard * rows) % len(dataset)
            x = dataset[start : start + rows] * np.float32(0.5)
        else:
            x = np.random.default_rng([step, shard, num_shards]).standard_normal((rows, features), dtype=np.float32)
        return {"x": x, "y": x[:, :1] * np.float32(0.1)}

    data = NamedSharding(mesh, P("data"))
    params = {
        "w1": jax.device_put(jnp.ones((features, args.hidden)) * 0.01, NamedSharding(mesh, P(None, "model"))),
        "w2": jax.device_put(jnp.ones((args.hidden, 1)) * 0.01, NamedSharding(mesh, P("model", None))),
    }

    @jax.jit
    def train_step(params, batch):
        def loss_fn(p):
            h = jnp.tanh(batch["x"] @ p["w1"])
            return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda w, g: w - 1e-3 * g, params, grads), loss

    def run(batches, start):
        """Per-step wall times: batch fetch, step, loss ready."""
        p = params
        times = []
        for step in range(start, start + args.steps):
            began = time.perf_counter()
            p, loss = train_step(p, batches(step))
            jax.block_until_ready(loss)
            times.append(time.perf_counter() - began)
        return times

    # The producer alone: both shards of one batch, serially, on this thread.
    began = time.perf_counter()
    for step in range(args.steps):
        make_batches(step, 0, 2), make_batches(step, 1, 2)
    producer = (time.perf_counter() - began) / args.steps

    with pw.loader(make_batches, mesh=mesh, spec=P("data"), prefetch=0, name="alone") as alone_loader:
        jax.block_until_ready(alone_loader.batch(0))
        began = time.perf_counter()
        for step in range(1, args.steps + 1):
            jax.block_until_ready(alone_loader.batch(step))
        alone = (time.perf_counter() - began) / args.steps

    total = args.steps * args.rounds
    host = [
        {k: np.concatenate([make_batches(s, 0, 2)[k], make_batches(s, 1, 2)[k]]) for k in ("x", "y")}
        for s in range(args.steps)
    ]
    floor_batches = [jax.device_put(b, data) for b in host]
    jax.block_until_ready(floor_batches)
    loader = pw.loader(make_batches, mesh=mesh, spec=P("data"), prefetch=args.prefetch, name="bench")
    run(lambda step: floor_batches[step % args.steps], 0)  # compile, warm caches
    run(loader.batch, total)  # first sidecar calls discover output specs

    fed, floor = [], []
    for r in range(args.rounds):
        floor += run(lambda step: floor_batches[step % args.steps], 0)
        fed += run(loader.batch, r * args.steps)
    state = loader.state()
    loader.close()

    fed_s, floor_s = statistics.median(fed), statistics.median(floor)
    print(
        f"producer '{args.producer}' alone: {producer * 1e3:.2f} ms per global batch ({2 * args.steps} sidecar blocks timed)"
    )
    print(f"loader alone, no prefetch: {alone * 1e3:.2f} ms per global batch (two sidecars + placement + join)")
    print(f"step fed by precomputed on-device batches (floor): {floor_s * 1e3:.2f} ms")
    print(
        f"step fed by pw.loader (prefetch {args.prefetch}): {fed_s * 1e3:.2f} ms; waited on {state['waits']} of {state['batches']} batches"
    )
    print(f"loader/floor step time ratio (median step of {len(fed)}, goal <= 1.10): {fed_s / floor_s:.3f}")


if __name__ == "__main__":
    main()
