"""The server's slices: which CPU device is which chip of which slice, and which
slices are up.

Devices carry what Pathways shows and what pathwaysutils and MaxText read:
``slice_index`` and chip ``coords`` in the device's attribute map, and the
``device_kind`` of their slice's TPU generation (``core/tpu_kinds.py``: slices of
different generations and shapes, ``v5p:2x2x1*2,v6e:2x2``; plain ``2x4`` slices are
``cpu``). A program runs on one kind of chip, as on real hardware: one whose devices
span two kinds is refused (``check_one_kind``); moving arrays between them is not.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pathways_kernel.core.tpu_kinds import SliceShape, format_slices
from pathways_kernel.server.errors import DATA_LOSS, ServerError


def chip_grid(chips: int) -> tuple[int, int]:
    """The most square (x, y) grid of ``chips`` chips, as a TPU slice lays them out."""
    x = math.isqrt(chips)
    while chips % x:
        x -= 1
    return chips // x, x


@dataclass
class Topology:
    """``slices`` slices of ``chips`` chips (``shapes``, one per slice, where they differ);
    devices are numbered slice by slice."""

    slices: int
    chips: int
    shapes: list[SliceShape] = field(default_factory=list)
    _down: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.shapes:
            self.shapes = [SliceShape(None, chip_grid(self.chips))] * self.slices
        # First device id of each slice, and one past the last.
        self._starts = [0, *itertools.accumulate(s.chips for s in self.shapes)]

    @classmethod
    def of(cls, shapes: list[SliceShape]) -> Topology:
        """The topology of ``shapes`` (``chips`` is the largest slice's)."""
        return cls(len(shapes), max(s.chips for s in shapes), list(shapes))

    @property
    def device_count(self) -> int:
        return self._starts[-1]

    @property
    def spec(self) -> str:
        """The slices as ``--slices`` names them: ``2x4``, ``v5p:2x2x1*2,v6e:2x2``."""
        return format_slices(self.shapes)

    def slice_of(self, device_id: int) -> int:
        return bisect.bisect_right(self._starts, device_id) - 1

    def coords(self, device_id: int) -> tuple[int, int, int]:
        slice_index = self.slice_of(device_id)
        return self.shapes[slice_index].coords(device_id - self._starts[slice_index])

    def device_kind(self, device_id: int) -> str:
        return self.shapes[self.slice_of(device_id)].device_kind

    def check_one_kind(self, device_ids: Iterable[int]) -> None:
        """Raises INVALID_ARGUMENT if ``device_ids`` span chips of two kinds (no ICI or
        compiled program joins a v5p and a v6e)."""
        first: dict[str, int] = {}
        for device in device_ids:
            first.setdefault(self.device_kind(device), self.slice_of(device))
        if len(first) > 1:
            (kind_a, slice_a), (kind_b, slice_b) = list(first.items())[:2]
            raise ServerError.invalid(
                f"a program cannot span two kinds of chip ({kind_a} on slice {slice_a}, {kind_b} on slice {slice_b}): "
                "run it on one kind's slices (pw.mesh(kind=...)) and move arrays between them (jax.device_put, reshard)"
            )

    def check_device(self, device_id: int) -> None:
        """Raises NOT_FOUND for a device the server does not have."""
        if not 0 <= device_id < self.device_count:
            raise ServerError.not_found(
                f"device {device_id} does not exist (this server has devices 0..{self.device_count - 1})"
            )

    def check_up(self, device_ids: Iterable[int]) -> None:
        """Raises DATA_LOSS if any of ``device_ids`` is on a slice that is down."""
        with self._lock:
            down = sorted({self.slice_of(d) for d in device_ids} & self._down)
        if down:
            raise ServerError(DATA_LOSS, f"slice {down[0]} is down (lost by the local Pathways server)")

    def devices_of(self, slice_index: int) -> range:
        return range(self._starts[slice_index], self._starts[slice_index + 1])

    def fail(self, slice_index: int) -> None:
        self._check_slice(slice_index)
        with self._lock:
            self._down.add(slice_index)

    def repair(self, slice_index: int) -> None:
        self._check_slice(slice_index)
        with self._lock:
            self._down.discard(slice_index)

    def _check_slice(self, slice_index: int) -> None:
        if not 0 <= slice_index < self.slices:
            raise ServerError.invalid(
                f"slice {slice_index} does not exist (this server has slices 0..{self.slices - 1})"
            )

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "slices": self.slices,
                "chips": self.chips,
                "kinds": [s.device_kind for s in self.shapes],
                "spec": self.spec,
                "down": sorted(self._down),
            }
