"""Host snapshots: a copy of a pytree of device arrays in host memory.

A snapshot records, per leaf, the array's bytes (a real copy: on CPU,
``np.asarray`` of a device array is a read-only view of the device buffer) and
where it lived: its ``PartitionSpec`` and the axes of its mesh. ``restore``
puts it back onto any mesh with the same specs, so state taken on two slices
comes back on the one that survived.

``snapshot`` starts device-to-host transfers (``copy_to_host_async``) and
returns at once; a worker thread copies each shard into one host buffer per
leaf (one copy per byte; numpy releases the GIL). Buffers of dead snapshots
that nothing else holds are reused, so a loop's snapshots do not page-fault
fresh memory every time (``_HostBuffers``). ``wait()``
blocks until the copy is complete and raises what the copy raised (e.g. a
``JaxRuntimeError`` with ``DATA_LOSS`` if a slice was lost before the bytes
were read).

The session's ``SnapshotStore`` keeps the last ``keep`` completed snapshots per
name (and, optionally, at most ``max_bytes`` in all): host memory stays
bounded however long a training loop or a notebook runs.

Over 700 lines for now: the copier, the store and the magics' helpers are its
seams, to be split in issue #21's structure round.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from pathways_kernel.core import jaxcompat
from pathways_kernel.core.errors import NamespaceError, PathwaysError
from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.namespace import user_namespace
from pathways_kernel.core.sessions import is_lost, session
from pathways_kernel.core.sessions import session as current
from pathways_kernel.core.text import count

#: Completed snapshots kept per name unless configured otherwise.
DEFAULT_KEEP = 2
DEFAULT_NAME = "snapshot"

MeshAxes = tuple[tuple[str, int], ...]

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
    spec: Any
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
        self._buffer = _Owned(buffer, reusable=True)
        weakref.finalize(self, _BUFFERS.on_leaf_dead, self._buffer).atexit = False


class _Owned:
    """A leaf's host value and whether the pool may take it back."""

    __slots__ = ("array", "reusable")

    def __init__(self, array: Any, reusable: bool = False) -> None:
        self.array = array
        self.reusable = reusable


def _get_host(leaf: Leaf) -> Any:
    buffer = leaf.__dict__.get("_buffer")
    if buffer is None:
        return None
    buffer.reusable = False  # handed out: whoever reads it may keep it
    return buffer.array


def _set_host(leaf: Leaf, value: Any) -> None:
    leaf.__dict__["_buffer"] = _Owned(value)


# After the dataclass is built, so its __init__ assigns through the property.
Leaf.host = property(_get_host, _set_host, doc="The leaf's host copy; reading it hands it out (see Leaf).")  # type: ignore[assignment]


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
        self._future: concurrent.futures.Future | None = None

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
        axes = tuple(mesh_axes.items()) if isinstance(mesh_axes, dict) else tuple(tuple(a) for a in mesh_axes)
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


# -- taking snapshots ---------------------------------------------------------
def _layout(value: Any) -> tuple[Any, MeshAxes]:
    spec = spec_of(value)
    if spec is None:
        return None, ()
    return spec, tuple((str(k), int(v)) for k, v in value.sharding.mesh.shape.items())


def _is_device_array(value: Any) -> bool:
    import jax

    return isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)


def is_known_lost(value: Any) -> bool:
    """Whether ``value`` is a device array known lost with a slice, never waiting for a
    pending one (which counts as not lost, unless the backend knows without reading: on the
    local server an array put on a slice just before its loss may not be ready yet, and a
    snapshot of it would only fail later, out of sight)."""
    return _is_device_array(value) and not value.is_deleted() and is_lost(value, wait=False)


def _copy_array(array: Any, out: np.ndarray) -> None:
    """Copy the distinct shards of ``array`` into ``out`` (one memcpy each)."""
    if out.ndim == 0 or array.is_fully_replicated:
        shard = array.addressable_shards[0]
        np.copyto(out, np.asarray(shard.data))
        return
    for shard in array.addressable_shards:
        if shard.replica_id == 0:
            out[shard.index] = np.asarray(shard.data)


