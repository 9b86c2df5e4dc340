"""Goodput of three ways to survive slice losses, side by side: same model, same failures.

One MLP trained with optax Adam on ``local:2x4`` (2 slices of 4 CPU devices;
global batch sharded over the slices, hidden layer over the chips), for
``--seconds`` of wall time per strategy, under the same seeded failure
schedule: a slice lost about every ``--mtbf`` s, repaired ``--mttr`` s later.

  (a) ``pw.elastic``: host snapshot every ``--snapshot-every`` steps, the step
      compiled ahead for the one-slice mesh (``prepare``), resume on the
      surviving slice, scale back up when the slice returns.
  (b) pathwaysutils' ``Manager.elastic_retry`` as its docs show it: the
      training function restarts on every elastic event, on the slices that
      are active (``minimum_slice_count=1``), from a host copy the loop takes
      every ``--snapshot-every`` steps (``jax.device_get``, as pathwaysutils'
      removed snapshot API did), and raises ``ScaleUpSignalError`` when the
      monitor thread (``poll_interval=1``) sees the slice back. ``Manager()``
      as is: the embedded backend shows pathwaysutils its slices. Its steps
      are marked with ``pw.steps`` and nothing else: the attempts are one run
      (``training/goodput_jobs.py``), and the host copies, inside the loop
      body, count as step time.
  (c) what most jobs do today: an orbax checkpoint every ``--checkpoint-every``
      steps; on a loss, wait for the slice to be repaired, restart (caches
      cleared, so the step compiles again), reload the latest checkpoint and
      redo the steps since. A real restart also pays process start and device
      initialization, which are not emulated here: (c) is flattered.

Each strategy's time is accounted by the same ledger (``pw.goodput``):
goodput = productive step time (steps kept, not redone) / wall time. Prints
each strategy's goodput and badput, the ml-goodput-measurement figure from
the same run, the accounting overhead per step, then ``goodput(a)/goodput(c)``
last. Goals: (a) >= 0.90, (a) >= (b), (a)/(c) >= 1.5, overhead <= 1%.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import random
import shutil
import tempfile
import threading
import time


class TimeUp(Exception):
    """The strategy's wall-time budget is spent."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="wall time per strategy (default 120)")
    parser.add_argument("--mtbf", type=float, default=15.0, help="seconds between slice losses (default 15)")
    parser.add_argument("--mttr", type=float, default=5.0, help="seconds a lost slice stays down (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the failure schedule")
    parser.add_argument("--snapshot-every", type=int, default=10, help="(a), (b): steps between host snapshots")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="(c): steps between orbax checkpoints")
    parser.add_argument("--only", default="abc", help="strategies to run, e.g. 'ac' (default abc)")
    parser.add_argument("--backend", default="local:2x4", help="what to connect to (default local:2x4)")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pathways_kernel as pw
    from pathways_kernel.core import meshes
    from pathways_kernel.training import accounting

    # elastic_retry logs every elastic event with its traceback: expected here, every ~15 s.
    logging.getLogger("pathwaysutils").setLevel(logging.CRITICAL)
    pw.connect(args.backend)
    session = pw.session()
    D, H, B, POOL = 256, 1024, 256, 16
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(POOL, B, D)).astype(np.float32)
    ys = np.tanh(xs @ rng.normal(scale=D**-0.5, size=(D, D)).astype(np.float32))
    opt = optax.adam(1e-3)
    specs = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}

    def init_state(mesh):
        key = np.random.default_rng(1)
        params = {
            "w1": key.normal(scale=D**-0.5, size=(D, H)).astype(np.float32),
            "b1": np.zeros(H, np.float32),
            "w2": key.normal(scale=H**-0.5, size=(H, D)).astype(np.float32),
            "b2": np.zeros(D, np.float32),
        }
        params = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in params.items()}
        return {"params": params, "opt": opt.init(params)}

    @jax.jit
    def train_step(state, x, y):
        def loss_fn(p):
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = opt.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}, loss

    def batch(step, mesh):
        sharding = NamedSharding(mesh, P("data"))
        return jax.device_put(xs[step % POOL], sharding), jax.device_put(ys[step % POOL], sharding)

    def mesh_of(indices):
        return meshes.build([sl for sl in session.topology.slices if sl.index in indices])

    # -- the failure schedule: same seed, same losses and repairs, per strategy --
    schedule_rng = random.Random(args.seed)
    schedule = []
    t = 0.0
    while True:
        t += args.mtbf * schedule_rng.uniform(0.8, 1.2)
        index, repaired = schedule_rng.randrange(2), t + args.mttr * schedule_rng.uniform(0.8, 1.2)
        if repaired >= args.seconds - 1:  # every loss is repaired within the run
            break
        schedule.append((t, index, repaired))

    def cluster(stop: threading.Event, start: float, applied: list) -> None:
        """Fails and repairs slices on the schedule, in wall time since ``start``."""
        events = sorted(
            [(t_fail, "fail", i) for t_fail, i, _ in schedule] + [(t_up, "restore", i) for _, i, t_up in schedule]
        )
        for at, action, index in events:
            if stop.wait(max(0.0, start + at - time.perf_counter())):
                return
            (pw.fail_slice if action == "fail" else pw.repair_slice)(index)
            applied.append(action)

    def run_strategy(name, fn):
        for sl in session.topology.down_slices:
            pw.repair_slice(sl.index)
        jax.clear_caches()  # each strategy compiles its own step
        stop = threading.Event()
        start = time.perf_counter()
        applied: list[str] = []
        thread = threading.Thread(target=cluster, args=(stop, start, applied), daemon=True)
        thread.start()
        try:
            account = fn(start + args.seconds)
        finally:
            stop.set()
            thread.join()
            for sl in session.topology.down_slices:
                pw.repair_slice(sl.index)
        if len(applied) != 2 * len(schedule):
            print(
                f"{name}: {len(applied)} of {2 * len(schedule)} scheduled failures and repairs happened: not comparable"
            )
        return account

    # -- (a) the kernel's elastic loop -------------------------------------------
    def strategy_a(deadline):
        def step_fn(state, step, mesh):
            if time.perf_counter() >= deadline:
                raise TimeUp
            new, _loss = train_step(state, *batch(step, mesh))
            return new

        state = init_state(session.mesh())
        loop = pw.elastic(
            step_fn,
            snapshot_every=args.snapshot_every,
            name="a-elastic",
            max_retries=None,
            prepare=lambda m: train_step.lower(
                pw.elastic.abstract(state, m),
                jax.ShapeDtypeStruct((B, D), jnp.float32, sharding=NamedSharding(m, P("data"))),
                jax.ShapeDtypeStruct((B, D), jnp.float32, sharding=NamedSharding(m, P("data"))),
            ).compile(),
        )
        with contextlib.suppress(TimeUp):
            loop(state, steps=10**9)
        return pw.goodput("a-elastic").accounts[0]

    # -- (b) pathwaysutils elastic_retry ------------------------------------------
    def strategy_b(deadline):
        # Only what a user writes: the attempts of the retried function are one
        # run, and the time between them badput by cause, through pw.steps alone.
        from pathwaysutils.elastic import manager

        mgr = manager.Manager()  # sees the emulated slices (core/pathwaysutils_compat.py)
        kept = {"step": 0, "host": None}

        @mgr.elastic_retry(minimum_slice_count=1, poll_interval=1)
        def train():
            mesh = mesh_of(mgr.active_slice_indices)
            if kept["host"] is None:
                state = init_state(mesh)
            else:
                state = jax.tree.map(
                    lambda h, like: jax.device_put(h, NamedSharding(mesh, like.sharding.spec)),
                    kept["host"],
                    kept["like"],
                )
            for step in pw.steps(itertools.count(kept["step"]), name="b-elastic_retry", start=kept["step"]):
                if time.perf_counter() >= deadline:
                    raise TimeUp
                if mgr.available_inactive_slices:
                    kept.update(step=step, host=jax.device_get(state), like=state)
                    raise manager.ScaleUpSignalError
                state, _loss = train_step(state, *batch(step, mesh))
                if (step + 1) % args.snapshot_every == 0:
                    kept.update(step=step + 1, host=jax.device_get(state), like=state)

        with contextlib.suppress(TimeUp):
            train()
        return pw.goodput("b-elastic_retry").accounts[0]

    # -- (c) restart from the latest orbax checkpoint -------------------------------
    def strategy_c(deadline):
        import orbax.checkpoint as ocp
        from pathwaysutils.elastic.elastic import is_error_due_to_slice_down

        directory = tempfile.mkdtemp(prefix="bench-goodput-")
        account = accounting.begin("c-checkpoint-restart", "restart")
        try:
            ckpt = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=2))
            mesh = session.mesh()
            state = init_state(mesh)
            ckpt.save(0, args=ocp.args.StandardSave(state))
            step = 0
            while True:
                try:
                    while True:
                        if time.perf_counter() >= deadline:
                            raise TimeUp
                        account.step_begin(step)
                        state, loss = train_step(state, *batch(step, mesh))
                        account.step_end(state)  # as the elastic loop does: the ledger treats all alike
                        step += 1
                        if step % args.snapshot_every == 0:
                            # Read the loss, as a loop logging it does.
                            with account.computing():
                                float(loss)
                        if step % args.checkpoint_every == 0:
                            with account.computing():  # the steps' device time comes due here
                                jax.block_until_ready(state)
                            with account.spent("checkpoint_save"):
                                ckpt.save(step, args=ocp.args.StandardSave(state))
                except jax.errors.JaxRuntimeError as error:
                    if not is_error_due_to_slice_down(error):
                        raise
                    account.recovery_begin()
                    with account.spent("slice_wait"):
                        while session.topology.down_slices:
                            time.sleep(0.05)
                    # The restarted job: nothing compiled, state from the latest checkpoint.
                    jax.clear_caches()
                    mesh = session.mesh()
                    ckpt.wait_until_finished()
                    latest = ckpt.latest_step()
                    target = jax.tree.map(
                        lambda a, mesh=mesh: jax.ShapeDtypeStruct(
                            a.shape, a.dtype, sharding=NamedSharding(mesh, a.sharding.spec)
                        ),
                        state,  # lost arrays still know their shapes and specs
                    )
                    state = ckpt.restore(latest, args=ocp.args.StandardRestore(target))
                    step = latest
                    account.recovery_end(step)
        except TimeUp:
            pass
        finally:
            account.end()
            ckpt.wait_until_finished()
            ckpt.close()
            shutil.rmtree(directory, ignore_errors=True)
        return account

    strategies = {
        "a": ("(a) pw.elastic", strategy_a),
        "b": ("(b) pathwaysutils elastic_retry", strategy_b),
        "c": ("(c) orbax checkpoint restart", strategy_c),
    }
    accounts = {}
    for key in args.only:
        label, fn = strategies[key]
        started = time.perf_counter()
        accounts[key] = run_strategy(label, fn)
        print(f"{label:<34} {accounts[key].summary()}  [{time.perf_counter() - started:.0f} s]", flush=True)

    # Accounting overhead: one step's ledger calls, timed alone, over the mean step time of (a).
    probe = accounting.begin("overhead-probe", "probe")
    n = 20_000
    start = time.perf_counter()
    for i in range(n):
        probe.step_begin(i)
        probe.step_end()
        with probe.spent("snapshot_stall"):
            pass
    per_step = (time.perf_counter() - start) / n
    probe.end()
    ref = accounts.get("a") or next(iter(accounts.values()))
    mean_step = ref.seconds["productive"] / max(1, ref.steps)

    print()
    print(
        f"failure schedule   {len(schedule)} losses in {args.seconds:.0f} s per strategy (seed {args.seed}): "
        + ", ".join(f"slice {i} {t:.0f}-{u:.0f} s" for t, i, u in schedule)
    )
    for key, account in accounts.items():
        label = strategies[key][0]
        seconds = account.seconds
        wall = account.wall_s
        badput = ", ".join(
            f"{k} {100 * v / wall:.1f}%"
            for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])
            if k != "productive" and v > 0.001 * wall
        )
        try:
            field = f"{account.field()['goodput']:.1f}%"
        except Exception as error:
            field = f"n/a ({type(error).__name__})"
        print(
            f"{label:<34} goodput {account.goodput:.3f}  {account.steps} steps kept, {account.steps_redone} redone, "
            f"{account.recoveries} recoveries; badput {badput}; ml-goodput-measurement {field}"
        )
    print(
        f"accounting overhead   {per_step * 1e6:.1f} us per step = {100 * per_step / mean_step:.2f}% of a {mean_step * 1000:.1f} ms step (goal <= 1%)"
    )
    if "a" in accounts and "b" in accounts:
        print(f"goodput(a)/goodput(b)          {accounts['a'].goodput / accounts['b'].goodput:.2f}  (goal >= 1)")
    if "a" in accounts:
        print(f"goodput(a)                     {accounts['a'].goodput:.3f}  (goal >= 0.90)")
    if "a" in accounts and "c" in accounts:
        print(f"goodput(a)/goodput(c)          {accounts['a'].goodput / accounts['c'].goodput:.2f}  (goal >= 1.5)")


if __name__ == "__main__":
    main()
