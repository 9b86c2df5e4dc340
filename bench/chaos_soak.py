"""Soak: 1,000 slice failures and repairs inside an elastic loop, with a live monitor.

``local:2x4`` in this process. A small training state (``--mib``, default
2 MiB: a ``P("data", "model")`` matrix, a ``P(None, "model")`` matrix and a
replicated vector) is trained by ``pw.elastic`` with ``snapshot_every=2``;
a telemetry hub subscription (what the monitor panel uses) receives metrics
and events all along. Each cycle is ``--cycle-len`` steps: slice 1 fails
(``pw.fail_slice``) at its second step, the loop rolls back onto slice 0,
and slice 1 is restored two steps later (the loop scales back up).

First, ``--fast-cycles`` (default 200) back-to-back failures and repairs with
no pause and no loop around them, in a real ``pathways`` kernel (its threads
included: ipykernel's watchers of stdout and stderr, which never leave their
call, once kept every loss's buffers for 5 s): each cycle puts an array of
half ``--mib`` sharded over both slices and one on a single chip of slice 1,
fails slice 1 and repairs it.

Prints, measured in the same run:
- for the back-to-back cycles: extra live arrays (``jax.live_arrays()``)
  over the baseline after each cycle, at most and at the end (goal: back to
  the baseline within one cycle, i.e. only the cycle's own two arrays), and
  RSS growth from cycle 10 to the end (goal <= 20 MB);
- RSS growth in MB from cycle 10 (compilations for both meshes done) to the
  end of the soak (goal <= 100); what a ``gc.collect()`` then frees is shown
  beside it;
- whether the final state equals a fault-free run of the same steps under
  the README's tolerance (``assert_allclose(rtol=1e-5, atol=1e-6)``, every leaf);
- per-cycle time, last 100 cycles over the first 100 (goal <= 1.2), last.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000, help="failure/repair cycles (default 1000)")
    parser.add_argument("--cycle-len", type=int, default=6, help="steps per cycle (default 6)")
    parser.add_argument("--mib", type=float, default=2.0, help="training state size in MiB (default 2)")
    parser.add_argument(
        "--fast-cycles", type=int, default=200, help="back-to-back fail/repair cycles first (default 200)"
    )
    args = parser.parse_args()
    window = min(100, args.cycles // 2)
    if args.fast_cycles:
        back_to_back(args.fast_cycles, args.mib / 2)

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pathways_kernel as pw
    from pathways_kernel.emulator import faults
    from pathways_kernel.monitoring import telemetry

    pw.connect("local:2x4")
    session = pw.session()
    mesh = session.mesh()
    cols = 512
    rows = max(8, int(args.mib * (1 << 20)) // 2 // cols // 4 // 8 * 8)
    host = {
        "w": np.linspace(-1.0, 1.0, rows * cols, dtype=np.float32).reshape(rows, cols),
        "v": np.linspace(0.5, 1.5, rows * cols, dtype=np.float32).reshape(rows, cols),
        "b": np.zeros(cols, np.float32),
    }
    specs = {"w": P("data", "model"), "v": P(None, "model"), "b": P()}

    def initial():
        return {k: jax.device_put(host[k], NamedSharding(mesh, specs[k])) for k in host}

    @jax.jit
    def update(state, step):
        # Elementwise only: the result does not depend on how many slices share the work.
        lr = 0.01 / (1.0 + 0.001 * step)
        w = state["w"] - lr * (state["w"] - 0.5 * state["v"])
        v = state["v"] * 0.999 + 0.001 * jnp.tanh(w)
        b = state["b"] + lr * (w[0] - state["b"])
        return {"w": w, "v": v, "b": b}

    steps = args.cycles * args.cycle_len
    fail_at, restore_at = 1, 3
    done: set[int] = set()
    cycle_start: list[float] = []
    rss_at_10: list[float] = []

    def soak_step(state, step, mesh):
        cycle, offset = divmod(step, args.cycle_len)
        if offset == fail_at and cycle not in done:
            done.add(cycle)
            cycle_start.append(time.perf_counter())
            if len(cycle_start) == 11:
                rss_at_10.append(rss_mb())
            pw.fail_slice(1)
        if offset == restore_at and mesh.shape["data"] == 1:
            pw.repair_slice(1)
        return update(state, step)

    def plain_step(state, step, mesh):
        return update(state, step)

    received = {"metrics": 0, "events": 0}
    hub = telemetry.hub(session)
    subscription = hub.subscribe(
        on_metrics=lambda m: received.__setitem__("metrics", received["metrics"] + 1),
        on_event=lambda e: received.__setitem__("events", received["events"] + 1),
    )
    loop = pw.elastic(soak_step, snapshot_every=2, name="soak", max_retries=None)
    began = time.perf_counter()
    try:
        final = loop(initial(), steps=steps)
        jax.block_until_ready(final)
    finally:
        subscription.close()
    soak_s = time.perf_counter() - began
    cycle_start.append(time.perf_counter())
    rss_end = rss_mb()
    kept_end = len(faults._graveyard)
    live_end = len(jax.live_arrays())
    # Lost arrays caught in reference cycles (exception tracebacks) wait for
    # Python's cyclic collector; shown apart, not part of the figure.
    gc.collect()
    rss_collected, live_collected = rss_mb(), len(jax.live_arrays())

    reference = pw.elastic(plain_step, snapshot_every=2, name="soak-reference")(initial(), steps=steps)
    final_host = jax.device_get(final)
    reference_host = jax.device_get(reference)
    try:
        for key in host:
            np.testing.assert_allclose(final_host[key], reference_host[key], rtol=1e-5, atol=1e-6)
        same = "yes (assert_allclose rtol=1e-5, atol=1e-6, every leaf)"
    except AssertionError as exc:
        same = "NO: " + " ".join(str(exc).split())[:300]

    per_cycle = np.diff(cycle_start)
    first, last = per_cycle[:window].sum(), per_cycle[-window:].sum()
    report = loop.last_run
    state_mib = sum(a.nbytes for a in host.values()) / (1 << 20)
    baseline = rss_at_10[0] if rss_at_10 else float("nan")
    print(f"state                {state_mib:.1f} MiB in {len(host)} arrays on local:2x4, snapshot_every=2")
    print(f"run                  {report.summary()}")
    print(
        f"cycles               {len(per_cycle)} fail/repair in {soak_s:.1f} s ({per_cycle.mean() * 1000:.0f} ms each)"
    )
    print(f"monitor              {received['metrics']} metrics updates, {received['events']} events received")
    print(f"kept buffers         {kept_end} at the end; live arrays {live_end}, {live_collected} after gc.collect()")
    print(
        f"RSS                  {baseline:.0f} MB at cycle 10, {rss_end:.0f} MB at the end, {rss_collected:.0f} MB after "
        "gc.collect()"
    )
    print(f"final state          equals the fault-free run: {same}")
    print(f"RSS growth           {rss_end - baseline:.0f} MB at the end  (goal <= 100)")
    print(f"per-cycle time, last {window}/first {window}    {last / first:.2f}  (goal <= 1.2)")


BACK_TO_BACK = """
import time, jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from pathways_kernel.emulator import faults

