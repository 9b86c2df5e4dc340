"""The chips of a Pathways cluster as Cloud Monitoring sees them: the TPU metrics GKE exports for
its workers' containers (``kubernetes.io/container/accelerator/...``) and Cloud TPU VMs for their
workers (``tpu.googleapis.com/accelerator/...``), read with ``google-cloud-monitoring`` and
Application Default Credentials.

    reader = CloudMonitoring("my-project", slices, cluster="my-cluster")
    reader.read()   # ChipReadings by device id, at Cloud Monitoring's 60 s resolution

Each series is placed on a slice and a chip: a GKE worker pod of a Pathways JobSet is named
``{jobset}-{job}-{job index}-{pod index}-{suffix}`` (or labelled ``jobset.sigs.k8s.io/job-index``
and ``batch.kubernetes.io/job-completion-index``): the job index is the slice, the pod index the
host in it; a TPU VM series' ``node_id`` (in name order) is the slice, ``worker_id`` the host.
Within a slice, chips are ordered by host, then ``accelerator_id``, and matched to the slice's
devices in id order. The API is asked at most every ``REFRESH_S``, on a thread of its own, so a
slow answer never holds up the monitor.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from pathways_kernel.core.backend import ChipMetrics, ChipReadings
from pathways_kernel.core.errors import BackendError

#: What GKE exports for TPU containers, and Cloud TPU VMs for their workers.
GKE = "kubernetes.io/container/accelerator/"
TPU_VM = "tpu.googleapis.com/accelerator/"
#: Seconds between the points of these series (their resolution).
RESOLUTION_S = 60.0
#: Seconds between two reads of the API.
REFRESH_S = 30.0
#: How far back a read looks for each series' latest point.
LOOKBACK_S = 300
#: Seconds one read of the API may take.
_TIMEOUT_S = 20.0
#: A plaintext endpoint to read instead of monitoring.googleapis.com (a stand-in or an emulator).
ENDPOINT_ENV = "PATHWAYS_MONITORING_ENDPOINT"
_SCOPE = "https://www.googleapis.com/auth/monitoring.read"
_POD = re.compile(r"-(\d+)-(\d+)-[a-z0-9]{5}$")
_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
_POD_INDEX = "batch.kubernetes.io/job-completion-index"


class CloudMonitoring(ChipMetrics):
    """TPU series of ``project`` (one GKE ``cluster``'s, or TPU VMs'; of pods or nodes named
    ``workers*`` when given), placed on ``slices`` (each slice's device ids)."""

    name = f"Cloud Monitoring, {RESOLUTION_S:g} s"

    def __init__(
        self,
        project: str | None,
        slices: Callable[[], Sequence[Sequence[int]]],
        *,
        cluster: str | None = None,
        workers: str | None = None,
        endpoint: str | None = None,
    ):
        self.cluster = cluster
        self.workers = workers
        self._slices = slices
        self._client, self.project = _client(project, endpoint or os.environ.get(ENDPOINT_ENV))
        self._lock = threading.Lock()
        self._latest: ChipReadings | None = None
        self._error: str | None = None
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def check(self) -> ChipReadings:
        """Reads once now; raises ``BackendError`` in one line (no permission, unknown project, no series)."""
        readings = self._fetch()
        with self._lock:
            self._latest, self._error = readings, None
        return readings

    def read(self) -> ChipReadings:
        if self._thread is None:
            self._thread = threading.Thread(target=self._refresh, name="pathways-cloud-monitoring", daemon=True)
            self._thread.start()
        with self._lock:
            latest, error = self._latest, self._error
        if error is not None or latest is None:
            raise BackendError(error or f"{self.name}: waiting for the first read")
        return latest

    def _refresh(self) -> None:
        while not self._closed:
            try:
                readings: ChipReadings | None = self._fetch()
                error = None
            except BackendError as failure:
                readings, error = None, str(failure)
            with self._lock:
                if readings is not None:
                    self._latest = readings
                self._error = error
            self._wake.wait(REFRESH_S)

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    # -- one read -------------------------------------------------------------
    def _fetch(self) -> ChipReadings:
        duty, prefix = self._series("duty_cycle")
        used, _ = self._series("memory_used", prefix)
        total, _ = self._series("memory_total", prefix)
        slices = self._slices()

        def by_device(figures: dict[int, dict[tuple[int, str], float]]) -> dict[int, float]:
            out: dict[int, float] = {}
            for slice_index, chips in figures.items():
                devices = sorted(slices[slice_index]) if slice_index < len(slices) else []
                for device, (_, value) in zip(devices, sorted(chips.items()), strict=False):
                    out[device] = value
            return out

        return ChipReadings(
            {d: v / 100.0 for d, v in by_device(duty).items()},
            {d: int(v) for d, v in by_device(used).items()},
            {d: int(v) for d, v in by_device(total).items()},
            RESOLUTION_S,
        )

    def _series(self, metric: str, prefix: str | None = None) -> tuple[dict[int, dict[tuple[int, str], float]], str]:
        """The latest value of ``metric`` per slice and chip key, and which family (GKE or TPU VM) had it."""
        from google.api_core import exceptions

        for family in (prefix,) if prefix else (GKE, TPU_VM):
            conditions = [f'metric.type = "{family}{metric}"']
            if family == GKE and self.cluster:
                conditions.append(f'resource.labels.cluster_name = "{self.cluster}"')
            if self.workers:  # the job's own: its pods, or its nodes' TPU VMs
                label = "pod_name" if family == GKE else "node_id"
                conditions.append(f'resource.labels.{label} = starts_with("{self.workers}")')
            now = int(time.time())
            try:
                found = list(
                    self._client.list_time_series(
                        request={
                            "name": f"projects/{self.project}",
                            "filter": " AND ".join(conditions),
                            "interval": {"end_time": {"seconds": now}, "start_time": {"seconds": now - LOOKBACK_S}},
                        },
                        timeout=_TIMEOUT_S,
                    )
                )
            except exceptions.PermissionDenied:
                raise BackendError(
                    f"{self.name}: no permission to read metrics of project {self.project} "
                    "(the credentials need roles/monitoring.viewer)"
                ) from None
            except (exceptions.NotFound, exceptions.InvalidArgument):
                raise BackendError(f"{self.name}: project {self.project} is unknown to Cloud Monitoring") from None
            except exceptions.GoogleAPICallError as error:
                raise BackendError(f"{self.name}: {type(error).__name__}: {error.message}") from None
            except Exception as error:  # transport trouble (DNS, TLS): its class says enough
                raise BackendError(f"{self.name}: {type(error).__name__} reading project {self.project}") from None
            if found:
                return _placed(found, family), family
        where = f"cluster {self.cluster} of " if self.cluster else ""
        raise BackendError(
            f"{self.name}: no TPU series ({metric}) for {where}project {self.project} in the last {LOOKBACK_S // 60} minutes"
        )


def _placed(series: list[Any], family: str) -> dict[int, dict[tuple[int, str], float]]:
    """Latest value per slice, per chip key (host, accelerator) within it."""
    nodes = sorted({s.resource.labels.get("node_id", "") for s in series}) if family == TPU_VM else []
    placed: dict[int, dict[tuple[int, str], float]] = {}
    for one in series:
        if not one.points:
            continue
        where = _slice_and_host(one, family, nodes)
        if where is None:
            continue
        accelerator = one.metric.labels.get("accelerator_id", "0")
        key = (where[1], accelerator.zfill(8))  # chips 2 and 10 in number order
        value = one.points[0].value  # newest first
        placed.setdefault(where[0], {})[key] = float(value.double_value or value.int64_value)
    return placed


def _slice_and_host(series: Any, family: str, nodes: list[str]) -> tuple[int, int] | None:
    labels = series.resource.labels
    if family == TPU_VM:
        worker = labels.get("worker_id", "0")
        return nodes.index(labels.get("node_id", "")), int(worker) if worker.isdigit() else 0
    pod_labels = series.metadata.user_labels
    if _JOB_INDEX in pod_labels and _POD_INDEX in pod_labels:
        return int(pod_labels[_JOB_INDEX]), int(pod_labels[_POD_INDEX])
    match = _POD.search(labels.get("pod_name", ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _client(project: str | None, endpoint: str | None) -> tuple[Any, str]:
    """A ``MetricServiceClient`` with Application Default Credentials, and the project to read
    (``project``, else the credentials'); BackendError in one line, never the credentials."""
    import google.auth
    from google.auth import exceptions as auth_exceptions

    # By name: mypy, once it follows google.cloud into this typed package, no longer finds google.cloud.storage.
    monitoring_v3: Any = importlib.import_module("google.cloud.monitoring_v3")

    try:
        credentials, default_project = google.auth.default(scopes=[_SCOPE])
    except auth_exceptions.DefaultCredentialsError as error:
        reason = str(error).split(". ")[0].split(":")[0]
        raise BackendError(
            f"Cloud Monitoring: no usable Application Default Credentials ({reason}); run "
            "`gcloud auth application-default login` or give the kernel a workload identity"
        ) from None
    chosen = project or default_project
    if not chosen:
        raise BackendError("Cloud Monitoring: no project: name one with --metrics-project")
    if endpoint:
        import grpc

        transports = importlib.import_module("google.cloud.monitoring_v3.services.metric_service.transports")
        transport = transports.MetricServiceGrpcTransport(channel=grpc.insecure_channel(endpoint))
        return monitoring_v3.MetricServiceClient(transport=transport), chosen
    return monitoring_v3.MetricServiceClient(credentials=credentials), chosen
