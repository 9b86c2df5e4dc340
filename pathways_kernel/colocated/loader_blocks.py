"""A loader's global batch as per-slice blocks: laid out, produced, joined.

``Layout`` says which block of the batch dimension each slice of a mesh
holds (``Part``); ``remote_producer`` is what each slice's sidecar runs to
make its block, nested so that cloudpickle ships it by value; ``Pending`` is
one step in flight, whose blocks the worker finishing the last one joins into
one global ``jax.Array`` without copying. The loader object that schedules
steps and hands batches to the training loop is ``data_loader.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any, cast

from pathways_kernel.colocated.sidecars import Colocated, SidecarError, colocated_mesh, failure, nbytes
from pathways_kernel.core import jaxcompat
from pathways_kernel.core.errors import MeshError

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh, PartitionSpec

    from pathways_kernel.core.slices import Topology

#: ``make_batches(step, shard, num_shards)``: block ``shard`` of ``num_shards`` of global batch ``step``.
MakeBatches = Callable[[int, int, int], Any]
#: One slice's block of a step as a worker hands it over: the pytree on the slice, and seconds busy.
Block = tuple[Any, float]
#: A step's global batch, and per slice the bytes of its block and seconds busy.
Joined = tuple[Any, dict[int, tuple[int, float]]]


class Part:
    """One slice's share of the mesh: its devices and its block of the batch."""

    def __init__(self, slice_index: int, mesh: Mesh, shard: int, num_shards: int):
        self.slice_index = slice_index
        self.mesh = mesh
        self.host_mesh = colocated_mesh(mesh.devices, mesh.axis_names)
        self.shard = shard
        self.num_shards = num_shards


