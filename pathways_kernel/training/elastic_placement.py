"""Where an elastic run's state and devices sit on the session's slices.

Which slices a mesh spans and which devices a state lives on (what a
recovery asks to know whether anything was lost), and where each leaf goes
on a new mesh: ``placement`` for a reshard (``reshard``), a restore and
``abstract`` (the shapes a ``prepare`` callback compiles for), so that every
placement matches the shardings the step runs with; and JAX's default device
once a slice is lost, which a step compiled ahead is cached under. The loop
that uses them is ``elastic_loop.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pathways_kernel.state import snapshots, transfers

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh, PartitionSpec, Sharding

    from pathways_kernel.core.sessions import Session


def mesh_slices(s: Session, mesh: Mesh) -> tuple[int, ...]:
    """The indices of the slices ``mesh``'s devices belong to."""
    ids = {d.id for d in mesh.devices.flat}
    return tuple(sl.index for sl in s.topology.slices if any(c.device.id in ids for c in sl.chips))


def up_slices(s: Session) -> tuple[int, ...]:
    """The indices of the session's live slices."""
    return tuple(sl.index for sl in s.topology.up_slices)


def devices_of(tree: Any) -> set[int]:
    """The ids of the devices ``tree``'s arrays live on."""
    import jax

    ids: set[int] = set()
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            # jaxlib ships no stubs, so mypy cannot resolve jax.Device to see its attributes.
            ids.update(d.id for d in leaf.sharding.device_set)  # type: ignore[attr-defined]
    return ids


def tree_slices(s: Session, tree: Any) -> tuple[int, ...]:
    """The indices of the slices ``tree``'s arrays live on."""
    ids = devices_of(tree)
    return tuple(sl.index for sl in s.topology.slices if any(c.device.id in ids for c in sl.chips))


def tree_nbytes(tree: Any) -> int:
    """Bytes of ``tree``'s arrays (what a reshard or restore event reports)."""
    import jax

    return sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree.leaves(tree))


def placement(spec: PartitionSpec | None, shape: tuple[int, ...], mesh: Mesh) -> Sharding:
    """Where the loop puts a leaf laid out with ``spec`` on ``mesh`` (a reshard,
    a restore, ``abstract``): ``spec`` fitted to ``mesh``, and a leaf that was on
    no mesh (an optimizer's step count, made on one device) replicated on it, as
    the step's own output of it is. Every placement thus matches the shardings
    the step runs with, so a step compiled ahead (``prepare``) is the one used."""
    from jax.sharding import PartitionSpec

    placed: Sharding = snapshots.sharding_on(PartitionSpec() if spec is None else spec, shape, mesh)
    return placed


def default_device_without(s: Session, lost: int) -> jax.Device | None:
    """JAX's default device once slice ``lost`` is down, if that moves it: off
    a lost slice to the first live device, as the embedded backend and
    pathwaysutils' ``Manager`` move it; ``None`` if it stays."""
    import jax

    gone = {d.id for sl in s.topology.slices if sl.index == lost for d in sl.devices}
    devices = s.devices()
    # jax.config's options are attributes JAX adds at run time, unseen by mypy.
    now = jax.config.jax_default_device or devices[0]  # type: ignore[attr-defined]
    if getattr(now, "id", None) not in gone:
        return None
    return next((d for d in devices if d.id not in gone), None)


def reshard(tree: Any, mesh: Mesh) -> Any:
    """Move live state onto ``mesh`` keeping each leaf's PartitionSpec, in one reshard
    (on a Pathways server, the server moves it: ``transfers.reshard``)."""
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    moving = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    moved = transfers.reshard(
        [leaves[i] for i in moving], [placement(snapshots.spec_of(leaves[i]), leaves[i].shape, mesh) for i in moving]
    )
    for i, array in zip(moving, moved, strict=True):
        leaves[i] = array
    return jax.tree.unflatten(treedef, leaves)


def abstract(tree: Any, mesh: Mesh) -> Any:
    """``tree`` as ``jax.ShapeDtypeStruct``s laid out on ``mesh`` with each
    leaf's PartitionSpec (as a reshard or restore places it; a leaf on no mesh
    replicated): for ``prepare``, e.g.
    ``lambda mesh: step.lower(*elastic.abstract(args, mesh)).compile()``."""
    import jax

    def leaf(x: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placement(snapshots.spec_of(x), x.shape, mesh))

    return jax.tree.map(leaf, tree)
