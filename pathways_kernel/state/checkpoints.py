"""Checkpoints: durable training state through orbax.

One orbax ``CheckpointManager`` per directory (``gs://BUCKET/PREFIX`` or a
local path) per session, saving asynchronously: ``save`` returns once the
arrays are copied off the devices, and orbax writes them in the background;
the returned ``Transfer`` ends (with a ``transfer`` event) when the step is
committed. Each step holds two items: ``state`` (orbax's own format) and
``layout`` (each leaf's key path, shape, dtype and PartitionSpec, as JSON),
so ``restore`` can rebuild the target shardings on the mesh of the slices
that are alive now, possibly smaller than the one that saved it; orbax
reads each shard directly into its new layout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_kernel.core import locations, objectstore, runs, sessions, storage_errors
from pathways_kernel.core.errors import StorageError
from pathways_kernel.state import snapshots, transfers
from pathways_kernel.state.manifest import (
    keys_to_json,
    spec_from_json,
    spec_to_json,
    tree_from_stored_keys,
    valid_dtype,
    valid_keys,
    valid_mesh_axes,
    valid_spec,
)
from pathways_kernel.state.transfers import Transfer

if TYPE_CHECKING:
    from types import FrameType

    from jax.sharding import Mesh

DEFAULT_KEEP = 3
#: orbax names steps by int64.
MAX_STEP = 2**63 - 1


class Checkpoints:
    """The session's checkpoint managers, one per directory (session extension).

    A directory only read from (list, restore) gets a reading manager, which
    needs no write access and creates nothing; the first save there replaces
    it with a writing one.
    """

    def __init__(self) -> None:
        self._managers: dict[str, tuple[Any, int | None]] = {}  # url -> (writing manager, its keep)
        self._readers: dict[str, Any] = {}
        self._lock = threading.Lock()

    def manager(self, location: locations.Location, keep: int | None = DEFAULT_KEEP, write: bool = True) -> Any:
        import orbax.checkpoint as ocp

        with self._lock:
            existing = self._managers.get(location.url)
            if existing is not None and (not write or existing[1] == keep):
                return existing[0]
            # orbax finds a missing bucket only in its background thread, in many log lines.
            objectstore.objects_for(location).check(location, write=write)
            if not write:
                if location.url not in self._readers:
                    # Not read_only=True: orbax warns on every start of such a manager.
                    options = ocp.CheckpointManagerOptions(create=False, enable_async_checkpointing=False)
                    self._readers[location.url] = ocp.CheckpointManager(
                        _path(location), options=options, item_names=("state", "layout")
                    )
                return self._readers[location.url]
            if existing is not None:  # another --keep: orbax reads max_to_keep only when it starts
                _close(existing[0])
            if (reader := self._readers.pop(location.url, None)) is not None:
                reader.close()
            options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True, create=True)
            manager = ocp.CheckpointManager(_path(location), options=options, item_names=("state", "layout"))
            self._managers[location.url] = (manager, keep)
            return manager

    def forget(self, location: locations.Location) -> None:
        """Drop the writing manager of a directory after a failed save: the next one starts clean."""
        with self._lock:
            existing = self._managers.pop(location.url, None)
        if existing is not None:
            _close(existing[0])

    def writers(self, url: str | None = None) -> list[Any]:
        with self._lock:
            return [m for u, (m, _) in self._managers.items() if url is None or u == url]

    def close(self) -> None:
        with self._lock:
            managers = [m for m, _ in self._managers.values()] + list(self._readers.values())
            self._managers.clear()
            self._readers.clear()
        for manager in managers:
            _close(manager)


def _close(manager: Any) -> None:
    """Finish and close ``manager``; a failed save was already reported by its transfer."""
    _ORBAX_ERRORS.hold()
    try:
        with contextlib.suppress(Exception):  # reported once, as one line, by the transfer that ran it
            manager.wait_until_finished()
        manager.close()
    finally:
        _ORBAX_ERRORS.release()


class _OrbaxErrors(logging.Filter):
    """Drops orbax's error logs while one of our saves runs: its failure
    reaches the user once, as one line, and orbax would log it from every
    background thread with a traceback each (hundreds of stderr lines).

    Installed (a filter on absl's logger and ``sys.unraisablehook``) only while
    a save or close holds it, and removed with the last one: importing the
    package changes neither. After a failed save a session holds it until it
    closes: orbax's threads go on completing writes into the loop it closed for
    seconds after the failure was reported (longer under load), each one more
    ``Event loop is closed`` traceback in whatever cell runs then.
    """

    def __init__(self) -> None:
        super().__init__()
        self.active = 0
        self.lock = threading.Lock()
        self._previous_hook: Any = None
        self._held_for: weakref.WeakSet[Any] = weakref.WeakSet()

    def hold_until_close(self, session: Any) -> None:
        """Hold until ``session`` closes (once per session): a save of it failed."""
        with self.lock:
            if session in self._held_for:
                return
            self._held_for.add(session)
        self.hold()
        session.on_close(self.release)

    def hold(self) -> None:
        with self.lock:
            self.active += 1
            if self.active == 1:
                logging.getLogger("absl").addFilter(self)
                self._previous_hook = sys.unraisablehook
                sys.unraisablehook = self._unraisable

    def release(self) -> None:
        with self.lock:
            self.active -= 1
            if self.active == 0:
                logging.getLogger("absl").removeFilter(self)
                # Put the previous hook back unless someone replaced ours meanwhile (theirs then stays).
                if sys.unraisablehook == self._unraisable:
                    sys.unraisablehook = self._previous_hook
                self._previous_hook = None

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.active and record.levelno >= logging.ERROR and _logged_by_orbax())

    def _unraisable(self, unraisable: Any) -> None:
        # Once a save fails, orbax closes its event loop while tensorstore still
        # completes writes into it: each completion raises this, unraisably.
        closed = isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"
        if not (closed and self.active):
            (self._previous_hook or sys.__unraisablehook__)(unraisable)


def _logged_by_orbax() -> bool:
    # The record's own pathname is absl's logging module; the caller is further up.
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if f"{os.sep}orbax{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


_ORBAX_ERRORS = _OrbaxErrors()


def _path(location: locations.Location) -> Any:
    from etils import epath

    return epath.Path(location.url)


def _registry() -> Checkpoints:
    def create(s: Any) -> Checkpoints:
        registry = Checkpoints()
        s.on_close(registry.close)
        return registry

    return sessions.session().component(Checkpoints, create)


def _layout(tree: Any) -> dict[str, Any]:
    import jax
    from jax.sharding import NamedSharding

    leaves = []
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        sharding = getattr(value, "sharding", None)
        named = sharding if isinstance(sharding, NamedSharding) else None
        leaves.append(
            {
                "keys": keys_to_json(path),
                "shape": list(np.shape(value)),
                "dtype": np.dtype(value.dtype).name if hasattr(value, "dtype") else np.asarray(value).dtype.name,
                "spec": spec_to_json(named.spec) if named is not None else None,
                "mesh_axes": [[str(k), int(v)] for k, v in named.mesh.shape.items()] if named is not None else [],
            }
        )
    return {"format": "pathways-checkpoint-layout/1", "leaves": leaves}


def check_step(step: Any) -> int:
    """``step`` if it is a whole number orbax can name a checkpoint by; raises ``StorageError``."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step <= MAX_STEP:
        raise StorageError(f"bad checkpoint step {step!r}: a step is a whole number from 0 to {MAX_STEP}")
    return int(step)


def _readable(tree: Any) -> None:
    """Refuse, naming it, a leaf whose data is gone (a shard on a lost slice): orbax would
    fail on it midway, in hundreds of lines."""
    import jax

    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not isinstance(leaf, jax.Array):
            continue
        try:
            leaf.block_until_ready()
        except jax.errors.JaxRuntimeError as exc:
            name = _leaf_name(path)
            if "DATA_LOSS" in str(exc):
                raise StorageError(
                    f"cannot checkpoint {name}: its data was lost with a slice (DATA_LOSS); restore it from a snapshot "
                    "or recompute it on the live slices, then save again"
                ) from None
            raise StorageError(f"cannot checkpoint {name}: reading it failed ({storage_errors.short(exc)})") from None


def _name_lost_leaf(tree: Any, exc: BaseException) -> None:
    """After a save failed with ``exc``: if a slice was lost meanwhile, raise the one line
    naming the leaf (``_readable``), not what orbax raised from deep inside it."""
    import jax

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, jax.errors.JaxRuntimeError) and "DATA_LOSS" in str(seen):
            _readable(tree)
            return
        seen = seen.__cause__ or seen.__context__


