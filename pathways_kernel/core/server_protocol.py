"""What both sides of the local server's process boundary agree on: the lines the server prints
as it starts, the environment a kernel gives it, the names of its services and files, and the
one call of its control channel.

The server (``pathways_kernel/server/``, its own process) and the kernel's side
(``backends/server_client.py``, which starts it and talks to it) import this module, never each
other. It imports nothing heavy (gRPC only inside the call), so the kernel reads the server's
names without the server's modules (protobuf, the server's arrays: ~0.1-0.4 s of a kernel's start).
"""

from __future__ import annotations

import json
from typing import Any

from pathways_kernel.core.errors import BackendError

# -- the lines ``pathways-local serve`` prints as it starts (``--progress`` adds the first two) --
#: Its process runs (the pid follows); then JAX's import and its devices.
PROCESS_LINE = "pathways-local: process up, pid "
#: Its devices exist (their count follows); then it binds its socket and says ``SERVING_LINE``.
DEVICES_LINE = "pathways-local: devices ready: "
#: Said before ``SERVING_LINE`` when the runtime metrics are served on a port of their own (the address follows).
METRICS_LINE = "pathways-local: runtime metrics (tpu-info) on "
#: It serves: what it serves, `` on ``, then its target (the line's last word).
SERVING_LINE = "pathways-local: serving "

#: Set by a kernel that starts the server: the kernel's pid (the server stops once it is gone).
PARENT_ENV = "PATHWAYS_LOCAL_PARENT_PID"

#: The server's trace file in a run directory (XProf shows it as host "pathways-local-server").
SERVER_TRACE = "pathways-local-server.xplane.pb"

# -- libtpu's runtime metric service, which the server serves for its chips (``server/metric_service.py``) --
METRIC_SERVICE = "tpu.monitoring.runtime.RuntimeMetricService"
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_USAGE = "tpu.runtime.hbm.memory.usage.bytes"
HBM_TOTAL = "tpu.runtime.hbm.memory.total.bytes"
#: Seconds the server measures the duty cycle over (the figure at a read is for the window ending then).
METRIC_WINDOW_S = 1.0

# -- the control channel (``server/control.py``): on the server's own address, JSON bodies --
CONTROL_SERVICE = "pathways_local.Control"


def control_call(target: str, method: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Calls ``method`` (``Fail``, ``Repair``, ``Status``, ``Cancel``) of the control channel of the
    server at ``target``; raises BackendError in one line if it fails."""
    import grpc

    with grpc.insecure_channel(target.removeprefix("grpc://")) as channel:
        rpc = channel.unary_unary(f"/{CONTROL_SERVICE}/{method}")
        try:
            result: dict[str, Any] = json.loads(rpc(json.dumps(body).encode(), timeout=timeout))
            return result
        except grpc.RpcError as error:
            detail = error.details() if hasattr(error, "details") else str(error)
            raise BackendError(f"local Pathways server at {target}: {method.lower()} failed: {detail}") from None