class _HostBuffers:
    """Host buffers of dead snapshot leaves, reused by new ones of the same shapes.

    Writing into fresh memory costs a page fault per page, which on a busy
    host is most of a snapshot's time; a training loop takes same-shaped
    snapshots over and over, so the buffers of the leaves that died are
    recycled, as runtimes reuse pinned staging buffers. Only buffers the
    copier filled and nobody was ever handed (``Leaf`` explains ownership)
    come back, and the pool holds at most as many bytes as the largest
    snapshot taken.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self._dead: collections.deque[_Owned] = collections.deque()
        self._bytes = 0
        self.limit = 0

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            free = self._free.get((shape, np.dtype(dtype).str))
            if free:
                buffer = free.pop()
                self._bytes -= buffer.nbytes
                return buffer
        return np.empty(shape, dtype)

    def on_leaf_dead(self, owned: _Owned) -> None:
        # A finalizer may run anywhere, even inside a lock this module holds
        # (a garbage collection during ``submit``): only queue the buffer
        # (``deque.append`` takes no lock); the copy thread recycles it.
        self._dead.append(owned)

    def recycle_dead(self) -> None:
        while True:
            try:
                owned = self._dead.popleft()
            except IndexError:
                return
            self.recycle(owned)

    def recycle(self, owned: _Owned) -> None:
        """Take back a dead leaf's buffer if it was the copier's and never handed out."""
        host = owned.array
        if not owned.reusable or not isinstance(host, np.ndarray):
            return
        with self._lock:
            if self._bytes + host.nbytes > self.limit:
                return
            owned.array, owned.reusable = None, False
            self._free.setdefault((host.shape, host.dtype.str), []).append(host)
            self._bytes += host.nbytes

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._bytes = 0

    def note_snapshot(self, nbytes: int) -> None:
        with self._lock:
            self.limit = max(self.limit, nbytes)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes


_BUFFERS = _HostBuffers()


def _copy_all(snap: Snapshot, arrays: list[Any], on_done: Callable[[Snapshot], None] | None) -> None:
    try:
        _copy_leaves(snap, arrays)
    except BaseException as error:
        # The future keeps the error for ``wait()``; its traceback must not keep
        # the (often lost) device arrays alive until the next garbage collection.
        arrays.clear()
        raise error.with_traceback(None) from None
    arrays.clear()
    if on_done is not None:
        on_done(snap)


def _copy_leaves(snap: Snapshot, arrays: list[Any]) -> None:
    _BUFFERS.recycle_dead()
    start = time.perf_counter()
    for leaf, array in zip(snap.leaves, arrays, strict=True):
        if leaf.on_device:
            out = _BUFFERS.get(leaf.shape, leaf.dtype)
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
    for path, value in pairs:
        key = jax.tree_util.keystr(path)
        if _is_device_array(value):
            spec, axes = _layout(value)
            leaves.append(Leaf(key, tuple(value.shape), np.dtype(value.dtype), spec, axes))
            # Read through an alias: the per-shard arrays a read caches die
            # with it, not with the user's array (a snapshot is host memory).
            value = jaxcompat.alias(value)
            value.copy_to_host_async()
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
    snap = Snapshot(name, step, treedef, leaves, run=run)
    _BUFFERS.note_snapshot(snap.nbytes)
    snap._future = _COPIER.submit(_copy_all, snap, arrays, on_done)
    return snap


def _numeric(value: Any) -> bool:
    try:
        return np.result_type(value) != np.dtype(object)
    except TypeError:
        return False


def snapshot(tree: Any, name: str | None = None, step: int | None = None) -> Snapshot:
    """Copy a pytree of jax arrays to host memory, asynchronously.

    Returns at once with a pending ``Snapshot`` (``.wait()`` to block); it is
    added to the session's store, which keeps the last K per name, and a
    ``snapshot`` event (bytes, copy duration, step) is emitted when done.

    Args:
      tree: any pytree whose leaves are jax arrays (others are kept as-is).
      name: what the store files it under (default ``"snapshot"``).
      step: the training step the state belongs to, if any.
    """
    return store().snap(tree, name or DEFAULT_NAME, step)


# -- restoring ----------------------------------------------------------------
def fit_spec(spec: Any, shape: tuple[int, ...], mesh: Any) -> Any:
    """``spec`` adjusted to ``mesh``: axes the mesh lacks are dropped, and a
    dimension the remaining axes do not divide is replicated."""
    from jax.sharding import PartitionSpec

    sizes = dict(mesh.shape)
    entries = []
    for dim, entry in enumerate(tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept = tuple(n for n in names if n in sizes)
        parts = int(np.prod([sizes[n] for n in kept], dtype=np.int64))
        if not kept or shape[dim] % parts:
            entries.append(None)
        else:
            entries.append(kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*entries[: len(shape)])


def sharding_on(spec: Any, shape: tuple[int, ...], mesh: Any) -> Any:
    """Where a leaf laid out with ``spec`` goes on ``mesh``: the fitted spec,
    or ``mesh``'s first device for a leaf that was not on a mesh (``None``)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    if spec is None:
        return jax.sharding.SingleDeviceSharding(mesh.devices.flat[0])
    return NamedSharding(mesh, fit_spec(spec, shape, mesh) if shape else PartitionSpec())


