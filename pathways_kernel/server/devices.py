"""The server's slices: which CPU device is which chip of which slice, and which
slices are up.

Devices carry what Pathways shows and what pathwaysutils and MaxText read:
``slice_index`` and chip ``coords`` in the device's attribute map.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pathways_kernel.server.errors import DATA_LOSS, ServerError


def chip_grid(chips: int) -> tuple[int, int]:
    """The most square (x, y) grid of ``chips`` chips, as a TPU slice lays them out."""
    x = int(math.isqrt(chips))
    while chips % x:
        x -= 1
    return chips // x, x


@dataclass
class Topology:
    """``slices`` slices of ``chips`` chips; device ``i`` is chip ``i % chips`` of slice ``i // chips``."""

    slices: int
    chips: int
    _down: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def device_count(self) -> int:
        return self.slices * self.chips

    def slice_of(self, device_id: int) -> int:
        return device_id // self.chips

    def coords(self, device_id: int) -> tuple[int, int, int]:
        width, _ = chip_grid(self.chips)
        chip = device_id % self.chips
        return chip % width, chip // width, 0

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
                "down": sorted(self._down),
            }
