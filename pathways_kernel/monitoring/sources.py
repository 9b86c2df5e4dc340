"""Where the telemetry hub's per-chip samples come from (``telemetry.py`` holds the hub).

``ChipSource`` reads a backend's chip service (``Backend.chip_metrics``: libtpu's runtime
metric service, which the local server serves too; Cloud Monitoring) and shows its figures
as they are. ``ClientSource`` measures from the client alone, so it works on every backend:
a chip is busy at a sample instant when a live array with a shard on it is not ready yet
(readiness read per array: per shard, jax would cache one array per shard, counted twice),
and its memory is the bytes of live array shards on it (or ``memory_stats()`` where the
backend reports it; CPU devices do not); arrays lost with a slice count for nothing, even
after its repair, from the moment it is down, nor do the buffers a loss keeps for readers
in flight (the backend's ``is_leftover``).

``ChipSource`` never falls back to the client's measure where asking an array is a request to the
server that JAX's client waits for holding the GIL (``Backend.array_queries_wait_on_server``: the
IFRT proxy, so ``local:``): the service not answering usually means that server does not either (a
stopped server froze the kernel in ``is_deleted`` of an array passed to a step). It keeps the last
memory figures then, no duty cycle, and its name says the service is unavailable.

Cost of ``ClientSource``: one pass over ``jax.live_arrays()`` per sample (~2 us per array),
numpy work per distinct sharding, no Python loop over chips except ``memory_stats()`` (every
``STATS_EVERY`` samples).
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pathways_kernel.core.backend import Backend, ChipMetrics
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.slices import Topology

if TYPE_CHECKING:
    import jax
    from jax.sharding import Sharding

#: An array's layout key for its per-shard bytes: id of its sharding, its shape, its dtype.
_ShapeKey = tuple[int, tuple[int, ...], np.dtype[Any]]

#: Distinct shardings remembered between samples (ids of live shardings).
_SHARDING_CACHE = 4096
#: ``memory_stats()`` is read every this many samples (it costs a call per chip).
STATS_EVERY = 4
#: A chip service's figures stand in for this many of its windows when it answers late.
STALE_WINDOWS = 3


@dataclasses.dataclass(frozen=True)
class Layout:
    """Chips in topology order: the index every per-chip array uses.

    Slices are contiguous: slice ``i`` of ``slices`` covers positions
    ``offsets[i]:offsets[i] + counts[i]``.
    """

    topology: Topology
    position: dict[int, int]  # device id -> chip position
    offsets: np.ndarray  # int64 [S]
    counts: np.ndarray  # int64 [S]
    up: np.ndarray  # bool [N]

    @classmethod
    def of(cls, topology: Topology) -> Layout:
        chips = topology.chips
        counts = np.array([len(s.chips) for s in topology.slices], np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if len(counts) else counts
        up = np.repeat(np.array([s.up for s in topology.slices], bool), counts) if len(counts) else np.zeros(0, bool)
        return cls(topology, {c.device.id: p for p, c in enumerate(chips)}, offsets, counts, up)

    @property
    def chips(self) -> int:
        return len(self.position)

    def positions(self, devices: Sequence[jax.Device]) -> np.ndarray:
        """Chip positions of ``devices`` (devices outside the session are skipped)."""
        pos = self.position
        return np.array([pos[d.id] for d in devices if d.id in pos], np.int64)


@dataclasses.dataclass(frozen=True)
class Sample:
    """What a source saw at one instant, per chip in layout order.

    ``busy``: 1.0 where the chip had work in flight (or a fraction when the
    source measures over an interval). ``memory``: bytes in use, or ``None``
    when unknown. ``memory_limit``: bytes the chip can hold, or ``None``.
    ``window_s``: set where ``busy`` is already a duty cycle over that window
    (the hub shows it as it is), else the hub averages instants over its own.
    """

    time: float
    busy: np.ndarray
    memory: np.ndarray | None
    memory_limit: np.ndarray | None = None
    window_s: float | None = None


class MetricsSource(abc.ABC):
    """Where per-chip samples come from; the seam for server-side metrics."""

    #: Reported to views as ``metrics.source``.
    name: str = "source"

    @abc.abstractmethod
    def sample(self, layout: Layout) -> Sample:
        """Sample every chip of ``layout`` now (called on the hub thread)."""

    def close(self) -> None:  # noqa: B027 - optional hook, deliberately a no-op by default
        """Release what the source holds."""


class ClientSource(MetricsSource):
    """Measure from this process: live arrays' readiness and shard bytes."""

    name = "client"

    def __init__(self, is_leftover: Callable[[jax.Array], bool] = lambda array: False) -> None:
        #: The backend's ``is_leftover``: arrays that only keep a lost slice's buffers for a reader.
        self._is_leftover = is_leftover
        # id(sharding) -> (sharding, positions, whether a position is on a down slice);
        # the strong ref keeps the id unique. Cleared when the layout changes.
        self._shardings: dict[int, tuple[Sharding, np.ndarray, bool]] = {}
        # Same, keyed by the device-assignment tuple JAX caches per mesh, so a new
        # sharding object over a known mesh costs no per-device work.
        self._assignments: dict[int, tuple[Sequence[jax.Device], np.ndarray]] = {}
        self._shard_bytes: dict[_ShapeKey, int] = {}
        # The layout the caches are for, held: an id() of a freed layout can come back as a new
        # one's, after a slice went down and up, and the caches would outlive the loss.
        self._layout: Layout | None = None
        self._stats_devices: list[jax.Device] | None = None
        self._stats: tuple[np.ndarray, np.ndarray | None] | None = None
        self._samples = 0
        # Arrays found lost (error buffers of a lost slice: nothing usable, so no memory in use),
        # and found fine under the current layout; a layout change (slice down/up) checks again.
        self._lost: weakref.WeakValueDictionary[int, jax.Array] = weakref.WeakValueDictionary()
        self._fine: weakref.WeakValueDictionary[int, jax.Array] = weakref.WeakValueDictionary()

    def _is_lost(self, array: jax.Array) -> bool:
        """Whether a ready ``array`` holds error buffers; each array is checked once per layout."""
        key = id(array)
        if self._fine.get(key) is array:
            return False
        if self._lost.get(key) is array:
            return True
        try:
            array.block_until_ready()
        except Exception:
            self._lost[key] = array
            return True
        self._fine[key] = array
        return False

    def sample(self, layout: Layout) -> Sample:
        import jax

        if layout is not self._layout:
            self._shardings.clear()
            self._shard_bytes.clear()
            self._assignments.clear()
            self._layout = layout
            self._fine.clear()
            self._stats_devices = _devices_with_memory_stats(layout)
            self._stats = None
        if len(self._shardings) > _SHARDING_CACHE:
            self._shardings.clear()
            self._shard_bytes.clear()
            self._assignments.clear()
        n = layout.chips
        down = ~layout.up
        busy = np.zeros(n, np.float32)
        memory = np.zeros(n, np.int64)
        counts: dict[_ShapeKey, int] = collections.defaultdict(int)
        pending: set[int] = set()
        shardings = self._shardings
        for array in jax.live_arrays():
            try:
                if array.is_deleted() or self._is_leftover(array):
                    continue
                sharding = array.sharding
                entry = shardings.get(id(sharding))
                if entry is None:
                    positions = self._positions(layout, sharding)
                    entry = shardings[id(sharding)] = (sharding, positions, bool(down[positions].any()))
                if entry[2]:
                    # A shard on a down slice: lost with it, even before the
                    # loss has swapped its buffers (which a read in flight delays).
                    continue
                if array.is_ready() and self._is_lost(array):
                    continue
                key = (id(sharding), array.shape, array.dtype)
                counts[key] += 1
                if not array.is_ready():
                    pending.add(key[0])
            except Exception:  # an array of a lost slice raises DATA_LOSS on access
                continue
        for sid in pending:
            busy[shardings[sid][1]] = 1.0
        for key, count in counts.items():
            per_shard = self._shard_bytes.get(key)
            if per_shard is None:
                sharding = shardings[key[0]][0]
                per_shard = _shard_nbytes(sharding, key[1], key[2])
                self._shard_bytes[key] = per_shard
            memory[shardings[key[0]][1]] += per_shard * count
        limit = None
        if self._stats_devices is not None:
            if self._stats is None or self._samples % STATS_EVERY == 0:
                self._stats = _memory_stats(self._stats_devices, n)
            memory, limit = self._stats
        self._samples += 1
        return Sample(time.time(), busy, memory, limit)

    def _positions(self, layout: Layout, sharding: Sharding) -> np.ndarray:
        devices = _devices_of(sharding)
        cached = self._assignments.get(id(devices))
        if cached is None or cached[0] is not devices:
            cached = (devices, layout.positions(devices))
            self._assignments[id(devices)] = cached
        return cached[1]


