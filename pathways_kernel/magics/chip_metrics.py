"""The chip-metrics options of ``%pathways connect``: ``--metrics cloud-monitoring``
(``pw.chip_metrics``). They join the ``connect`` subcommand's own parser, as the Slurm
options do; the connection is made first, then the monitor reads the chips as asked.
"""

from __future__ import annotations

import argparse

from IPython.core.interactiveshell import InteractiveShell

import pathways_kernel.magics.connection  # noqa: F401  (the Slurm options wrap connect first)
from pathways_kernel.magics import SUBCOMMANDS, Subcommand
from pathways_kernel.monitoring.chip_metrics import SOURCES
from pathways_kernel.monitoring.chip_metrics import chip_metrics as use_chip_metrics

_connect = SUBCOMMANDS["connect"]
_parser = _connect.parser
_parser.add_argument(
    "--metrics",
    choices=SOURCES,
    default=None,
    help="where the monitor reads chips: cloud-monitoring (the TPU series GKE or Cloud TPU VMs export, "
    "with Application Default Credentials, 60 s resolution), runtime (the backend's own chip service), client",
)
_parser.add_argument("--metrics-project", default=None, help="cloud-monitoring: project (default: the credentials')")
_parser.add_argument("--metrics-cluster", default=None, help="cloud-monitoring: GKE cluster of the Pathways workers")
_parser.add_argument(
    "--metrics-workers",
    default=None,
    metavar="PREFIX",
    help="cloud-monitoring: only the workers whose names start with PREFIX (GKE pods, a Slurm job's TPU VM nodes)",
)


def connect(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """``connect``, then the monitor's chip source as ``--metrics`` says."""
    shown = _connect.func(shell, args, cell)
    if args.metrics:
        print(
            use_chip_metrics(
                args.metrics, project=args.metrics_project, cluster=args.metrics_cluster, workers=args.metrics_workers
            )
        )
    return shown


SUBCOMMANDS["connect"] = Subcommand("connect", connect, _parser, _connect.cell)