class Layout:
    """How ``spec`` on ``mesh`` splits a batch among the mesh's slices.

    Each slice must hold a block of the mesh (as ``pw.mesh()`` builds them:
    DCN axes across slices) and only the batch dimension may be split across
    slices; other dimensions may be split over a slice's own (ICI) axes.
    """

    def __init__(self, mesh: Mesh, spec: PartitionSpec, topology: Topology):
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.mesh = mesh
        self.spec = spec
        self.sharding = NamedSharding(mesh, spec)
        devices = mesh.devices
        owner = np.vectorize(topology.slice_of, otypes=[int])(devices)
        batch_axes = _axes(spec[0] if len(spec) else None)
        parts_total = math.prod(mesh.shape[a] for a in batch_axes)
        rows = NamedSharding(mesh, PartitionSpec(spec[0] if len(spec) else None)).devices_indices_map((parts_total,))
        blocks = {}
        meshes = {}
        for index in sorted({int(i) for i in owner.flat}):
            where = np.argwhere(owner == index)
            box = tuple(slice(lo, hi + 1) for lo, hi in zip(where.min(0), where.max(0), strict=True))
            if (owner[box] != index).any():
                raise MeshError(
                    f"slice {index}'s devices are not one block of the mesh; build the mesh with pw.mesh() "
                    f"(DCN axes across slices, ICI axes within)"
                )
            local = Mesh(devices[box], mesh.axis_names)
            for axis in _axes_of(spec[1:]):
                if local.shape[axis] != mesh.shape[axis]:
                    raise MeshError(
                        f"spec {spec} splits a non-batch dimension over axis '{axis}', which spans slices; "
                        f"only the batch dimension (first) may be split across slices"
                    )
            spans = {
                (rows[d][0].start or 0, parts_total if rows[d][0].stop is None else rows[d][0].stop)
                for d in local.devices.flat
            }
            lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
            if {u for start, stop in spans for u in range(start, stop)} != set(range(lo, hi)):
                raise MeshError(
                    f"spec {spec} gives slice {index} rows that are not one block of the batch on this mesh"
                )
            blocks[index] = (lo, hi)
            meshes[index] = local
        widths = {hi - lo for lo, hi in blocks.values()}
        starts = sorted({lo for lo, _ in blocks.values()})
        width = widths.pop()
        if widths or starts != list(range(0, parts_total, width)):
            raise MeshError(f"spec {spec} does not split the batch into equal per-slice blocks on this mesh")
        num_shards = parts_total // width
        self.parts = [Part(index, meshes[index], blocks[index][0] // width, num_shards) for index in sorted(blocks)]
        self.num_shards = num_shards
        self._concat_axis = self._concatenation_axis(batch_axes)

    def _concatenation_axis(self, batch_axes: tuple[str, ...]) -> int | None:
        """The mesh axis along which the slices' meshes, in slice order, stack into the mesh with
        their blocks in batch order (as ``pw.mesh()`` lays them out), if the batch dimension is
        split over that axis alone; then ``assemble`` joins blocks in one request."""
        import numpy as np

        if len(batch_axes) != 1 or any(position != p.shard for position, p in enumerate(self.parts)):
            return None
        axis = self.mesh.axis_names.index(batch_axes[0])
        stacked = np.concatenate([p.mesh.devices for p in self.parts], axis=axis)
        return axis if stacked.tolist() == self.mesh.devices.tolist() else None

    @property
    def slices(self) -> tuple[int, ...]:
        return tuple(p.slice_index for p in self.parts)

    def assemble(self, trees: dict[int, Any]) -> Any:
        """One global array per leaf from each slice's local arrays (no copy; the slices'
        arrays are donated when the blocks join in one request)."""
        import jax

        flat = {index: jax.tree.flatten(tree) for index, tree in trees.items()}
        (first, (leaves0, treedef0)), *rest = flat.items()
        for index, (leaves, treedef) in rest:
            shapes0 = [leaf.shape for leaf in leaves0]
            # jax's PyTreeDef is the compiled module's class, which has no stub: mypy cannot resolve its type.
            if treedef != treedef0 or [leaf.shape for leaf in leaves] != shapes0:  # type: ignore[operator]
                raise SidecarError(
                    f"make_batches returned {[leaf.shape for leaf in leaves]} on slice {index} but {shapes0} on "
                    f"slice {first}: every shard of a batch must have the same structure and shapes"
                )
        if any(not leaf.ndim for leaf in leaves0):
            raise SidecarError("make_batches must return arrays with a batch dimension, got a scalar")
        # Behind the proxy client (the local server, Pathways) each disassemble and assemble is a
        # request; in process there are none to save, and the embedded backend's fault injection
        # swaps the buffers of arrays that the join would alias (it crashed in jax.live_arrays).
        if self._concat_axis is not None and jaxcompat.proxied(leaves0[0]):
            joined = jaxcompat.concatenate_by_mesh_axis(
                [tuple(flat[p.slice_index][0][position] for p in self.parts) for position in range(len(leaves0))],
                self._concat_axis,
                tuple(self.mesh.axis_sizes),
                list(itertools.accumulate(p.mesh.shape[self.mesh.axis_names[self._concat_axis]] for p in self.parts)),
                [self.sharding] * len(leaves0),
            )
            if joined is not None:
                return jax.tree.unflatten(treedef0, joined)
        order = self.sharding._addressable_device_assignment
        out = []
        for position, leaf0 in enumerate(leaves0):
            shape = (leaf0.shape[0] * self.num_shards,) + tuple(leaf0.shape[1:])
            by_device = {
                s.device: s.data for _index, (leaves, _) in flat.items() for s in leaves[position].addressable_shards
            }
            out.append(jax.make_array_from_single_device_arrays(shape, self.sharding, [by_device[d] for d in order]))
        return jax.tree.unflatten(treedef0, out)


class Pending:
    """One step in flight: a future per slice's block, and ``joined``, the assembled batch.

    The worker that finishes a step's last block assembles the global batch,
    so the training loop's thread only picks it up. ``joined`` resolves to
    ``(batch, {slice: (bytes, busy_s)})`` or to the error of the
    lowest-numbered slice that failed (see ``sidecar.failure``).
    """

    def __init__(self, blocks: dict[int, Future[Block]], layout: Layout, name: str):
        self.blocks = blocks
        self.joined: Future[Joined] = Future()
        self._left = len(blocks)
        self._lock = threading.Lock()
        self._layout = layout
        self._name = name
        for future in blocks.values():
            future.add_done_callback(self._block_done)

    def cancel(self) -> None:
        for future in self.blocks.values():
            future.cancel()
        self.joined.cancel()

    def _block_done(self, _future: Future[Block]) -> None:
        with self._lock:
            self._left -= 1
            if self._left:
                return
        if self.joined.cancelled() or any(f.cancelled() for f in self.blocks.values()):
            self.joined.cancel()
            return
        try:
            for index, future in sorted(self.blocks.items()):
                if (error := future.exception()) is not None:
                    raise failure(self._name, index, error)
            results = {index: future.result() for index, future in self.blocks.items()}
            sizes = {index: (nbytes(tree), busy) for index, (tree, busy) in results.items()}
            batch = self._layout.assemble({index: tree for index, (tree, _busy) in results.items()})
        except Exception as exc:  # handed to the consumer, which re-raises it
            self._settle(self.joined.set_exception, exc)
            return
        self._settle(self.joined.set_result, (batch, sizes))

    def _settle(self, setter: Callable[[Any], None], value: Any) -> None:
        # Cancelled meanwhile by a reset: nobody wants this step any more.
        with contextlib.suppress(InvalidStateError):
            setter(value)


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _axes_of(entries: Any) -> list[str]:
    return [a for entry in entries for a in _axes(entry)]


def remote_producer(make_batches: MakeBatches, spec: PartitionSpec, name: str) -> Colocated:
    """What each slice's sidecar runs: one block of one batch, laid out on the slice."""

    def produce(request: jax.Array) -> object:
        import jax
        import numpy as np
        from jax.sharding import NamedSharding

        step, shard, num_shards = (int(v) for v in np.asarray(request.addressable_shards[0].data))
        block = make_batches(step, shard, num_shards)
        # data_loader.Loader._job places the request with a NamedSharding over the slice's colocated CPUs.
        sharding = NamedSharding(cast(NamedSharding, request.sharding).mesh, spec)

        def place(leaf: object) -> jax.Array:
            host = np.asarray(leaf)
            return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

        return jax.tree.map(place, block)

    produce.__name__ = produce.__qualname__ = name
    return produce