def spec_of(array: Any) -> Any:
    """``array``'s PartitionSpec, or ``None`` if it is not laid out on a mesh."""
    from jax.sharding import NamedSharding

    return array.sharding.spec if isinstance(array.sharding, NamedSharding) else None


def shardings_for(snap: Snapshot, mesh: Any) -> list[Any]:
    """The sharding each device leaf of ``snap`` gets on ``mesh`` (``None`` for host leaves)."""
    return [sharding_on(leaf.spec, leaf.shape, mesh) if leaf.on_device else None for leaf in snap.leaves]


def default_mesh(snap: Snapshot) -> Any:
    """A mesh over the live slices with the snapshot's axis names."""
    names = [name for name, _ in snap.mesh_axes]
    return session().mesh(names or None)


def restore(snap: Snapshot, mesh: Any = None, *, emit: bool = True, shardings: Sequence[Any] | None = None) -> Any:
    """Put ``snap`` back on devices: a pytree of jax arrays on ``mesh``.

    Each leaf gets its recorded ``PartitionSpec`` on ``mesh`` (default: the
    live slices' mesh with the snapshot's axis names); axes ``mesh`` lacks,
    or that no longer divide a dimension, become replicated on that
    dimension. Leaves that were not on a mesh go to ``mesh``'s first device.
    ``shardings``: one per leaf instead (``None`` for host leaves), all put
    in one ``device_put``. Emits a ``restore`` event (bytes, duration, step).
    """
    import jax

    snap.wait()
    if mesh is None:
        mesh = default_mesh(snap)
    start = time.perf_counter()
    if shardings is None:
        shardings = shardings_for(snap, mesh)
    device_idx = [i for i, leaf in enumerate(snap.leaves) if leaf.on_device]
    placed = jax.device_put([snap.leaves[i].host for i in device_idx], [shardings[i] for i in device_idx])
    values = [leaf.host for leaf in snap.leaves]
    for i, array in zip(device_idx, placed, strict=True):
        values[i] = array
    jax.block_until_ready(placed)
    duration = time.perf_counter() - start
    if emit:
        session().events.emit(
            "restore",
            bytes=snap.nbytes,
            duration_s=duration,
            step=snap.step,
            slices_after=_slices_of(mesh),
            detail=f"'{snap.name}' from {snap.age_s:.1f} s ago",
        )
    return jax.tree.unflatten(snap.treedef, values)


def _slices_of(mesh: Any) -> tuple[int, ...]:
    ids = {d.id for d in mesh.devices.flat}
    return tuple(s.index for s in session().topology.slices if any(c.device.id in ids for c in s.chips))


