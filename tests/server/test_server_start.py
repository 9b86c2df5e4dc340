"""How the kernel starts its local Pathways server: early, beside its own imports, and lean.

The server's process imports only the server (no IPython, no kernel layer), and the kernel's
first line can start it before importing JAX or IPython (``import pathways_kernel`` is cheap);
the session's ``local:SxC`` backend then adopts that server instead of starting a second one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pathways_kernel.backends import server_client


def _imported_after(code: str) -> list[str]:
    """The modules of interest a fresh interpreter holds after running ``code``."""
    probe = (
        f"{code}\nimport json, sys\n"
        "print(json.dumps(sorted(m for m in sys.modules if m in ('IPython', 'jax', 'ipykernel') "
        "or m.startswith('pathways_kernel.') and not m.startswith(('pathways_kernel.server', 'pathways_kernel.core')))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_server_process_imports_only_the_server():
    # What `pathways-local serve` imports before it serves (its handlers, the CLI); JAX is its own.
    held = _imported_after("import pathways_kernel.server.cli, pathways_kernel.server.service")
    assert [m for m in held if m != "jax"] == []


def test_kernel_can_start_the_server_before_its_heavy_imports():
    # __main__.py starts the default server right after these; JAX, IPython and the layers come later.
    assert _imported_after("import pathways_kernel; from pathways_kernel.backends import start_server_early") == [
        "pathways_kernel.backends"
    ]


def test_kernel_side_imports_none_of_the_servers_modules():
    # What starts the server, talks to it and reads its metrics and trace: none of it is the server's
    # process (.importlinter's kernel-side contract checks every module; this checks what really loads).
    probe = (
        "import json, sys\n"
        "import pathways_kernel.backends.server_client, pathways_kernel.backends.local_server\n"
        "import pathways_kernel.backends.interrupts, pathways_kernel.backends.runtime_metrics\n"
        "import pathways_kernel.profiling.capture, pathways_kernel.profiling.jax_trace\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('pathways_kernel.server'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_public_names_still_come_from_the_package():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pathways_kernel as pw; from pathways_kernel import *; "
            "print(pw.mesh.__module__, callable(connect), 'load_ipython_extension' in pw.__all__, 'snapshot' in dir(pw))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["pathways_kernel.api", "True", "True", "True"]


def test_started_early_server_is_adopted_once():
    env = server_client.kernel_env()
    server_client.start_early(1, 2, env)
    early = server_client._early
    assert early is not None
    server = server_client.start(1, 2, env=env)
    try:
        assert server.pid == early.process.pid  # the same process, not a second server
        assert server.target == f"grpc://unix:{early.socket_path}"
        assert server_client._early is None
    finally:
        server.stop()
    assert not os.path.exists(early.directory)


def test_unadopted_early_server_is_stopped():
    env = server_client.kernel_env()
    server_client.start_early(1, 2, env)
    early = server_client._early
    assert early is not None
    other = server_client.start(1, 1, env=env)  # another shape: a server of its own
    try:
        assert other.pid != early.process.pid
        server_client.discard_early()
        assert early.process.wait(15) is not None
        assert not os.path.exists(early.directory)
    finally:
        other.stop()


def test_kernel_server_starts_beside_the_kernels_imports():
    import pytest
    from kernels import SERVER, Kernel

    if not os.path.exists("/proc/uptime"):
        pytest.skip("reads process start times from Linux's /proc")
    kernel = Kernel(backend=SERVER)
    with open("/proc/uptime") as uptime:
        ready = float(uptime.read().split()[0])  # seconds since boot, as /proc/PID/stat counts
    try:
        reply = kernel.run(
            "import os, json, pathways_kernel as pw\n"
            "def _started(pid):\n"
            "    ticks = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[19])\n"
            "    return ticks / os.sysconf('SC_CLK_TCK')\n"
            "print(json.dumps([_started(os.getpid()), _started(pw.session().backend.server.pid)]))"
        )
    finally:
        kernel.shutdown()
    assert reply.status == "ok", reply.error
    kernel_started, server_started = json.loads(reply.text.strip().splitlines()[-1])
    # Started first thing, not after ipykernel's and JAX's imports (most of the way to ready).
    assert server_started - kernel_started < 0.15 * (ready - kernel_started), (kernel_started, server_started, ready)
