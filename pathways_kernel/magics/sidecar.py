"""``%%pathways sidecar``: define functions that run colocated with slices; ``%pathways sidecar``: their activity."""

from __future__ import annotations

import argparse

from IPython.core.interactiveshell import InteractiveShell

from pathways_kernel.colocated.activity import ActivityTable, stats
from pathways_kernel.colocated.sidecars import define
from pathways_kernel.magics import Text, argument, magic_arguments, seconds, slice_list, subcommand


@subcommand("sidecar", cell=True)
@magic_arguments(name="pathways sidecar")
@argument(
    "--slices",
    type=slice_list,
    default="all",
    help="slices the cell's @pw.sidecar functions run on: all (default) or e.g. 0,1",
)
@argument(
    "--timeout",
    type=seconds(0.0, 86400.0, allow_minimum=False),
    default=None,
    help="seconds before a sidecar call is reported hung (default 60, at most a day)",
)
def sidecar(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Cell: its @pw.sidecar functions run colocated with --slices; line: sidecar calls, bytes, time, queue depth."""
    if cell is None:
        return ActivityTable(stats())
    defined = define(cell, shell.user_ns, args.slices, args.timeout)
    if not defined:
        return Text("no @pw.sidecar function defined in this cell")
    return Text("\n".join(repr(s) for s in defined))