# -- the store ----------------------------------------------------------------
class SnapshotStore:
    """The session's snapshots: last ``keep`` completed per name, at most
    ``max_bytes`` in all (oldest dropped first; ``None`` = no total bound)."""

    def __init__(self, events: Any = None, keep: int = DEFAULT_KEEP, max_bytes: int | None = None):
        self.events = events
        self._lock = threading.Lock()
        self._done: dict[str, collections.deque[Snapshot]] = {}
        self._pending: list[Snapshot] = []
        self._origins: dict[str, Origin] = {}
        self.keep = keep
        self.max_bytes = max_bytes

    def configure(self, keep: int | None = None, max_bytes: int | None | str = "unchanged") -> None:
        if keep is not None:
            if keep < 1:
                raise PathwaysError(f"keep must be at least 1, got {keep}")
            self.keep = keep
        if max_bytes != "unchanged":
            self.max_bytes = max_bytes  # type: ignore[assignment]
        with self._lock:
            self._evict()

    def snap(self, tree: Any, name: str, step: int | None = None, run: int | None = None) -> Snapshot:
        """Take a snapshot of ``tree`` and add it; returns it pending."""
        snap = take(tree, name, step, on_done=self._completed, run=run)
        with self._lock:
            self._pending.append(snap)
        # A weak reference: no cycle snapshot -> future -> callback -> snapshot,
        # so snapshots die when dropped, not at some garbage collection.
        ref = weakref.ref(snap)
        snap._future.add_done_callback(lambda _f: self._forget_pending(ref()))  # type: ignore[union-attr]
        return snap

    def add(self, snap: Snapshot) -> Snapshot:
        """File a snapshot made elsewhere (e.g. ``Snapshot.from_host``)."""
        if snap.done():
            self._file(snap)
        else:
            with self._lock:
                self._pending.append(snap)
            ref = weakref.ref(snap)
            snap._future.add_done_callback(lambda _f: self._filed_when_done(ref()))  # type: ignore[union-attr]
        return snap

    def _filed_when_done(self, snap: Snapshot | None) -> None:
        if snap is not None:
            self._forget_pending(snap)
            if snap.ok():
                self._file(snap)

    def _completed(self, snap: Snapshot) -> None:
        self._file(snap)
        if self.events is not None:
            self.events.emit(
                "snapshot",
                bytes=snap.nbytes,
                duration_s=snap.duration_s,
                step=snap.step,
                detail=f"'{snap.name}' {count(len(snap.leaves), 'array')}, {_throughput(snap)}",
            )

    def _file(self, snap: Snapshot) -> None:
        with self._lock:
            queue = self._done.setdefault(snap.name, collections.deque())
            # Two copies run at once: an elastic run's snapshot done after a
            # later one of the same run (its final one) goes before it.
            at = len(queue)
            while at and snap.run is not None and queue[at - 1].run == snap.run and queue[at - 1].step > snap.step:
                at -= 1
            queue.insert(at, snap)
            self._evict()

    def _forget_pending(self, snap: Snapshot | None) -> None:
        with self._lock:
            if snap is not None and snap in self._pending:
                self._pending.remove(snap)

    def _evict(self) -> None:
        # Completed snapshots only: a pending one may still fail (its slice
        # lost mid-copy), and then the older one is what we restore.
        for queue in self._done.values():
            while len(queue) > self.keep:
                queue.popleft()
        if self.max_bytes is not None:
            while self._total() > self.max_bytes:
                oldest = min((q[0] for q in self._done.values() if q), key=lambda s: s.created, default=None)
                if oldest is None:
                    break
                self._done[oldest.name].popleft()
        for name in [n for n, q in self._done.items() if not q]:
            del self._done[name]

    def _total(self) -> int:
        return sum(s.nbytes for q in self._done.values() for s in q)

    # -- queries ------------------------------------------------------------
    def latest(self, name: str = DEFAULT_NAME, wait: bool = True, run: int | None = None) -> Snapshot | None:
        """The newest good snapshot of ``name`` (``None`` if none); with
        ``run``, the newest that elastic run took.

        With ``wait``, pending snapshots of that name are waited for first;
        ones whose copy failed are skipped.
        """
        if wait:
            with self._lock:
                pending = [s for s in self._pending if s.name == name and (run is None or s.run == run)]
            concurrent.futures.wait([s._future for s in pending if s._future is not None])
        with self._lock:
            queue = self._done.get(name, ())
            return next((s for s in reversed(queue) if run is None or s.run == run), None)

    # -- where notebook variables came from ------------------------------------
    def note_origin(self, variable: str, value: Any, snap_name: str, run: int, group: Sequence[str]) -> None:
        """Record that ``variable``, while it holds ``value`` (these very
        arrays), is entry ``variable`` of the state of elastic run ``run``,
        whose snapshots are filed as ``snap_name`` and hold ``group``."""
        import jax

        arrays = [weakref.ref(leaf) for leaf in jax.tree.leaves(value) if _is_device_array(leaf)]
        with self._lock:
            self._origins[variable] = Origin(variable, snap_name, run, tuple(group), arrays)

    def origin(self, variable: str, value: Any) -> Origin | None:
        """The elastic run ``variable``'s current ``value`` came from, if it
        still holds the arrays that run left in it (reassigning it forgets
        the run: its snapshots are of some other value)."""
        with self._lock:
            origin = self._origins.get(variable)
        return origin if origin is not None and origin.holds(value) else None

    def list(self) -> list[Snapshot]:
        """Every kept and pending snapshot, oldest first."""
        with self._lock:
            return sorted([s for q in self._done.values() for s in q] + list(self._pending), key=lambda s: s.created)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._done)

    @property
    def nbytes(self) -> int:
        """Host bytes held by kept snapshots."""
        with self._lock:
            return self._total()

    def drop(self, name: str) -> None:
        with self._lock:
            self._done.pop(name, None)

    def clear(self) -> None:
        with self._lock:
            self._done.clear()


