"""A snapshot's leaves and their copy to the host: ``Leaf``, ``Snapshot``, ``take``.

A snapshot records, per leaf, the array's bytes (a real copy: on CPU,
``np.asarray`` of a device array is a read-only view of the device buffer) and
where it lived: its ``PartitionSpec`` and the axes of its mesh.

``take`` requests the device-to-host transfer of every distinct shard at once
(``copy_to_host_async`` of each shard's array, under ``sessions.COPIES.lock``, so
that an injected loss lands before or after them, never between: the server
completes reads it was asked for, and a loss mid-copy takes nothing the copy
needed) and returns; a worker thread copies each shard into one host buffer per
leaf (one copy per byte; numpy releases the GIL), taken from the pool of dead
leaves' buffers (``host_buffers.py``). ``Snapshot.wait()`` blocks until the copy is
complete and raises what the copy raised (e.g. a ``JaxRuntimeError`` with
``DATA_LOSS`` if a slice was lost before the bytes were read).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_kernel.core import jaxcompat
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.sessions import COPIES
from pathways_kernel.core.text import count
from pathways_kernel.state.host_buffers import BUFFERS, Owned
from pathways_kernel.state.placement import MeshAxes, is_device_array, layout_of

if TYPE_CHECKING:
    from jax.sharding import PartitionSpec

DEFAULT_NAME = "snapshot"

# Two workers: one snapshot can copy while the next is being started.
_COPIER = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="pathways-snapshot")


@dataclasses.dataclass(eq=False)
class Leaf:
    """One leaf of a snapshot.

    ``spec`` is the leaf's ``PartitionSpec`` (``None`` if it was not laid out
    on a mesh), ``mesh_axes`` the ``(name, size)`` axes of its mesh, ``host``
    the copied bytes (set once the snapshot is done). ``on_device`` is false
    for leaves that were not device arrays (numpy arrays, Python scalars):
    those are restored as they were.

    Ownership of ``host``: a buffer the snapshot copier filled belongs to the
    leaf, and goes back to the host-buffer pool when the leaf dies, unless it
    was ever handed out. Reading ``leaf.host`` hands it out (the reader may
    keep it, view it, or give it to ``device_put``, which can alias it), so
    from then on the buffer is never reused; neither is a buffer that came
    from outside (``host = ...``). Nothing depends on reference counts.
    """

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    spec: PartitionSpec | None
    mesh_axes: MeshAxes
    host: Any = dataclasses.field(default=None, repr=False)
    on_device: bool = True

    @property
    def nbytes(self) -> int:
        return (
            int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize
            if self.on_device
            else _nbytes(self._buffer.array)
        )

    def _fill(self, buffer: np.ndarray) -> None:
        """Give the leaf a buffer the copier owns; it returns to the pool when the leaf dies."""
        self._buffer = Owned(buffer, reusable=True)
        weakref.finalize(self, BUFFERS.on_leaf_dead, self._buffer).atexit = False


def _get_host(leaf: Leaf) -> Any:
    buffer = leaf.__dict__.get("_buffer")
    if buffer is None:
        return None
    buffer.reusable = False  # handed out: whoever reads it may keep it
    return buffer.array


def _set_host(leaf: Leaf, value: Any) -> None:
    leaf.__dict__["_buffer"] = Owned(value)


# After the dataclass is built, so its __init__ assigns through the property.
Leaf.host = property(_get_host, _set_host, doc="The leaf's host copy; reading it hands it out (see Leaf).")


def _nbytes(value: Any) -> int:
    return int(getattr(value, "nbytes", 0))


class Snapshot:
    """A host copy of a pytree, with each leaf's layout; see the module doc."""

    def __init__(
        self,
        name: str,
        step: int | None,
        treedef: Any,
        leaves: list[Leaf],
        created: float | None = None,
        run: int | None = None,
    ):
        self.name = name
        self.step = step
        #: The elastic run that took it (``None`` for others): a run resumes only from its own.
        self.run = run
        self.created = time.time() if created is None else created
        self.treedef = treedef
        self.leaves = leaves
        self.nbytes = sum(leaf.nbytes for leaf in leaves)
        self.duration_s: float | None = None  # of the copy, once done
        self._future: concurrent.futures.Future[None] | None = None

    # -- lifecycle ----------------------------------------------------------
    def done(self) -> bool:
        """Whether the copy has finished (successfully or not)."""
        return self._future is None or self._future.done()

    def ok(self) -> bool:
        """Whether the copy has finished successfully."""
        return self.done() and (self._future is None or self._future.exception() is None)

    def wait(self, timeout: float | None = None) -> Snapshot:
        """Block until every byte is on the host; returns self.

        Raises whatever the copy raised (``JaxRuntimeError`` on lost data).
        """
        if self._future is not None:
            self._future.result(timeout)
        return self

    def settle(self) -> None:
        """Block until the copy has finished, successfully or not (``wait`` raises what it raised)."""
        if self._future is not None:
            concurrent.futures.wait([self._future])

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the copy has finished (now, if it has), on the thread that finished it."""
        if self._future is None:
            callback()
        else:
            self._future.add_done_callback(lambda _f: callback())

    # -- contents -----------------------------------------------------------
    def host_tree(self) -> Any:
        """The snapshot as a pytree of host (numpy) arrays; waits."""
        import jax

        self.wait()
        return jax.tree.unflatten(self.treedef, [leaf.host for leaf in self.leaves])

    @property
    def age_s(self) -> float:
        return time.time() - self.created

    @property
    def mesh_axes(self) -> MeshAxes:
        """The mesh axes of the first leaf that had a mesh (``()`` if none)."""
        return next((leaf.mesh_axes for leaf in self.leaves if leaf.mesh_axes), ())

    @classmethod
    def from_host(
        cls,
        tree: Any,
        specs: Any = None,
        mesh_axes: MeshAxes | dict[str, int] = (),
        name: str = DEFAULT_NAME,
        step: int | None = None,
        created: float | None = None,
    ) -> Snapshot:
        """A done snapshot from host data (storage restore builds these).

        Args:
          tree: a pytree of numpy arrays (each becomes a device leaf).
          specs: ``PartitionSpec``s (or ``None``) as a pytree matching ``tree``
            or a flat list in leaf order; ``None`` for all means replicated.
          mesh_axes: the ``(name, size)`` axes the specs refer to.
        """
        import jax
        from jax.sharding import PartitionSpec

        pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
        if specs is None:
            flat_specs: list[Any] = [None] * len(pairs)
        elif isinstance(specs, (list, tuple)) and not isinstance(specs, PartitionSpec) and len(specs) == len(pairs):
            flat_specs = list(specs)
        else:
            flat_specs = jax.tree.leaves(specs, is_leaf=lambda s: s is None or isinstance(s, PartitionSpec))
        if len(flat_specs) != len(pairs):
            raise PathwaysError(
                f"snapshot from host: {len(pairs)} leaves but {len(flat_specs)} specs; give one spec per leaf"
            )
        axes = (
            tuple(mesh_axes.items())
            if isinstance(mesh_axes, dict)
            else tuple((str(name), int(size)) for name, size in mesh_axes)
        )
        leaves = []
        for (path, value), spec in zip(pairs, flat_specs, strict=True):
            host = np.asarray(value)
            leaves.append(
                Leaf(jax.tree_util.keystr(path), host.shape, host.dtype, spec, axes if spec is not None else (), host)
            )
        return cls(name, step, treedef, leaves, created)

    # -- display ------------------------------------------------------------
    def summary(self) -> str:
        state = "copying" if not self.done() else "ok" if self.ok() else "failed"
        step = "" if self.step is None else f" step {self.step}"
        return f"snapshot '{self.name}'{step}: {count(len(self.leaves), 'array')}, {format_bytes(self.nbytes)}, {state}"

    def __repr__(self) -> str:
        return f"<{self.summary()}>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.summary())


#: One leaf's reads: the distinct shards' arrays, each with where it goes (``None``: all of it).
Reads = list[tuple[Any, Any]]


def _request_reads(array: Any) -> Reads:
    """Request the host copy of each distinct shard of ``array`` now; returns them to read."""
    if array.ndim == 0 or array.is_fully_replicated:
        reads: Reads = [(None, array.addressable_shards[0].data)]
    else:
        reads = [(shard.index, shard.data) for shard in array.addressable_shards if shard.replica_id == 0]
    for _, data in reads:
        data.copy_to_host_async()
    return reads


def _copy_array(reads: Reads, out: np.ndarray) -> None:
    """Copy the requested shards into ``out`` (one memcpy each)."""
    for index, data in reads:
        if index is None:
            np.copyto(out, np.asarray(data))
        else:
            out[index] = np.asarray(data)


def _copy_all(snap: Snapshot, arrays: list[Any], on_done: Callable[[Snapshot], None] | None) -> None:
    try:
        _copy_leaves(snap, arrays)
    except BaseException as error:
        # The future keeps the error for ``wait()``; its traceback must not keep
        # the (often lost) device arrays alive until the next garbage collection.
        arrays.clear()
        raise error.with_traceback(None) from None
    finally:
        COPIES.finished()
    arrays.clear()
    if on_done is not None:
        on_done(snap)


def _copy_leaves(snap: Snapshot, arrays: list[Any]) -> None:
    BUFFERS.recycle_dead()
    start = time.perf_counter()
    for leaf, array in zip(snap.leaves, arrays, strict=True):
        if leaf.on_device:
            out = BUFFERS.get(leaf.shape, leaf.dtype)
            _copy_array(array, out)
            leaf._fill(out)
    snap.duration_s = time.perf_counter() - start


def take(
    tree: Any,
    name: str = DEFAULT_NAME,
    step: int | None = None,
    on_done: Callable[[Snapshot], None] | None = None,
    run: int | None = None,
) -> Snapshot:
    """Start copying ``tree`` to the host and return its pending ``Snapshot``.

    The store-free core of ``snapshot``; ``on_done(snap)`` runs on the copy
    thread after a successful copy.
    """
    import jax

    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves, arrays = [], []
    with COPIES.lock:
        for path, value in pairs:
            key = jax.tree_util.keystr(path)
            if is_device_array(value):
                spec, axes = layout_of(value)
                leaves.append(Leaf(key, tuple(value.shape), np.dtype(value.dtype), spec, axes))
                # Read through an alias: the per-shard arrays a read caches die
                # with it, not with the user's array (a snapshot is host memory).
                value = _request_reads(jaxcompat.alias(value))
            elif isinstance(value, jax.core.Tracer):
                raise PathwaysError(
                    f"cannot snapshot {key or 'a value'} inside a traced function (jit/grad); snapshot outside it"
                )
            else:
                host = np.array(value, copy=True) if isinstance(value, np.ndarray) else value
                leaves.append(
                    Leaf(
                        key,
                        tuple(np.shape(value)),
                        np.result_type(value) if _numeric(value) else np.dtype(object),
                        None,
                        (),
                        host,
                        on_device=False,
                    )
                )
            arrays.append(value)
        COPIES.started()
    snap = Snapshot(name, step, treedef, leaves, run=run)
    BUFFERS.note_snapshot(snap.nbytes)
    try:
        snap._future = _COPIER.submit(_copy_all, snap, arrays, on_done)
    except BaseException:
        COPIES.finished()
        raise
    return snap


def _numeric(value: Any) -> bool:
    try:
        return np.result_type(value) != np.dtype(object)
    except TypeError:
        return False
