"""Overhead of the live monitor on a jitted training loop (local:2x4).

Interleaves blocks of training steps with the telemetry hub sampling at 4 Hz
and a subscribed monitor connection (the real ``Connection`` sender thread
and the real protocol encode path, into an in-process comm that drops the
bytes), against blocks with no subscriber (where the hub still samples once a
second for the metrics history; before the first block it has not sampled at
all, so a truly monitor-free loop costs no more than these). Prints the median step times and,
last, the median ratio of each monitored block to the idle block after it
(goal <= 1.03).

    python bench/monitor_overhead.py [--blocks 12] [--steps 20]
"""

from __future__ import annotations

import argparse
import contextvars
import os
import statistics
import time

os.environ.setdefault("PATHWAYS_BACKEND", "local:2x4")


class DroppingComm:
    """Stands in for the kernel's comm: counts what the frontend would receive."""

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0
        self._closed = False

    def on_msg(self, callback) -> None:
        pass

    def on_close(self, callback) -> None:
        pass

    def send(self, data=None, metadata=None, buffers=None) -> None:
        self.messages += 1
        self.bytes += sum(len(b) for b in buffers or ())

    def close(self, data=None, metadata=None, buffers=None) -> None:
        self._closed = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=12, help="blocks per mode (interleaved)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per block")
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pathways_kernel as pw
    from pathways_kernel.monitoring import telemetry
    from pathways_kernel.monitoring.comm import MonitorServer
    from pathways_kernel.monitoring.connection import Connection

    session = pw.connect("local:2x4")
    mesh = session.mesh(("data", "model"))
    w = args.width
    key = jax.random.PRNGKey(0)
    params = {
        "w1": jax.device_put(jax.random.normal(key, (w, w)) * 0.01, NamedSharding(mesh, P(None, "model"))),
        "w2": jax.device_put(jax.random.normal(key, (w, w)) * 0.01, NamedSharding(mesh, P("model", None))),
    }
    batch = jax.device_put(jax.random.normal(key, (256, w)), NamedSharding(mesh, P("data", None)))

    def loss_fn(p, x):
        h = jax.nn.relu(x @ p["w1"])
        return jnp.mean((h @ p["w2"] - x) ** 2)

    @jax.jit
    def step(p, x):
        loss, grads = jax.value_and_grad(loss_fn)(p, x)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), loss

    def block(p):
        start = time.perf_counter()
        for _ in range(args.steps):
            p, loss = step(p, batch)
        loss.block_until_ready()
        return p, (time.perf_counter() - start) / args.steps

    params, _ = block(params)  # compile and warm up

    hub = telemetry.hub(session)
    hub.configure(sample_hz=4.0, publish_hz=2.0)
    comm = DroppingComm()
    server = MonitorServer()

    on, off = [], []
    cpu_before, wall_before = hub.sample_cpu_s, time.perf_counter()
    for i in range(2 * args.blocks):
        monitored = i % 2 == 0
        conn = None
        if monitored:
            conn = Connection(comm, server)
            conn.start(contextvars.copy_context())
            time.sleep(0.3)  # subscribed and sampling before the block starts
        params, per_step = block(params)
        (on if monitored else off).append(per_step)
        if conn is not None:
            conn.close("shutdown")

    med_on, med_off = statistics.median(on), statistics.median(off)
    # Each monitored block against the unmonitored block right after it: load drift cancels.
    ratios = sorted(a / b for a, b in zip(on, off, strict=True))
    q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
    print(f"blocks per mode        {args.blocks} x {args.steps} steps")
    print(f"step time, hub off     {med_off * 1000:.2f} ms (median of blocks; 1 Hz history sampling only)")
    print(f"step time, hub on      {med_on * 1000:.2f} ms (4 Hz sampling, subscribed comm)")
    print(f"hub's last sample took {hub.last_sample_s * 1000:.2f} ms")
    print(
        f"hub sampling CPU       {(hub.sample_cpu_s - cpu_before) / (time.perf_counter() - wall_before):.2%} of one core over the run"
    )
    print(f"frames sent            {comm.messages} ({comm.bytes} buffer bytes)")
    print(f"ratio of medians       {med_on / med_off:.3f}")
    print(f"paired ratios IQR      {q1:.3f} .. {q3:.3f} (noise of this machine)")
    print(f"overhead ratio (on/off, median of paired blocks) {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
