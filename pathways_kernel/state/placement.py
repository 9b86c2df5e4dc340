"""Where an array's shards lie on a mesh, and where they go on another one.

A snapshot records each leaf's ``PartitionSpec`` and the ``(name, size)`` axes
of its mesh; putting it back on a mesh of fewer slices fits that spec to the
new mesh (``fit_spec``): axes the mesh lacks are dropped, and a dimension the
remaining axes do not divide is replicated. Snapshots, checkpoints and the
elastic loop place state this way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh, PartitionSpec, Sharding

#: The ``(name, size)`` axes of a mesh, in its order.
MeshAxes: TypeAlias = tuple[tuple[str, int], ...]


def is_device_array(value: object) -> bool:
    """Whether ``value`` is a concrete jax array (not a tracer inside jit/grad)."""
    import jax

    return isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)


def spec_of(array: jax.Array) -> PartitionSpec | None:
    """``array``'s PartitionSpec, or ``None`` if it is not laid out on a mesh."""
    from jax.sharding import NamedSharding

    return array.sharding.spec if isinstance(array.sharding, NamedSharding) else None


def layout_of(array: jax.Array) -> tuple[PartitionSpec | None, MeshAxes]:
    """``array``'s PartitionSpec and its mesh's axes (``None, ()`` if it is on no mesh)."""
    from jax.sharding import NamedSharding

    sharding = array.sharding
    if not isinstance(sharding, NamedSharding):
        return None, ()
    return sharding.spec, tuple((str(k), int(v)) for k, v in sharding.mesh.shape.items())


def fit_spec(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """``spec`` adjusted to ``mesh``: axes the mesh lacks are dropped, and a
    dimension the remaining axes do not divide is replicated."""
    from jax.sharding import PartitionSpec

    sizes = dict(mesh.shape)
    entries: list[str | tuple[str, ...] | None] = []
    for dim, entry in enumerate(tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept = tuple(n for n in names if n in sizes)
        parts = int(np.prod([sizes[n] for n in kept], dtype=np.int64))
        if not kept or shape[dim] % parts:
            entries.append(None)
        else:
            entries.append(kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*entries[: len(shape)])


def sharding_on(spec: PartitionSpec | None, shape: tuple[int, ...], mesh: Mesh) -> Sharding:
    """Where a leaf laid out with ``spec`` goes on ``mesh``: the fitted spec,
    or ``mesh``'s first device for a leaf that was not on a mesh (``None``)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    if spec is None:
        return jax.sharding.SingleDeviceSharding(mesh.devices.flat[0])
    return NamedSharding(mesh, fit_spec(spec, shape, mesh) if shape else PartitionSpec())
