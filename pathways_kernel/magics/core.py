"""Core subcommands: status, topology, devices, mesh, connect, events."""

from __future__ import annotations

import argparse

from IPython.core.interactiveshell import InteractiveShell

from pathways_kernel import api
from pathways_kernel.backends import connection
from pathways_kernel.core import meshes
from pathways_kernel.core.slices import DeviceTable
from pathways_kernel.magics import (
    Text,
    argument,
    integer,
    magic_arguments,
    name_list,
    non_empty,
    preflight_seconds,
    subcommand,
)

#: More slices than any one Pathways cluster runs.
MAX_SLICES = 4096


@subcommand("status")
@magic_arguments(name="pathways status")
def status(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Backend, platform, JAX version, slices up/total, chips and devices."""
    return api.status()


@subcommand("topology")
@magic_arguments(name="pathways topology")
def topology(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Slices and their chips (coordinates, state): HTML in notebooks, text elsewhere."""
    return api.topology()


@subcommand("devices")
@magic_arguments(name="pathways devices")
def devices(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Every device with its slice, chip coordinates, kind and state."""
    return DeviceTable(api.topology())


@subcommand("mesh")
@magic_arguments(name="pathways mesh")
@argument("--axes", type=name_list, default=None, help="comma-separated axis names (default: data,model)")
@argument("--dcn", type=non_empty, default=None, help="sizes across slices per axis, e.g. 2,1 (product = live slices)")
@argument(
    "--ici", type=non_empty, default=None, help="sizes within a slice per axis, e.g. 1,4 (product = chips per slice)"
)
@argument("--name", type=non_empty, default="mesh", help="bind the mesh to this name in the namespace (default: mesh)")
@argument("--no-bind", action="store_true", help="do not bind the mesh into the namespace")
@argument("--overwrite", action="store_true", help="let --name replace a value of another type")
@argument("--kind", type=non_empty, default=None, help="only slices of this kind of chip, e.g. v5p or 'TPU v6 lite'")
def mesh(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Build a multi-slice mesh over the live slices: a DCN axis across slices, ICI axes within."""
    m = api.mesh(
        args.axes,
        None if args.dcn is None else meshes.parse_shape(args.dcn),
        None if args.ici is None else meshes.parse_shape(args.ici),
        name=None if args.no_bind else args.name,
        overwrite=args.overwrite,
        kind=args.kind,
    )
    bound = "" if args.no_bind else f" -> bound to '{args.name}'"
    return Text(meshes.describe(m) + bound)


@subcommand("connect")
@magic_arguments(name="pathways connect")
@argument(
    "spec",
    help="local:SxC (default local:2x4: S slices of C chips in a local Pathways server, a child process reached "
    "through JAX's proxy client), embedded:SxC (the same slices in the kernel's process: faster steps, "
    "jax.debug.print works), grpc://HOST:PORT (Pathways proxy), slurm:JOB or sps (shared service)",
)
@argument("--force", action="store_true", help="switch even if device arrays would be discarded")
@argument("--timeout", type=preflight_seconds, default=None, help="proxy: seconds for the pre-flight check (default 5)")
@argument(
    "--insecure",
    action="store_true",
    default=None,
    help="proxy: plaintext gRPC, as kubectl port-forward gives (default: ALTS, or $IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS)",
)
@argument(
    "--server",
    action="store_true",
    help="local:SxC: run the slices in a local Pathways server (what local:SxC does by itself; kept for "
    "last wave's commands)",
)
@argument("--cluster", default="", help="sps: GKE cluster name")
@argument("--project", default="", help="sps: Google Cloud project")
@argument("--region", default="", help="sps: cluster location")
@argument("--service", default="", help="sps: HOST:PORT of the Pathways head")
@argument("--tpu", default="", help="sps: TYPE:TOPOLOGY, e.g. tpuv6e:2x2")
@argument("--count", type=integer(1, MAX_SLICES), default=1, help="sps: number of slices (default 1)")
@argument("--bucket", default="", help="sps: gs:// scratch location for the proxy")
@argument("--proxy-image", default=None, help="sps: proxy server image (default: the one the service needs)")
def connect(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Switch the session's backend (before the first computation, or with --force)."""
    if args.spec == "sps":
        connection.connect_shared_service(
            cluster=args.cluster,
            project=args.project,
            region=args.region,
            service=args.service,
            tpu=args.tpu,
            count=args.count,
            bucket=args.bucket,
            proxy_image=args.proxy_image,
            insecure=bool(args.insecure),
            timeout=args.timeout,
            force=args.force,
        )
    else:
        api.connect(args.spec, force=args.force, timeout=args.timeout, insecure=args.insecure, server=args.server)
    return api.status()


@subcommand("events")
@magic_arguments(name="pathways events")
@argument("--last", type=integer(1), default=20, help="show the last N events (default 20)")
@argument("--kind", type=non_empty, default=None, help="only events of this kind, e.g. slice_down")
def events(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """The session's event log: slice up/down, reshards, snapshots, transfers, ..."""
    return api.events_table(args.last, args.kind)
