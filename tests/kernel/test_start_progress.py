"""A fresh kernel says what it does while its local Pathways server starts (issue #31 item 1).

The kernel answers the frontend before its server is up; the monitor comm says how far the
server's start is (``starting``), and a cell run meanwhile waits under a line that counts the
seconds, then runs. The server is held at its process's start by a gate file (a
``sitecustomize`` on the path), so the window is there on a quiet machine as on a loaded one.
A second gate holds the kernel's import of pathwaysutils, which its start defers past the
first cell, so the window in which jax.profiler waits for pathwaysutils' hooks is there too.
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
PATHWAYSUTILS_GATE_ENV = "PATHWAYS_TEST_PATHWAYSUTILS_GATE"
#: Holds `pathways-local serve` (and nothing else) until the gate file exists, at most 90 s; and
#: the kernel's first import of pathwaysutils until the second gate file exists, at most 300 s
#: (the fixture opens both at its end).
SITECUSTOMIZE = f"""
import os, sys, time
if "pathways_kernel.server" in sys.orig_argv and "serve" in sys.orig_argv and os.environ.get("{GATE_ENV}"):
    _deadline = time.monotonic() + 90
    while not os.path.exists(os.environ["{GATE_ENV}"]) and time.monotonic() < _deadline:
        time.sleep(0.05)
if sys.orig_argv[-3:-1] == ["pathways_kernel", "-f"] and os.environ.get("{PATHWAYSUTILS_GATE_ENV}"):
    import importlib.machinery

    class _HoldPathwaysutils:
        # Held in the module's execution: finders run under Python's global import lock.
        def find_spec(self, name, path=None, target=None):
            if name != "pathwaysutils":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            execute = spec.loader.exec_module

            def held(module):
                deadline = time.monotonic() + 300
                while not os.path.exists(os.environ["{PATHWAYSUTILS_GATE_ENV}"]) and time.monotonic() < deadline:
                    time.sleep(0.05)
                execute(module)

            spec.loader.exec_module = held
            return spec

    sys.meta_path.insert(0, _HoldPathwaysutils())
"""
#: A library module that takes jax.profiler.trace when imported and calls it later: its caller's
#: cell never names the profiler.
STEPTRACE = """
import glob, os
import jax
from jax.profiler import trace

def traced_step(directory):
    with trace(directory):
        jax.numpy.arange(8.0).sum().block_until_ready()
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory, "plugins", "*", "*", "*.xplane.pb")))
"""
WAITING = re.compile(r"^waiting for the local Pathways server to start \((\d+) s\)\.\.\. ")
HOOKS = re.compile(r"^jax\.profiler\.trace: waiting for pathwaysutils' profiling hooks \((\d+) s\)\.\.\.$")
WAITED = re.compile(r"^jax\.profiler\.trace waited (\d+) s for pathwaysutils' profiling hooks$")


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Kernel, Path, list[dict[str, Any]], Frontend, Path]:
    """A default (``local:2x4``) kernel whose server is held at its start, and its import of
    pathwaysutils after that; the tests open the gates."""
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (site / "steptrace.py").write_text(STEPTRACE)
    gate, pathwaysutils_gate = site / "open", site / "open-pathwaysutils"
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, GATE_ENV: str(gate), PATHWAYSUTILS_GATE_ENV: str(pathwaysutils_gate)}
    kernel = Kernel(backend=SERVER, env=env)
    seen: list[dict[str, Any]] = []
    try:
        yield kernel, gate, seen, Frontend(kernel), pathwaysutils_gate
    finally:
        gate.touch()
        pathwaysutils_gate.touch()
        kernel.shutdown()


def _idle(cell: str):
    """A ``_collect`` predicate: the kernel went idle after ``cell``."""
    return lambda m: (
        m["msg_type"] == "status"
        and m["parent_header"].get("msg_id") == cell
        and m["content"]["execution_state"] == "idle"
    )


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
    kernel, gate, seen, frontend, _ = gated
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
        _idle(cell),
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
    kernel, gate, seen, frontend, _ = gated
    gate.touch()
    reply = kernel.run("import jax; print(len(jax.devices()))")
    assert reply.status == "ok" and reply.text == "8\n", reply
    assert not [m for m in reply.messages if m["msg_type"] in ("display_data", "clear_output")]
    comm_id = frontend.open()
    seen.clear()
    topology = _collect(kernel, seen, lambda m: is_comm_msg(m, comm_id, "topology"), 60)
    assert topology is not None
    assert not [m for m in seen if _starting(m, comm_id) is not None]


def test_a_library_calling_jax_profiler_right_after_the_start_gets_pathwaysutils_profiler(gated, tmp_path):
    # The start defers pathwaysutils' import (orbax, FastAPI) past the first cell, here held by the
    # second gate: a jax.profiler call waits for its hooks under a line, so a module that calls the
    # profiler (it took jax.profiler.trace at its import) traces the local server too, though the
    # cell never names it.
    kernel, gate, seen, _, pathwaysutils_gate = gated
    gate.touch()
    assert kernel.run("import steptrace").status == "ok"
    cell = kernel.kc.execute(f"print('first step')\nprint(steptrace.traced_step({str(tmp_path)!r}))")
    waiting = _collect(
        kernel,
        seen,
        lambda m: (
            m["msg_type"] in ("display_data", "update_display_data")
            and m["parent_header"].get("msg_id") == cell
            and HOOKS.match(m["content"]["data"]["text/plain"]) is not None
        ),
        60,
    )
    assert waiting is not None, "the profiler call did not wait for pathwaysutils' hooks under a line"
    pathwaysutils_gate.touch()
    done = _collect(
        kernel,
        seen,
        _idle(cell),
        120,
    )
    assert done is not None, "the cell did not finish once pathwaysutils was in"
    ours = [m for m in seen if m["parent_header"].get("msg_id") == cell]
    kinds = [m["msg_type"] for m in ours]
    assert "error" not in kinds, [m["content"] for m in ours if m["msg_type"] == "error"]
    # The line says how long the call waited, and what the cell printed before it stays.
    assert "clear_output" not in kinds, kinds
    lines = [
        m["content"]["data"]["text/plain"] for m in ours if m["msg_type"] in ("display_data", "update_display_data")
    ]
    assert WAITED.match(lines[-1]) is not None, lines
    # The trace has the server's side: pathwaysutils' profiler ran.
    traced = "".join(m["content"]["text"] for m in ours if m["msg_type"] == "stream")
    assert traced.startswith("first step\n"), traced
    assert "pathways-local-server.xplane.pb" in traced, traced
    assert f"{os.uname().nodename}.xplane.pb" in traced, traced
    # Once pathwaysutils is in, jax.profiler is its own, and a later call does not wait.
    reply = kernel.run(
        "import jax\n"
        "from pathwaysutils import profiling\n"
        "from pathways_kernel.profiling import jax_trace\n"
        "print(profiling.start_trace is jax_trace.start_trace, jax.config.jax_enable_compilation_cache)\n"
        f"print(steptrace.traced_step({str(tmp_path / 'again')!r}))"
    )
    assert reply.status == "ok", reply.error
    assert reply.text.splitlines()[0] == "True False", reply.text
    assert "pathways-local-server.xplane.pb" in reply.text, reply.text
    assert not [m for m in reply.messages if m["msg_type"] in ("display_data", "clear_output")]
