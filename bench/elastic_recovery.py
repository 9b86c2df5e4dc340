"""Elastic recovery time against its floor, and snapshot throughput against numpy.

1 GiB of training state (``--gib``), a pytree of arrays sharded over
``local:2x4`` (half ``P("data", "model")``, half ``P(None, "model")``), trained
by ``pw.elastic`` with host snapshots. At a fixed step slice 1 fails
(``pw.fail_slice``); we measure from the ``slice_down`` event to the end of
the first step completed on the reduced mesh (detection, mesh rebuild,
snapshot restore, recompile, one step). In the same run, the floor: one
``jax.device_put`` of the same host snapshot onto the reduced mesh, right
after each recovery (a second one, into the memory the first freed, is shown
too: the restore had no such luck, the lost state's buffers were still held).

The step is deliberately light (a block of each big table is read, the
small dense head is trained), so the figure measures recovery, not the model's own
step time; a step that rewrote all 1 GiB would add its own cost on top.

Snapshot throughput: device-to-host copy of the state by ``pw.snapshot``
(start to ``wait()``) against a plain numpy copy of the same bytes (each
distinct shard's device buffer, as numpy sees it without copying, copied with
``ndarray.copy``), alternating, medians of ``--reps``.

Steady-state cost: a small MLP trained with optax Adam (6 MiB of state, a
few ms per step), ``--steady-steps`` steps run by ``pw.elastic`` at the
default snapshot interval against the same step in a plain Python loop that
reads its state every ``snapshot_every`` steps (as a loop logging its loss
does, and as the elastic loop waits on its snapshots), alternating, medians
of ``--reps``.

Prints ``elastic/plain steady state`` (goal <= 1.02), ``recovery/floor``
(goal <= 1.5), ``recovery/warm floor`` (goal <= 1.5) and ``snapshot/numpy
throughput`` (goal >= 0.7), the figures last.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="training state size in GiB (default 1)")
    parser.add_argument("--reps", type=int, default=7, help="repetitions of each throughput measurement")
    parser.add_argument("--cycles", type=int, default=3, help="failure/repair cycles (one recovery measured each)")
    parser.add_argument("--steady-steps", type=int, default=300, help="steps per steady-state run (default 300)")
    parser.add_argument("--backend", default="local:2x4", help="what to connect to (default local:2x4)")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pathways_kernel as pw
    from pathways_kernel.state import snapshots

    pw.connect(args.backend)
    plain_s, elastic_s = steady_state(args.steady_steps, args.reps)
    session = pw.session()
    mesh = session.mesh()
    tables, rows = 8, 1024
    cols = max(8, int(args.gib * (1 << 30)) // tables // rows // 4 // 8 * 8)
    specs = [P("data", "model"), P(None, "model")] * (tables // 2)
    state = {
        "tables": [
            jax.device_put(np.full((rows, cols), 0.01 * (i + 1), np.float32), NamedSharding(mesh, spec))
            for i, spec in enumerate(specs)
        ],
        "head": jax.device_put(np.zeros((tables, 16), np.float32), NamedSharding(mesh, P())),
    }
    jax.block_until_ready(state)
    nbytes = sum(x.nbytes for x in jax.tree.leaves(state))

    @jax.jit
    def update_head(tables, head, target):
        # Reads a block of each (frozen) table, takes a gradient step on the head.
        feats = jnp.stack([t[:8, :16].mean(axis=0) for t in tables])
        return head - 0.1 * 2 * (head * feats - target)

    target = jnp.float32(1.0)
    cycle_len, fail_offset, restore_offset = 20, 12, 18
    recoveries: list[float] = []
    floors: list[float] = []
    warm: list[float] = []
    marks: dict[str, float] = {}
    done_cycles: set[int] = set()

    def step_fn(st, step, mesh):
        cycle, offset = divmod(step, cycle_len)
        if cycle < args.cycles and offset == fail_offset and cycle not in done_cycles:
            done_cycles.add(cycle)
            loop.prepared.wait()
            pw.fail_slice(1)
        if cycle < args.cycles and offset == restore_offset and mesh.shape["data"] == 1:
            pw.repair_slice(1)
        out = {"tables": st["tables"], "head": update_head(st["tables"], st["head"], target)}
        if mesh.shape["data"] == 1 and "down" in marks:
            jax.block_until_ready(out)
            recoveries.append(time.perf_counter() - marks.pop("down"))
            floors.append(floor_now(mesh))
        return out

    def floor_now(mesh) -> float:
        """One device_put of the snapshot the loop restored, onto the same reduced
        mesh, into fresh device memory as the restore had to; a second one, into
        the memory the first just freed, is kept for the record (``warm``)."""
        snap = snapshots.store().latest("elastic:bench")
        shardings = [sh for sh in snapshots.shardings_for(snap, mesh) if sh is not None]
        hosts = [leaf.host for leaf in snap.leaves if leaf.on_device]
        times = []
        for _ in range(2):
            start = time.perf_counter()
            placed = jax.device_put(hosts, shardings)
            jax.block_until_ready(placed)
            times.append(time.perf_counter() - start)
            del placed
        warm.append(times[1])
        return times[0]

    def on_event(event):
        if event.kind == "slice_down":
            marks["down"] = time.perf_counter()

    loop = pw.elastic(
        step_fn,
        snapshot_every=10,
        name="bench",
        # Compile the step for the one-slice mesh ahead of a loss.
        # (It runs when the loop starts, before the `del state` below.)
        prepare=lambda m: update_head.lower(
            pw.elastic.abstract(state["tables"], m),  # noqa: F821
            pw.elastic.abstract(state["head"], m),  # noqa: F821
            target,
        ).compile(),
    )
    unsubscribe = session.events.subscribe(on_event)
    try:
        final = loop(state, steps=args.cycles * cycle_len)
    finally:
        unsubscribe()
    del state, final
    snap = snapshots.store().latest("elastic:bench")
    ratios = [r / f for r, f in zip(recoveries, floors, strict=True)]

    # Snapshot D2H throughput vs numpy copying the same bytes: each distinct
    # shard's device buffer (seen by numpy without a copy) copied with ndarray.copy.
    on_device = snapshots.restore(snap, session.mesh())
    jax.block_until_ready(on_device)
    buffers = [
        np.asarray(shard.data)
        for leaf in jax.tree.leaves(on_device)
        for shard in leaf.addressable_shards
        if shard.replica_id == 0
    ]
    snap_times, copy_times = [], []

    def time_snapshot() -> None:
        start = time.perf_counter()
        taken = snapshots.take(on_device, "bench-throughput").wait()
        snap_times.append(time.perf_counter() - start)
        del taken

    def time_numpy() -> None:
        start = time.perf_counter()
        copies = [b.copy() for b in buffers]
        copy_times.append(time.perf_counter() - start)
        del copies

    for rep in range(args.reps):
        # Alternate which goes first, so that drift in machine load hits both alike.
        for measure in (time_snapshot, time_numpy) if rep % 2 == 0 else (time_numpy, time_snapshot):
            measure()
    snap_s, copy_s = statistics.median(snap_times), statistics.median(copy_times)

    report = loop.last_run
    gib = nbytes / (1 << 30)
    ms = lambda xs: ", ".join(f"{x * 1000:.0f}" for x in xs)  # noqa: E731
    print(f"state                {gib:.2f} GiB in {len(snap.leaves)} arrays on local:2x4")
    print(f"run                  {report.summary()}")
    print(f"recovery             {ms(recoveries)} ms (slice_down -> first step done on 1 slice, per cycle)")
    print(f"floor                {ms(floors)} ms (device_put of the same snapshot onto 1 slice, per cycle)")
    print(f"floor, warm          {ms(warm)} ms (a second device_put, into memory the first just freed)")
    print(f"snapshot D2H         {gib / snap_s:.2f} GiB/s (median {snap_s * 1000:.0f} ms; runs {ms(snap_times)})")
    print(f"numpy copy           {gib / copy_s:.2f} GiB/s (median {copy_s * 1000:.0f} ms; runs {ms(copy_times)})")
    print(
        f"steady state         plain {ms(plain_s)} ms, elastic {ms(elastic_s)} ms ({args.steady_steps} steps each, alternating)"
    )
    print(
        f"elastic/plain steady state    {statistics.median(elastic_s) / statistics.median(plain_s):.3f}  "
        f"(default snapshot interval; goal <= 1.02)"
    )
    print(
        f"recovery/floor                {statistics.median(ratios):.2f}  (median of {len(ratios)} cycles; goal <= 1.5)"
    )
    warm_ratios = [r / w for r, w in zip(recoveries, warm, strict=True)]
    print(
        f"recovery/warm floor           {statistics.median(warm_ratios):.2f}  (median of {len(warm_ratios)} cycles; goal <= 1.5)"
    )
    print(f"snapshot/numpy throughput     {copy_s / snap_s:.2f}  (goal >= 0.7)")


def steady_state(steps: int, reps: int) -> tuple[list[float], list[float]]:
    """Seconds for ``steps`` steps of the same training step, plain and elastic, alternating."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pathways_kernel as pw
    from pathways_kernel.training.elastic_loop import DEFAULT_SNAPSHOT_EVERY

    mesh = pw.session().mesh()
    d, h, b = 256, 1024, 256
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(16, b, d)).astype(np.float32)
    ys = np.tanh(xs)
    opt = optax.adam(1e-3)
    specs = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}
    shapes = {"w1": (d, h), "b1": (h,), "w2": (h, d), "b2": (d,)}

    def init():
        params = {k: jax.device_put(np.full(shapes[k], 0.01, np.float32), NamedSharding(mesh, specs[k])) for k in specs}
        state = {"params": params, "opt": opt.init(params)}
        return jax.block_until_ready(state)

    @jax.jit
    def update(state, x, y):
        def loss_fn(p):
            return jnp.mean((jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"] - y) ** 2)

        grads = jax.grad(loss_fn)(state["params"])
        updates, opt_state = opt.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}

    def step_fn(state, step, mesh):
        batch = NamedSharding(mesh, P("data"))
        return update(state, jax.device_put(xs[step % 16], batch), jax.device_put(ys[step % 16], batch))

    def plain() -> float:
        state = init()
        start = time.perf_counter()
        for step in range(steps):
            state = step_fn(state, step, mesh)
            if (step + 1) % DEFAULT_SNAPSHOT_EVERY == 0:
                jax.block_until_ready(state)
        jax.block_until_ready(state)
        return time.perf_counter() - start

    loop = pw.elastic(step_fn, name="steady")

    def elastic() -> float:
        state = init()
        start = time.perf_counter()
        loop(state, steps=steps)
        return time.perf_counter() - start

    plain(), elastic()  # compile both
    plain_s, elastic_s = [], []
    for rep in range(reps):
        for run in (plain, elastic) if rep % 2 == 0 else (elastic, plain):
            (plain_s if run is plain else elastic_s).append(run())
    return plain_s, elastic_s


if __name__ == "__main__":
    main()
