"""RL across slices on the local Pathways server against in-process JAX: weight sync,
rollout throughput, rollout and training side by side.

Two sides, each a fresh process on the same machine: in-process CPU JAX with 2 devices,
and JAX's own proxy client (``JAX_PLATFORMS=proxy`` + pathwaysutils) against
``pathways-local serve --slices 2x1`` (one chip per slice, so both fit a 2-core machine).
The trainer lives on slice 0 (device 0), the rollout on slice 1 (device 1).

  * weight sync: 64 MiB of parameters (4 x 16 MiB float32) from the trainer to the rollout,
    as an RL framework moves them every step: in-process ``jax.device_put``, on the server
    pathwaysutils' side channel (``experimental.reshard.reshard``, the ``reshardRequest`` Tunix
    sends, plans cached), median of 7; the server counts the bytes that passed through
    the client meanwhile (goal 0);
  * rollout: a small decoder (2 layers, width 512, vocabulary 512) generating 64 tokens for
    a batch of 32 with a KV cache, one jitted decode step per token (cache and position stay
    on the device), greedy; tokens/s;
  * overlap: a training loop (30 steps) on slice 0 and a rollout phase (one generation) on
    slice 1 in two threads at once,
    against the longer of the two alone (on disjoint slices they should not wait for each other);
  * a tiny op on slice 1 while a long program (~1 s) runs on slice 0, over that program's time;
  * RL goodput under losses: a small GRPO loop on ``local:4x1`` (a process of its own, ``pw``), the
    trainer a ``pw.elastic`` loop on slices 0-1, the rollout a ``pw.elastic_map`` on slices 2-3, for two
    minutes with three slice losses (rollout, trainer, rollout; each repaired 8 s later): the
    ledger's goodput (productive over wall time) of that run, and of a fault-free one for reference.

The machine is shared: the sides alternate, twice, and each keeps its best figure; the load
average is printed. Ratios last: sync time server/in-process (goal <= 1.5), rollout tokens/s
server/in-process (goal >= 0.5), overlap both/longer alone on the server (goal <= 1.3), and last RL
goodput under 3 losses in 2 minutes (goal >= 0.85). ``--rl-goodput`` measures only that one.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time

SYNC_MIB = 64
SYNC_REPEATS = 7
BATCH, WIDTH, VOCAB, LAYERS, TOKENS = 32, 512, 512, 2, 64
ROLLOUTS = 1  # generations per rollout phase
TRAIN_STEPS = 30


def measure(target: str | None) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import SingleDeviceSharding

    trainer, rollout = (SingleDeviceSharding(d) for d in sorted(jax.devices(), key=lambda d: d.id)[:2])
    rng = np.random.default_rng(0)
    side = int((SYNC_MIB << 20) / 4 / 4) ** 0.5
    weights = {f"w{i}": rng.normal(size=(int(side), int(side))).astype(np.float32) for i in range(4)}
    params = jax.block_until_ready({k: jax.device_put(v, trainer) for k, v in weights.items()})
    to_rollout = {k: rollout for k in params}

    if target is None:

        def sync():
            return jax.device_put(params, to_rollout)
    else:
        from pathwaysutils.experimental import reshard as experimental_reshard

        def sync():
            return experimental_reshard.reshard(params, to_rollout, cache_resharding_plans=True)

    def client_bytes() -> int:
        if target is None:
            return 0
        from pathways_kernel.backends import server_client

        counts = server_client.status(target)["counts"]
        return counts.get("host_bytes_from_client", 0) + counts.get("host_bytes_to_client", 0)

    jax.block_until_ready(sync())
    before = client_bytes()
    times = []
    for _ in range(SYNC_REPEATS):
        start = time.perf_counter()
        synced = jax.block_until_ready(sync())
        times.append(time.perf_counter() - start)
    sync_bytes = client_bytes() - before
    equal = all(np.array_equal(np.asarray(synced[k]), weights[k]) for k in weights)

    # -- rollout: a tiny decoder with a KV cache on the rollout device -------------
    model = jax.device_put(
        {
            "embed": rng.normal(size=(VOCAB, WIDTH)).astype(np.float32) * 0.05,
            "qkv": rng.normal(size=(LAYERS, WIDTH, 3 * WIDTH)).astype(np.float32) * 0.05,
            "out": rng.normal(size=(LAYERS, WIDTH, WIDTH)).astype(np.float32) * 0.05,
        },
        rollout,
    )

    @jax.jit
    def decode(model, cache, token, position):  # the position stays on the device, as the cache does
        h = model["embed"][token]
        keys, values = cache
        for layer in range(LAYERS):
            q, k, v = jnp.split(h @ model["qkv"][layer], 3, axis=-1)
            keys = keys.at[layer, :, position].set(k)
            values = values.at[layer, :, position].set(v)
            scores = jnp.einsum("bd,btd->bt", q, keys[layer]) / WIDTH**0.5
            scores = jnp.where(jnp.arange(TOKENS) <= position, scores, -1e9)
            h = h + jnp.tanh(jnp.einsum("bt,btd->bd", jax.nn.softmax(scores), values[layer]) @ model["out"][layer])
        return (keys, values), jnp.argmax(h @ model["embed"].T, axis=-1).astype(jnp.int32), position + 1

    def generate() -> jax.Array:
        shape = (LAYERS, BATCH, TOKENS, WIDTH)
        cache = (jax.device_put(jnp.zeros(shape), rollout), jax.device_put(jnp.zeros(shape), rollout))
        token = jax.device_put(jnp.arange(BATCH, dtype=jnp.int32), rollout)
        position = jax.device_put(jnp.int32(0), rollout)
        out = []
        for _ in range(TOKENS):
            cache, token, position = decode(model, cache, token, position)
            out.append(token)
        return jax.block_until_ready(jnp.stack(out))

    def rollout_phase() -> None:
        for _ in range(ROLLOUTS):
            generate()

    generate()
    rollouts = []
    for _ in range(3):
        start = time.perf_counter()
        generate()
        rollouts.append(time.perf_counter() - start)

    # -- training on slice 0 while the rollout runs on slice 1 ------------------------
    w = jax.device_put(rng.normal(size=(768, 768)).astype(np.float32) * 0.01, trainer)
    x = jax.device_put(rng.normal(size=(256, 768)).astype(np.float32), trainer)

    @jax.jit
    def train_step(w, x):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2))(w)
        return w - 0.01 * grad, loss

    def train() -> None:
        nonlocal w
        for _ in range(TRAIN_STEPS):
            w, loss = train_step(w, x)
            loss.block_until_ready()

    train()

    def timed(*work) -> float:
        threads = [threading.Thread(target=fn) for fn in work]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start

    # -- a tiny op on the rollout's slice while a long program runs on the trainer's ----------
    @jax.jit
    def long_program(w, x):
        return jax.lax.fori_loop(0, 40, lambda _, a: jnp.tanh(a @ w), x).sum()

    tiny = jax.jit(lambda a: a + 1)
    small = jax.device_put(jnp.ones(4), rollout)
    float(long_program(w, x)), tiny(small).block_until_ready()
    start = time.perf_counter()
    float(long_program(w, x))
    long_s = time.perf_counter() - start
    waits = []

    def tiny_ops() -> None:
        time.sleep(long_s / 4)  # the long program is running by then
        start = time.perf_counter()
        tiny(small).block_until_ready()
        waits.append(time.perf_counter() - start)

    timed(lambda: float(long_program(w, x)), tiny_ops)

    alone_train = min(timed(train) for _ in range(2))
    alone_rollout = min(timed(rollout_phase) for _ in range(2))
    together = min(timed(train, rollout_phase) for _ in range(2))
    return {
        "sync_ms": statistics.median(times) * 1e3,
        "sync_client_bytes": sync_bytes,
        "sync_equal": equal,
        "rollout_tokens_s": BATCH * TOKENS / min(rollouts),
        "train_alone_s": alone_train,
        "rollout_alone_s": alone_rollout,
        "together_s": together,
        "overlap": together / max(alone_train, alone_rollout),
        "long_program_s": long_s,
        "tiny_during_long_ms": waits[0] * 1e3,
    }


# -- RL goodput under slice losses: pw.elastic (trainer) + pw.elastic_map (rollout) on local:4x1 ----------
RL_SPEC, TRAINER, ROLLOUT = "local:4x1", [0, 1], [2, 3]
RL_FAULT_FREE_S, RL_FAULTS_S = 30.0, 120.0
#: (seconds into the run, slice): each lost, then repaired RL_REPAIR_S later; 3 losses in 2 minutes, both roles.
RL_LOSSES, RL_REPAIR_S = ((20.0, 3), (55.0, 1), (90.0, 2)), 8.0
RL_VOCAB, RL_WIDTH, RL_PROMPT, RL_NEW, RL_GROUP, RL_PROMPTS, RL_TARGET = 64, 128, 4, 16, 8, 8, 7


def rl_goodput() -> dict:
    """A GRPO loop's goodput (the ledger's: productive time over wall time) fault-free, then for two minutes
    with three slice losses (two of the rollout's, one of the trainer's), each repaired 8 s later."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pathways_kernel as pw
    from pathways_kernel.training.goodput import ledger

    pw.connect(RL_SPEC)
    rng = np.random.default_rng(0)
    init = {
        "embed": rng.normal(size=(RL_VOCAB, RL_WIDTH)).astype(np.float32) * 0.3,
        "out": rng.normal(size=(RL_WIDTH, RL_VOCAB)).astype(np.float32) / RL_WIDTH**0.5,
    }

    def logits(params, tokens):
        return jnp.tanh(params["embed"][tokens]) @ params["out"]

    @jax.jit
    def generate(params, prompts, seeds):
        def one(prompt, seed):
            def step(carry, _):
                token, key = carry
                key, sub = jax.random.split(key)
                nxt = jax.random.categorical(sub, logits(params, token)).astype(jnp.int32)
                return (nxt, key), nxt

            _, new = jax.lax.scan(step, (prompt[-1], jax.random.key(seed)), None, length=RL_NEW)
            return jnp.concatenate([prompt, new])

        return jax.vmap(one)(prompts, seeds)

    @jax.jit
    def update(state, sequences, advantages):
        def loss(params):
            logp = jax.nn.log_softmax(logits(params, sequences[:, :-1]))
            taken = jnp.take_along_axis(logp, sequences[:, 1:, None], axis=-1)[..., 0][:, RL_PROMPT - 1 :]
            return -jnp.mean(advantages[:, None] * taken)

        grads = jax.grad(loss)(state["params"])
        return {"params": jax.tree.map(lambda p, g: p - 0.1 * g, state["params"], grads)}

    def rollout(params, batch, mesh):
        return generate(params, batch[:, :RL_PROMPT], batch[:, RL_PROMPT])

    def grpo(state, step, mesh):
        r = np.random.default_rng(step)
        prompts = np.repeat(r.integers(0, RL_VOCAB, size=(RL_PROMPTS, RL_PROMPT)), RL_GROUP, axis=0)
        seeds = step * RL_PROMPTS * RL_GROUP + np.arange(RL_PROMPTS * RL_GROUP)
        requests = np.concatenate([prompts, seeds[:, None]], axis=1).astype(np.int32)
        sequences = pw.elastic_map(rollout, requests, state["params"], batch_size=16, slices=ROLLOUT)
        rewards = (sequences[:, RL_PROMPT:] == RL_TARGET).mean(axis=1).astype(np.float32)
        grouped = rewards.reshape(RL_PROMPTS, RL_GROUP)
        advantages = ((grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, keepdims=True) + 1e-6)).reshape(-1)
        return update(state, *jax.device_put((sequences, advantages), NamedSharding(mesh, P())))

    def run(name: str, steps: int, losses=()) -> tuple[float, int, float]:
        train = pw.elastic(grpo, snapshot_every=5, slices=TRAINER, name=name)
        state = jax.device_put({"params": init}, NamedSharding(train._mesh(pw.session()), P()))
        start = time.perf_counter()
        timers = [threading.Timer(at, pw.fail_slice, (i,)) for at, i in losses]
        timers += [threading.Timer(at + RL_REPAIR_S, pw.repair_slice, (i,)) for at, i in losses]
        for timer in timers:
            timer.start()
        jax.block_until_ready(train(state, steps=steps, progress=False))
        wall = time.perf_counter() - start
        for timer in timers:
            timer.join()
        account = ledger().find(name)
        assert account is not None
        return account.goodput, steps, wall

    run("rl-warm-up", 10)  # compiles, on both trainer meshes' sizes after the first loss (its own)
    # Fault-free for RL_FAULT_FREE_S: the step rate, then as many steps as fill RL_FAULTS_S.
    probe_goodput, probe_steps, probe_wall = run("rl-fault-free", 40)
    steps = max(40, int(probe_steps / probe_wall * RL_FAULT_FREE_S))
    free_goodput, _, free_wall = run("rl-fault-free", steps)
    faults_steps = int(steps / free_wall * RL_FAULTS_S)
    faults_goodput, _, faults_wall = run("rl-faults", faults_steps, RL_LOSSES)
    losses = [e for e in pw.session().events.last(2000) if e.kind in ("slice_down",)]
    return {
        "rl_free_goodput": free_goodput,
        "rl_free_wall_s": free_wall,
        "rl_steps": faults_steps,
        "rl_faults_goodput": faults_goodput,
        "rl_faults_wall_s": faults_wall,
        "rl_losses": len(losses),
        "rl_steps_per_s_ratio": (faults_steps / faults_wall) / (steps / free_wall),
    }


