"""Latency from Slurm marking a node DOWN to the kernel's ``slice_down`` event.

A real Slurm on this machine (tests/slurm.py: munged, slurmctld, two slurmd),
a two-node job, and ``local:2x2`` bound to it (``pw.connect_slurm(job,
local=...)``: slice 0 = tpu-0, slice 1 = tpu-1). Each cycle runs ``scontrol
update nodename=tpu-1 state=down`` and times until the ``slice_down`` event
(the fault path of ``pw.fail_slice``: arrays lost with DATA_LOSS), then
``state=resume`` until ``slice_up``.

Mechanism: the watch thread polls ``scontrol show job -o`` and ``scontrol
show node -o`` every ``slurm_watch.POLL_S`` (0.5 s). In the same run, the
floor: one poll (both commands) timed alone, so the figure shows how much
of the latency is the polling period and how much the commands.

Prints the median down -> slice_down latency over ``--cycles`` (goal <= 2 s)
and its ratio to the poll period, the figure last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import slurm as slurm_cluster  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10, help="down/resume cycles (default 10)")
    args = parser.parse_args()
    if os.geteuid() != 0 or not slurm_cluster.installed():
        print("needs root and Debian's slurm-wlm and munge (make test installs them); skipped")
        return
    cluster = slurm_cluster.Cluster().start()
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        run(cluster, args.cycles)
    finally:
        cluster.stop()


def wait_event(events, kind: str, after: int, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in events.since(after):
            if event.kind == kind:
                return event
        time.sleep(0.005)
    raise TimeoutError(f"no {kind} event within {timeout} s")


def run(cluster: slurm_cluster.Cluster, cycles: int) -> None:
    import pathways_kernel as pw
    from pathways_kernel.backends import slurm_watch
    from pathways_kernel.backends.slurm import Slurm

    job = cluster.submit("#!/bin/bash\nsleep 600\n", "--nodes=2", "--time=20")
    session = pw.connect_slurm(job, local="local:2x2")
    events = session.events
    downs, ups = [], []
    for _ in range(cycles):
        seq = events.last(1)[0].seq
        start = time.time()
        cluster.set_node("tpu-1", "down", "bench")
        downs.append(wait_event(events, "slice_down", seq).time - start)
        seq = events.last(1)[0].seq
        start = time.time()
        cluster.set_node("tpu-1", "resume")
        ups.append(wait_event(events, "slice_up", seq).time - start)
    slurm = Slurm()
    polls = []
    for _ in range(10):
        start = time.perf_counter()
        slurm.job(job)
        slurm.nodes(["tpu-0", "tpu-1"])
        polls.append(time.perf_counter() - start)
    period = slurm_watch.POLL_S
    print(f"mechanism        polling scontrol show job/node -o every {period} s on a daemon thread")
    print(f"one poll         median {statistics.median(polls) * 1000:.0f} ms (both commands)")
    print(f"resume->slice_up median {statistics.median(ups):.2f} s (min {min(ups):.2f}, max {max(ups):.2f})")
    print(f"down->slice_down min {min(downs):.2f} s, max {max(downs):.2f} s over {cycles} cycles")
    median = statistics.median(downs)
    print(
        f"down->slice_down median {median:.2f} s (goal <= 2 s: {'met' if median <= 2.0 else 'MISSED'}), "
        f"{median / period:.2f}x the poll period"
    )


if __name__ == "__main__":
    main()
