"""Big arrays through the local server: bounded memory on each side, and memory given back after ``del``.

A 256 MiB array goes up (``device_put``), comes back (``np.asarray``) and is deleted, in a
process whose session is on ``local:2x4`` as a kernel's is (the server it starts, JAX's own
proxy client, what the local backend adds).
Each side's resident size is read from /proc at each phase; peaks are reset between phases
(``clear_refs``), so each phase's peak is its own.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time

import pytest

MIB = 256
#: What a phase may hold beyond its arrays: allocator slack, gRPC's buffers, a 4 MiB message.
FIXED_MIB = 64


def _status(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) >> 10
    return fields


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")


def client() -> dict:
    import jax
    import numpy as np

    import pathways_kernel as pw

    server_pid = pw.session().backend.server.pid
    device = jax.devices()[0]
    jax.device_put(np.ones(8, np.float32), device).block_until_ready()
    host = np.ones((MIB << 20) // 4, np.float32)
    me = os.getpid()
    out: dict = {"base": {"client": _status(me), "server": _status(server_pid)}}
    for phase in ("put", "get", "del"):
        _reset_peak(me)
        _reset_peak(server_pid)
        if phase == "put":
            on_device = jax.device_put(host, device)
            on_device.block_until_ready()
        elif phase == "get":
            back = np.asarray(on_device)
            assert back[-1] == 1.0
        else:
            del on_device, back
            gc.collect()
            time.sleep(3)  # the trimmer's and the server's reclaim's second
        out[phase] = {"client": _status(me), "server": _status(server_pid)}
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="reads peaks from Linux's /proc")
def test_big_array_memory_is_bounded_and_returned():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "PATHWAYS_"))}
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PATHWAYS_BACKEND": "local:2x4"},
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    result = json.loads(lines[-1])
    base = result["base"]
    # The server holds the array once: the upload is adopted as the device buffer, the read is a view of it.
    for phase in ("put", "get"):
        assert result[phase]["server"]["VmHWM"] - base["server"]["VmRSS"] <= 1.5 * MIB + FIXED_MIB, result
    # After del, each process is back where it started.
    assert result["del"]["server"]["VmRSS"] - base["server"]["VmRSS"] <= FIXED_MIB, result
    assert result["del"]["client"]["VmRSS"] - base["client"]["VmRSS"] <= FIXED_MIB, result


if __name__ == "__main__":
    print(json.dumps(client()), flush=True)
