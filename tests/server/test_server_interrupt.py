"""Interrupting a cell on the local Pathways server (issue #27 item 5).

A cell that dispatched a long unblocked loop and was interrupted while it waited for the
result left every step queued on the server: the next tiny cell silently waited for all of
them (44.9 s seen). Now the kernel tells the server, which drops what it has not started
(those outputs read as CANCELLED) and the interrupted cell says in one line what still runs.
Before that, the steps the notebook's variables wait for finish (at most 30 s; a second
interrupt drops them), so a loop's ``params`` stays readable.
"""

from __future__ import annotations

import time

import pytest
from kernels import Kernel
from load import cpu_hogs

LOOP = """
import time, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = pw.mesh()
x = jax.device_put(np.ones((512, 512), np.float32), NamedSharding(mesh, P(("data", "model"))))
w = jax.device_put(np.full((512, 512), 1e-3, np.float32), NamedSharding(mesh, P()))

@jax.jit
def step(w, x):
    h = jnp.tanh(x @ w) @ w
    return w - 1e-4 * (h.T @ x) / x.shape[0]

step(w, x).block_until_ready()
"""

RUN = """
out = []
for _ in range(400):
    w = step(w, x)
    out.append(w)
print("dispatched", flush=True)
float(out[-1].sum())
"""


def said_on_stderr(kernel: Kernel, msg_id: str) -> str:
    """What the cell ``msg_id`` wrote to stderr, up to its idle status."""
    said = []
    while (msg := kernel.iopub(30)) is not None:
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stderr":
            said.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    return "".join(said)


def wait_printed(kernel: Kernel, msg_id: str, marker: str, timeout: float, stream: str = "stdout") -> str:
    """Waits until the cell ``msg_id`` prints ``marker`` on ``stream``; what it wrote to stderr meanwhile."""
    said = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kernel.iopub(max(0.1, deadline - time.monotonic()))
        if msg is None or msg["parent_header"].get("msg_id") != msg_id or msg["msg_type"] != "stream":
            continue
        if msg["content"]["name"] == "stderr":
            said.append(msg["content"]["text"])
        if msg["content"]["name"] == stream and marker in msg["content"]["text"]:
            return "".join(said)
    raise AssertionError(f"the cell did not print {marker!r} within {timeout} s")


@pytest.mark.serial  # asserts how long the cell after the interrupt takes
def test_an_interrupted_loop_leaves_no_queued_work_for_the_next_cell():
    kernel = Kernel("pathways", backend=None)
    try:
        reply = kernel.run(LOOP, timeout=240)
        assert reply.status == "ok", reply.error
        with cpu_hogs():
            msg_id = kernel.kc.execute(RUN)
            # Interrupt once the loop is dispatched, while the cell waits for its last step:
            # a fixed sleep let a quiet machine run all 400 steps first, leaving nothing to cancel.
            said_before = wait_printed(kernel, msg_id, "dispatched", timeout=120)
            kernel.km.interrupt_kernel()
            # The cell first waits for the steps `w` and `out` wait for; a second interrupt drops them.
            said_before += wait_printed(kernel, msg_id, "interrupt again to drop them", timeout=60, stream="stderr")
            kernel.km.interrupt_kernel()
            interrupted = None
            while interrupted is None:
                msg = kernel.kc.get_shell_msg(timeout=60)
                if msg["parent_header"].get("msg_id") == msg_id:
                    interrupted = msg
            assert interrupted["content"]["status"] == "error"
            assert interrupted["content"]["ename"] == "KeyboardInterrupt"
            said = said_before + said_on_stderr(kernel, msg_id)
            started = time.monotonic()
            tiny = kernel.run("print(float(jnp.ones(4).sum()))", timeout=240)
            took = time.monotonic() - started
        assert tiny.status == "ok", tiny.error
        assert "4.0" in tiny.text
        # The last steps were never started: reading them says why, in one line.
        lost = kernel.run("float(out[-1].sum())")
        assert lost.status == "error"
        assert "CANCELLED" in lost.error, lost.error
        assert took < 30, f"the cell after the interrupt took {took:.1f} s"
        # The interrupted cell said, in one line, what the next one may still wait for.
        assert "dropped the work this cell had queued" in said, said
        assert "w, out not computed in time: the steps queued for them were dropped too" in said, said
    finally:
        kernel.shutdown()


DONATED = """
dstep = jax.jit(step, donate_argnums=0)
for _ in range(30):
    w = dstep(w, x)
float(w.sum())
"""


def test_an_interrupt_after_donating_steps_that_all_finished_says_nothing_runs():
    """Executions whose outputs were donated into the next step were counted as running forever:
    a cell interrupted long after they had finished said 'up to 8 executions it had started run
    to the end first'. Now the count is true, and nothing running is no line."""
    kernel = Kernel("pathways", backend=None)
    try:
        reply = kernel.run(LOOP + DONATED, timeout=240)
        assert reply.status == "ok", reply.error
        msg_id = kernel.kc.execute("time.sleep(60)")
        time.sleep(3.0)
        kernel.km.interrupt_kernel()
        said = said_on_stderr(kernel, msg_id)
        assert "executions it had started" not in said, said
        assert kernel.run("print(float(jnp.ones(4).sum()))", timeout=60).status == "ok"
    finally:
        kernel.shutdown()


PARAMS_LOOP = """
params = w
for _ in range(60):
    params = step(params, x)
print("dispatched", flush=True)
time.sleep(120)
"""


def test_an_interrupted_loop_leaves_the_variables_it_bound_readable():
    """A loop of unread steps binding ``params``, interrupted once dispatched: the kernel dropped
    every step the server had not started, ``params``'s own among them, so the next cell read
    CANCELLED. Now the steps the cell's variables wait for finish first (bounded), under one line."""
    kernel = Kernel("pathways", backend=None)
    try:
        reply = kernel.run(
            LOOP
            + "expected = w\nfor _ in range(60):\n    expected = step(expected, x)\nexpected = float(expected.sum())",
            timeout=240,
        )
        assert reply.status == "ok", reply.error
        with cpu_hogs():
            msg_id = kernel.kc.execute(PARAMS_LOOP)
            said = wait_printed(kernel, msg_id, "dispatched", timeout=120)
            kernel.km.interrupt_kernel()
            said += said_on_stderr(kernel, msg_id)
            read = kernel.run("print(float(params.sum()) == expected)", timeout=120)
        assert read.status == "ok", read.error
        assert read.text.strip() == "True", read.text
        # Said in one line, if the steps took over a second; nothing was given up.
        assert "not computed in time" not in said, said
    finally:
        kernel.shutdown()
