"""Snapshot and elastic subcommands: snapshot, snapshots, autosnapshot, elastic."""

from __future__ import annotations

import argparse

from IPython.core.interactiveshell import InteractiveShell
from jax.sharding import Mesh

from pathways_kernel.core.errors import NamespaceError, PathwaysError
from pathways_kernel.core.namespace import check_bindable
from pathways_kernel.magics import (
    Text,
    argument,
    integer,
    magic_arguments,
    name_list,
    non_empty,
    subcommand,
    whole_number,
)
from pathways_kernel.state import snapshots
from pathways_kernel.state.autosnapshots import autosnapshot as set_autosnapshot
from pathways_kernel.state.autosnapshots import for_shell
from pathways_kernel.training.elastic_loop import DEFAULT_MAX_RETRIES, DEFAULT_SNAPSHOT_EVERY, Elastic
from pathways_kernel.training.elastic_run import check_count, check_steps

#: What the loop binds in the namespace for each step: never training state.
LOOP_NAMES = ("step", "mesh")


@subcommand("snapshot")
@magic_arguments(name="pathways snapshot")
@argument("names", nargs="*", help="variables to snapshot (default: every variable holding jax arrays)")
@argument("--step", type=integer(0), default=None, help="record this training step with the snapshot")
@argument("--keep", type=integer(1), default=None, help="keep the last K snapshots per name from now on")
@argument(
    "--to", type=non_empty, default=None, help="also persist to gs://BUCKET/PREFIX or a directory, in the background"
)
@argument("--id", type=non_empty, default=None, help="id of the persisted snapshot (default: NAME or NAME-stepN)")
def snapshot(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Copy variables' jax arrays to host memory (async), with their PartitionSpecs."""
    if args.keep is not None:
        snapshots.store().configure(keep=args.keep)
    taken = snapshots.snapshot_variables(args.names or None, args.step)
    if not taken:
        return Text("no variable holds jax arrays: nothing to snapshot")
    if args.to:
        from pathways_kernel.magics.storage import persist_taken

        return persist_taken(taken, args.to, args.id)
    return Text("\n".join(s.summary() for s in taken))


@subcommand("snapshots")
@magic_arguments(name="pathways snapshots")
@argument("action", nargs="?", choices=("list", "restore"), default="list", help="list (default) or restore")
@argument(
    "url", nargs="?", default=None, help="gs://BUCKET/PREFIX or a directory: persisted snapshots instead of host ones"
)
@argument("--name", default=None, help="restore: bind to this variable (default: the snapshot's name)")
def snapshots_(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """The host snapshots kept in this session, or those persisted under a URL (list/restore)."""
    if args.url or args.action == "restore":
        from pathways_kernel.magics.storage import remote_snapshots

        return remote_snapshots(args.action, args.url, args.name)
    return snapshots.SnapshotTable(snapshots.store().list())


@subcommand("autosnapshot")
@magic_arguments(name="pathways autosnapshot")
@argument(
    "state", nargs="?", choices=("on", "off"), help="turn snapshot-after-each-cell on or off (default: show status)"
)
@argument("--max-bytes", type=integer(0), default=None, help="host bytes autosnapshots may hold in all")
def autosnapshot(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """After each cell, snapshot the jax variables that changed (for healing after a slice loss)."""
    if args.state is None:
        return for_shell(shell).status()
    return set_autosnapshot(args.state == "on", args.max_bytes)


@subcommand("elastic", cell=True)
@magic_arguments(name="pathways elastic")
@argument(
    "--steps",
    type=whole_number,
    required=True,
    help="steps of the whole run: the cell runs once for each of steps --start..--steps-1",
)
@argument("--state", type=name_list, required=True, help="comma-separated variables that are the training state")
@argument("--start", type=whole_number, default=0, help="first step (default 0), e.g. the step a snapshot is from")
@argument("--snapshot-every", type=whole_number, default=DEFAULT_SNAPSHOT_EVERY, help="steps between host snapshots")
@argument(
    "--max-retries", type=whole_number, default=DEFAULT_MAX_RETRIES, help="consecutive slice losses before giving up"
)
@argument("--axes", type=name_list, default=None, help="mesh axes (default: data,model; data spans slices)")
@argument("--kind", default=None, help="run on the slices of this TPU kind only, e.g. v5p (slices of several kinds)")
@argument("--no-progress", action="store_true", help="no progress display under the cell")
def elastic(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Run the cell as an elastic training step: survives slice loss, scales back up."""
    if cell is None or not cell.strip():
        raise PathwaysError(
            "%%pathways elastic needs a cell body: the training step, using `step`, `mesh` and the --state variables"
        )
    steps, start = check_steps(args.steps, args.start, ("--steps", "--start"))
    snapshot_every = check_count(args.snapshot_every, "--snapshot-every", 1)
    max_retries = check_count(args.max_retries, "--max-retries", 1)
    names = args.state
    for n in names:
        if n in LOOP_NAMES:
            raise NamespaceError(
                f"--state {n}: the loop binds `step` and `mesh` for each step; keep the training state in other variables"
            )
        check_bindable(n, None, overwrite=True)  # the run binds the state back: never pw, In, a builtin
    ns = shell.user_ns
    missing = [n for n in names if n not in ns]
    if missing:
        raise NamespaceError(
            f"--state {', '.join(missing)} is not defined; create the initial state in an earlier cell"
        )
    code = compile(cell, "<%%pathways elastic>", "exec")

    def body(state: dict[str, object], step: int, mesh: Mesh) -> dict[str, object]:
        ns.update(state)
        ns["step"], ns["mesh"] = step, mesh
        exec(code, ns)  # the user's own cell
        if deleted := [n for n in names if n not in ns]:
            ns.update({n: state[n] for n in deleted})  # what the step began with: nothing is lost
            raise NamespaceError(
                f"the cell deleted --state {', '.join(deleted)} at step {step} (now back as the step began): each "
                "step must leave the state variables bound to the new state, assigned, never deleted"
            )
        return {n: ns[n] for n in names}

    loop = Elastic(
        body,
        snapshot_every,
        max_retries,
        args.axes,
        name=",".join(names),
        state_label=", ".join(names),
        kind=args.kind,
    )
    try:
        ns.update(loop.run({n: ns[n] for n in names}, steps, start, progress=not args.no_progress))
    finally:
        if loop.last_run is not None:
            # However the run ended (done, interrupted, an error), the variables
            # hold its state: healing may take them back to its snapshots.
            store = snapshots.store()
            for n in names:
                store.note_origin(n, ns.get(n), f"elastic:{loop.name}", loop.last_run.run, names)
    return loop.last_run
