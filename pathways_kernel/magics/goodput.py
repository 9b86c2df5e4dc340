"""``%pathways goodput``: where the accelerator time went (``pw.goodput()``)."""

from __future__ import annotations

import argparse

from IPython.core.interactiveshell import InteractiveShell

from pathways_kernel.magics import argument, magic_arguments, non_empty, number, subcommand, whole_number
from pathways_kernel.training import accounting, goodput_report
from pathways_kernel.training.goodput_logging import cloud_logging


@subcommand("goodput")
@magic_arguments(name="pathways goodput")
@argument(
    "--run",
    type=non_empty,
    default=None,
    help="one run by name (default: every run of the session, and the notebook's idle time)",
)
@argument("--no-field", action="store_true", help="skip ml-goodput-measurement's own figure for each run")
@argument(
    "--over-time",
    action="store_true",
    help="goodput and badput over the run (default: the latest) as a stacked chart, and its step times",
)
@argument(
    "--intervals", type=whole_number, default=None, help="with --over-time: this many equal intervals (default 20)"
)
@argument("--window", metavar="SECONDS", type=number, default=None, help="with --over-time: intervals of SECONDS")
@argument(
    "--cloud-logging",
    metavar="JOB|off",
    default=None,
    help="Pathways on GKE: new runs also write their goodput log to Cloud Logging as job JOB-<run>-<n>; 'off' stops",
)
def goodput(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Goodput and badput by cause, per run and for the session; MFU where the step's FLOPs are known."""
    if args.cloud_logging is not None:
        job = None if args.cloud_logging == "off" else args.cloud_logging
        print(cloud_logging(job))
        return None
    if args.over_time or args.intervals is not None or args.window is not None:
        return goodput_report.OverTime(goodput_report.goodput_over_time(args.run, args.intervals, args.window))
    return goodput_report.goodput(args.run, field=not args.no_field)


def install(shell: InteractiveShell) -> None:
    accounting.install(shell)
