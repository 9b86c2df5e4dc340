"""Running a test module as a JAX proxy client of a local Pathways server, in its own process.

The client must be a process of its own: JAX's platform (``proxy``) and its target are fixed
when it starts. The module prints its result as one JSON line last.
"""

from __future__ import annotations

import json
import subprocess
import sys

from pathways_kernel.backends import server_client


def run_client(script: str, target: str, *args: str, timeout: float = 240, env=None, prefix=()) -> dict:
    """Runs ``python script *args`` against ``target``; the last JSON line it printed."""
    out = subprocess.run(
        [*prefix, sys.executable, script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or server_client.client_env(target),
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    said = "\n".join(line for line in out.stderr.splitlines() if line.strip())
    assert out.returncode == 0 and lines, f"client {' '.join(args[:1])} failed (rc {out.returncode}):\n{said[-3000:]}"
    return json.loads(lines[-1])
