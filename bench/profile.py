"""What profiling costs: step time while tracing against not, and the wait for the summary.

On local:2x4, a jitted, sharded training-like step (matmul, tanh, a
cross-slice reduction) runs in paired rounds, untraced then traced
(inside ``pw.profile``, the default host tracer level), so both see the same
machine load. The figure is the median over rounds of traced / untraced median step time.

Then one capture of ``--capture-s`` seconds (default 10) of the same loop,
timed from the end of its body to the summary being ready (collecting the
trace from the profiler, writing its XSpace file, summarizing it from memory:
what the user waits for after the cell). Beside it, the same loop traced
with plain ``jax.profiler.start_trace``/``stop_trace`` (which also converts
the trace to a trace.json.gz and writes both files), read back from the file
and summarized: the wait before.

Prints the summary wait (goal <= 3 s) and the plain one, then the step time ratio last (goal <= 1.15).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10, help="steps per round and mode")
    parser.add_argument("--capture-s", type=float, default=10.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--host-tracer-level", type=int, default=None, help="default: pw.profile's")
    args = parser.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["PATHWAYS_PROFILE_DIR"] = tempfile.mkdtemp(prefix="bench-profile-")
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pathways_kernel as pw
    from pathways_kernel.profiling.capture import DEFAULT_HOST_TRACER_LEVEL

    if args.host_tracer_level is None:
        args.host_tracer_level = DEFAULT_HOST_TRACER_LEVEL
    pw.connect("local:2x4")
    mesh = pw.mesh()
    w = jax.device_put(jnp.full((args.size, args.size), 0.01), NamedSharding(mesh, P(None, "model")))
    x0 = jax.device_put(jnp.ones((args.size, args.size)), NamedSharding(mesh, P("data", None)))

    @jax.jit
    def step(x, w):
        y = jnp.tanh(x @ w)
        return y / (1.0 + jnp.mean(jnp.abs(y)))  # the mean crosses both slices

    def steps(n: int) -> list[float]:
        x, times = x0, []
        for _ in range(n):
            t = time.perf_counter()
            x = step(x, w)
            x.block_until_ready()
            times.append(time.perf_counter() - t)
        return times

    steps(5)  # compile and warm up
    # Paired rounds, each traced round against the untraced one just before it:
    # the load of a shared machine drifts slower than a round.
    plain, traced, ratios = [], [], []
    for r in range(args.rounds):
        before = steps(args.steps)
        with pw.profile(f"round{r}", host_tracer_level=args.host_tracer_level) as capture:
            during = steps(args.steps)
        capture.summary()
        plain += before
        traced += during
        ratios.append(statistics.median(during) / statistics.median(before))
    base, under = statistics.median(plain), statistics.median(traced)
    print(
        f"step ({args.size}x{args.size} matmul, 2 slices x 4 chips): untraced {base * 1e3:.1f} ms, "
        f"traced {under * 1e3:.1f} ms (medians of {len(plain)} steps each, {args.rounds} paired rounds)"
    )

    def loop() -> tuple[int, float]:
        end, n = time.perf_counter() + args.capture_s, 0
        while time.perf_counter() < end:
            steps(1)
            n += 1
        return n, time.perf_counter()

    with pw.profile("long", host_tracer_level=args.host_tracer_level) as capture:
        n, body_end = loop()
    stopped = time.perf_counter()
    summary = capture.summary()
    ready = time.perf_counter()
    print(
        f"{args.capture_s:.0f} s capture ({n} steps, trace {capture.size / 2**20:.1f} MiB): "
        f"end of body -> summary {ready - body_end:.2f} s (collect + write the trace {stopped - body_end:.2f} s, "
        f"summarize {ready - stopped:.2f} s) (goal <= 3 s)"
    )
    plain_n, plain_wait, plain_stop, plain_mib = plain_capture(args, loop)
    print(
        f"  the same with jax.profiler.stop_trace ({plain_n} steps, trace {plain_mib:.1f} MiB): {plain_wait:.2f} s "
        f"(stop_trace {plain_stop:.2f} s, read back + summarize {plain_wait - plain_stop:.2f} s)"
    )
    print(
        "  busy per device: " + ", ".join(f"slice {s.index} {s.fraction(summary.wall_ns):.0%}" for s in summary.slices)
    )
    print(f"traced/untraced step time: {statistics.median(ratios):.3f} (median of per-round ratios; goal <= 1.15)")


def plain_capture(args, loop) -> tuple[int, float, float, float]:
    """(steps, end of body -> summary s, of which stop_trace s, MiB) for the same loop
    traced by jax.profiler alone, its file read back and summarized."""
    import jax

    import pathways_kernel as pw
    from pathways_kernel.profiling import summary as summary_lib

    logdir = tempfile.mkdtemp(prefix="bench-profile-plain-")
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = args.host_tracer_level
    jax.profiler.start_trace(logdir, profiler_options=options)
    with jax.profiler.TraceAnnotation(summary_lib.WINDOW_PREFIX + "plain"):
        n, body_end = loop()
    jax.profiler.stop_trace()
    stopped = time.perf_counter()
    # The kernel's trace and, on local:, the server's (it traces its own process into the same run).
    data = []
    for path in sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))):
        with open(path, "rb") as f:
            data.append(f.read())
    slice_of = {d.id: s.index for s in pw.session().topology.slices for d in s.devices}
    summary_lib.summarize(data, "plain", slice_of)
    return n, time.perf_counter() - body_end, stopped - body_end, sum(map(len, data)) / 2**20


if __name__ == "__main__":
    main()
