"""Kernel-side cost of one monitor update at 65,536 chips (64 slices x 1,024), synthetic values.

Runs the real path a published sample takes (per-slice aggregation of the hub,
conversion to protocol v1, binary encoding) on a synthetic topology of that
size, and the one-off topology frame. Prints the time per update, the bytes
per chip per update and, last, the share of the 2 Hz publish period one update
costs (the figure to keep far below 1).

    python bench/monitor_scale.py [--slices 64] [--chips 1024]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np

from pathways_kernel.core.backend import Placement
from pathways_kernel.core.slices import Topology
from pathways_kernel.monitoring import encoding, protocol, telemetry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import monitor_frontend  # the panel's decoding, in Python


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slices", type=int, default=64)
    parser.add_argument("--chips", type=int, default=1024, help="chips per slice")
    parser.add_argument("--updates", type=int, default=40)
    args = parser.parse_args()

    side = int(np.sqrt(args.chips))
    n = args.slices * args.chips
    devices = [types.SimpleNamespace(id=i, platform="tpu") for i in range(n)]
    placements = [
        Placement(i // args.chips, ((i % args.chips) % side, (i % args.chips) // side, 0), 0, "TPU v5p")
        for i in range(n)
    ]
    started = time.perf_counter()
    topology = Topology.from_placements(devices, placements, "tpu").with_slice_state(3, "down")
    layout = telemetry.Layout.of(topology)
    backend = types.SimpleNamespace(spec="proxy", target="grpc://synthetic:29000", supports_fault_injection=False)
    t_data, t_buffers = protocol.encode_topology(encoding.topology_message(topology, 1, backend))
    topology_s = time.perf_counter() - started

    rng = np.random.default_rng(0)
    costs, sizes = [], []
    for seq in range(1, args.updates + 1):
        utilization = rng.random(n, dtype=np.float32)
        memory = rng.integers(0, 95 * 2**30, n)
        started = time.perf_counter()
        metrics = telemetry.aggregate(layout, 1, seq, "synthetic", 2.0, utilization, memory, None)
        data, buffers = protocol.encode_metrics(encoding.metrics_message(metrics))
        costs.append(time.perf_counter() - started)
        sizes.append(sum(len(b) for b in buffers))
    monitor_frontend.decode_metrics(data, buffers)  # what the frontend gets is valid v1

    per_update = statistics.median(costs)
    print(f"chips                          {n} ({args.slices} slices x {args.chips})")
    print(
        f"topology frame (once)          {sum(len(b) for b in t_buffers) / n:.1f} B/chip, built in {topology_s * 1000:.0f} ms"
    )
    print(f"metrics frame                  {statistics.median(sizes) / n:.2f} B/chip per update")
    print(f"kernel cost per update         {per_update * 1000:.2f} ms (median of {args.updates})")
    print(f"share of the 2 Hz period       {per_update / 0.5:.4f}")


if __name__ == "__main__":
    main()
