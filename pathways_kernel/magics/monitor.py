"""``%pathways monitor``: the live notebook dashboard (``pw.monitor()``)."""

from __future__ import annotations

import argparse

from IPython.core.interactiveshell import InteractiveShell

import pathways_kernel.magics.chip_metrics  # noqa: F401  (adds --metrics to connect)
from pathways_kernel.magics import argument, magic_arguments, number, subcommand, whole_number
from pathways_kernel.monitoring.widget import monitor as show_monitor


@subcommand("monitor")
@magic_arguments(name="pathways monitor")
@argument("--rate", type=number, default=None, help="updates per second (default 2)")
@argument("--events", type=whole_number, default=8, help="how many recent events to list (default 8)")
@argument("--sample-hz", type=number, default=None, help="telemetry sampling rate in Hz (default 4)")
def monitor(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Live dashboard: per-slice utilization and memory, slice states, last events; updates while cells run."""
    return show_monitor(rate=args.rate, events=args.events, sample_hz=args.sample_hz)
