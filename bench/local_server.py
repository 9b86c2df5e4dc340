"""The local Pathways server against in-process JAX: step, dispatch, transfers.

The same measurements run twice, each in a fresh process on the same machine:
in-process CPU JAX with 8 devices, and JAX's own proxy client
(``JAX_PLATFORMS=proxy`` + pathwaysutils) against ``pathways-local serve
--slices 2x4`` on a Unix socket.

  * step: a jitted optax MLP training step, data-parallel over 8 devices with
    donated state, sized to about 5 ms in-process; each step waited on before
    the next (8 CPU devices queued several steps deep can stall XLA's CPU
    collectives on a 2-core machine), median of 5 repeats of 40 steps;
  * dispatch: ``x + 1`` on a 4-element array, waited on each time (round trip);
  * host->device: ``device_put`` of 64 MiB to one device; device->host:
    ``np.asarray`` of a fresh 64 MiB device array;
  * the floor under the tiny op: a bare gRPC round trip over a Unix socket in a
    directory like the server's, to a gRPC asyncio server as the local server's
    (unary, and one message each way on an open bidirectional stream, as the
    IFRT session's requests travel), from gRPC's Python client, 64-byte messages.

The machine is shared, so the two sides alternate, twice, and each keeps its
best figure; the load average is printed with each figure. ``--baseline REV``
adds a third side: the same client against a server run from the package as it
was at git revision REV (before and after a change, in one run).

Then, on a server-backed kernel (``local-server:2x4``): elastic recovery against
its warm floor (``bench/elastic_recovery.py`` with a 0.25 GiB state) and the
goodput of ``pw.elastic`` under slice losses (``bench/goodput.py --only a``,
``--goodput-seconds`` of wall time).

Prints the ratios last: tiny op / stream floor (goal <= 2), server/in-process step time (goal <= 1.2),
server/in-process transfer throughput (goal >= 0.5), recovery/warm floor on the
server (goal <= 1.5) and goodput (a) on the server (goal >= 0.90).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator

STEPS = 40
REPEATS = 5
BATCH, WIDTH = 256, 128
MIB = 64


def measure() -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    mesh = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    data, replicated = NamedSharding(mesh, P(("data", "model"))), NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    params = {
        f"w{i}": jax.device_put(rng.normal(size=(WIDTH, WIDTH)).astype(np.float32) * 0.05, replicated) for i in range(3)
    }
    optimizer = optax.adam(1e-3)
    state = (params, jax.device_put(optimizer.init(params), replicated))
    x = jax.device_put(rng.normal(size=(BATCH, WIDTH)).astype(np.float32), data)

    def loss_fn(p, x):
        h = x
        for i in range(3):
            h = jnp.tanh(h @ p[f"w{i}"])
        return jnp.mean((h - x) ** 2)

    @jax.jit
    def step(state, x):
        p, o = state
        loss, grads = jax.value_and_grad(loss_fn)(p, x)
        updates, o = optimizer.update(grads, o, p)
        return (optax.apply_updates(p, updates), o), loss

    step = jax.jit(step, donate_argnums=0)
    for _ in range(3):
        state, loss = step(state, x)
    float(loss)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(STEPS):
            state, loss = step(state, x)
            loss.block_until_ready()
        times.append((time.perf_counter() - start) / STEPS)

    tiny = jnp.ones(4)
    add = jax.jit(lambda a: a + 1)
    add(tiny).block_until_ready()
    rounds = []
    for _ in range(200):
        start = time.perf_counter()
        add(tiny).block_until_ready()
        rounds.append(time.perf_counter() - start)

    host = np.ones((MIB << 20) // 4, np.float32)
    device = devices[0]
    jax.device_put(host[:16], device).block_until_ready()
    up, down = [], []
    double = jax.jit(lambda a: a * 2)
    for _ in range(3):
        start = time.perf_counter()
        on_device = jax.device_put(host, device)
        on_device.block_until_ready()
        up.append(time.perf_counter() - start)
        fresh = double(on_device)
        fresh.block_until_ready()
        start = time.perf_counter()
        np.array(fresh, copy=True)  # in-process np.asarray is a zero-copy view
        down.append(time.perf_counter() - start)
    return {
        "step_ms": statistics.median(times) * 1e3,
        "dispatch_us": statistics.median(rounds) * 1e6,
        "h2d_mib_s": MIB / min(up),
        "d2h_mib_s": MIB / min(down),
    }


FLOOR_ROUNDS = 300


def floor_server(path: str) -> None:
    """A bare gRPC asyncio server on ``unix:path``: an echo method, unary and streaming."""
    import asyncio

    import grpc

    async def unary(request: bytes, context: object) -> bytes:
        return request

    async def stream(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    block = bytes(MIB << 20)

    async def read(request: bytes, context: object) -> AsyncIterator[bytes]:
        # As the local server answers a host-buffer lookup: 4 MiB messages of a buffer it holds.
        for offset in range(0, len(block), 4 << 20):
            yield block[offset : offset + (4 << 20)]

    async def serve() -> None:
        server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        )
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "floor.Echo",
                    {
                        "Unary": grpc.unary_unary_rpc_method_handler(unary),
                        "Stream": grpc.stream_stream_rpc_method_handler(stream),
                        "Read": grpc.unary_stream_rpc_method_handler(read),
                    },
                )
            ]
        )
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        print("serving", flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


def floor() -> dict:
    """Median round trips (us) of a bare gRPC unary call and of one message on an open stream."""
    import queue

    import grpc
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="bench-floor-") as directory:
        path = os.path.join(directory, "floor.sock")
        server = subprocess.Popen([sys.executable, __file__, "--floor-server", path], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "serving"
            channel = grpc.insecure_channel(f"unix:{path}")
            payload = b"x" * 64
            unary = channel.unary_unary("/floor.Echo/Unary")
            unary(payload, timeout=30)
            rounds = []
            for _ in range(FLOOR_ROUNDS):
                start = time.perf_counter()
                unary(payload, timeout=30)
                rounds.append(time.perf_counter() - start)
            requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
            responses = channel.stream_stream("/floor.Echo/Stream")(iter(requests.get, None))
            requests.put(payload)
            next(responses)
            trips = []
            for _ in range(FLOOR_ROUNDS):
                start = time.perf_counter()
                requests.put(payload)
                next(responses)
                trips.append(time.perf_counter() - start)
            requests.put(None)
            reads = []
            for _ in range(3):
                start = time.perf_counter()
                received = bytearray()
                for message in channel.unary_stream("/floor.Echo/Read")(payload, timeout=60):
                    received += message  # JAX's client too copies each message once more (into a Cord)
                np.frombuffer(received, np.uint8).copy()  # and then into the array it returns
                reads.append(time.perf_counter() - start)
            channel.close()
        finally:
            server.terminate()
            server.wait(10)
    return {
        "unary_us": statistics.median(rounds) * 1e6,
        "stream_us": statistics.median(trips) * 1e6,
        "read_mib_s": MIB / min(reads),
        "load": os.getloadavg()[0],
    }


def _memory(pid: int) -> tuple[int, int]:
    """(resident, peak since the last reset) of process ``pid``, in MiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmRSS"].split()[0]) >> 10, int(fields["VmHWM"].split()[0]) >> 10


