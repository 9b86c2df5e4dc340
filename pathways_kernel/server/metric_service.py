"""libtpu's runtime metric service, served by the local server: what ``tpu-info`` reads on a TPU
host (``tpu.monitoring.runtime.RuntimeMetricService``, ``GetRuntimeMetric``), for its chips.

    tpu.runtime.tensorcore.dutycycle.percent   per device: % of the last ``METRIC_WINDOW_S`` spent executing programs
    tpu.runtime.hbm.memory.usage.bytes         per device: bytes of the arrays on it
    tpu.runtime.hbm.memory.total.bytes         per device: the HBM of its kind (``HBM_BYTES``)

Each figure is a ``Metric`` whose attribute is the device id (``int_attr``), as libtpu answers
and as ``tpu_info.metrics.get_chip_usage_new`` reads it. The message types are the ones the
``tpu-info`` package ships. The service is served on the server's own address (its Unix socket
in a 0700 directory: whoever may run programs there may read their figures, no one else), and,
with ``serve --metrics-port``, alone on a loopback TCP port, where ``tpu-info``'s client, which
dials TCP only, reaches it.

A device is busy from a program's dispatch until its outputs are ready (``DeviceActivity``,
told by the server of every program it dispatches): overlapping programs count once.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb

# The service's and metrics' names, and the window, are the kernel's too (its reader: backends/runtime_metrics.py).
from pathways_kernel.core.server_protocol import DUTY_CYCLE, HBM_TOTAL, HBM_USAGE, METRIC_SERVICE, METRIC_WINDOW_S
from pathways_kernel.server.errors import abort

#: How often the busy time is recorded, so the window's start is known to this precision.
_TICK_S = 0.05

_GIB = 1 << 30
#: HBM per chip by JAX's ``device_kind`` (Cloud TPU's published figures).
#: (``core/tpu_kinds.py`` names the kinds a server's slices report; a TPU VM's v5p says "TPU v5".)
HBM_BYTES: dict[str, int] = {
    "TPU v4": 32 * _GIB,
    "TPU v5 lite": 16 * _GIB,
    "TPU v5e": 16 * _GIB,
    "TPU v5": 95 * _GIB,
    "TPU v5p": 95 * _GIB,
    "TPU v6 lite": 32 * _GIB,
    "TPU v6e": 32 * _GIB,
    "TPU7x": 192 * _GIB,
}
#: Any other kind, the server's own ``cpu`` devices among them: a v5e chip's.
DEFAULT_HBM_BYTES = 16 * _GIB


def hbm_bytes(device_kind: str) -> int:
    """HBM bytes of one chip of ``device_kind`` (``DEFAULT_HBM_BYTES`` for a kind not listed)."""
    return HBM_BYTES.get(device_kind, DEFAULT_HBM_BYTES)


class DeviceActivity:
    """When each device was executing programs, as a duty cycle over the last ``window_s``.

    ``dispatched`` is called on the serving thread for every program the server runs; a
    watcher thread per set of devices waits for the outputs in dispatch order (programs on
    the same devices run in that order) and marks the devices idle once none runs there.
    """

    def __init__(self, devices: int, window_s: float = METRIC_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self._clock = clock
        self.devices = devices
        self._lock = threading.Lock()
        self._running = [0] * devices
        self._since = [0.0] * devices
        self._busy = [0.0] * devices  # seconds busy, completed stretches only
        # (time, busy seconds per device then), one per tick, the window's worth.
        self._ticks: collections.deque[tuple[float, list[float]]] = collections.deque(
            maxlen=int(window_s / _TICK_S) + 2
        )
        self._watchers: dict[tuple[int, ...], queue.SimpleQueue[Sequence[Any] | None]] = {}
        self._closed = threading.Event()
        threading.Thread(target=self._tick, name="pathways-local-duty-cycle", daemon=True).start()

    def dispatched(self, device_ids: Sequence[int], outputs: Sequence[Any]) -> None:
        """A program was dispatched on ``device_ids``; it runs until each of ``outputs`` (arrays
        with ``shards``) is ready."""
        now = self._clock()
        ids = tuple(device_ids)
        with self._lock:
            for d in ids:
                if self._running[d] == 0:
                    self._since[d] = now
                self._running[d] += 1
            watcher = self._watchers.get(ids)
            if watcher is None:
                watcher = self._watchers[ids] = queue.SimpleQueue()
                threading.Thread(
                    target=self._watch, args=(ids, watcher), name="pathways-local-program-watch", daemon=True
                ).start()
        watcher.put(outputs)

    def _watch(self, ids: tuple[int, ...], programs: queue.SimpleQueue[Sequence[Any] | None]) -> None:
        while (outputs := programs.get()) is not None:
            for output in outputs:
                for shard in output.shards:
                    with contextlib.suppress(Exception):  # a failed program ran until it failed
                        shard.block_until_ready()
            now = self._clock()
            with self._lock:
                for d in ids:
                    self._running[d] -= 1
                    if self._running[d] == 0:
                        self._busy[d] += now - self._since[d]

    def _busy_at(self, now: float) -> list[float]:
        return [b + (now - s if r else 0.0) for b, s, r in zip(self._busy, self._since, self._running, strict=True)]

    def _tick(self) -> None:
        while not self._closed.wait(_TICK_S):
            now = self._clock()
            with self._lock:
                self._ticks.append((now, self._busy_at(now)))

    def duty_cycle(self) -> list[float]:
        """Percent of the last ``window_s`` each device spent executing programs (0 at start)."""
        now = self._clock()
        with self._lock:
            busy = self._busy_at(now)
            start = next((tick for tick in self._ticks if tick[0] >= now - self.window_s), None)
        if start is None or now <= start[0]:
            return [0.0] * len(busy)
        span = now - start[0]
        return [min(100.0, max(0.0, 100.0 * (b - b0) / span)) for b, b0 in zip(busy, start[1], strict=True)]

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            watchers = list(self._watchers.values())
        for watcher in watchers:
            watcher.put(None)


def handlers(
    activity: DeviceActivity, bytes_per_device: Callable[[], Sequence[int]], device_kind: Callable[[int], str]
) -> grpc.GenericRpcHandler:
    """``RuntimeMetricService``: duty cycle from ``activity``, usage from ``bytes_per_device``,
    totals by each device's kind."""

    def figures(name: str) -> tuple[str, list[float] | list[int]] | None:
        if name == DUTY_CYCLE:
            return "as_double", activity.duty_cycle()
        if name == HBM_USAGE:
            return "as_int", list(bytes_per_device())
        if name == HBM_TOTAL:
            return "as_int", [hbm_bytes(device_kind(d)) for d in range(activity.devices)]
        return None

    def get_runtime_metric(request: pb.MetricRequest, context: grpc.ServicerContext) -> pb.MetricResponse:
        found = figures(request.metric_name)
        if found is None:
            abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"the local Pathways server does not serve metric {request.metric_name!r}; "
                f"it serves {', '.join(NAMES)}",
            )
        field, values = found
        response = pb.MetricResponse()
        response.metric.name = request.metric_name
        now = time.time()
        for device, value in enumerate(values):
            metric = response.metric.metrics.add()
            metric.attribute.key = "device-id"
            metric.attribute.value.int_attr = device
            metric.timestamp.FromNanoseconds(int(now * 1e9))
            setattr(metric.gauge, field, value)
        return response

    def list_supported_metrics(
        request: pb.ListSupportedMetricsRequest, context: grpc.ServicerContext
    ) -> pb.ListSupportedMetricsResponse:
        response = pb.ListSupportedMetricsResponse()
        for name in NAMES:
            if request.filter in name:
                response.supported_metric.add().metric_name = name
        return response

    return grpc.method_handlers_generic_handler(
        METRIC_SERVICE,
        {
            "GetRuntimeMetric": grpc.unary_unary_rpc_method_handler(
                get_runtime_metric, pb.MetricRequest.FromString, pb.MetricResponse.SerializeToString
            ),
            "ListSupportedMetrics": grpc.unary_unary_rpc_method_handler(
                list_supported_metrics,
                pb.ListSupportedMetricsRequest.FromString,
                pb.ListSupportedMetricsResponse.SerializeToString,
            ),
        },
    )


NAMES = (DUTY_CYCLE, HBM_USAGE, HBM_TOTAL)