def _leaf_name(path: Any) -> str:
    """``state['w']`` for the path of a leaf of ``{"state": {"w": ...}}``."""
    import jax

    if path and isinstance(path[0], jax.tree_util.DictKey) and isinstance(path[0].key, str):
        return path[0].key + jax.tree_util.keystr(tuple(path[1:]))
    return jax.tree_util.keystr(tuple(path)) or "the tree"


def _discard_step(manager: Any, location: locations.Location, step: int) -> None:
    """Remove what a failed save of ``step`` left (orbax's temporary directory), unless it was committed."""
    import shutil

    manager.reload()
    if step in manager.all_steps():
        return
    root = _path(location)
    for leftover in [*root.glob(f"{step}.orbax-checkpoint-tmp*"), root / str(step)]:
        if leftover.exists():
            if location.scheme == "file":
                shutil.rmtree(str(leftover), ignore_errors=True)
            else:
                leftover.rmtree()


def save(tree: Any, url: str, step: int, *, keep: int | None = DEFAULT_KEEP, force: bool = False) -> Transfer:
    """Save ``tree`` as checkpoint ``step`` under ``url``, asynchronously.

    Returns a ``Transfer`` that ends when orbax has committed the step
    (``.wait()``); the devices are free again as soon as this returns. A
    save that fails leaves nothing behind in the directory.

    Raises:
      StorageError: malformed URL, bad step or keep, missing bucket, a
        directory that cannot be written, step already saved, an array
        whose data was lost with a slice (before or during the save), and
        orbax errors during the blocking part.
    """
    import jax
    import orbax.checkpoint as ocp

    location = locations.parse_url(url)
    step = check_step(step)
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise StorageError(f"bad keep {keep!r}: keep at least 1 checkpoint (or None for all)")
    _readable(tree)
    nbytes = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(tree))
    registry = _registry()
    objects = objectstore.objects_for(location)
    made = objects.missing_dirs(location)
    with storage_errors.errors_as("checkpoint save", location):
        manager = registry.manager(location, keep)
        if step in manager.all_steps() and not force:
            raise StorageError(
                f"checkpoint step {step} already exists in {location.url}; checkpoints are never overwritten: use another --step"
            )
        args = ocp.args.Composite(state=ocp.args.StandardSave(tree), layout=ocp.args.JsonSave(_layout(tree)))

    def failed() -> None:
        # Close the manager first: a write still in flight while leftovers were removed
        # could land after them (seen in CI under load: the directory was left behind).
        registry.forget(location)
        with contextlib.suppress(Exception):  # the save's own failure is what the user needs to see
            _discard_step(manager, location, step)
        objectstore.remove_empty(made)

    # Held from here until the save has ended, in whichever thread that happens.
    _ORBAX_ERRORS.hold()
    try:
        # The blocking part (device -> host copies) runs here; orbax writes the rest on its own thread.
        with storage_errors.errors_as("checkpoint save", location), runs.spent("checkpoint_save"):
            manager.save(step, args=args, force=True)
    except BaseException as exc:
        failed()
        _ORBAX_ERRORS.hold_until_close(sessions.session())
        _ORBAX_ERRORS.release()
        _name_lost_leaf(tree, exc)
        raise

    def finish(transfer: Transfer) -> int:
        transfer.checked()
        try:
            with storage_errors.errors_as("checkpoint save", location):
                try:
                    manager.wait_until_finished()
                except BaseException as exc:
                    failed()
                    _ORBAX_ERRORS.hold_until_close(session)
                    _name_lost_leaf(tree, exc)
                    raise
        finally:
            _ORBAX_ERRORS.release()
        transfer.advance(nbytes)
        return step

    session = sessions.session()
    events = session.events
    return Transfer("checkpoint save", f"step {step} -> {location.url}", nbytes, events).start(finish)