def run(env: dict[str, str], target: str | None, mode: str = "--child") -> dict:
    command = [sys.executable, __file__, mode, *([target] if target else [])]
    out = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise SystemExit(f"measurement failed:\n{out.stderr[-3000:]}")
    return {**json.loads(lines[-1]), "load": os.getloadavg()[0]}


def best(runs: list[dict]) -> dict:
    """Each figure's best run (least time, most throughput; a ratio's times from one run); the highest load seen."""
    pick = {"rollout_tokens_s": max, "load": max, "sync_equal": min, "sync_client_bytes": max}
    figures = {key: pick.get(key, min)(r[key] for r in runs) for key in runs[0]}
    # The overlap's three times come from one run (its ratio's), not each from its best run.
    overlap = min(runs, key=lambda r: r["overlap"])
    figures.update({key: overlap[key] for key in ("train_alone_s", "rollout_alone_s", "together_s")})
    tiny = min(runs, key=lambda r: r["tiny_during_long_ms"] / r["long_program_s"])
    figures.update({key: tiny[key] for key in ("long_program_s", "tiny_during_long_ms")})
    return figures


def report_rl_goodput(base: dict[str, str]) -> None:
    rl = run(base, None, "--rl-goodput-child")
    print(
        f"GRPO on {RL_SPEC} (trainer {TRAINER}, rollout {ROLLOUT}): fault-free goodput {rl['rl_free_goodput']:.2f} "
        f"over {rl['rl_free_wall_s']:.0f} s; with {rl['rl_losses']} losses {rl['rl_steps']} steps in "
        f"{rl['rl_faults_wall_s']:.0f} s, steps/s {rl['rl_steps_per_s_ratio']:.2f} of the fault-free run's; "
        f"load average {rl['load']:.1f}"
    )
    print(f"RL goodput under 3 losses in 2 minutes: {rl['rl_faults_goodput']:.2f} (goal >= 0.85)")


