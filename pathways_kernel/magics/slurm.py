"""Slurm options of ``%pathways connect``: ``slurm:JOB``, ``--submit``, ``local:SxC --slurm JOB``.

They join the ``connect`` subcommand's own parser, so ``%pathways connect
--help`` lists them with the rest, and a line that uses them goes to
``pw.connect_slurm``; any other line runs ``connect`` as before.
"""

from __future__ import annotations

import argparse

from IPython.core.interactiveshell import InteractiveShell

from pathways_kernel import api
from pathways_kernel.backends import slurm as slurm_lib
from pathways_kernel.backends import slurm_backend
from pathways_kernel.core.errors import SpecError
from pathways_kernel.magics import SUBCOMMANDS, Subcommand, core, integer, number

_parser = core.connect.parser
_parser.add_argument(
    "--slurm",
    default=None,
    metavar="JOB",
    help="local:SxC: bind the emulated slices to the nodes of this Slurm job (id or name)",
)
_parser.add_argument(
    "--wait",
    type=number,
    default=None,
    help=f"slurm: seconds to wait for a pending job to start (default {slurm_lib.DEFAULT_WAIT_S:.0f})",
)
_parser.add_argument(
    "--nodes-per-slice",
    type=integer(1),
    default=None,
    help="slurm: nodes per slice (default: the job's nodes split evenly over the slices)",
)
_parser.add_argument(
    "--feature",
    default=None,
    metavar="PREFIX",
    help="slurm: group nodes into slices by their node feature starting with PREFIX, e.g. slice",
)
_parser.add_argument(
    "--submit",
    nargs=argparse.REMAINDER,
    default=None,
    metavar="SCRIPT [sbatch options]",
    help="slurm: submit SCRIPT (or the shipped template pathways-job) with the sbatch options after "
    "it, wait for it and connect; cancelled when the kernel exits. Put it last on the line",
)


def connect(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """``connect`` with the Slurm options handled; otherwise the plain ``connect``."""
    slurm_spec = args.spec.startswith("slurm:") or args.spec == "slurm"
    if not (slurm_spec or args.slurm or args.submit):
        return core.connect(shell, args, cell)
    if slurm_spec and args.slurm:
        raise SpecError("--slurm JOB binds local:SxC to a job; to connect to the job's proxy use slurm:JOB alone")
    submit = args.submit or [None]
    if slurm_spec:
        job, local = args.spec.partition(":")[2], None
    else:
        job, local = args.slurm or "", args.spec
    slurm_backend.connect(
        slurm_backend.parse_spec("slurm:" + job),
        submit=submit[0],
        sbatch=submit[1:],
        local=local,
        force=args.force,
        timeout=args.timeout,
        insecure=args.insecure,
        wait=args.wait,
        nodes_per_slice=args.nodes_per_slice,
        feature=args.feature,
    )
    return api.status()


SUBCOMMANDS["connect"] = Subcommand("connect", connect, _parser, SUBCOMMANDS["connect"].cell)