def big(mib: int) -> dict:
    """``device_put`` of ``mib`` MiB sharded over the 8 devices, read back, deleted: each process's
    peak above its start (per phase, in MiB), what it holds after ``del``, and the throughputs.
    On the server side this process is a session on ``local:2x4``, as a kernel is."""
    import gc

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    pids = [os.getpid()]
    if os.environ.get("PATHWAYS_BACKEND"):
        import pathways_kernel as pw

        pids.append(pw.session().backend.server.pid)
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P("x"))
    jax.device_put(np.ones((8, 8), np.float32), sharding).block_until_ready()
    host = np.ones(((mib << 20) // 4 // 8, 8), np.float32)
    start = [_memory(pid)[0] for pid in pids]
    out: dict = {}
    for phase in ("put", "get", "del"):
        for pid in pids:
            with open(f"/proc/{pid}/clear_refs", "w") as refs:
                refs.write("5")  # the peak from here
        began = time.perf_counter()
        if phase == "put":
            on_device = jax.device_put(host, sharding)
            on_device.block_until_ready()
        elif phase == "get":
            back = np.array(on_device, copy=True)  # in-process np.asarray is a zero-copy view
        else:
            del on_device, back
            gc.collect()
            time.sleep(3)  # the server's reclaim and the kernel's heap trimmer take a second
        took = time.perf_counter() - began
        memory = [_memory(pid) for pid in pids]
        out[f"{phase}_mib_s"] = mib / took
        out[f"{phase}_peak"] = [peak - s for (_, peak), s in zip(memory, start, strict=True)]
        out[f"{phase}_held"] = [rss - s for (rss, _), s in zip(memory, start, strict=True)]
    return out


def run(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, timeout=900, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise SystemExit(f"measurement failed:\n{out.stderr[-3000:]}")
    return {**json.loads(lines[-1]), "load": os.getloadavg()[0]}


def best(runs: list[dict]) -> dict:
    """Each figure's best run: least time, most throughput; the load average, the highest seen."""
    return {key: (max if key.endswith(("_s", "load")) else min)(r[key] for r in runs) for key in runs[0]}


class BaselineServer:
    """``pathways-local serve --slices 2x4`` run from the package as it was at a git revision,
    started by its command line alone (``server_client.start`` passes flags that older servers
    refuse: ``--progress`` came with a6a9649)."""

    def __init__(self, directory: str):
        os.chmod(directory, 0o700)  # the server refuses a socket directory others may enter
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
        # python -m looks in the working directory first, then PYTHONPATH, then the installed package.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pathways_kernel.server", "serve", "--slices", "2x4"]
            + ["--socket", os.path.join(directory, "baseline.sock")],
            cwd=directory,
            env={**env, "PYTHONPATH": directory, "JAX_PLATFORMS": "cpu"},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        # Waits for its serving line, at most 120 s (then it is killed, which ends the wait).
        deadline = threading.Timer(120, self.process.kill)
        deadline.start()
        for line in self.process.stdout:
            if line.startswith("pathways-local: serving "):
                deadline.cancel()
                self.target = line.rsplit(" ", 1)[1].strip()
                # Whatever it prints later is read, so that a full pipe never blocks it.
                threading.Thread(target=self.process.stdout.read, daemon=True).start()
                return
        deadline.cancel()
        raise SystemExit(f"the baseline server ended without serving (exit {self.process.wait()})")

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def baseline_server(revision: str, directory: str) -> tuple[BaselineServer, str]:
    """A server run from the package as it was at git ``revision``, and the revision's short name."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    name = subprocess.run(
        ["git", "-C", root, "rev-parse", "--short", revision], capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", root, "archive", revision, "pathways_kernel"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    return BaselineServer(directory), name


def script(name: str, *args: str, timeout: float = 1800) -> list[str]:
    """Runs ``bench/NAME`` with ``args``; its output lines."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    out = subprocess.run([sys.executable, path, *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
    return out.stdout.splitlines()


def figure(lines: list[str], prefix: str) -> float:
    """The number that follows ``prefix`` on its line."""
    line = next(line for line in lines if line.startswith(prefix))
    return float(line[len(prefix) :].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REV", help="also measure a server run from git revision REV")
    parser.add_argument("--goodput-seconds", type=float, default=60.0, help="wall time of the goodput run (60)")
    parser.add_argument("--skip-elastic", action="store_true", help="only step, dispatch and transfers")
    parser.add_argument(
        "--big-mib", type=int, default=512, help="the big array's MiB (512; 3072 is issue 27's case: needs ~8 GiB free)"
    )
    args = parser.parse_args()
    from pathways_kernel.backends import server_client

    print(f"load average at start: {os.getloadavg()[0]:.1f} (2-core machine, shared)", flush=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    sides = {"in-process": {**base, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"}}
    servers = []
    with tempfile.TemporaryDirectory(prefix="bench-local-server-") as directory:
        try:
            if args.baseline:
                server, name = baseline_server(args.baseline, directory)
                servers.append(server)
                sides[f"server@{name}"] = server_client.client_env(server.target, connect_timeout_s=60)
            servers.append(server_client.start(2, 4))
            sides["local server"] = server_client.client_env(servers[-1].target, connect_timeout_s=60)
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            floors = []
            for _ in range(2):
                for side, env in sides.items():
                    runs[side].append(run(env))
                floors.append(floor())
        finally:
            for server in servers:
                server.stop()
    figures = {side: best(side_runs) for side, side_runs in runs.items()}
    print(f"{'':24}" + "".join(f"{side:>16}" for side in figures))
    for key, label in (
        ("step_ms", "step (ms)"),
        ("dispatch_us", "tiny op round trip (us)"),
        ("h2d_mib_s", "host->device (MiB/s)"),
        ("d2h_mib_s", "device->host (MiB/s)"),
        ("load", "load average (max)"),
    ):
        print(f"{label:24}" + "".join(f"{f[key]:16.1f}" for f in figures.values()))
    in_process, proxied = figures["in-process"], figures["local server"]
    bare = best(floors)
    print(
        f"bare gRPC round trip on a Unix socket (floor): unary {bare['unary_us']:.1f} us, "
        f"one message each way on a stream {bare['stream_us']:.1f} us; a {MIB} MiB read streamed in 4 MiB "
        f"messages, copied as JAX's client copies it: {bare['read_mib_s']:.1f} MiB/s (load average {bare['load']:.1f})"
    )
    ratios = []
    if not args.skip_elastic:
        lines = script(
            "elastic_recovery.py",
            "--backend",
            "local-server:2x4",
            "--gib",
            "0.25",
            "--cycles",
            "3",
            "--steady-steps",
            "50",
            "--reps",
            "2",
        )
        load = os.getloadavg()[0]
        print("\nelastic recovery on the server (bench/elastic_recovery.py --gib 0.25):")
        print("\n".join("  " + line for line in lines if line.startswith(("recovery ", "floor", "run "))))
        recovery = figure(lines, "recovery/warm floor")
        ratios.append(f"recovery/warm floor on the server: {recovery:.2f} (goal <= 1.5; load average {load:.1f})")
        lines = script(
            "goodput.py", "--only", "a", "--backend", "local-server:2x4", "--seconds", str(args.goodput_seconds)
        )
        print(f"\ngoodput on the server (bench/goodput.py --only a --seconds {args.goodput_seconds:.0f}):")
        print("\n".join("  " + line for line in lines if line.startswith(("(a) pw.elastic   ", "failure schedule"))))
        load = os.getloadavg()[0]
        goodput = figure(lines, "goodput(a)")
        ratios.append(f"goodput (a) on the server: {goodput:.3f} (goal >= 0.90; load average {load:.1f})")
    big_runs = {}
    for side, env in (
        ("in-process", sides["in-process"]),
        ("local:2x4", {**base, "PATHWAYS_BACKEND": "local:2x4"}),
    ):
        out = subprocess.run(
            [sys.executable, __file__, "--big", str(args.big_mib)], capture_output=True, text=True, timeout=900, env=env
        )
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode or not lines:
            raise SystemExit(f"big-array run failed:\n{out.stderr[-3000:]}")
        big_runs[side] = json.loads(lines[-1])
    print(
        f"\n{args.big_mib} MiB array, sharded over 8 devices (peak and held: MiB above each process's start; "
        f"load average {os.getloadavg()[0]:.1f}):"
    )
    for side, figures_ in big_runs.items():
        who = ["this process"] if side == "in-process" else ["kernel", "server"]
        print(
            f"  {side:12} put {figures_['put_mib_s']:7.1f} MiB/s, read {figures_['get_mib_s']:7.1f} MiB/s; "
            + "; ".join(
                f"{name}: peak {figures_['put_peak'][i]} on put, {figures_['get_peak'][i]} on read, "
                f"{figures_['del_held'][i]} held after del"
                for i, name in enumerate(who)
            )
        )
    step = proxied["step_ms"] / in_process["step_ms"]
    h2d = proxied["h2d_mib_s"] / in_process["h2d_mib_s"]
    d2h = proxied["d2h_mib_s"] / in_process["d2h_mib_s"]
    print()
    print(f"tiny op round trip / stream floor: {proxied['dispatch_us'] / bare['stream_us']:.2f} (goal <= 2)")
    print(f"host->device throughput server/in-process: {h2d:.2f} (goal >= 0.8)")
    print(f"device->host throughput server/in-process: {d2h:.2f} (goal >= 0.5)")
    print(f"device->host throughput server/bare gRPC read: {proxied['d2h_mib_s'] / bare['read_mib_s']:.2f}")
    print(f"step time server/in-process: {step:.2f} (goal <= 1.2)")
    for line in ratios:
        print(line)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--floor-server"]:
        floor_server(sys.argv[2])
    elif sys.argv[1:2] == ["--big"]:
        print(json.dumps(big(int(sys.argv[2]))), flush=True)
    elif sys.argv[1:] == ["--child"]:
        if os.environ.get("JAX_PLATFORMS") == "proxy":
            import pathwaysutils

            pathwaysutils.initialize()
        print(json.dumps(measure()), flush=True)
    else:
        main()
