"""The topology model: slices of chips, each chip backed by one JAX device.

Built from a backend's placements, so it is the same for emulated CPU slices
and for real TPU slices whose devices carry ``slice_index`` and ``coords``.
Immutable: a slice going down yields a new ``Topology``; the session swaps it
in and tells its listeners.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast

from pathways_kernel.core.backend import Placement
from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.text import count

SliceState = Literal["up", "down"]


@dataclasses.dataclass(frozen=True)
class Chip:
    """One chip: the unit the monitor draws, backed by one JAX device."""

    id: int
    slice_index: int
    coords: tuple[int, ...]
    state: SliceState
    device: Any = dataclasses.field(compare=False, repr=False)
    core_on_chip: int = 0


@dataclasses.dataclass(frozen=True)
class Slice:
    """An ICI-connected group of chips; slices talk to each other over DCN."""

    index: int
    state: SliceState
    chips: tuple[Chip, ...]
    kind: str = ""

    @property
    def up(self) -> bool:
        return self.state == "up"

    @property
    def devices(self) -> list[Any]:
        return [chip.device for chip in self.chips]

    @property
    def cores_per_chip(self) -> int:
        """JAX devices per physical chip (2 where a chip exposes each TensorCore)."""
        return max((c.core_on_chip for c in self.chips), default=0) + 1

    @property
    def physical_chips(self) -> int:
        return len({c.coords for c in self.chips})

    @property
    def shape(self) -> tuple[int, ...]:
        """Extent of the chip grid along each coordinate axis."""
        if not self.chips:
            return ()
        dims = len(self.chips[0].coords)
        return tuple(max(c.coords[d] for c in self.chips) + 1 for d in range(dims))


@dataclasses.dataclass(frozen=True)
class Topology(TextDisplay):
    """Every slice the session's client drives, in slice-index order."""

    slices: tuple[Slice, ...]
    platform: str = ""

    @classmethod
    def from_placements(cls, devices: Sequence[Any], placements: Sequence[Placement], platform: str = "") -> Topology:
        """Group devices into slices by their placement."""
        by_slice: dict[int, list[Chip]] = {}
        kinds: dict[int, str] = {}
        for device, place in zip(devices, placements, strict=True):
            chip = Chip(device.id, place.slice_index, tuple(place.coords), "up", device, place.core_on_chip)
            by_slice.setdefault(place.slice_index, []).append(chip)
            kinds[place.slice_index] = place.kind
        slices = tuple(
            Slice(index, "up", tuple(sorted(chips, key=_chip_order)), kinds[index])
            for index, chips in sorted(by_slice.items())
        )
        return cls(slices, platform)

    @property
    def chips(self) -> list[Chip]:
        return [chip for s in self.slices for chip in s.chips]

    @property
    def devices(self) -> list[Any]:
        return [chip.device for chip in self.chips]

    @property
    def up_slices(self) -> list[Slice]:
        return [s for s in self.slices if s.up]

    @property
    def down_slices(self) -> list[Slice]:
        return [s for s in self.slices if not s.up]

    @property
    def kinds(self) -> dict[str, list[Slice]]:
        """The slices by chip kind (``"TPU v5p"``), each kind's in slice order."""
        by_kind: dict[str, list[Slice]] = {}
        for s in self.slices:
            by_kind.setdefault(s.kind, []).append(s)
        return by_kind

    def slice(self, index: int) -> Slice:
        for s in self.slices:
            if s.index == index:
                return s
        raise KeyError(index)

    def slice_of(self, device: Any) -> int:
        """The slice index that holds ``device``."""
        return self._slice_by_device_id()[device.id]

    def _slice_by_device_id(self) -> dict[int, int]:
        # Frozen dataclass: cache the map on the instance.
        try:
            return cast(dict[int, int], self.__dict__["_by_id"])
        except KeyError:
            mapping = {chip.device.id: chip.slice_index for chip in self.chips}
            object.__setattr__(self, "_by_id", mapping)
            return mapping

    def with_slice_state(self, index: int, state: SliceState) -> Topology:
        """A copy with slice ``index`` (and its chips) in ``state``."""
        slices = tuple(
            dataclasses.replace(s, state=state, chips=tuple(dataclasses.replace(c, state=state) for c in s.chips))
            if s.index == index
            else s
            for s in self.slices
        )
        return dataclasses.replace(self, slices=slices)

    def to_text(self) -> str:
        count = _count(sum(s.physical_chips for s in self.slices), len(self.chips))
        lines = [f"{len(self.up_slices)}/{len(self.slices)} slices up, {count} ({self.platform})"]
        if len(self.kinds) > 1:  # slices of several TPU generations: what each kind has
            for kind, group in self.kinds.items():
                up = sum(s.up for s in group)
                chips = sum(s.physical_chips for s in group)
                indices = ",".join(str(s.index) for s in group)
                lines.append(f"  {kind}: slices {indices} ({up}/{len(group)} up, {_count(chips, chips)})")
        for s in self.slices:
            shape = "x".join(map(str, s.shape)) or "-"
            kind = f" {s.kind}" if s.kind else ""
            lines.append(f"  slice {s.index}: {s.state:<4} {_count(s.physical_chips, len(s.chips))}{kind} grid {shape}")
            cores = s.cores_per_chip > 1
            lines.append(
                "    "
                + " ".join(f"{c.id}@{_coords(c.coords)}{f'/c{c.core_on_chip}' if cores else ''}" for c in s.chips[:32])
            )
            if len(s.chips) > 32:
                lines[-1] += f" ... (+{len(s.chips) - 32})"
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        blocks = "".join(_slice_html(s) for s in self.slices)
        summary = html.escape(
            f"{len(self.up_slices)}/{len(self.slices)} slices up · "
            f"{_count(sum(s.physical_chips for s in self.slices), len(self.chips))} · {self.platform}"
        )
        return (
            '<div class="pathways-topology" style="font-family:var(--jp-code-font-family,monospace)">'
            f"<div><b>Topology</b> {summary}</div>"
            f'<div style="display:flex;flex-wrap:wrap;gap:12px;margin-top:6px">{blocks}</div></div>'
        )