def steps(url: str) -> list[int]:
    """The committed checkpoint steps under ``url``, ascending."""
    location = locations.parse_url(url)
    with storage_errors.errors_as("checkpoint list", location):
        manager = _registry().manager(location, write=False)
        manager.reload()
        return sorted(manager.all_steps())


def restore(url: str, step: int | None = None, mesh: Mesh | None = None) -> Any:
    """Restore checkpoint ``step`` (default: the latest) onto ``mesh``.

    ``mesh`` defaults to the mesh over the live slices with the axis names
    the checkpoint was saved with; each leaf keeps its PartitionSpec where
    the mesh allows it (axes the mesh lacks, or that no longer divide a
    dimension, become replicated).

    Raises:
      StorageError: nothing saved there, no such step, unreachable storage.
    """
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding, PartitionSpec

    location = locations.parse_url(url)
    if step is not None:
        step = check_step(step)
    with storage_errors.errors_as("checkpoint restore", location):
        manager = _registry().manager(location, write=False)
        manager.reload()
        available = manager.all_steps()
    if not available:
        raise StorageError(
            f"no checkpoint in {location.url}: save one first (%pathways checkpoint save VAR {location.url} --step N)"
        )
    if step is None:
        step = max(available)
    elif step not in available:
        raise StorageError(
            f"no checkpoint step {step} in {location.url}; steps there: {', '.join(map(str, sorted(available)))}"
        )
    with storage_errors.errors_as("checkpoint restore", location):
        leaves = manager.restore(step, args=ocp.args.Composite(layout=ocp.args.JsonRestore()))["layout"]["leaves"]
    if not _valid_layout(leaves):
        raise StorageError(
            f"checkpoint step {step} in {location.url} is damaged: its layout names non-numeric dtypes or malformed "
            "shapes, specs or key paths; restore another step"
        )
    if mesh is None:
        axes = next((tuple(a[0] for a in e["mesh_axes"]) for e in leaves if e["mesh_axes"]), None)
        mesh = sessions.session().mesh(axes)
    first = mesh.devices.flat[0]
    abstract = []
    for entry in leaves:
        shape = tuple(entry["shape"])
        dtype = np.dtype(jax.numpy.dtype(entry["dtype"]))
        spec = spec_from_json(entry["spec"])
        sharding: jax.sharding.Sharding
        if spec is None:
            sharding = jax.sharding.SingleDeviceSharding(first)
        else:
            sharding = NamedSharding(mesh, snapshots.fit_spec(spec, shape, mesh) if shape else PartitionSpec())
        abstract.append(jax.ShapeDtypeStruct(shape, dtype, sharding=sharding))
    target = tree_from_stored_keys([e["keys"] for e in leaves], abstract, f"checkpoint step {step} in {location.url}")
    nbytes = sum(int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize for a in abstract)

    def job(transfer: Transfer) -> Any:
        transfer.checked()
        with storage_errors.errors_as("checkpoint restore", location):
            result = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
        jax.block_until_ready(result)
        transfer.advance(nbytes)
        return result

    return transfers.run_sync(
        "checkpoint restore", f"step {step} <- {location.url}", job, sessions.session().events, total=nbytes
    )


