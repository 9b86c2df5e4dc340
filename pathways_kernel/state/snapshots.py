"""Host snapshots: a copy of a pytree of device arrays in host memory.

A snapshot records, per leaf, the array's bytes and where it lived: its
``PartitionSpec`` and the axes of its mesh. ``restore`` puts it back onto any
mesh with the same specs, so state taken on two slices comes back on the one
that survived.

This module is what the rest of the kernel uses: ``snapshot`` (``pw.snapshot``),
``restore``, the session's ``store``, and the notebook's side (the variables
``%pathways snapshot`` takes, the table ``%pathways snapshots`` shows). The
parts live beside it:

- ``host_copy.py``: ``Leaf``, ``Snapshot`` and ``take``, the asynchronous copy
  to the host;
- ``host_buffers.py``: the pool of dead leaves' buffers that copies reuse;
- ``snapshot_store.py``: ``SnapshotStore`` (the last ``keep`` completed
  snapshots per name, at most ``max_bytes`` in all) and ``Origin``;
- ``placement.py``: where a leaf's shards go on another mesh (``fit_spec``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pathways_kernel.core.errors import NamespaceError
from pathways_kernel.core.namespace import user_namespace
from pathways_kernel.core.sessions import is_lost, session
from pathways_kernel.state.host_copy import DEFAULT_NAME, Snapshot, take
from pathways_kernel.state.placement import fit_spec, is_device_array, sharding_on, spec_of
from pathways_kernel.state.snapshot_store import DEFAULT_KEEP, Origin, SnapshotStore, store

if TYPE_CHECKING:
    from jax.sharding import Mesh, Sharding

__all__ = [
    "DEFAULT_KEEP",
    "DEFAULT_NAME",
    "Origin",
    "Snapshot",
    "SnapshotStore",
    "SnapshotTable",
    "default_mesh",
    "device_values",
    "fit_spec",
    "is_known_lost",
    "restore",
    "sharding_on",
    "shardings_for",
    "snapshot",
    "snapshot_variables",
    "spec_of",
    "store",
    "take",
]


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


def is_known_lost(value: Any) -> bool:
    """Whether ``value`` is a device array known lost with a slice, never waiting for a
    pending one (which counts as not lost, unless the backend knows without reading: on the
    local server an array put on a slice just before its loss may not be ready yet, and a
    snapshot of it would only fail later, out of sight)."""
    return is_device_array(value) and not value.is_deleted() and is_lost(value, wait=False)


def shardings_for(snap: Snapshot, mesh: Mesh) -> list[Sharding | None]:
    """The sharding each device leaf of ``snap`` gets on ``mesh`` (``None`` for host leaves)."""
    return [sharding_on(leaf.spec, leaf.shape, mesh) if leaf.on_device else None for leaf in snap.leaves]


def default_mesh(snap: Snapshot) -> Mesh:
    """A mesh over the live slices with the snapshot's axis names."""
    names = [name for name, _ in snap.mesh_axes]
    mesh: Mesh = session().mesh(names or None)
    return mesh


def restore(
    snap: Snapshot, mesh: Mesh | None = None, *, emit: bool = True, shardings: Sequence[Sharding | None] | None = None
) -> Any:
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


def _slices_of(mesh: Mesh) -> tuple[int, ...]:
    ids = {d.id for d in mesh.devices.flat}
    return tuple(s.index for s in session().topology.slices if any(c.device.id in ids for c in s.chips))


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
        if leaves and any(is_device_array(leaf) for leaf in leaves):
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
