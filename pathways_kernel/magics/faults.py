"""Fault subcommands: fail, restore, chaos (embedded backend only) and health."""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from pathways_kernel import api
from pathways_kernel.emulator.chaosmonkey import MAX_SECONDS, MIN_SECONDS
from pathways_kernel.magics import argument, integer, magic_arguments, seconds, subcommand

chaos_seconds = seconds(MIN_SECONDS, MAX_SECONDS)


@subcommand("fail")
@magic_arguments(name="pathways fail")
@argument("slice", type=integer(0), help="index of the slice to lose")
def fail(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Lose a slice (local backend): arrays with a shard on it raise DATA_LOSS from now on."""
    return api.fail_slice(args.slice)


@subcommand("repair")
@magic_arguments(name="pathways repair")
@argument("slice", type=integer(0), help="index of the slice to bring back")
def repair(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Bring a lost slice back, empty (local backend): lost arrays stay lost."""
    return api.repair_slice(args.slice)


@subcommand("chaos")
@magic_arguments(name="pathways chaos")
@argument("--mtbf", type=chaos_seconds, default=None, help="mean seconds a slice stays up before it fails")
@argument("--mttr", type=chaos_seconds, default=None, help="mean seconds a failed slice stays down")
@argument("--seed", type=integer(0), default=0, help="seed of the failure schedule (same seed, same schedule)")
@argument("--min-up", type=integer(0), default=1, help="slices that always stay up (default 1)")
@argument("--off", action="store_true", help="stop chaos; slices stay as they are")
def chaos(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Random slice failures and repairs from a seeded schedule (local backend; off by default)."""
    if args.off:
        return api.chaos_off()
    if args.mtbf is None and args.mttr is None:
        return api.chaos_status()
    if args.mtbf is None or args.mttr is None:
        raise UsageError("%pathways chaos: give both --mtbf S and --mttr S (seconds), or --off")
    return api.chaos(args.mtbf, args.mttr, seed=args.seed, min_up=args.min_up)


@subcommand("health")
@magic_arguments(name="pathways health")
def health(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Run the slice health check (a tiny computation per slice): which slices are up."""
    return api.health()
