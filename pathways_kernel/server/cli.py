"""``pathways-local``: serve emulated slices to JAX's proxy client, and fail or
repair them.

    pathways-local serve --slices 2x4 [--port 0] [--host 127.0.0.1] [--socket PATH]
    pathways-local fail SLICE --server TARGET
    pathways-local repair SLICE --server TARGET
    pathways-local status --server TARGET
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import getpass
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import stat
import sys
from typing import TYPE_CHECKING, NoReturn

from pathways_kernel.core import parsing
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.server_protocol import (
    DEVICES_LINE,
    METRICS_LINE,
    PARENT_ENV,
    PROCESS_LINE,
    SERVING_LINE,
    control_call,
)
from pathways_kernel.core.text import shown

if TYPE_CHECKING:
    import grpc

    from pathways_kernel.core.tpu_kinds import SliceShape


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Most devices one server emulates (as ``local:SxC`` in a kernel): each is a CPU device of this process.
MAX_DEVICES = 4096


def _slices(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"([0-9]+)x([0-9]+)", text.strip().lower())  # ASCII digits: int() takes "１" and "١" too
    if match is None:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not SLICESxCHIPS (digits 0-9), e.g. 2x4")
    digits = [group.lstrip("0") for group in match.groups()]
    if not all(digits):
        raise argparse.ArgumentTypeError(f"{shown(text)}: slices and chips must be at least 1, e.g. 2x4")
    # Numbers this long are too many devices anyway; int() of thousands of digits is slow or refused.
    huge = any(len(d) > 9 for d in digits)
    if huge or int(digits[0]) * int(digits[1]) > MAX_DEVICES:
        devices = "more than the" if huge else f"{int(digits[0]) * int(digits[1])} devices, more than the"
        raise argparse.ArgumentTypeError(f"{shown(text)} is {devices} {MAX_DEVICES} devices a local server emulates")
    return int(digits[0]), int(digits[1])


def _port(text: str) -> int:
    try:
        return parsing.whole_number(text, 0, 65535)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a port from 0 to 65535 (0: a free one)") from None


def _slice_index(text: str) -> int:
    try:
        return parsing.whole_number(text, 0, MAX_DEVICES - 1)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error} (a slice index)") from None


def _slice_shapes(text: str) -> list[SliceShape]:
    """``--slices``: S slices of C CPU chips (``_slices``), or slices of TPU generations and
    shapes, ``v5p:2x2x1*2,v6e:2x2`` (``core/tpu_kinds.py``)."""
    from pathways_kernel.core.errors import SpecError
    from pathways_kernel.core.tpu_kinds import parse_slices

    if ":" not in text:
        slices, chips = _slices(text)
        return parse_slices(f"{slices}x{chips}")
    try:
        return parse_slices(text)
    except SpecError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _serving(shapes: list[SliceShape]) -> str:
    """What the first line says is served: ``2 slices x 4 chips``, ``3 slices (v5p:2x2x1*2,v6e:2x2)``."""
    from pathways_kernel.core.tpu_kinds import format_slices

    if len(set(shapes)) == 1 and shapes[0].generation is None:
        return f"{len(shapes)} slices x {shapes[0].chips} chips"
    return f"{len(shapes)} slices ({format_slices(shapes)})"


def _cannot_bind(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None if it can."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(info[0], socket.SOCK_STREAM) as probe:
            probe.bind(info[4])
    except OSError as error:
        return error.strerror or str(error)
    return None


def _private_socket(path: str) -> str:
    """``path``, after making sure its directory exists and only this user can enter it."""
    path = os.path.abspath(path)
    if path != path.lower():
        # JAX's proxy client lower-cases JAX_BACKEND_TARGET before it connects.
        raise SystemExit(
            f"pathways-local: the socket path {path} has capitals, and JAX's proxy client lower-cases "
            "JAX_BACKEND_TARGET, so no client could reach it; choose a lower-case path"
        )
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory)
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise SystemExit(
            f"pathways-local: {directory} must be a directory only you can enter (chmod 700), "
            "since whoever reaches the socket can run programs as you"
        )
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise SystemExit(f"pathways-local: {path} exists and is not a socket; choose another path")
        os.unlink(path)  # a socket left by an earlier server
    return path


def serve(args: argparse.Namespace) -> int:
    shapes = args.slices
    logging.basicConfig(level=os.environ.get("PATHWAYS_LOCAL_LOG", "WARNING"), format="pathways-local: %(message)s")
    # Each step of the start is a line (core/server_protocol.py), so that a kernel waiting for it can
    # say where it is (backends/server_client.py's start).
    if args.progress:
        print(f"{PROCESS_LINE}{os.getpid()}", flush=True)
    # Before JAX starts: the server's devices are CPU devices, whatever the caller's environment says.
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_num_cpu_devices", sum(s.chips for s in shapes))
    devices = len(jax.devices())  # starts the backend
    if args.progress:
        print(f"{DEVICES_LINE}{devices}", flush=True)
    from concurrent import futures

    import grpc

    from pathways_kernel.server import control, metric_service, service
    from pathways_kernel.server.devices import Topology

    backend = service.Server(Topology.of(shapes))
    activity = metric_service.DeviceActivity(backend.topology.device_count)
    backend.program_observers.append(activity.dispatched)
    metrics = metric_service.handlers(
        activity,
        lambda: backend.status()["bytes_per_device"],
        backend.topology.device_kind,  # the kind InitRequest gives each device (device_requests.py)
    )
    # The sessions' streams run on an event loop (fewer thread hand-offs per message than
    # gRPC's threaded server); the other methods run on its thread pool.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    grpc_server = grpc.aio.server(
        migration_thread_pool=futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="pathways-local-grpc"),
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
        ],
    )
    grpc_server.add_generic_rpc_handlers([service.handlers(backend), control.handlers(backend), metrics])
    if args.metrics_port is not None:
        _serve_metrics(metrics, args.metrics_port, loop)
    if args.socket:
        path = _private_socket(args.socket)
        try:
            grpc_server.add_insecure_port(f"unix:{path}")
        except RuntimeError:
            print(f"pathways-local: cannot listen on {path}", file=sys.stderr)
            return 1
        target = f"grpc://unix:{path}"
    else:
        # Bind once ourselves first: gRPC's own failure is a multi-line log without the reason.
        refused = _cannot_bind(args.host, args.port)
        if not refused and not _loopback(args.host):
            print(
                f"pathways-local: WARNING: --host {args.host} serves without authentication or encryption: "
                f"anyone who can reach it can run programs as {getpass.getuser()} and read your arrays",
                file=sys.stderr,
                flush=True,
            )
        port, refused = _add_port(grpc_server, args.host, args.port, refused)
        if not port:
            print(
                f"pathways-local: cannot listen on {args.host}:{args.port}: {refused}; "
                "pick another with --port, or --port 0 for a free one",
                file=sys.stderr,
            )
            return 1
        target = f"grpc://{args.host}:{port}"
    # What the imports made (~100k objects: JAX, protobuf's descriptors) is never garbage: kept out
    # of the collector, a full collection (heap.Reclaimer's, after big arrays go) takes ~0 ms, not 60-120.
    gc.freeze()
    loop.run_until_complete(grpc_server.start())
    print(f"{SERVING_LINE}{_serving(shapes)} on {target}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if parent := os.environ.get(PARENT_ENV):
        loop.create_task(_orphaned(int(parent), stop))
    loop.run_until_complete(stop.wait())
    # A client's session is a stream that never ends by itself, so the grace is always spent in
    # full: short, since whoever stops the server (a kernel shutting down) is leaving too.
    loop.run_until_complete(grpc_server.stop(grace=0.2))
    # Nothing outlives the server (its arrays, programs and sidecars go with it), and tearing the
    # interpreter down (JAX's client and devices, the gRPC pool's threads, a hung sidecar) took
    # 0.8-1.9 s of every server-backed kernel's shutdown at load 10-13: leave without it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _add_port(server: grpc.aio.Server, host: str, port: int, refused: str | None) -> tuple[int, str | None]:
    """Listens on ``host:port`` unless ``refused`` already says why not; the port bound (0 if
    none) and why it was refused (gRPC says no more than that it refused)."""
    if refused:
        return 0, refused
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound = 0
    return bound, None if bound else "refused"


def _serve_metrics(metrics: grpc.GenericRpcHandler, port: int, loop: asyncio.AbstractEventLoop) -> bool:
    """Serves the runtime metric service alone on ``localhost:port`` (for ``tpu-info``, whose client
    dials loopback TCP only); False, said in one line, if the port is taken: the server serves on
    without them there (a second kernel with the same ``PATHWAYS_LOCAL_METRICS_PORT`` still starts;
    its monitor reads them on the server's socket)."""
    from concurrent import futures

    import grpc

    refused = _cannot_bind("127.0.0.1", port)
    server = grpc.aio.server(migration_thread_pool=futures.ThreadPoolExecutor(2, "pathways-local-metrics"))
    server.add_generic_rpc_handlers([metrics])
    bound, refused = _add_port(server, "127.0.0.1", port, refused)
    if not bound:
        print(
            f"pathways-local: cannot serve runtime metrics on 127.0.0.1:{port} ({refused}); serving without them there",
            file=sys.stderr,
            flush=True,
        )
        return False
    loop.run_until_complete(server.start())
    _metrics_servers.append(server)  # held while the process serves
    print(f"{METRICS_LINE}localhost:{bound}", flush=True)
    return True


_metrics_servers: list[object] = []
#: The default of ``--metrics-port``: set it where a kernel starts the server (``local:``) to read its chips with tpu-info.
METRICS_PORT_ENV = "PATHWAYS_LOCAL_METRICS_PORT"


async def _orphaned(parent: int, stop: asyncio.Event) -> None:
    """Stop once ``parent`` is gone, even when it was killed (kill -9) without stopping us."""
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    stop.set()


def _control(args: argparse.Namespace) -> int:
    # As the kernel calls them (backends/server_client.py): fail, repair and status, 30 s each.
    body = {} if args.command == "status" else {"slice": args.slice}
    try:
        result = control_call(args.server, args.command.capitalize(), body, 30.0)
    except PathwaysError as error:
        print(f"pathways-local: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, its errors one line (argparse prints the whole usage above each)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog="pathways-local", description="Serve emulated Pathways slices to JAX's proxy client; fail or repair them."
    )
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve_cmd = commands.add_parser("serve", help="serve S slices of C chips (CPU devices) to JAX's proxy client")
    serve_cmd.add_argument(
        "--slices",
        type=_slice_shapes,
        default="2x4",
        help="SLICESxCHIPS, e.g. 2x4 (default), or TPU slices KIND:GRID[*N],..., e.g. v5p:2x2x1*2,v6e:2x2",
    )
    serve_cmd.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    serve_cmd.add_argument("--port", type=_port, default=0, help="port (default 0: a free one, printed)")
    serve_cmd.add_argument("--socket", help="listen on this Unix socket instead (its directory must be 0700)")
    serve_cmd.add_argument(
        "--metrics-port",
        type=_port,
        default=os.environ.get(METRICS_PORT_ENV) or None,  # argparse converts a string default with _port
        help="also serve libtpu's runtime metrics (duty cycle, HBM; read-only) on localhost:PORT for tpu-info "
        f"(8431 is libtpu's; default ${METRICS_PORT_ENV}); any user of this machine can read them there",
    )
    serve_cmd.add_argument(
        "--progress",
        action="store_true",
        help="also print each step of the start as a line (process up, devices ready), for a launcher that shows them",
    )
    for name, text in (("fail", "lose a slice"), ("repair", "bring a lost slice back, empty")):
        cmd = commands.add_parser(name, help=text)
        cmd.add_argument("slice", type=_slice_index)
        cmd.add_argument("--server", required=True, help="the server's target, grpc://HOST:PORT or grpc://unix:PATH")
    status_cmd = commands.add_parser("status", help="slices, which are down, bytes on each device")
    status_cmd.add_argument("--server", required=True)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    return _control(args)


if __name__ == "__main__":
    sys.exit(main())
