"""Latency from Slurm marking a node DOWN to the kernel's ``slice_down`` event.

A real Slurm on this machine (tests/support/slurm.py: munged, slurmctld, two slurmd),
a two-node ``--no-kill`` job, and ``local:2x2`` bound to it
(``pw.connect_slurm(job, local=...)``: slice 0 = tpu-0, slice 1 = tpu-1).
Each cycle submits such a job and binds it (the same session: the slices the
last job left down come back), runs ``scontrol update nodename=tpu-1
state=down`` and times until the ``slice_down`` event (the fault path of
``pw.fail_slice``: arrays lost with DATA_LOSS), then resumes the node and
cancels the job. A node that fails leaves a ``--no-kill`` job for good, hence
a new job per cycle.

Half the cycles are flaps: ``state=resume`` right after ``state=down``, the
node back in service before the next poll (as with ReturnToService=2). The
kernel still sees it, from the job's node list.

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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

import slurm as slurm_cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20, help="cycles, half of them flaps (default 20)")
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

    downs, flaps = [], []
    for cycle in range(cycles):
        job = cluster.submit("#!/bin/bash\nsleep 600\n", "--nodes=2", "--no-kill", "--time=20")
        cluster.wait_job(job, "RUNNING")
        events = pw.connect_slurm(job, local="local:2x2").events
        seq = events.last(1)[0].seq
        start = time.time()
        cluster.set_node("tpu-1", "down", "bench")
        flap = cycle % 2 == 1
        if flap:
            cluster.set_node("tpu-1", "resume")
        (flaps if flap else downs).append(wait_event(events, "slice_down", seq).time - start)
        if not flap:
            cluster.set_node("tpu-1", "resume")
        cluster.run("scancel", job)
        cluster.wait_job(job, "CANCELLED")
        cluster.wait_nodes("idle")
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
    print(
        f"flap->slice_down median {statistics.median(flaps):.2f} s (min {min(flaps):.2f}, max {max(flaps):.2f}) "
        f"over {len(flaps)} flaps (DOWN then resumed at once)"
    )
    print(f"down->slice_down min {min(downs):.2f} s, max {max(downs):.2f} s over {len(downs)} cycles")
    median = statistics.median(downs)
    print(
        f"down->slice_down median {median:.2f} s (goal <= 2 s: {'met' if median <= 2.0 else 'MISSED'}), "
        f"{median / period:.2f}x the poll period"
    )


if __name__ == "__main__":
    main()
