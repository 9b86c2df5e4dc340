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

import threading
from typing import Any

import numpy as np

from pathways_kernel.state import storage
from pathways_kernel.core.errors import StorageError
from pathways_kernel.state.transfers import Transfer

DEFAULT_KEEP = 3


class Checkpoints:
    """The session's checkpoint managers, one per directory (session extension)."""

    def __init__(self) -> None:
        self._managers: dict[str, Any] = {}
        self._lock = threading.Lock()

    def manager(self, location: storage.Location, keep: int | None = DEFAULT_KEEP) -> Any:
        import orbax.checkpoint as ocp

        with self._lock:
            if location.url not in self._managers:
                # orbax finds a missing bucket only in its background thread, in many log lines.
                storage.objects_for(location).check(location)
                options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True, create=True)
                self._managers[location.url] = ocp.CheckpointManager(_path(location), options=options, item_names=("state", "layout"))
            return self._managers[location.url]

    def close(self) -> None:
        with self._lock:
            for manager in self._managers.values():
                manager.wait_until_finished()
                manager.close()
            self._managers.clear()


def _path(location: storage.Location) -> Any:
    from etils import epath

    return epath.Path(location.url)


def _registry() -> Checkpoints:
    from pathways_kernel.core.sessions import session

    def create(s: Any) -> Checkpoints:
        registry = Checkpoints()
        s.on_close(registry.close)
        return registry

    return session().component(Checkpoints, create)


def _layout(tree: Any) -> dict[str, Any]:
    import jax
    from jax.sharding import NamedSharding

    leaves = []
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        sharding = getattr(value, "sharding", None)
        named = isinstance(sharding, NamedSharding)
        leaves.append({
            "keys": storage._keys_to_json(path),
            "shape": list(np.shape(value)),
            "dtype": np.dtype(value.dtype).name if hasattr(value, "dtype") else np.asarray(value).dtype.name,
            "spec": storage._spec_to_json(sharding.spec) if named else None,
            "mesh_axes": [[str(k), int(v)] for k, v in sharding.mesh.shape.items()] if named else [],
        })
    return {"format": "pathways-checkpoint-layout/1", "leaves": leaves}


def save(tree: Any, url: str, step: int, *, keep: int | None = DEFAULT_KEEP, force: bool = False) -> Transfer:
    """Save ``tree`` as checkpoint ``step`` under ``url``, asynchronously.

    Returns a ``Transfer`` that ends when orbax has committed the step
    (``.wait()``); the devices are free again as soon as this returns.

    Raises:
      StorageError: malformed URL, missing bucket, step already saved, and
        orbax errors during the blocking part.
    """
    import jax

    import orbax.checkpoint as ocp

    location = storage.parse_url(url)
    nbytes = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(tree))
    with storage.errors_as("checkpoint save", location):
        manager = _registry().manager(location, keep)
        if step in manager.all_steps() and not force:
            raise StorageError(f"checkpoint step {step} already exists in {location.url}; checkpoints are never overwritten: use another --step")
        args = ocp.args.Composite(state=ocp.args.StandardSave(tree), layout=ocp.args.JsonSave(_layout(tree)))
        # The blocking part (device -> host copies) runs here; orbax writes the rest on its own thread.
        manager.save(step, args=args, force=True)

    def finish(transfer: Transfer) -> int:
        transfer.checked()
        with storage.errors_as("checkpoint save", location):
            manager.wait_until_finished()
        transfer.advance(nbytes)
        return step

    from pathways_kernel.core.sessions import session

    return Transfer("checkpoint save", f"step {step} -> {location.url}", nbytes, session().events).start(finish)


def steps(url: str) -> list[int]:
    """The committed checkpoint steps under ``url``, ascending."""
    location = storage.parse_url(url)
    with storage.errors_as("checkpoint list", location):
        manager = _registry().manager(location)
        manager.reload()
        return sorted(manager.all_steps())


def restore(url: str, step: int | None = None, mesh: Any = None) -> Any:
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

    from pathways_kernel.state import snapshots
    from pathways_kernel.core.sessions import session

    location = storage.parse_url(url)
    with storage.errors_as("checkpoint restore", location):
        manager = _registry().manager(location)
        manager.reload()
        available = manager.all_steps()
    if not available:
        raise StorageError(f"no checkpoint in {location.url}: save one first (%pathways checkpoint save VAR {location.url} --step N)")
    if step is None:
        step = max(available)
    elif step not in available:
        raise StorageError(f"no checkpoint step {step} in {location.url}; steps there: {', '.join(map(str, sorted(available)))}")
    with storage.errors_as("checkpoint restore", location):
        leaves = manager.restore(step, args=ocp.args.Composite(layout=ocp.args.JsonRestore()))["layout"]["leaves"]
    if mesh is None:
        axes = next((tuple(a[0] for a in e["mesh_axes"]) for e in leaves if e["mesh_axes"]), None)
        mesh = session().mesh(axes)
    first = mesh.devices.flat[0]
    abstract = []
    for entry in leaves:
        shape = tuple(entry["shape"])
        dtype = np.dtype(jax.numpy.dtype(entry["dtype"]))
        spec = storage._spec_from_json(entry["spec"])
        if spec is None:
            sharding = jax.sharding.SingleDeviceSharding(first)
        else:
            sharding = NamedSharding(mesh, snapshots.fit_spec(spec, shape, mesh) if shape else PartitionSpec())
        abstract.append(jax.ShapeDtypeStruct(shape, dtype, sharding=sharding))
    target = storage._tree_from_keys([e["keys"] for e in leaves], abstract)
    nbytes = sum(int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize for a in abstract)

    def job(transfer: Transfer) -> Any:
        transfer.checked()
        with storage.errors_as("checkpoint restore", location):
            result = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
        jax.block_until_ready(result)
        transfer.advance(nbytes)
        return result

    from pathways_kernel.state import transfers

    return transfers.run_sync("checkpoint restore", f"step {step} <- {location.url}", job, session().events, total=nbytes)


def wait(url: str | None = None) -> None:
    """Block until pending async saves (of ``url``, or all) are committed."""
    registry = _registry()
    with registry._lock:
        managers = [m for u, m in registry._managers.items() if url is None or u == storage.parse_url(url).url]
    for manager in managers:
        manager.wait_until_finished()


class CheckpointList(list):
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
    return CheckpointList(storage.parse_url(url).url, steps(url))

