"""TPU generations a local backend can emulate, and the slice specs that name them.

    "2x4"                  2 slices of 4 chips (CPU devices, device_kind "cpu")
    "v5p:2x2x1*2,v6e:2x2"  two TPU v5p slices of 2x2x1 chips, then one v6e slice of 2x2

A generation's slice shape is its chip grid, as Google Cloud's topologies name it
(v5p and TPU7x: a 3D torus AxBxC; v5e and v6e: a 2D AxB); ``*N`` repeats a slice.
Each device of such a slice reports the ``device_kind`` the chip reports on Pathways
("TPU v5p"; a TPU VM's own runtime says "TPU v5") and its chip coordinates (x, y, z)
in the grid, z = 0 for the 2D generations.

Peak dense bf16 FLOP/s per chip, from Google Cloud's TPU pages (cloud.google.com/tpu/docs/
v4, /v5e, /v5p, /v6e, /tpu7x; checked 2026-12): the table in docs/backends.md.
"""

from __future__ import annotations

import dataclasses
import math
import re

from pathways_kernel.core.errors import SpecError
from pathways_kernel.core.text import shown


@dataclasses.dataclass(frozen=True)
class Generation:
    """One TPU generation: what its chips report and can do."""

    name: str  # as a slice spec names it: v5p
    device_kind: str  # as JAX reports it on Pathways: "TPU v5p"
    dims: int  # 3 for a 3D torus, 2 for a 2D one
    peak_bf16_flops: float  # per chip, dense


GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation("v4", "TPU v4", 3, 275e12),
        Generation("v5e", "TPU v5 lite", 2, 197e12),
        Generation("v5p", "TPU v5p", 3, 459e12),
        Generation("v6e", "TPU v6 lite", 2, 918e12),
        Generation("tpu7x", "TPU7x", 3, 2307e12),
    )
}

#: device_kind -> peak dense bf16 FLOP/s per chip (a TPU VM's v5p says "TPU v5").
PEAK_BF16_FLOPS: dict[str, float] = {g.device_kind: g.peak_bf16_flops for g in GENERATIONS.values()} | {
    "TPU v5": 459e12,
    "TPU v5e": 197e12,
    "TPU v6e": 918e12,
}

CPU_KIND = "cpu"
_PLAIN = re.compile(r"([0-9]+)[xX]([0-9]+)")
_PART = re.compile(r"([a-z0-9]+):([0-9]+(?:[xX][0-9]+)*)(?:\*([0-9]+))?")
#: Upper bound on emulated devices; XLA's CPU client gets slow far beyond it.
MAX_DEVICES = 4096


@dataclasses.dataclass(frozen=True)
class SliceShape:
    """One slice: its generation (None: plain CPU chips) and chip grid."""

    generation: Generation | None
    grid: tuple[int, ...]

    @property
    def chips(self) -> int:
        return math.prod(self.grid)

    @property
    def device_kind(self) -> str:
        return self.generation.device_kind if self.generation else CPU_KIND

    def coords(self, chip: int) -> tuple[int, int, int]:
        """Chip ``chip``'s (x, y, z) in the grid, x fastest."""
        x, y, _ = (*self.grid, 1, 1)[:3]
        return chip % x, (chip // x) % y, chip // (x * y)

    def text(self) -> str:
        grid = "x".join(map(str, self.grid))
        return f"{self.generation.name}:{grid}" if self.generation else grid


def _most_square(chips: int) -> tuple[int, int]:
    y = int(math.isqrt(chips))
    while chips % y:
        y -= 1
    return chips // y, y


def parse_slices(text: str, prefix: str = "") -> list[SliceShape]:
    """The slices a spec body names (the module's docstring); ``prefix`` (``local:``) is how
    the message shows the spec.

    Raises:
      SpecError: one line saying what is wrong and an example that works.
    """
    body = text.strip()
    if any(len(digits) > 6 for digits in re.findall(r"[0-9]+", body)):  # int() of thousands of digits is slow
        raise SpecError(
            f"bad slices {shown(prefix + text)}: more than the {MAX_DEVICES} devices a local backend emulates"
        )
    plain = _PLAIN.fullmatch(body)
    if plain:
        count, chips = (int(g) for g in plain.groups())
        slices = [SliceShape(None, _most_square(chips))] * count if count and chips else []
        if not slices:
            raise SpecError(f"bad slices {shown(prefix + text)}: slices and chips must be at least 1, e.g. 2x4")
    else:
        slices = []
        for part in body.split(","):
            slices.extend(_kind_part(part.strip(), text, prefix))
    devices = sum(s.chips for s in slices)
    if devices > MAX_DEVICES:
        raise SpecError(
            f"bad slices {shown(prefix + text)}: {devices} devices is more than the {MAX_DEVICES} a local backend emulates"
        )
    return slices


def _kind_part(part: str, text: str, prefix: str) -> list[SliceShape]:
    match = _PART.fullmatch(part)
    example = "e.g. 2x4, or v5p:2x2x1*2,v6e:2x2 for TPU generations"
    if match is None:
        raise SpecError(f"bad slices {shown(prefix + text)}: {shown(part)} is not KIND:GRID[*COUNT], {example}")
    name, grid_text, repeat = match.groups()
    generation = GENERATIONS.get(name)
    if generation is None:
        known = ", ".join(GENERATIONS)
        raise SpecError(f"bad slices {shown(prefix + text)}: unknown TPU generation {shown(name)} (known: {known})")
    grid = tuple(int(d) for d in grid_text.lower().split("x"))
    if len(grid) != generation.dims:
        wanted = "AxBxC" if generation.dims == 3 else "AxB"
        raise SpecError(
            f"bad slices {shown(prefix + text)}: a {name} slice is a {generation.dims}D grid {wanted}, got {grid_text}"
        )
    count = int(repeat) if repeat is not None else 1
    if count < 1 or min(grid) < 1:
        raise SpecError(f"bad slices {shown(prefix + text)}: grid sizes and counts must be at least 1, {example}")
    return [SliceShape(generation, grid)] * count


def format_slices(slices: list[SliceShape]) -> str:
    """The spec body of ``slices``: ``2x4`` for equal CPU slices, else ``v5p:2x2x1*2,v6e:2x2``."""
    if slices and all(s.generation is None for s in slices) and len(set(slices)) == 1:
        return f"{len(slices)}x{slices[0].chips}"
    parts: list[tuple[str, int]] = []
    for s in slices:
        if parts and parts[-1][0] == s.text():
            parts[-1] = (s.text(), parts[-1][1] + 1)
        else:
            parts.append((s.text(), 1))
    return ",".join(name if n == 1 else f"{name}*{n}" for name, n in parts)
