"""Where the local server's time goes, on each side: CPU seconds of the server process and of
JAX's proxy client for one 64 MiB device->host read and for one tiny op, against in-process JAX
and against a bare gRPC round trip over the same kind of Unix socket.

``bench/local_server.py`` gives the ratios the goals are set on (issue #28 items 6 and 7);
this says why they are what they are. Each figure is the median of its repeats; both
processes' CPU is read around each repeat (the server's from ``/proc``), so it is the work
each side did for it, whatever else runs on the machine (the wall times are not).

  * read: ``np.asarray`` of a fresh 64 MiB single-device array (in-process: ``np.array(...,
    copy=True)``, its only copy); the server streams it to the client's host-buffer lookup;
  * tiny op: ``add(x).block_until_ready()`` on a 4-element array, which JAX's client sends as
    three requests (execute, check_value_ready, destruct_array), each answered;
  * floor: one 64-byte message each way on an open bidirectional stream to a gRPC asyncio
    echo server, as the IFRT session's requests and responses travel.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator

MIB = 64
READS = 12
OPS = 3000


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(server_pid: int) -> dict[str, float]:
    """This process is a JAX client (in-process CPU, or proxy to the server ``server_pid``; 0: none)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    proxied = server_pid > 0
    server_cpu = (lambda: _cpu_s(server_pid)) if proxied else (lambda: 0.0)
    device = jax.devices()[0]
    on_device = jax.device_put(np.ones((MIB << 20) // 4, np.float32), device)
    double = jax.jit(lambda a: a * 2)
    walls, server, client = [], [], []
    for _ in range(READS):
        fresh = double(on_device)
        fresh.block_until_ready()
        time.sleep(0.1)  # the server's reclaim of the last read's buffers, out of the figure
        s0, c0, w0 = server_cpu(), time.process_time(), time.perf_counter()
        value = np.asarray(fresh) if proxied else np.array(fresh, copy=True)
        walls.append(time.perf_counter() - w0)
        client.append(time.process_time() - c0)
        server.append(server_cpu() - s0)
        del value, fresh
    tiny, add = jnp.ones(4), jax.jit(lambda a: a + 1)
    add(tiny).block_until_ready()
    rounds = []
    s0, c0 = server_cpu(), time.process_time()
    for _ in range(OPS):
        start = time.perf_counter()
        add(tiny).block_until_ready()
        rounds.append(time.perf_counter() - start)
    op_server, op_client = (server_cpu() - s0) / OPS, (time.process_time() - c0) / OPS
    return {
        "read_ms": statistics.median(walls) * 1e3,
        "read_server_cpu_ms": statistics.median(server) * 1e3,
        "read_client_cpu_ms": statistics.median(client) * 1e3,
        "op_us": statistics.median(rounds) * 1e6,
        "op_server_cpu_us": op_server * 1e6,
        "op_client_cpu_us": op_client * 1e6,
    }


def echo_server(path: str) -> None:
    import grpc

    async def stream(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    async def serve() -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "floor.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(stream)}
        )
        server.add_generic_rpc_handlers([handler])
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        print("serving", flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


def floor() -> dict[str, float]:
    """The bare stream round trip: wall, and each side's CPU per round trip."""
    import grpc

    with tempfile.TemporaryDirectory(prefix="bench-costs-") as directory:
        path = os.path.join(directory, "echo.sock")
        server = subprocess.Popen([sys.executable, __file__, "--echo-server", path], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "serving"
            channel = grpc.insecure_channel(f"unix:{path}")
            requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
            responses = channel.stream_stream("/floor.Echo/Stream")(iter(requests.get, None))
            payload = b"x" * 64
            requests.put(payload)
            next(responses)
            trips = []
            s0, c0 = _cpu_s(server.pid), time.process_time()
            for _ in range(OPS):
                start = time.perf_counter()
                requests.put(payload)
                next(responses)
                trips.append(time.perf_counter() - start)
            server_cpu, client_cpu = (_cpu_s(server.pid) - s0) / OPS, (time.process_time() - c0) / OPS
            requests.put(None)
            channel.close()
        finally:
            server.terminate()
            server.wait(10)
    return {
        "trip_us": statistics.median(trips) * 1e6,
        "server_cpu_us": server_cpu * 1e6,
        "client_cpu_us": client_cpu * 1e6,
    }


def child(env: dict[str, str], server_pid: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(server_pid)], capture_output=True, text=True, timeout=900, env=env
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise SystemExit(f"measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def _text(path: str) -> str:
    with open(path, errors="replace") as file:
        return file.read()


def start_server(directory: str) -> tuple[subprocess.Popen[bytes], str]:
    """``pathways-local serve --slices 2x4`` on a socket in ``directory``; waits (at most 120 s)
    for its serving line. Its output goes to files: a full pipe would stall it."""
    path = os.path.join(directory, "server.sock")
    out_path = os.path.join(directory, "server.out")
    with open(out_path, "wb") as out, open(os.path.join(directory, "server.err"), "wb") as err:
        server = subprocess.Popen(
            [sys.executable, "-m", "pathways_kernel.server", "serve", "--slices", "2x4", "--socket", path],
            stdout=out,
            stderr=err,
        )
    deadline = time.monotonic() + 120
    while "serving" not in _text(out_path):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"the local server did not start: {_text(os.path.join(directory, 'server.err'))[-2000:]}")
        time.sleep(0.1)
    return server, f"grpc://unix:{path}"


def main() -> None:
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    in_process = child({**base, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"}, 0)
    with tempfile.TemporaryDirectory(prefix="bench-costs-") as directory:
        server, target = start_server(directory)
        try:
            proxy_env = {
                **base,
                "JAX_PLATFORMS": "proxy",
                "JAX_BACKEND_TARGET": target,
                "IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS": "true",
            }
            proxied = child(proxy_env, server.pid)
        finally:
            server.terminate()
            server.wait(30)
    bare = floor()
    load = os.getloadavg()[0]
    print(f"\n{MIB} MiB device->host read (median of {READS}):")
    print(f"  in-process   wall {in_process['read_ms']:6.1f} ms, CPU {in_process['read_client_cpu_ms']:6.1f} ms")
    print(
        f"  local server wall {proxied['read_ms']:6.1f} ms; CPU: server {proxied['read_server_cpu_ms']:6.1f} ms, "
        f"JAX's client {proxied['read_client_cpu_ms']:6.1f} ms"
    )
    print(
        f"  JAX's client alone does {proxied['read_client_cpu_ms'] / in_process['read_client_cpu_ms']:.1f}x the "
        f"in-process read's CPU: its read cannot take less wall time than that (goal: <= 2x the in-process wall)"
    )
    print(f"\ntiny op round trip (median of {OPS}):")
    print(
        f"  local server wall {proxied['op_us']:7.0f} us; CPU per op: server {proxied['op_server_cpu_us']:5.0f} us, "
        f"JAX's client {proxied['op_client_cpu_us']:5.0f} us (3 requests and 3 responses)"
    )
    print(
        f"  bare stream  wall {bare['trip_us']:7.0f} us; CPU per round trip: server {bare['server_cpu_us']:5.0f} us, "
        f"gRPC's Python client {bare['client_cpu_us']:5.0f} us (1 message each way)"
    )
    print(
        f"  tiny op / floor: wall {proxied['op_us'] / bare['trip_us']:.2f} (goal <= 2), "
        f"server CPU {proxied['op_server_cpu_us'] / bare['server_cpu_us']:.2f}"
    )
    print(f"load average at end: {load:.1f} (2-core machine, shared)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--echo-server"]:
        echo_server(sys.argv[2])
    elif sys.argv[1:2] == ["--child"]:
        if os.environ.get("JAX_PLATFORMS") == "proxy":
            import pathwaysutils

            pathwaysutils.initialize()
        print(json.dumps(measure(int(sys.argv[2]))), flush=True)
    else:
        main()
