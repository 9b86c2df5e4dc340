"""Multi-slice meshes: a DCN axis across slices, ICI axes within a slice.

Device ordering is JAX's own (``mesh_utils.create_hybrid_device_mesh``). That
function groups devices by their ``slice_index`` attribute, which CPU devices
lack, so each device is wrapped in a thin ``_SliceTagged`` carrying the slice
index from our topology, and the resulting array is mapped back to the real
devices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pathways_kernel.core import parsing, tpu_kinds
from pathways_kernel.core.errors import MeshError
from pathways_kernel.core.slices import Slice
from pathways_kernel.core.text import count, shown

DEFAULT_AXES = ("data", "model")


@dataclasses.dataclass(frozen=True)
class _SliceTagged:
    """A device seen by ``mesh_utils`` with the slice index our topology knows."""

    device: Any
    slice_index: int

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """The shapes a mesh is built from; ``shape = dcn * ici`` per axis."""

    axes: tuple[str, ...]
    dcn: tuple[int, ...]
    ici: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d * i for d, i in zip(self.dcn, self.ici, strict=True))


def plan(
    num_slices: int,
    chips_per_slice: int,
    axes: Sequence[str] | None = None,
    dcn: Sequence[int] | None = None,
    ici: Sequence[int] | None = None,
) -> MeshPlan:
    """Fill in defaults and check that the shapes fit the slices.

    Defaults: axes ``("data", "model")``; the first axis spans slices over DCN
    (``dcn = (num_slices, 1, ...)``) and the last spans a slice's chips over
    ICI (``ici = (1, ..., chips_per_slice)``).

    Raises:
      MeshError: the axes, DCN or ICI shapes do not fit the live devices.
    """
    axes = tuple(axes) if axes else DEFAULT_AXES
    if len(set(axes)) != len(axes) or not all(a.isidentifier() for a in axes):
        raise MeshError(f"mesh axes must be distinct identifiers, got {','.join(axes)}")
    n = len(axes)
    dcn = tuple(dcn) if dcn else (num_slices,) + (1,) * (n - 1)
    ici = tuple(ici) if ici else (1,) * (n - 1) + (chips_per_slice,)
    for label, shape in (("dcn", dcn), ("ici", ici)):
        if len(shape) != n:
            raise MeshError(f"--{label} has {len(shape)} sizes but there are {n} axes ({','.join(axes)})")
        if any(s < 1 for s in shape):
            raise MeshError(f"--{label} sizes must be positive, got {_fmt(shape)}")
    if math.prod(dcn) != num_slices:
        raise MeshError(
            f"DCN shape {_fmt(dcn)} needs {math.prod(dcn)} slices but {num_slices} are up; "
            f"use a DCN shape whose product is {num_slices}"
        )
    if math.prod(ici) != chips_per_slice:
        raise MeshError(
            f"ICI shape {_fmt(ici)} needs {math.prod(ici)} chips per slice but each slice has "
            f"{chips_per_slice}; use an ICI shape whose product is {chips_per_slice}"
        )
    return MeshPlan(axes, dcn, ici)


def build(
    slices: Sequence[Slice],
    axes: Sequence[str] | None = None,
    dcn: Sequence[int] | None = None,
    ici: Sequence[int] | None = None,
) -> Any:
    """A ``jax.sharding.Mesh`` over ``slices`` (normally the live ones).

    Raises:
      MeshError: no slices, slices of unequal size, or shapes that do not fit.
    """
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh

    if not slices:
        raise MeshError("no slice is up: restore a slice before building a mesh")
    sizes = {len(s.chips) for s in slices}
    if len(sizes) != 1:
        raise MeshError(f"slices have different chip counts {sorted(sizes)}; a multi-slice mesh needs equal slices")
    p = plan(len(slices), sizes.pop(), axes, dcn, ici)
    tagged = [_SliceTagged(chip.device, position) for position, s in enumerate(slices) for chip in s.chips]
    try:
        grid = mesh_utils.create_hybrid_device_mesh(
            p.ici, p.dcn, devices=tagged, process_is_granule=False, allow_split_physical_axes=True
        )
    except (ValueError, NotImplementedError, AssertionError) as exc:
        raise MeshError(f"cannot lay out mesh {_fmt(p.shape)} on these slices: {exc}") from None
    devices = np.vectorize(lambda t: t.device, otypes=[object])(grid)
    return Mesh(devices, p.axes)


def of_kind(slices: Sequence[Slice], kind: str | None) -> list[Slice]:
    """The slices of chips of ``kind`` (a device kind, ``"TPU v6 lite"``, or a generation, ``"v6e"``);
    with ``kind`` None, all of them if they are of one kind.

    Raises:
      MeshError: ``kind`` None and the slices are of several kinds (a program runs on one), or no
        slice of ``kind``.
    """
    by_kind: dict[str, list[Slice]] = {}
    for s in slices:
        by_kind.setdefault(s.kind, []).append(s)
    named = ", ".join(
        f"{k or 'unknown'} on slice {','.join(str(s.index) for s in group)}" for k, group in by_kind.items()
    )
    if kind is None:
        if len(by_kind) > 1:
            raise MeshError(
                f"the live slices are of {len(by_kind)} kinds ({named}): pick one, e.g. pw.mesh(kind='v5p')"
            )
        return list(slices)
    wanted = tpu_kinds.GENERATIONS[kind].device_kind if kind in tpu_kinds.GENERATIONS else kind
    if wanted not in by_kind:
        raise MeshError(f"no live slice is {wanted} (live: {named or 'none'})")
    return by_kind[wanted]


def parse_shape(text: str) -> tuple[int, ...]:
    """``"2,1"`` or ``"2x1"`` -> ``(2, 1)``; raises ``MeshError`` on bad input."""
    try:
        return tuple(parsing.whole_number(p, 1) for p in text.replace("x", ",").split(","))
    except ValueError as exc:
        raise MeshError(
            f"bad shape {shown(text)}: expected comma-separated positive integers, e.g. 2,1 ({exc})"
        ) from None


def describe(mesh: Any) -> str:
    """One line: axis names and sizes."""
    return (
        "Mesh("
        + ", ".join(f"{name}={size}" for name, size in mesh.shape.items())
        + f") over {count(mesh.size, 'device')}"
    )


def _fmt(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape))
