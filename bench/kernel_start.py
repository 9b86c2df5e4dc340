"""Kernel start to first jax.devices() result: `pathways` kernel vs a stock ipykernel.

Both kernels get 8 CPU devices (the stock one through JAX_NUM_CPU_DEVICES) and
run `import jax; len(jax.devices())`. Runs alternate between the two so that
machine noise hits both alike; prints the median ratio last (goal <= 1.25).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from jupyter_client.manager import KernelManager

CELL = "import jax; print(len(jax.devices()))"


def time_to_devices(kernel_name: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        out: list[str] = []
        kc.execute_interactive(
            CELL,
            timeout=120,
            output_hook=lambda m: out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None,
        )
        elapsed = time.perf_counter() - start
        assert "".join(out).strip() == "8", out
        return elapsed
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith("PATHWAYS_")}
    base["JAX_PLATFORMS"] = "cpu"
    stock_env = dict(base, JAX_NUM_CPU_DEVICES="8")
    time_to_devices("python3", stock_env)  # warm the OS file cache for both
    time_to_devices("pathways", base)
    ours, stock = [], []
    for run in range(args.runs):
        ours.append(time_to_devices("pathways", base))
        stock.append(time_to_devices("python3", stock_env))
        print(f"run {run}: pathways {ours[-1]:.2f} s   stock ipykernel {stock[-1]:.2f} s")
    ratios = [a / b for a, b in zip(ours, stock, strict=True)]
    print(f"median pathways {statistics.median(ours):.2f} s, stock {statistics.median(stock):.2f} s")
    print(
        f"kernel_start ratio (pathways/stock, median of {args.runs}): {statistics.median(ratios):.2f}  (goal <= 1.25)"
    )


if __name__ == "__main__":
    main()