class ChipSource(ClientSource):
    """Each chip's duty cycle and memory as the backend's ``ChipMetrics`` says. A late answer (a
    loaded machine) keeps the last figures for up to ``STALE_WINDOWS`` of the service's windows;
    past that, the client's measure, and the name says so (its error logged once per outage)."""

    def __init__(self, backend: Backend, metrics: ChipMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(backend.is_leftover)
        self._metrics = metrics
        self._may_scan = not backend.array_queries_wait_on_server
        self._clock = clock
        self.name = metrics.name
        self._failing = False
        self._last: tuple[float, Layout, Sample] | None = None  # (monotonic time, layout, sample)

    def sample(self, layout: Layout) -> Sample:
        try:
            readings = self._metrics.read()
        except PathwaysError as error:
            last = self._last
            if last is not None and last[1] is layout and self._clock() - last[0] <= self._stale_s(last[2]):
                return dataclasses.replace(last[2], time=time.time())
            if not self._failing:  # the views say it (the source's name); a loaded server's late answer is no alarm
                _log().info(
                    "%s; %s meanwhile", error, "showing the client's measure" if self._may_scan else "no figures"
                )
            self._failing = True
            if self._may_scan:
                self.name = f"client ({self._metrics.name} unavailable)"
                return super().sample(layout)
            self.name = f"{self._metrics.name} unavailable: last memory figures, no duty cycle"
            return self._unmeasured(layout)
        self._failing = False
        self.name = self._metrics.name
        n = layout.chips
        busy = np.zeros(n, np.float32)
        memory = np.zeros(n, np.int64)
        limit = np.zeros(n, np.int64)
        for device_id, position in layout.position.items():
            busy[position] = readings.duty_cycle.get(device_id, 0.0)
            memory[position] = readings.memory_used.get(device_id, 0)
            limit[position] = readings.memory_total.get(device_id, 0)
        sample = Sample(time.time(), busy, memory, limit if limit.any() else None, readings.window_s)
        self._last = (self._clock(), layout, sample)
        return sample

    def _unmeasured(self, layout: Layout) -> Sample:
        """No duty cycle, and the memory last read (none if the layout changed): asks no array."""
        last = self._last
        kept = last[2] if last is not None and last[1] is layout else None
        return Sample(
            time.time(),
            np.zeros(layout.chips, np.float32),
            kept.memory if kept is not None else None,
            kept.memory_limit if kept is not None else None,
            kept.window_s if kept is not None else None,
        )

    @staticmethod
    def _stale_s(sample: Sample) -> float:
        return STALE_WINDOWS * (sample.window_s or 1.0)

    def close(self) -> None:
        self._metrics.close()


def _devices_of(sharding: Sharding) -> Sequence[jax.Device]:
    # _device_assignment is ordered and cached by JAX; device_set is the public fallback.
    devices = getattr(sharding, "_device_assignment", None)
    return devices if devices is not None else list(sharding.device_set)


def _shard_nbytes(sharding: Sharding, shape: tuple[int, ...], dtype: npt.DTypeLike) -> int:
    try:
        shard_shape = sharding.shard_shape(shape)
    except Exception:
        shard_shape = shape
    return int(np.prod(shard_shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _devices_with_memory_stats(layout: Layout) -> list[jax.Device] | None:
    devices = layout.topology.devices
    try:
        stats = devices[0].memory_stats() if devices else None
    except Exception:
        stats = None
    return devices if stats and "bytes_in_use" in stats else None


def _memory_stats(devices: list[jax.Device], n: int) -> tuple[np.ndarray, np.ndarray | None]:
    used = np.zeros(n, np.int64)
    limit = np.zeros(n, np.int64)
    for p, device in enumerate(devices):
        stats = device.memory_stats() or {}
        used[p] = stats.get("bytes_in_use", 0)
        limit[p] = stats.get("bytes_limit", 0)
    return used, (limit if limit.any() else None)


def _log() -> logging.Logger:
    return logging.getLogger(__name__)
