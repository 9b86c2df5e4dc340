"""Durable-state subcommands: checkpoint, cache; remote parts of snapshot/snapshots.

``%pathways snapshot NAME --to URL`` and ``%pathways snapshots list|restore
URL`` live with the other snapshot subcommands (magics/elastic.py) and call
``persist_taken`` / ``remote_snapshots`` here.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from IPython.core.interactiveshell import InteractiveShell

from pathways_kernel.core import locations
from pathways_kernel.core.errors import NamespaceError, PathwaysError
from pathways_kernel.core.namespace import bind, check_bindable, user_namespace
from pathways_kernel.magics import MAX_INT, Text, argument, integer, magic_arguments, name_list, seconds, subcommand
from pathways_kernel.state import checkpoints, compile_cache, snapshots, storage
from pathways_kernel.state.manifest import SnapshotList


def persist_taken(taken: Sequence[snapshots.Snapshot], url: str, snapshot_id: str | None = None) -> Text:
    """Start uploading freshly taken snapshots; one line each."""
    if snapshot_id and len(taken) > 1:
        raise PathwaysError(
            "--id names one snapshot; give one variable, or leave --id out (ids are NAME or NAME-stepN)"
        )
    lines = []
    for snap in taken:
        storage.persist(snap, url, snapshot_id)
        target = locations.parse_url(url).child(snapshot_id or storage.default_id(snap))
        lines.append(f"{snap.summary()}; persisting to {target.url} in the background")
    return Text("\n".join(lines))


def remote_snapshots(action: str, url: str | None, name: str | None) -> SnapshotList | Text:
    """``%pathways snapshots list URL`` and ``%pathways snapshots restore URL [--name VAR]``."""
    if not url:
        raise PathwaysError(f"%pathways snapshots {action} needs a URL: gs://BUCKET/PREFIX or a local directory")
    if action == "list":
        return storage.list_snapshots(url)
    info = storage.read_info(url)
    target = info.name if name is None else name
    # Refused before the download: a restore replaces a variable's data, never the notebook's own names.
    check_bindable(target, None, overwrite=True)
    tree = storage.restore(info.url)
    bind(target, tree, overwrite=True)
    return Text(f"restored {info.id} ({len(info.manifest['leaves'])} arrays) from {info.url} -> bound to '{target}'")


@subcommand("checkpoint")
@magic_arguments(name="pathways checkpoint")
@argument("action", choices=("save", "restore", "list"), help="save variables, restore them, or list saved steps")
@argument("url", help="gs://BUCKET/PREFIX or a local directory (one orbax checkpoint directory)")
@argument(
    "--step",
    type=integer(0, checkpoints.MAX_STEP),
    default=None,
    help="the step to save (required) or restore (default: latest)",
)
@argument(
    "--vars",
    type=name_list,
    default=None,
    help="comma-separated variables to save (default: every variable holding jax arrays)",
)
@argument(
    "--keep",
    type=integer(1, MAX_INT),
    default=checkpoints.DEFAULT_KEEP,
    help="checkpoints kept in the directory (default 3)",
)
@argument("--wait", action="store_true", help="block until the save is committed")
def checkpoint(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Orbax checkpoints of notebook variables: async save, restore onto the live slices, list."""
    if args.action == "list":
        return checkpoints.listing(args.url)
    if args.action == "restore":
        restored = checkpoints.restore(args.url, args.step)
        if not isinstance(restored, dict) or not all(isinstance(k, str) and k.isidentifier() for k in restored):
            raise PathwaysError(
                f"checkpoint in {args.url} was not saved from notebook variables; use pw.checkpoint_restore() instead"
            )
        # All or none: a checkpoint naming one of the notebook's own names binds nothing.
        for var, value in restored.items():
            check_bindable(var, value, overwrite=True)
        for var, value in restored.items():
            bind(var, value, overwrite=True)
        step = "latest step" if args.step is None else f"step {args.step}"
        return Text(
            f"restored {', '.join(restored)} ({step}) from {locations.parse_url(args.url).url} onto the live slices"
        )
    if args.step is None:
        raise PathwaysError("%pathways checkpoint save needs --step N (the training step this state belongs to)")
    ns = user_namespace()
    if ns is None:
        raise NamespaceError(
            "checkpointing variables needs a notebook; call pw.checkpoint_save(tree, url, step) instead"
        )
    for var in args.vars or ():
        if var not in ns:
            raise NamespaceError(f"no variable '{var}' in the notebook; define it or check the spelling")
    values = snapshots.device_values(ns, args.vars)
    if not values:
        raise NamespaceError("no variable holds jax arrays: nothing to checkpoint")
    transfer = checkpoints.save(values, args.url, args.step, keep=args.keep)
    if args.wait:
        transfer.wait()
        return Text(transfer.summary())
    return Text(
        f"saving {', '.join(values)} as step {args.step} to {locations.parse_url(args.url).url} in the background"
    )


@subcommand("cache")
@magic_arguments(name="pathways cache")
@argument("location", nargs="?", default=None, help="gs://BUCKET/PREFIX, a directory, or off (default: show status)")
@argument(
    "--min-compile-s",
    type=seconds(0.0, 86400.0),
    default=compile_cache.DEFAULT_MIN_COMPILE_S,
    help="cache only programs that take at least this long to compile (default 0.2)",
)
def cache(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """JAX's persistent compilation cache in Cloud Storage or a directory; hits and misses become events."""
    return compile_cache.cache(args.location, args.min_compile_s)