def main() -> None:
    from pathways_kernel.backends import server_client

    print(f"load average at start: {os.getloadavg()[0]:.1f} (2-core machine, shared)", flush=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    if sys.argv[1:2] == ["--rl-goodput"]:
        report_rl_goodput(base)
        return
    server = server_client.start(2, 1)
    try:
        sides = {
            "in-process": ({**base, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}, None),
            "local server": (server_client.client_env(server.target, connect_timeout_s=60), server.target),
        }
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for _ in range(2):
            for side, (env, target) in sides.items():
                runs[side].append(run(env, target))
    finally:
        server.stop()
    figures = {side: best(side_runs) for side, side_runs in runs.items()}
    print(f"{'':32}" + "".join(f"{side:>16}" for side in figures))
    for key, label in (
        ("sync_ms", f"weight sync {SYNC_MIB} MiB (ms)"),
        ("sync_client_bytes", "  bytes through the client"),
        ("rollout_tokens_s", "rollout (tokens/s)"),
        ("train_alone_s", "training alone (s)"),
        ("rollout_alone_s", "rollout alone (s)"),
        ("together_s", "both at once (s)"),
        ("long_program_s", "long program on slice 0 (s)"),
        ("tiny_during_long_ms", "  tiny op on slice 1 meanwhile (ms)"),
        ("load", "load average (max)"),
    ):
        print(f"{label:32}" + "".join(f"{float(f[key]):16.1f}" for f in figures.values()))
    local, server_side = figures["in-process"], figures["local server"]
    assert server_side["sync_equal"] and local["sync_equal"], "the synced weights differ"
    print()
    print(f"in-process overlap both/longer alone: {local['overlap']:.2f} (for reference)")
    print(
        f"weight sync time server/in-process: {server_side['sync_ms'] / local['sync_ms']:.2f} (goal <= 1.5), "
        f"{server_side['sync_client_bytes']} bytes through the client (goal 0)"
    )
    print(
        f"rollout tokens/s server/in-process: {server_side['rollout_tokens_s'] / local['rollout_tokens_s']:.2f} "
        "(goal >= 0.5)"
    )
    print(f"overlap on the server both/longer alone: {server_side['overlap']:.2f} (goal <= 1.3)")
    tiny = server_side["tiny_during_long_ms"] / 1e3 / server_side["long_program_s"]
    print(
        f"tiny op on slice 1 during a long program on slice 0, over that program's time, server: {tiny:.2f} (goal <= 0.05)"
    )
    report_rl_goodput(base)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rl-goodput-child"]:
        print(json.dumps(rl_goodput()), flush=True)
    elif sys.argv[1:2] == ["--child"]:
        target = sys.argv[2] if len(sys.argv) > 2 else None
        if target is not None:
            import pathwaysutils

            pathwaysutils.initialize()
        print(json.dumps(measure(target)), flush=True)
    else:
        main()