def _valid_layout(leaves: Any) -> bool:
    """Whether a layout read back from storage describes leaves a restore may build (see manifest.valid_manifest)."""
    if not isinstance(leaves, list):
        return False
    try:
        return all(
            valid_keys(e["keys"], len(leaves))
            and valid_dtype(e["dtype"]) is not None
            and isinstance(e["shape"], list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in e["shape"])
            and valid_spec(e["spec"])
            and valid_mesh_axes(e["mesh_axes"])
            for e in leaves
        )
    except (KeyError, TypeError):
        return False


def wait(url: str | None = None) -> None:
    """Block until pending async saves (of ``url``, or all) are committed."""
    for manager in _registry().writers(None if url is None else locations.parse_url(url).url):
        manager.wait_until_finished()


class CheckpointList(list[int]):
    """Committed steps under a directory; renders as one line."""

    def __init__(self, url: str, found: list[int]):
        super().__init__(found)
        self.url = url

    def __repr__(self) -> str:
        if not self:
            return f"no checkpoints in {self.url}"
        return f"{len(self)} checkpoint(s) in {self.url}: steps {', '.join(map(str, self))} (latest {self[-1]})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


def listing(url: str) -> CheckpointList:
    return CheckpointList(locations.parse_url(url).url, steps(url))
