"""Reading libtpu's runtime metric service (``tpu.monitoring.runtime.RuntimeMetricService``), the
service ``tpu-info`` reads on a TPU host (``localhost:8431``) and the local server serves for its
chips (``server/metric_service.py``): one reader for both, so the figures a user sees on
``local:`` come through the code that reads real TPUs.

    reader = RuntimeMetrics("unix:/tmp/pathways-local-XXXX/server.sock")
    reader.read()   # ChipReadings: duty cycle, HBM used and total, by device id

Each metric is one ``GetRuntimeMetric`` call, per device a ``Metric`` whose attribute is the
device id (``int_attr``), as ``tpu_info.metrics`` reads them; the totals are read once. The
metric names are libtpu's (``server/metric_service.py`` serves under them).
"""

from __future__ import annotations

import threading

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb

from pathways_kernel.core.backend import ChipMetrics, ChipReadings
from pathways_kernel.core.errors import BackendError
from pathways_kernel.core.server_protocol import DUTY_CYCLE, HBM_TOTAL, HBM_USAGE, METRIC_SERVICE

#: Seconds one call may take: the hub samples a few times a second and must not stall on a dead server.
_TIMEOUT_S = 1.0


class RuntimeMetrics(ChipMetrics):
    """The runtime metric service at ``target``: ``unix:PATH`` (a local server's socket, only its
    user can reach it) or ``HOST:PORT`` (libtpu's own, with local credentials as tpu-info dials it)."""

    def __init__(self, target: str, window_s: float, name: str = "runtime metrics"):
        self.target = target
        self.window_s = window_s
        self.name = f"{name}, {window_s:g} s"
        if target.startswith("unix:"):
            self._channel = grpc.insecure_channel(target)
        else:
            self._channel = grpc.secure_channel(target, grpc.local_channel_credentials())
        self._get = self._channel.unary_unary(
            f"/{METRIC_SERVICE}/GetRuntimeMetric",
            request_serializer=pb.MetricRequest.SerializeToString,
            response_deserializer=pb.MetricResponse.FromString,
        )
        self._totals: dict[int, int] | None = None
        self._lock = threading.Lock()

    def _metric(self, name: str) -> dict[int, pb.Metric]:
        try:
            response = self._get(pb.MetricRequest(metric_name=name), timeout=_TIMEOUT_S)
        except grpc.RpcError as error:
            detail = error.details() if isinstance(error, grpc.Call) else str(error)
            raise BackendError(f"the runtime metric service at {self.target} did not answer {name}: {detail}") from None
        return {m.attribute.value.int_attr: m for m in response.metric.metrics}

    def read(self) -> ChipReadings:
        with self._lock:
            duty = self._metric(DUTY_CYCLE)
            used = self._metric(HBM_USAGE)
            if self._totals is None:
                self._totals = {d: m.gauge.as_int for d, m in self._metric(HBM_TOTAL).items()}
            totals = self._totals
        return ChipReadings(
            {d: m.gauge.as_double / 100.0 for d, m in duty.items()},
            {d: m.gauge.as_int for d, m in used.items()},
            totals,
            self.window_s,
        )

    def close(self) -> None:
        self._channel.close()
