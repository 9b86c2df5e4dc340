"""Connection subcommands: reconnect; and the notice after a disconnect."""

from __future__ import annotations

import argparse
import sys

from IPython.core.interactiveshell import InteractiveShell

import pathways_kernel.magics.slurm  # noqa: F401  (adds the Slurm options to connect)
from pathways_kernel import api
from pathways_kernel.backends import connection
from pathways_kernel.core import shellhooks
from pathways_kernel.magics import argument, magic_arguments, preflight_seconds, subcommand


@subcommand("reconnect")
@magic_arguments(name="pathways reconnect")
@argument(
    "--timeout",
    type=preflight_seconds,
    default=None,
    help="proxy: seconds for the pre-flight check (default: as before)",
)
def reconnect(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Clear JAX's backends and caches and connect again to the same backend (after a disconnect)."""
    connection.reconnect(timeout=args.timeout)
    return api.status()


def _show_notice(*_: object) -> None:
    if notice := connection.NOTICE.take():
        print(notice, file=sys.stderr)


def install(shell: InteractiveShell) -> None:
    """Show the disconnect notice before the next cell runs (once per disconnect; not after a
    cell whose error said it already, ``connection.error_line``)."""
    shellhooks.of(shell).register("pre_run_cell", _show_notice)
