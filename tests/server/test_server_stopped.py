"""A stopped or stuck local Pathways server never freezes the kernel through its monitor (issue #27 item 0).

The monitor's telemetry samples on a background thread. On ``local:`` its figures come from the
server's runtime metric service, a call with a bound; when that did not answer, it measured from
the client instead: ``is_deleted()``/``is_ready()`` of every live array, each a request JAX's
proxy client makes and waits for without a bound, holding the GIL. A server stopped (SIGSTOP)
or stuck then froze the whole kernel: even ``1+1`` got no answer.
"""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import monitor_frontend
import pytest
from comm_frontend import Frontend
from comm_frontend import is_comm_msg as _is
from kernels import Kernel

SETUP = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = pw.mesh()
arrays = [jax.device_put(np.full((8, 8), float(i)), NamedSharding(mesh, P("data", "model"))) for i in range(20)]
bump = jax.jit(lambda a: a + 1)
bump(arrays[0]).block_until_ready()
"""


def server_pid(kernel: Kernel) -> int:
    status = kernel.run("%pathways status").text
    match = re.search(r"local Pathways server, pid (\d+)", status)
    assert match, status
    return int(match.group(1))


def source_of(msg: dict[str, Any]) -> str:
    return monitor_frontend.decode_metrics(msg["content"]["data"], msg["buffers"]).source


def answer_s(kernel: Kernel, code: str, timeout: float) -> float | None:
    """Seconds until the kernel answers ``code`` (None: no answer within ``timeout``)."""
    started = time.monotonic()
    msg_id = kernel.kc.execute(code)
    while (left := started + timeout - time.monotonic()) > 0:
        try:
            reply = kernel.kc.get_shell_msg(timeout=left)
        except Exception:  # queue.Empty: no answer in time
            return None
        if reply["parent_header"].get("msg_id") == msg_id:
            assert reply["content"]["status"] == "ok", reply["content"]
            return time.monotonic() - started
    return None


@pytest.mark.serial  # asserts how long 1+1 takes while the server is stopped
def test_a_stopped_server_does_not_freeze_the_kernel_while_the_monitor_samples():
    kernel = Kernel("pathways", backend=None)
    try:
        reply = kernel.run(SETUP, timeout=240)
        assert reply.status == "ok", reply.error
        pid = server_pid(kernel)
        frontend = Frontend(kernel)
        comm = frontend.open()
        msg = frontend.wait_for(lambda m: _is(m, comm, "metrics"), timeout=60)
        assert msg is not None, "no metrics from the monitor"
        assert "runtime metrics" in source_of(msg)
        os.kill(pid, signal.SIGSTOP)
        try:
            # The metric service's calls time out (1 s each); its last figures stand for 3 s, then
            # the monitor goes on publishing and says its figures' source does not answer.
            late = frontend.wait_for(lambda m: _is(m, comm, "metrics") and "unavailable" in source_of(m), timeout=15)
            # Arrays passed to a step: JAX's client no longer knows whether they were donated, and
            # asking (``is_deleted``) is a request it waits for, holding the GIL.
            made = answer_s(kernel, "fresh = [bump(a) for a in arrays[:4]]", timeout=30)
            mark = len(frontend.inbox)
            sampled = frontend.wait_for(lambda m: _is(m, comm, "metrics"), timeout=8, since=mark)
            took = answer_s(kernel, "1+1", timeout=30)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert made is not None, "the kernel did not dispatch 4 steps within 30 s while its server was stopped"
        assert sampled is not None, "the monitor stopped publishing once the cell had passed arrays to a step"
        assert took is not None, "the kernel did not answer 1+1 within 30 s while its server was stopped"
        assert took < 5.0, f"1+1 took {took:.1f} s while the server was stopped"
        assert late is not None, "the monitor never said its chip service does not answer"
        # Once the server runs again, so does JAX.
        after = kernel.run("print(float(arrays[3][0, 0]))", timeout=60)
        assert after.status == "ok" and "3.0" in after.text, after.error
    finally:
        kernel.shutdown()