@dataclasses.dataclass(frozen=True)
class Origin:
    """A notebook variable that an elastic run left its state in (``SnapshotStore.origin``)."""

    variable: str
    snap_name: str
    run: int
    group: tuple[str, ...]  # the run's state variables: a rollback takes them all back together
    arrays: list  # weak references to the arrays the run left in the variable

    def holds(self, value: Any) -> bool:
        import jax

        leaves = [leaf for leaf in jax.tree.leaves(value) if _is_device_array(leaf)]
        return (
            bool(leaves)
            and len(leaves) == len(self.arrays)
            and all(ref() is leaf for ref, leaf in zip(self.arrays, leaves, strict=True))
        )


def _throughput(snap: Snapshot) -> str:
    if not snap.duration_s:
        return ""
    return f"{format_bytes(snap.nbytes / snap.duration_s)}/s"


def store(session: Any = None) -> SnapshotStore:
    """The session's ``SnapshotStore`` (session extension ``"snapshots"``)."""
    if session is None:
        session = current()
    return session.component(SnapshotStore, lambda s: SnapshotStore(s.events))


class SnapshotTable:
    """Kept snapshots rendered as text (``%pathways snapshots``)."""

    def __init__(self, snaps: Sequence[Snapshot]):
        self.snaps = list(snaps)

    def __repr__(self) -> str:
        if not self.snaps:
            return "no snapshots"
        return "\n".join(f"{s.summary()}, {s.age_s:.0f} s ago" for s in self.snaps)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


#: IPython's own names: its output history holds arrays but is not user state.
_IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})


def device_values(namespace: dict[str, Any], names: Iterable[str] | None = None) -> dict[str, Any]:
    """Names in ``namespace`` whose value is a pytree holding jax arrays
    (all of them but private and IPython's own names, unless ``names`` says)."""
    import jax

    out = {}
    for name in names if names is not None else list(namespace):
        if names is None and (name.startswith("_") or name in _IPYTHON_NAMES):
            continue
        value = namespace.get(name)
        try:
            leaves = jax.tree.leaves(value)
        except Exception:  # an object whose flattening fails is not state we can snapshot
            continue
        if leaves and any(_is_device_array(leaf) for leaf in leaves):
            out[name] = value
    return out


def snapshot_variables(names: Sequence[str] | None = None, step: int | None = None) -> list[Snapshot]:
    """Snapshot notebook variables, each under its own name (``%pathways snapshot``).

    ``names=None`` takes every variable holding jax arrays, but those whose
    data was lost with a slice.

    Raises:
      NamespaceError: not in IPython, or a name is unknown, holds no jax array
        or lost its data with a slice.
    """
    import jax

    ns = user_namespace()
    if ns is None:
        raise NamespaceError("snapshotting variables needs a notebook (IPython); call pw.snapshot(tree) instead")
    for name in names or ():
        if name not in ns:
            raise NamespaceError(f"no variable '{name}' in the notebook; define it or check the spelling")
    values = device_values(ns, names)
    missing = [n for n in names or () if n not in values]
    if missing:
        raise NamespaceError(
            f"{', '.join(missing)} holds no jax array; only device arrays (or pytrees of them) are snapshotted"
        )
    # A lost variable has nothing to copy: its snapshot could only fail, later
    # and out of sight, while the reply had counted it.
    lost = [n for n, value in values.items() if any(is_known_lost(leaf) for leaf in jax.tree.leaves(value))]
    if names and lost:
        raise NamespaceError(
            f"{', '.join(lost)} lost its data with a slice (DATA_LOSS): nothing to snapshot; "
            "restore or recompute it first"
        )
    st = store()
    values = {n: value for n, value in values.items() if n not in lost}
    return [st.snap(value, name, step) for name, value in values.items()]
