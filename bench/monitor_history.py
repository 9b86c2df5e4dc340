"""History on subscribe at 65,536 chips (64 slices x 1,024): what it costs to send, against the 250 ms budget.

Fills the kernel's real ``History`` with a full 15 minutes at 2 Hz of synthetic
frames (1,800 per-slice points, 300 per-chip points), then times, per
subscribe, the path ``connection.Connection`` takes (``history_message`` ->
``protocol.encode_history``) and the frontend's decode and validation
(tests/support/monitor_frontend.py, the panel's rules in Python), and one slice's
``chip_history`` reply. Prints the bytes sent and, last, the share of the
250 ms budget the history takes before the websocket (kernel + decode).

    python bench/monitor_history.py [--slices 64] [--chips 1024]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np

from pathways_kernel.core.backend import Placement
from pathways_kernel.core.slices import Topology
from pathways_kernel.monitoring import encoding, history, protocol, telemetry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import monitor_frontend  # the panel's decoding, in Python

BUDGET_S = 0.250


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slices", type=int, default=64)
    parser.add_argument("--chips", type=int, default=1024, help="chips per slice")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    side = int(np.sqrt(args.chips))
    n = args.slices * args.chips
    devices = [types.SimpleNamespace(id=i, platform="tpu") for i in range(n)]
    placements = [
        Placement(i // args.chips, ((i % args.chips) % side, (i % args.chips) // side, 0), 0, "TPU v5p")
        for i in range(n)
    ]
    topology = Topology.from_placements(devices, placements, "tpu")
    layout = telemetry.Layout.of(topology)

    publish_hz = 2.0
    kept = history.History(args.slices, n, publish_hz, memory_hint=95 * 2**30)
    rng = np.random.default_rng(0)
    utilization = rng.random(n, dtype=np.float32)
    memory = rng.integers(0, 95 * 2**30, n)
    start = time.time() - history.SLICE_HISTORY_S
    for i in range(int(history.SLICE_HISTORY_S * publish_hz)):
        m = telemetry.aggregate(layout, 1, i + 1, "synthetic", 2.0, utilization, memory, None)
        kept.record(dataclasses.replace(m, time=start + i / publish_hz))
    hub = types.SimpleNamespace(history=lambda: kept, layout=layout, topology_seq=1)

    costs, decodes = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        data, buffers = protocol.encode_history(encoding.history_message(hub))
        costs.append(time.perf_counter() - started)
        started = time.perf_counter()
        decoded = monitor_frontend.decode_history(data, buffers)
        decodes.append(time.perf_counter() - started)
    assert decoded.points == len(kept) and decoded.utilization.shape == (len(kept), args.slices)
    sent = sum(len(b) for b in buffers)

    chip_costs = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        reply = protocol.encode_chip_history_reply("bench", encoding.chip_history(hub, 0, args.chips))
        monitor_frontend.decode_chip_history(*reply)
        chip_costs.append(time.perf_counter() - started)

    encode, decode = statistics.median(costs), statistics.median(decodes)
    print(f"chips                            {n} ({args.slices} slices x {args.chips})")
    print(
        f"history kept in the kernel       {kept.nbytes / 2**20:.1f} MiB of {history.MAX_BYTES >> 20} MiB "
        f"(formula: {history.bytes_for(args.slices, n, publish_hz) / 2**20:.1f} MiB)"
    )
    print(
        f"history message                  {decoded.points} points x {args.slices} slices, "
        f"{sent / 1e6:.2f} MB of buffers"
    )
    print(f"kernel: build + encode           {encode * 1000:.1f} ms (median of {args.repeats})")
    print(f"frontend rules: decode+validate  {decode * 1000:.1f} ms (Python; the page does this in TypeScript)")
    print(
        f"chip_history, one slice          {statistics.median(chip_costs) * 1000:.1f} ms for "
        f"{args.chips} chips x {history.CHIP_HISTORY_S} points, encode + decode"
    )
    print(f"share of the 250 ms budget       {(encode + decode) / BUDGET_S:.3f} (before the websocket)")


if __name__ == "__main__":
    main()