def rss_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 1e6

host = np.linspace(-1.0, 1.0, int({mib} * (1 << 20)) // 4, dtype=np.float32)
sharding, chip = NamedSharding(pw.mesh(), P(("data", "model"))), pw.topology().slices[1].devices[0]
baseline = len(jax.live_arrays())
extra, rss = [], []
began = time.perf_counter()
for _ in range({cycles}):
    arrays = [jax.device_put(host, sharding), jax.device_put(host, chip)]
    faults.fail_slice(1)
    faults.repair_slice(1)
    del arrays
    extra.append(len(jax.live_arrays()) - baseline)
    rss.append(rss_mb())
took = time.perf_counter() - began
start = rss[min(10, len(rss) - 1)]
print(f"back-to-back         {cycles} fail/repair cycles in a kernel in {{took:.1f}} s ({{took / {cycles} * 1000:.0f}} ms each), "
      f"two {mib:g} MiB arrays lost each (one sharded over both slices, one on one chip)")
print(f"live arrays          at most {{max(extra)}} over the baseline after a cycle, {{extra[-1]}} after the last "
      "(goal: 0, back to the baseline within one cycle)")
print(f"RSS growth           {{rss[-1] - start:.1f}} MB from cycle 10 to the last  (goal <= 20)")
"""


def back_to_back(cycles: int, mib: float) -> None:
    """``cycles`` fail/repair cycles with no pause, in a real ``pathways`` kernel (its threads
    included: ipykernel's pipe watchers once kept every loss's buffers for 5 s)."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="pathways")
    said: list[str] = []

    def collect(msg: dict) -> None:
        if msg["header"]["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            said.append(msg["content"]["text"])
        elif msg["header"]["msg_type"] == "error":
            said.append("\n".join(msg["content"]["traceback"]))

    try:
        client.execute_interactive(BACK_TO_BACK.format(cycles=cycles, mib=mib), output_hook=collect, timeout=1200)
    finally:
        client.stop_channels()
        manager.shutdown_kernel()
    print("".join(said).rstrip())


if __name__ == "__main__":
    main()
