"""A fresh kernel says what it does while its local Pathways server starts (issue #31 item 1).

The kernel answers the frontend before its server is up; the monitor comm says how far the
server's start is (``starting``), and a cell run meanwhile waits under a line that counts the
seconds, then runs. The server is held at its process's start by a gate file (a
``sitecustomize`` on the path), so the window is there on a quiet machine as on a loaded one.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from comm_frontend import Frontend, is_comm_msg
from kernels import SERVER, Kernel

GATE_ENV = "PATHWAYS_TEST_SERVER_GATE"
#: Holds `pathways-local serve` (and nothing else) until the gate file exists, at most 90 s.
SITECUSTOMIZE = f"""
import os, sys, time
if "pathways_kernel.server" in sys.orig_argv and "serve" in sys.orig_argv and os.environ.get("{GATE_ENV}"):
    _deadline = time.monotonic() + 90
    while not os.path.exists(os.environ["{GATE_ENV}"]) and time.monotonic() < _deadline:
        time.sleep(0.05)
"""
WAITING = re.compile(r"^waiting for the local Pathways server to start \((\d+) s\)\.\.\. ")


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Kernel, Path, list[dict[str, Any]], Frontend]:
    """A default (``local:2x4``) kernel whose server is held at its start; the test opens the gate."""
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    gate = site / "open"
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    kernel = Kernel(backend=SERVER, env={"PYTHONPATH": path, GATE_ENV: str(gate)})
    seen: list[dict[str, Any]] = []
    try:
        yield kernel, gate, seen, Frontend(kernel)
    finally:
        gate.touch()
        kernel.shutdown()


def _collect(kernel: Kernel, seen: list[dict[str, Any]], until, timeout: float) -> dict[str, Any] | None:
    """Reads IOPub into ``seen`` until a message satisfies ``until``; None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        msg = kernel.iopub(min(remaining, 0.2))
        if msg is not None:
            seen.append(msg)
            if until(msg):
                return msg
    return None


def _starting(msg: dict[str, Any], comm_id: str) -> dict[str, Any] | None:
    return msg["content"]["data"] if is_comm_msg(msg, comm_id, "starting") else None


def test_a_cell_run_while_the_server_starts_waits_under_a_line_then_runs(gated):
    kernel, gate, seen, frontend = gated
    comm_id = frontend.open()
    # The panel hears that the server is starting, with the seconds so far, before the server is up.
    first = _collect(kernel, seen, lambda m: _starting(m, comm_id) is not None, 60)
    assert first is not None, "no `starting` message on the monitor comm"
    data = _starting(first, comm_id)
    assert data["what"] == "starting the local Pathways server (2 slices x 4 chips)"
    assert data["steps"] == ["process up", "devices", "listening", "connected"]
    assert data["state"] == "starting" and data["done"] == 0
    cell = kernel.kc.execute("import jax; print(len(jax.devices()))")
    waiting = _collect(
        kernel,
        seen,
        lambda m: (
            m["msg_type"] == "update_display_data"
            and m["parent_header"].get("msg_id") == cell
            and WAITING.match(m["content"]["data"]["text/plain"]) is not None
        ),
        30,
    )
    assert waiting is not None, "the cell showed no line counting the seconds it waits"
    ticks = [
        int(WAITING.match(m["content"]["data"]["text/plain"]).group(1))
        for m in seen
        if m["msg_type"] in ("display_data", "update_display_data") and m["parent_header"].get("msg_id") == cell
    ]
    assert ticks == sorted(ticks) and ticks[-1] > ticks[0], ticks
    gate.touch()
    done = _collect(
        kernel,
        seen,
        lambda m: (
            m["msg_type"] == "status"
            and m["parent_header"].get("msg_id") == cell
            and m["content"]["execution_state"] == "idle"
        ),
        120,
    )
    assert done is not None, "the cell did not finish once the server was up"
    ours = [m for m in seen if m["parent_header"].get("msg_id") == cell]
    kinds = [m["msg_type"] for m in ours]
    # The waiting line goes away when the server is ready, and then the cell runs.
    assert "clear_output" in kinds and kinds.index("clear_output") < kinds.index("stream"), kinds
    assert [m["content"]["text"] for m in ours if m["msg_type"] == "stream"] == ["8\n"]
    # The comm said each step it saw, in order, and then that the server is ready.
    progress = [d for m in seen if (d := _starting(m, comm_id)) is not None]
    dones = [d["done"] for d in progress]
    assert dones == sorted(dones), dones
    assert any(0 < d < 4 for d in dones), dones
    assert progress[-1]["state"] == "ready" and progress[-1]["done"] == 4, progress[-1]
    topology = next((m for m in seen if is_comm_msg(m, comm_id, "topology")), None) or _collect(
        kernel, seen, lambda m: is_comm_msg(m, comm_id, "topology"), 60
    )
    assert topology is not None and topology["content"]["data"]["chips"] == 8


def test_once_started_cells_run_without_the_line_and_new_comms_get_no_progress(gated):
    kernel, gate, seen, frontend = gated
    gate.touch()
    reply = kernel.run("import jax; print(len(jax.devices()))")
    assert reply.status == "ok" and reply.text == "8\n", reply
    assert not [m for m in reply.messages if m["msg_type"] in ("display_data", "clear_output")]
    comm_id = frontend.open()
    seen.clear()
    topology = _collect(kernel, seen, lambda m: is_comm_msg(m, comm_id, "topology"), 60)
    assert topology is not None
    assert not [m for m in seen if _starting(m, comm_id) is not None]


def test_pathwaysutils_profiling_hooks_are_in_once_a_cell_names_the_profiler(gated):
    # The start defers pathwaysutils' import (orbax, FastAPI) past the first cell; a cell that
    # names the profiler waits for its hooks, so jax.profiler traces the local server too.
    kernel, gate, seen, frontend = gated
    gate.touch()
    reply = kernel.run(
        "import jax\n"
        "from pathwaysutils import profiling\n"
        "from pathways_kernel.profiling import jax_trace\n"
        "print(profiling.start_trace is jax_trace.start_trace, jax.config.jax_enable_compilation_cache)"
    )
    assert reply.status == "ok" and reply.text.split()[-2:] == ["True", "False"], reply