def _count(chips: int, devices: int) -> str:
    """``"8 chips"``, or ``"8 chips (16 devices)"`` where chips expose several cores."""
    return count(chips, "chip") if chips == devices else f"{count(chips, 'chip')} ({count(devices, 'device')})"


def _chip_order(chip: Chip) -> tuple[Any, ...]:
    return (tuple(reversed(chip.coords)), chip.core_on_chip, chip.id)


def _coords(coords: Iterable[int]) -> str:
    return "(" + ",".join(map(str, coords)) + ")"


def _slice_html(s: Slice) -> str:
    # A 3D torus is drawn as its z-planes side by side (one spacer column
    # between them); a chip's cores stack within its cell.
    x, y, planes = (s.shape + (1, 1, 1))[:3]
    cores = s.cores_per_chip
    up = s.up
    border = "var(--jp-brand-color1,#1976d2)" if up else "var(--jp-error-color1,#d32f2f)"
    cells = []
    for chip in s.chips[:1024]:
        title = html.escape(f"chip {chip.id} coords {_coords(chip.coords)} core {chip.core_on_chip} {chip.state}")
        bg = "var(--jp-brand-color3,#bbdefb)" if up else "var(--jp-error-color3,#ffcdd2)"
        label = "✕" if not up else str(chip.id)
        cx, cy, cz = (tuple(chip.coords) + (0, 0, 0))[:3]
        cells.append(
            f'<div title="{title}" style="grid-column:{cz * (x + 1) + cx + 1};grid-row:{cy * cores + chip.core_on_chip + 1};'
            f'background:{bg};padding:2px 4px;text-align:center;font-size:11px">{label}</div>'
        )
    state = "up" if up else "DOWN"
    kind = html.escape(f" · {s.kind}" if s.kind else "")
    return (
        f'<div style="border:2px solid {border};padding:4px;border-radius:4px">'
        f"<div>slice {s.index} · <b>{state}</b> · {_count(s.physical_chips, len(s.chips))}{kind}</div>"
        f'<div style="display:grid;grid-template-columns:repeat({planes * (x + 1) - 1},auto);gap:2px;margin-top:4px">{"".join(cells)}</div>'
        "</div>"
    )


class DeviceTable:
    """The session's devices with their slice, coordinates and state."""

    def __init__(self, topology: Topology):
        self.topology = topology

    def rows(self) -> list[tuple[str, ...]]:
        return [
            (
                str(c.id),
                str(c.slice_index),
                _coords(c.coords),
                str(c.core_on_chip),
                str(c.device.platform),
                str(getattr(c.device, "device_kind", "")),
                c.state,
            )
            for c in self.topology.chips
        ]

    _HEAD = ("id", "slice", "coords", "core", "platform", "kind", "state")

    def __repr__(self) -> str:
        rows = [self._HEAD, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEAD))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in self._HEAD)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in self.rows())
        return f'<table class="pathways-devices"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
