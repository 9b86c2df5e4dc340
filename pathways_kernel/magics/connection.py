"""Connection subcommands: reconnect; and the notice after a disconnect."""

from __future__ import annotations

import argparse
import sys

from IPython.core.interactiveshell import InteractiveShell

import pathways_kernel.magics.slurm  # noqa: F401  (adds the Slurm options to connect)
from pathways_kernel import api
from pathways_kernel.backends import connection
from pathways_kernel.backends.local_server import RECONNECT
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


def _show_notice(result: object = None) -> None:
    notice = connection.NOTICE.take()
    # A cell whose error said the server is gone, and what to do, has said the notice already.
    said = str(getattr(result, "error_in_exec", None) or "")
    if notice and RECONNECT not in said:
        print(notice, file=sys.stderr)


def install(shell: InteractiveShell) -> None:
    """Show the disconnect notice under the cell during or before which it came (once per disconnect)."""
    shellhooks.of(shell).register("post_run_cell", _show_notice)
