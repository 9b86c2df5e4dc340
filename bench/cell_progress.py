"""Cost of per-cell progress on a training loop, in a real `pathways` kernel (local:2x4).

Runs cells of a jitted step under ``pw.steps(range(STEPS), progress=...)`` with
``pw.log(loss=...)`` each step, alternating progress on and off, timed inside
the kernel. Prints each mode's median block time, what a frontend received
(live updates per second of run, at most 4; outputs per run), and, last, the median ratio of each block with
progress to the block without it after it (goal <= 1.02).

    python bench/cell_progress.py [--blocks 8] [--steps 1500]
"""

from __future__ import annotations

import argparse
import os
import statistics

from jupyter_client.manager import KernelManager

SETUP = """
import time
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = pw.mesh()
x = jax.device_put(jnp.ones((256, 256)), NamedSharding(mesh, P("data")))
@jax.jit
def step(x):
    y = jnp.tanh(x @ x.T) * 0.5
    return y, jnp.mean(y)
step(x)[0].block_until_ready()
"""

BLOCK = """
start = time.perf_counter()
for i in pw.steps(range({steps}), progress={progress}):
    x, loss = step(x)
    pw.log(loss=loss)
x.block_until_ready()
print(time.perf_counter() - start)
"""


def run(kc, code: str) -> tuple[str, int, int]:
    """Run ``code``; returns its stdout, and the live updates (the last one is the
    summary) and outputs it produced."""
    out, updates, displays = [], 0, 0

    def hook(msg):
        nonlocal updates, displays
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "update_display_data":
            updates += 1
        elif kind == "display_data":
            displays += 1

    reply = kc.execute_interactive(code, output_hook=hook, timeout=600)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"cell failed: {reply['content']}")
    return "".join(out), updates, displays


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=8, help="blocks per mode (interleaved)")
    parser.add_argument("--steps", type=int, default=1500, help="steps per block")
    args = parser.parse_args()

    km = KernelManager(kernel_name="pathways")
    km.start_kernel(env={**os.environ, "JAX_PLATFORMS": "cpu"})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        run(kc, SETUP)
        run(kc, BLOCK.format(steps=args.steps, progress=True))  # warm: step compiled, view code imported
        on, off, rates, displays = [], [], [], []
        for _ in range(args.blocks):
            text, updates, shown = run(kc, BLOCK.format(steps=args.steps, progress=True))
            on.append(float(text.split()[-1]))
            rates.append((updates - 1) / on[-1])
            displays.append(shown)
            text, updates, shown = run(kc, BLOCK.format(steps=args.steps, progress=False))
            off.append(float(text.split()[-1]))
            assert updates == shown == 0, f"progress=False sent {updates} updates, {shown} outputs"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    print(f"{args.steps} steps per block, {args.blocks} blocks per mode")
    print(
        f"progress on : median {statistics.median(on):.3f} s ({1e3 * statistics.median(on) / args.steps:.2f} ms/step)"
    )
    print(
        f"progress off: median {statistics.median(off):.3f} s ({1e3 * statistics.median(off) / args.steps:.2f} ms/step)"
    )
    print(f"live updates per second of run: median {statistics.median(rates):.2f} (at most 4)")
    print(f"outputs per run: {sorted(set(displays))} (updated in place, then the summary)")
    ratio = statistics.median(a / b for a, b in zip(on, off, strict=True))
    print(f"with/without progress, median of paired blocks: {ratio:.3f} (goal <= 1.02)")


if __name__ == "__main__":
    main()
