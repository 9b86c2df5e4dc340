"""Bounded metrics history, kept in the kernel so any view that opens shows the past at once.

Two ring buffers, filled from the telemetry hub's published metrics:

- **per slice**, every published frame, for the last ``SLICE_HISTORY_S``
  (15 minutes at the publish rate): mean utilization, bytes in use, whether
  the slice was up. A slice's state is kept per point, so a slice that went
  down shows as down from then on, not over its whole history.
- **per chip**, one point a second, for the last ``CHIP_HISTORY_S``
  (5 minutes): utilization and memory quantized to one byte each, as the
  protocol sends them (``quantize_utilization``, ``quantize_memory`` in a
  power-of-two unit fixed per history).

Memory, for S slices and N chips at publish rate R Hz (capacities, not use)::

    slice part: ceil(900 R) * (8 + 13 S) bytes     (time f8; util f4, bytes f8, up u1)
    chip part:  300 * (8 + 2 N) bytes              (time f8; util u1, memory u1)

At 64 slices of 1,024 chips and 2 Hz that is 1.5 MB + 39.3 MB = 40.8 MB, within
``MAX_BYTES`` (64 MiB); ``bytes_for`` computes it and the hub refuses to keep
chip history for a layout that would not fit (slice history always fits).
A topology change of chip count (a reconnect) starts a new history.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from pathways_kernel.monitoring.quantize import memory_unit_for, quantize_memory, quantize_utilization

SLICE_HISTORY_S = 15 * 60
CHIP_HISTORY_S = 5 * 60
CHIP_PERIOD_S = 1.0
MAX_BYTES = 64 << 20


def bytes_for(slices: int, chips: int, publish_hz: float) -> int:
    """Capacity in bytes of a history for ``slices`` slices, ``chips`` chips at ``publish_hz``."""
    slice_points = math.ceil(SLICE_HISTORY_S * publish_hz)
    chip_points = math.ceil(CHIP_HISTORY_S / CHIP_PERIOD_S)
    return slice_points * (8 + 13 * slices) + chip_points * (8 + 2 * chips)


class _Ring:
    """Fixed-capacity rows of numpy arrays; ``ordered`` reads them oldest first."""

    def __init__(self, capacity: int, columns: dict[str, tuple[tuple[int, ...], npt.DTypeLike]]):
        self.capacity = capacity
        self.columns = {name: np.zeros((capacity, *shape), dtype) for name, (shape, dtype) in columns.items()}
        self.count = 0
        self._next = 0

    def append(self, **values: npt.ArrayLike) -> None:
        for name, column in self.columns.items():
            column[self._next] = values[name]
        self._next = (self._next + 1) % self.capacity
        self.count = min(self.count + 1, self.capacity)

    def ordered(self, name: str, since: float | None = None) -> np.ndarray:
        column = self.columns[name]
        if self.count < self.capacity:
            rows = column[: self.count]
        else:
            rows = np.concatenate([column[self._next :], column[: self._next]])
        if since is not None:
            rows = rows[self.ordered("time") >= since] if name != "time" else rows[rows >= since]
        return rows

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns.values())


class SliceFrame(Protocol):
    """One slice of a ``Frame`` (``telemetry.SliceMetrics``)."""

    @property
    def utilization(self) -> float: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def state(self) -> str: ...


class Frame(Protocol):
    """What ``History.record`` reads of a published ``telemetry.Metrics`` frame
    (named by its shape: telemetry imports this module)."""

    @property
    def time(self) -> float: ...
    @property
    def utilization(self) -> np.ndarray: ...
    @property
    def memory(self) -> np.ndarray: ...
    @property
    def slices(self) -> Sequence[SliceFrame]: ...


class History:
    """The last 15 minutes per slice and 5 minutes per chip of one layout's metrics."""

    def __init__(self, slices: int, chips: int, publish_hz: float, memory_hint: int = 0):
        self.slices, self.chips = slices, chips
        self._lock = threading.Lock()
        self._slice = _Ring(
            max(1, math.ceil(SLICE_HISTORY_S * max(publish_hz, 1 / CHIP_PERIOD_S))),
            {
                "time": ((), np.float64),
                "util": ((slices,), np.float32),
                "bytes": ((slices,), np.float64),
                "up": ((slices,), np.bool_),
            },
        )
        self.keeps_chips = bytes_for(slices, chips, publish_hz) <= MAX_BYTES
        self._chip = (
            _Ring(
                math.ceil(CHIP_HISTORY_S / CHIP_PERIOD_S),
                {"time": ((), np.float64), "util": ((chips,), np.uint8), "memory": ((chips,), np.uint8)},
            )
            if self.keeps_chips
            else None
        )
        #: Bytes per step of per-chip memory; fixed for the history so old points stay comparable.
        self.memory_unit = memory_unit_for(memory_hint)
        self._last_chip_time = -math.inf

    def record(self, metrics: Frame) -> None:
        """Add one published ``Metrics`` frame (called on the hub thread)."""
        if len(metrics.slices) != self.slices or len(metrics.utilization) != self.chips:
            return  # a frame of another layout: the hub starts a new history
        util = np.array([s.utilization for s in metrics.slices], np.float32)
        used = np.array([s.memory_bytes for s in metrics.slices], np.float64)
        up = np.array([s.state == "up" for s in metrics.slices], np.bool_)
        with self._lock:
            self._slice.append(time=metrics.time, util=util, bytes=used, up=up)
            if self._chip is not None and metrics.time - self._last_chip_time >= CHIP_PERIOD_S * 0.95:
                if self.memory_unit == 1 and len(metrics.memory):
                    self.memory_unit = memory_unit_for(int(np.max(metrics.memory)))
                self._chip.append(
                    time=metrics.time,
                    util=quantize_utilization(metrics.utilization),
                    memory=quantize_memory(metrics.memory, self.memory_unit),
                )
                self._last_chip_time = metrics.time

    def slice_series(self, since: float | None = None) -> dict[str, np.ndarray]:
        """Per-slice series, oldest first: ``time`` [T], ``util`` [T, S], ``bytes`` [T, S], ``up`` [T, S]."""
        with self._lock:
            return {name: self._slice.ordered(name, since).copy() for name in self._slice.columns}

    def chip_series(self, start: int = 0, stop: int | None = None, since: float | None = None) -> dict[str, np.ndarray]:
        """Per-chip series of chips ``start:stop`` (layout positions), oldest first; empty if not kept."""
        with self._lock:
            if self._chip is None:
                return {"time": np.zeros(0), "util": np.zeros((0, 0), np.uint8), "memory": np.zeros((0, 0), np.uint8)}
            times = self._chip.ordered("time", since).copy()
            return {
                "time": times,
                "util": self._chip.ordered("util", since)[:, start:stop].copy(),
                "memory": self._chip.ordered("memory", since)[:, start:stop].copy(),
            }

    @property
    def nbytes(self) -> int:
        """Bytes held for history (the ring capacities, allocated up front)."""
        return self._slice.nbytes + (self._chip.nbytes if self._chip is not None else 0)

    def __len__(self) -> int:
        return self._slice.count


__all__ = ["CHIP_HISTORY_S", "History", "MAX_BYTES", "SLICE_HISTORY_S", "bytes_for"]
