"""The shared Pathways service form of connect: held safely inside a kernel.

No GKE cluster is reachable here, so the flow itself (deploy a proxy job,
port-forward) cannot run; what can run is checked: a Jupyter interrupt while
the flow's signal handlers would be installed stops the cell and keeps the
kernel (and so the proxy) alive, and bad requests fail in one line.
"""

from __future__ import annotations

import importlib.util
import queue
import time

import pytest

from pathways_kernel.backends.shared_service import ServiceRequest
from pathways_kernel.core.errors import SpecError

pytestmark = pytest.mark.kernel

HAS_FLOW = importlib.util.find_spec("kubernetes") is not None and importlib.util.find_spec("portpicker") is not None

# With the [sps] extra, the flow's own object installs its handlers (they
# delete the proxy job and exit). Without it, a handler that ends the process
# stands in for them.
INSTALL_FLOW_HANDLERS = (
    "from pathwaysutils.experimental.shared_pathways_service import isc_pathways\n"
    "_flow = isc_pathways._ISCPathways(cluster='c', project='p', region='r', gcs_bucket='gs://b',\n"
    "    pathways_service='head:29001', expected_tpu_instances={'tpuv6e:2x2': 1}, proxy_job_name='j',\n"
    "    proxy_server_image='i')\n"
    "_flow._cleanup = lambda: os._exit(3)\n"
    "with kernel_keeps_sigint():\n"
    "    _flow._register_signal_handlers()\n"
    if HAS_FLOW
    else "with kernel_keeps_sigint():\n    signal.signal(signal.SIGINT, lambda *a: os._exit(3))\n"
)


def test_interrupt_stops_the_cell_not_the_shared_service(kernel):
    # Same cell, as in `%pathways connect sps`: after the flow is entered the
    # cell goes on (pre-flight, first contact), and may be interrupted there.
    # (ipykernel itself restores SIGINT between cells.)
    msg_id = kernel.kc.execute(
        "import os, signal, time\nfrom pathways_kernel.backends.shared_service import kernel_keeps_sigint\n"
        + INSTALL_FLOW_HANDLERS
        # The wait is short sleeps, as a pre-flight's retries are: CPython acts on a SIGINT that
        # lands between its last check and a blocking call only when that call returns, so one
        # 30 s sleep entered just as the interrupt arrives ignores it for 30 s (seen twice in CI).
        + "print('armed', flush=True)\nfor _ in range(300):\n    time.sleep(0.1)\n"
    )
    start = time.time()
    armed = None
    while armed is None and time.time() < start + 60:  # interrupt only once the handlers are in place
        msg = kernel.iopub(timeout=start + 60 - time.time())
        if msg and msg["parent_header"].get("msg_id") == msg_id and "armed" in msg["content"].get("text", ""):
            armed = time.time() - start
    kernel.km.interrupt_kernel()
    interrupted = time.time()
    reply = None
    while reply is None and time.time() < interrupted + 30:
        try:
            msg = kernel.kc.get_shell_msg(timeout=interrupted + 30 - time.time())
        except queue.Empty:
            break
        reply = msg if msg["parent_header"].get("msg_id") == msg_id else None
    assert reply is not None, (
        f"no reply {time.time() - interrupted:.1f} s after the interrupt; 'armed' seen after {armed} s; "
        f"kernel alive: {kernel.km.is_alive()}"
    )
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert kernel.km.is_alive()
    assert kernel.run("print('still here')").text.strip().endswith("still here")


@pytest.mark.parametrize(
    "fields,words",
    [
        (dict(tpu="v6e-2x2"), "bad --tpu"),
        (dict(count=0), "bad --count"),
        (dict(service="head"), "bad --service"),
        (dict(bucket=""), "--bucket"),
    ],
)
def test_bad_requests_name_the_option(fields, words):
    base = dict(cluster="c", project="p", region="r", service="head:29001", tpu="tpuv6e:2x2", count=2, bucket="gs://b")
    with pytest.raises(SpecError, match=words):
        ServiceRequest(**{**base, **fields})
