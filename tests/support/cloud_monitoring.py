"""A stand-in Cloud Monitoring API on 127.0.0.1: ``google.monitoring.v3.MetricService/ListTimeSeries``,
built from google-cloud-monitoring's own message types, serving TPU series shaped as GKE exports
them for a Pathways JobSet's workers (``k8s_container``, ``kubernetes.io/container/accelerator/...``)
and as Cloud TPU VMs export them (``tpu_worker``, ``tpu.googleapis.com/accelerator/...``).

    monitoring = StandIn({"gke-project": gke_series("pathways", slices=2, hosts=1, chips=4, ...)})
    # the kernel: PATHWAYS_MONITORING_ENDPOINT=monitoring.address

A project named ``denied`` answers PERMISSION_DENIED; one not served, NOT_FOUND.
"""

from __future__ import annotations

import re
import time
from concurrent import futures

import grpc
from google.cloud import monitoring_v3

METHOD = "/google.monitoring.v3.MetricService/ListTimeSeries"
_TYPE = re.compile(r'metric\.type = "([^"]+)"')
_CLUSTER = re.compile(r'resource\.labels\.cluster_name = "([^"]+)"')
_STARTS = re.compile(r'resource\.labels\.(pod_name|node_id) = starts_with\("([^"]+)"\)')


def point(value: float | int) -> dict:
    now = int(time.time())
    typed = {"double_value": value} if isinstance(value, float) else {"int64_value": value}
    return {"interval": {"end_time": {"seconds": now - 20}}, "value": typed}


def gke_series(
    jobset: str, *, slices: int, hosts: int, chips: int, duty: list[float], used: list[int], total: int
) -> list[monitoring_v3.TimeSeries]:
    """The three accelerator series per chip of every worker pod (``{jobset}-worker-{slice}-{host}-xxxxx``),
    with ``duty[s]`` percent and ``used[s]`` bytes on each chip of slice ``s``."""
    series = []
    for s in range(slices):
        for h in range(hosts):
            pod = f"{jobset}-worker-{s}-{h}-{'abcde'[s % 5]}{h}x9z"
            for chip in range(chips):
                for metric, value in (("duty_cycle", duty[s]), ("memory_used", used[s]), ("memory_total", total)):
                    series.append(
                        monitoring_v3.TimeSeries(
                            metric={
                                "type": f"kubernetes.io/container/accelerator/{metric}",
                                "labels": {
                                    "accelerator_id": str(chip),
                                    "make": "cloud-tpu",
                                    "model": "tpu-v5-lite-podslice",
                                    "tpu_topology": "2x2",
                                },
                            },
                            resource={
                                "type": "k8s_container",
                                "labels": {
                                    "project_id": "p",
                                    "location": "us-east5",
                                    "cluster_name": "pw-cluster",
                                    "namespace_name": "default",
                                    "pod_name": pod,
                                    "container_name": "pathways-worker",
                                },
                            },
                            metric_kind="GAUGE",
                            value_type="INT64",
                            points=[point(value)],
                        )
                    )
    return series


def tpu_vm_series(*, nodes: list[str], chips: int, duty: list[float], used: list[int], total: int) -> list:
    """The accelerator series of each chip of one-worker TPU VMs, node ``n`` being slice ``n``."""
    series = []
    for n, node in enumerate(nodes):
        for chip in range(chips):
            for metric, value in (("duty_cycle", duty[n]), ("memory_used", used[n]), ("memory_total", total)):
                series.append(
                    monitoring_v3.TimeSeries(
                        metric={
                            "type": f"tpu.googleapis.com/accelerator/{metric}",
                            "labels": {"accelerator_id": str(chip)},
                        },
                        resource={
                            "type": "tpu_worker",
                            "labels": {"project_id": "p", "zone": "us-east5-a", "node_id": node, "worker_id": "0"},
                        },
                        points=[point(value)],
                    )
                )
    return series


class StandIn:
    """Serves ``projects`` (name -> series) until ``stop``; ``requests`` holds (project, filter) asked."""

    def __init__(self, projects: dict[str, list[monitoring_v3.TimeSeries]]):
        self.projects = projects
        self.requests: list[tuple[str, str]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        self.server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "google.monitoring.v3.MetricService",
                    {
                        "ListTimeSeries": grpc.unary_unary_rpc_method_handler(
                            self._list,
                            monitoring_v3.ListTimeSeriesRequest.deserialize,
                            monitoring_v3.ListTimeSeriesResponse.serialize,
                        )
                    },
                )
            ]
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def _list(self, request, context):
        project = request.name.removeprefix("projects/")
        self.requests.append((project, request.filter))
        if project == "denied":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "Permission monitoring.timeSeries.list denied")
        if project not in self.projects:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Project {project} not found")
        wanted = _TYPE.search(request.filter)
        cluster = _CLUSTER.search(request.filter)
        starts = _STARTS.search(request.filter)
        return monitoring_v3.ListTimeSeriesResponse(
            time_series=[
                s
                for s in self.projects[project]
                if wanted
                and s.metric.type == wanted.group(1)
                and (not cluster or s.resource.labels.get("cluster_name") == cluster.group(1))
                and (not starts or s.resource.labels.get(starts.group(1), "").startswith(starts.group(2)))
            ]
        )

    def stop(self) -> None:
        self.server.stop(0)
