"""Telemetry as protocol v1 messages: topology, metrics, history, chip history.

What the hub holds (``monitoring/telemetry.py``) becomes the dataclasses of
``monitoring/protocol.py`` here. Each hub sample and each topology is encoded
once, however many comms send it (``encoded_metrics``, ``encoded_topology``):
65,536 chips take 35 ms to encode, and a dashboard opened beside the panel
reuses the panel's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from pathways_kernel.core.backend import Backend
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.slices import Topology
from pathways_kernel.monitoring import protocol, telemetry
from pathways_kernel.monitoring.history import MAX_BYTES as MAX_HISTORY_BYTES
from pathways_kernel.monitoring.history import SLICE_HISTORY_S
from pathways_kernel.monitoring.quantize import memory_unit_for, quantize_memory, quantize_utilization


def topology_message(topology: Topology, topology_seq: int, backend: Backend) -> protocol.TopologyMessage:
    chips = topology.chips
    n = len(chips)
    coords = np.zeros((n, 3), np.uint16)
    for p, chip in enumerate(chips):
        c = chip.coords[:3]
        coords[p, : len(c)] = c
    slices: list[protocol.SliceInfo] = []
    offset = 0
    for s in topology.slices:
        shape = tuple(s.shape)
        slices.append(protocol.SliceInfo(s.index, s.state, s.kind, shape, offset, len(s.chips)))
        offset += len(s.chips)
    return protocol.TopologyMessage(
        topology_seq=topology_seq,
        backend=backend.spec,
        target=backend.target,
        platform=topology.platform,
        supports_fault_injection=bool(backend.supports_fault_injection),
        slices=tuple(slices),
        chip_id=np.fromiter((c.id for c in chips), np.int32, n),
        chip_slice=np.fromiter((c.slice_index for c in chips), np.uint16, n),
        chip_coords=coords,
    )


def metrics_message(m: telemetry.Metrics) -> protocol.MetricsMessage:
    unit = memory_unit_for(int(m.memory.max()) if m.memory.size else 0)
    return protocol.MetricsMessage(
        seq=m.seq,
        time=m.time,
        topology_seq=m.topology_seq,
        source=m.source,
        window_s=m.window_s if m.window_s > 0 else 1e-3,
        memory_unit=unit,
        slices=m.slices,
        utilization=m.total_utilization,
        memory_bytes=m.memory_bytes,
        chip_utilization=quantize_utilization(m.utilization),
        chip_memory=quantize_memory(m.memory, unit),
    )


def history_message(hub: telemetry.TelemetryHub) -> protocol.HistoryMessage:
    """The hub's per-slice history of the current layout (empty before its first sample)."""
    history = hub.history()
    slices = tuple(s.index for s in hub.layout.topology.slices)
    series: dict[str, np.ndarray]
    if history is None or history.slices != len(slices):
        series = {
            "time": np.zeros(0),
            "util": np.zeros((0, len(slices)), np.float32),
            "bytes": np.zeros((0, len(slices))),
            "up": np.zeros((0, len(slices)), np.bool_),
        }
    else:
        series = history.slice_series()
    return protocol.HistoryMessage(
        topology_seq=hub.topology_seq,
        slices=slices,
        window_s=float(SLICE_HISTORY_S),
        time=series["time"],
        utilization=series["util"],
        memory_bytes=series["bytes"],
        up=series["up"],
    )


def chip_history(hub: telemetry.TelemetryHub, start: int, stop: int) -> protocol.ChipHistory:
    """Per-chip series of chip positions ``start:stop`` from the hub's history.

    Raises:
      PathwaysError: positions past the last chip, or a layout too large for per-chip history.
    """
    chips = hub.layout.chips
    if stop > chips:
        raise PathwaysError(f"chip_history: chips {start}:{stop} asked for, but the topology has {chips}")
    history = hub.history()
    if history is not None and not history.keeps_chips:
        raise PathwaysError(
            f"chip_history: {chips} chips are too many to keep per-chip history within "
            f"{MAX_HISTORY_BYTES >> 20} MiB; per-slice history is kept"
        )
    series: dict[str, np.ndarray]
    if history is None or history.chips != chips:
        series = {
            "time": np.zeros(0),
            "util": np.zeros((0, stop - start), np.uint8),
            "memory": np.zeros((0, stop - start), np.uint8),
        }
        unit = 1
    else:
        series = history.chip_series(start, stop)
        unit = history.memory_unit
    return protocol.ChipHistory(hub.topology_seq, start, stop, unit, series["time"], series["util"], series["memory"])


class _EncodedOnce:
    """The newest message encoded, and what it was encoded from: each hub sample or
    topology is encoded once, however many comms send it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[object, ...] | None = None
        self._message: protocol.Message | None = None

    def get(self, key: tuple[object, ...], encode: Callable[[], protocol.Message]) -> protocol.Message:
        # The key holds its objects (not their ids), so a freed one's id cannot match a new one;
        # numbers compare by value, objects by identity (a topology's == would walk every chip).
        with self._lock:
            old, message = self._key, self._message
            if message is None or old is None or len(old) != len(key) or not all(map(_same, old, key)):
                message = self._message = encode()
                self._key = key
            return message


def _same(a: object, b: object) -> bool:
    return a == b if isinstance(a, int) else a is b


_encoded_metrics = _EncodedOnce()
_encoded_topology = _EncodedOnce()


def encoded_metrics(m: telemetry.Metrics) -> protocol.Message:
    return _encoded_metrics.get((m, m.seq), lambda: protocol.encode_metrics(metrics_message(m)))


def encoded_topology(topology: Topology, topology_seq: int, backend: Backend) -> protocol.Message:
    return _encoded_topology.get(
        (topology, topology_seq, backend),
        lambda: protocol.encode_topology(topology_message(topology, topology_seq, backend)),
    )
