"""``%pathways connect ... --metrics cloud-monitoring``: the panel shows the chips as Cloud Monitoring
has them, per slice, read by google-cloud-monitoring's own client from a stand-in API on 127.0.0.1
(``tests/support/cloud_monitoring.py``) that serves series shaped as GKE exports them for a Pathways
JobSet's workers and as Cloud TPU VMs export them. This test acts as the panel (the monitor comm).

No Pathways cluster runs here: the kernel's slices are the embedded backend's, the series name
the same 2 slices x 4 chips. Application Default Credentials are a user's file whose secrets
must never show.
"""

from __future__ import annotations

import json

import monitor_frontend
import pytest
from cloud_monitoring import StandIn, gke_series, tpu_vm_series
from comm_frontend import Frontend
from comm_frontend import is_comm_msg as _is
from kernels import EMBEDDED, Kernel

GIB = 1 << 30
SECRET = "sekrit-refresh-token-do-not-print"


@pytest.fixture(scope="module")
def monitoring():
    standin = StandIn(
        {
            "gke-project": gke_series(
                "pathways", slices=2, hosts=1, chips=4, duty=[75, 25], used=[3 * GIB, 1 * GIB], total=16 * GIB
            ),
            # A Slurm job's two nodes, and a TPU VM of someone else's in the same project (first by name).
            "tpu-vm-project": tpu_vm_series(
                nodes=["job7-node-a", "job7-node-b", "another-vm"],
                chips=4,
                duty=[10, 90, 50],
                used=[GIB, 2 * GIB, GIB],
                total=32 * GIB,
            ),
            "empty-project": [],
        }
    )
    yield standin
    standin.stop()


@pytest.fixture(scope="module")
def kernel(monitoring, tmp_path_factory):
    adc = tmp_path_factory.mktemp("adc") / "application_default_credentials.json"
    adc.write_text(
        json.dumps(
            {"type": "authorized_user", "client_id": "id.apps", "client_secret": SECRET, "refresh_token": SECRET}
        )
    )
    k = Kernel(
        "pathways",
        backend=EMBEDDED,
        env={"GOOGLE_APPLICATION_CREDENTIALS": str(adc), "PATHWAYS_MONITORING_ENDPOINT": monitoring.address},
    )
    assert k.run("x = 1").status == "ok"
    yield k
    k.shutdown()


def connect(kernel, options: str):
    reply = kernel.run(f"%pathways connect embedded:2x4 --force --metrics cloud-monitoring {options}", timeout=120)
    assert reply.status == "ok", reply.error
    assert SECRET not in reply.text + reply.error
    return reply


def panel_metrics(kernel, source: str) -> monitor_frontend.MetricsMessage:
    """The first metrics message from ``source`` a newly opened panel gets."""
    frontend = Frontend(kernel)
    comm = frontend.open()
    msg = frontend.wait_for(lambda m: _is(m, comm, "metrics") and m["content"]["data"]["source"] == source, timeout=30)
    assert msg is not None, f"no metrics from {source}"
    return monitor_frontend.decode_metrics(msg["content"]["data"], msg["buffers"])


def test_gke_series_of_a_pathways_jobset_show_per_slice(kernel, monitoring):
    reply = connect(
        kernel, "--metrics-project gke-project --metrics-cluster pw-cluster --metrics-workers pathways-worker"
    )
    assert "monitor: chips from Cloud Monitoring, 60 s (cluster pw-cluster, project gke-project): 8 chips" in reply.text
    metrics = panel_metrics(kernel, "Cloud Monitoring, 60 s")
    assert metrics.window_s == 60
    assert [s.utilization for s in metrics.slices] == pytest.approx([0.75, 0.25])
    assert [s.memory_bytes for s in metrics.slices] == [4 * 3 * GIB, 4 * GIB]
    assert [s.memory_limit_bytes for s in metrics.slices] == [4 * 16 * GIB] * 2
    asked = [f for project, f in monitoring.requests if project == "gke-project"]
    assert asked and all(
        'resource.labels.cluster_name = "pw-cluster"' in f and 'starts_with("pathways-worker")' in f for f in asked
    )


def test_tpu_vm_series_of_a_slurm_job_s_nodes_show_per_slice(kernel):
    reply = connect(kernel, "--metrics-project tpu-vm-project --metrics-workers job7-node")
    assert "8 chips" in reply.text
    metrics = panel_metrics(kernel, "Cloud Monitoring, 60 s")
    assert [s.utilization for s in metrics.slices] == pytest.approx([0.1, 0.9])
    assert [s.memory_limit_bytes for s in metrics.slices] == [4 * 32 * GIB] * 2


@pytest.mark.parametrize(
    "project, said",
    [
        ("denied", "Cloud Monitoring, 60 s: no permission to read metrics of project denied"),
        ("no-such-project", "Cloud Monitoring, 60 s: project no-such-project is unknown to Cloud Monitoring"),
        ("empty-project", "Cloud Monitoring, 60 s: no TPU series (duty_cycle) for project empty-project"),
    ],
)
def test_what_cannot_be_read_is_one_line_and_the_panel_keeps_the_client_figure(kernel, project, said):
    reply = connect(kernel, f"--metrics-project {project}")
    lines = [line for line in reply.text.splitlines() if "Cloud Monitoring" in line]
    assert len(lines) == 1 and lines[0].startswith(said), reply.text
    assert lines[0].endswith("; the monitor keeps the client-side figure")
    metrics = panel_metrics(kernel, "client (Cloud Monitoring, 60 s unavailable)")
    assert metrics.chips == 8


def test_unusable_credentials_are_one_line_without_the_secret(kernel, tmp_path):
    broken = tmp_path / "adc.json"
    broken.write_text(json.dumps({"type": "not-a-type", "refresh_token": SECRET}))
    reply = kernel.run(
        "import os; adc = os.environ['GOOGLE_APPLICATION_CREDENTIALS']\n"
        f"os.environ['GOOGLE_APPLICATION_CREDENTIALS'] = {str(broken)!r}\n"
        "%pathways connect embedded:2x4 --force --metrics cloud-monitoring --metrics-project gke-project",
        timeout=120,
    )
    assert kernel.run("os.environ['GOOGLE_APPLICATION_CREDENTIALS'] = adc").status == "ok"
    assert reply.status == "ok", reply.error
    lines = [line for line in reply.text.splitlines() if "Cloud Monitoring" in line]
    assert len(lines) == 1 and "no usable Application Default Credentials" in lines[0], reply.text
    assert SECRET not in reply.text + reply.error


def test_the_notebook_monitor_says_what_measured_the_chips(kernel):
    connect(kernel, "--metrics-project gke-project --metrics-cluster pw-cluster")
    reply = kernel.run(
        "import time\ndash = pw.monitor()\ndeadline = time.time() + 20\n"
        "while 'measured by' not in dash.snapshot_html() and time.time() < deadline:\n"
        "    time.sleep(0.2)\n"
        "print(dash.snapshot_html())",
        timeout=60,
    )
    assert reply.status == "ok", reply.error
    assert "utilization 50% · memory 16.0 GiB · measured by Cloud Monitoring, 60 s" in reply.text, reply.text
