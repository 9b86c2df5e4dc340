"""The local Pathways server against in-process JAX: step, dispatch, transfers.

The same measurements run twice, each in a fresh process on the same machine:
in-process CPU JAX with 8 devices, and JAX's own proxy client
(``JAX_PLATFORMS=proxy`` + pathwaysutils) against ``pathways-local serve
--slices 2x4`` on a Unix socket.

  * step: a jitted optax MLP training step, data-parallel over 8 devices with
    donated state, sized to about 5 ms in-process; each step waited on before
    the next (8 CPU devices queued several steps deep can stall XLA's CPU
    collectives on a 2-core machine), median of 5 repeats of 40 steps;
  * dispatch: ``x + 1`` on a 4-element array, waited on each time (round trip);
  * host->device: ``device_put`` of 64 MiB to one device; device->host:
    ``np.asarray`` of a fresh 64 MiB device array.

The machine is shared, so the two sides alternate, twice, and each keeps its
best figure. Prints the ratios last: server/in-process step time (goal <= 1.3) and
server/in-process transfer throughput (goal >= 0.5).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

STEPS = 40
REPEATS = 5
BATCH, WIDTH = 256, 128
MIB = 64


def measure() -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    mesh = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    data, replicated = NamedSharding(mesh, P(("data", "model"))), NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    params = {
        f"w{i}": jax.device_put(rng.normal(size=(WIDTH, WIDTH)).astype(np.float32) * 0.05, replicated) for i in range(3)
    }
    optimizer = optax.adam(1e-3)
    state = (params, jax.device_put(optimizer.init(params), replicated))
    x = jax.device_put(rng.normal(size=(BATCH, WIDTH)).astype(np.float32), data)

    def loss_fn(p, x):
        h = x
        for i in range(3):
            h = jnp.tanh(h @ p[f"w{i}"])
        return jnp.mean((h - x) ** 2)

    @jax.jit
    def step(state, x):
        p, o = state
        loss, grads = jax.value_and_grad(loss_fn)(p, x)
        updates, o = optimizer.update(grads, o, p)
        return (optax.apply_updates(p, updates), o), loss

    step = jax.jit(step, donate_argnums=0)
    for _ in range(3):
        state, loss = step(state, x)
    float(loss)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(STEPS):
            state, loss = step(state, x)
            loss.block_until_ready()
        times.append((time.perf_counter() - start) / STEPS)

    tiny = jnp.ones(4)
    add = jax.jit(lambda a: a + 1)
    add(tiny).block_until_ready()
    rounds = []
    for _ in range(200):
        start = time.perf_counter()
        add(tiny).block_until_ready()
        rounds.append(time.perf_counter() - start)

    host = np.ones((MIB << 20) // 4, np.float32)
    device = devices[0]
    jax.device_put(host[:16], device).block_until_ready()
    up, down = [], []
    double = jax.jit(lambda a: a * 2)
    for _ in range(3):
        start = time.perf_counter()
        on_device = jax.device_put(host, device)
        on_device.block_until_ready()
        up.append(time.perf_counter() - start)
        fresh = double(on_device)
        fresh.block_until_ready()
        start = time.perf_counter()
        np.array(fresh, copy=True)  # in-process np.asarray is a zero-copy view
        down.append(time.perf_counter() - start)
    return {
        "step_ms": statistics.median(times) * 1e3,
        "dispatch_us": statistics.median(rounds) * 1e6,
        "h2d_mib_s": MIB / min(up),
        "d2h_mib_s": MIB / min(down),
    }


def run(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, timeout=900, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise SystemExit(f"measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def best(runs: list[dict]) -> dict:
    """Each figure's best run: least time, most throughput."""
    return {key: (max if key.endswith("_s") else min)(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    from pathways_kernel.server import launch

    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    in_process_runs, proxied_runs = [], []
    server = launch.start(2, 4)
    try:
        for _ in range(2):
            in_process_runs.append(run({**base, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"}))
            proxied_runs.append(run(launch.client_env(server.target, connect_timeout_s=60)))
    finally:
        server.stop()
    in_process, proxied = best(in_process_runs), best(proxied_runs)
    print(f"{'':24}{'in-process':>14}{'local server':>14}")
    for key, label in (
        ("step_ms", "step (ms)"),
        ("dispatch_us", "tiny op round trip (us)"),
        ("h2d_mib_s", "host->device (MiB/s)"),
        ("d2h_mib_s", "device->host (MiB/s)"),
    ):
        print(f"{label:24}{in_process[key]:14.1f}{proxied[key]:14.1f}")
    step = proxied["step_ms"] / in_process["step_ms"]
    h2d = proxied["h2d_mib_s"] / in_process["h2d_mib_s"]
    d2h = proxied["d2h_mib_s"] / in_process["d2h_mib_s"]
    print(f"host->device throughput server/in-process: {h2d:.2f} (goal >= 0.5)")
    print(f"device->host throughput server/in-process: {d2h:.2f} (goal >= 0.5)")
    print(f"step time server/in-process: {step:.2f} (goal <= 1.3)")


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        if os.environ.get("JAX_PLATFORMS") == "proxy":
            import pathwaysutils

            pathwaysutils.initialize()
        print(json.dumps(measure()), flush=True)
    else:
        main()
