"""Kernel start to first jax.devices() result: `pathways` kernel vs a stock ipykernel.

Both kernels get 8 CPU devices (the stock one through JAX_NUM_CPU_DEVICES) and
run `import jax; len(jax.devices())`, then are restarted (as JupyterLab restarts
a kernel) and run it again. Runs alternate between the two so that machine noise
hits both alike; prints the median ratios last (goals: start <= 1.5, restart <= 2).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from jupyter_client.manager import KernelManager

CELL = "import jax; print(len(jax.devices()))"


def _devices(kc: Any) -> None:
    kc.wait_for_ready(timeout=120)
    out: list[str] = []
    kc.execute_interactive(
        CELL,
        timeout=120,
        output_hook=lambda m: out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None,
    )
    assert "".join(out).strip() == "8", out


def time_to_devices(kernel_name: str, env: dict[str, str]) -> tuple[float, float]:
    """Seconds from launch to the first ``jax.devices()`` result, and from a restart to the next."""
    start = time.perf_counter()
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    try:
        _devices(kc)
        elapsed = time.perf_counter() - start
        start = time.perf_counter()
        km.restart_kernel(now=False)  # as JupyterLab's restart: shutdown_request, then a new process
        _devices(kc)
        return elapsed, time.perf_counter() - start
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
    ours, stock, ours_restart, stock_restart = [], [], [], []
    for run in range(args.runs):
        for times, restarts, name, env in (
            (ours, ours_restart, "pathways", base),
            (stock, stock_restart, "python3", stock_env),
        ):
            start, restart = time_to_devices(name, env)
            times.append(start)
            restarts.append(restart)
        print(
            f"run {run}: start pathways {ours[-1]:.2f} s, stock ipykernel {stock[-1]:.2f} s; "
            f"restart pathways {ours_restart[-1]:.2f} s, stock {stock_restart[-1]:.2f} s (load average {os.getloadavg()[0]:.1f})"
        )
    ratios = [a / b for a, b in zip(ours, stock, strict=True)]
    restart_ratios = [a / b for a, b in zip(ours_restart, stock_restart, strict=True)]
    print(f"median pathways {statistics.median(ours):.2f} s, stock {statistics.median(stock):.2f} s")
    print(
        f"restart ratio (pathways/stock, median of {args.runs}): {statistics.median(restart_ratios):.2f}  (goal <= 2)"
    )
    print(
        f"kernel_start ratio (pathways/stock, median of {args.runs}): {statistics.median(ratios):.2f}  (goal <= 1.5 on local:2x4)"
    )


if __name__ == "__main__":
    main()
