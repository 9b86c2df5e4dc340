"""The local Pathways server and JAX's proxy client of another jaxlib release, both ways round.

``make test-compat`` runs this file under each jax/jaxlib release's own venv; the project's
``.venv`` holds the other release. There, a client of each release meets the server under the
project's jaxlib, and the server under each release meets the project's client: the versions
negotiated at GetVersion must be ones both speak. Under ``make test`` both sides are the one
jaxlib and it is skipped (docs/testing.md says why ``make test`` installs no second one).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pathways_kernel.backends import server_client
from pathways_kernel.core import server_protocol

REPO = Path(__file__).resolve().parents[2]
OTHER = REPO / ".venv" / "bin" / "python"  # the project's own jaxlib
CLIENT = str(Path(__file__).with_name("test_local_server.py"))


@pytest.fixture(scope="module")
def other() -> str:
    if not OTHER.exists() or Path(sys.prefix).resolve() == OTHER.parent.parent.resolve():
        pytest.skip("one jaxlib on each side: make test-compat runs this under each other release")
    import jaxlib

    if jaxlib_version(str(OTHER)) == jaxlib.__version__:
        pytest.skip(f"the release under test is .venv's own ({jaxlib.__version__})")
    return str(OTHER)


def jaxlib_version(python: str) -> str:
    said = subprocess.run(
        [python, "-c", "import jaxlib; print(jaxlib.__version__)"], capture_output=True, text=True, timeout=120
    )
    return said.stdout.strip()


def basics(python: str, target: str, out: str) -> dict:
    """Runs test_local_server.py's ``basics`` client under ``python``; its last JSON line."""
    said = subprocess.run(
        [python, CLIENT, "basics", target, out],
        capture_output=True,
        text=True,
        timeout=240,
        env=server_client.client_env(target),
    )
    lines = [line for line in said.stdout.splitlines() if line.startswith("{")]
    assert said.returncode == 0 and lines, said.stderr[-3000:]
    result: dict = json.loads(lines[-1])
    return result


def serve(python: str, socket_path: str) -> tuple[subprocess.Popen[str], str]:
    """``pathways-local serve`` for 2x4 under ``python``, and its target once it serves."""
    process = subprocess.Popen(
        [python, "-m", "pathways_kernel.server", "serve", "--slices", "2x4", "--socket", socket_path],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 120  # waits for its first line, at most 2 min under load
    for line in process.stdout:
        if line.startswith(server_protocol.SERVING_LINE):
            return process, line.rsplit(" ", 1)[1].strip()
        assert time.monotonic() < deadline, "the server did not say it serves within 2 min"
    raise AssertionError(f"the server under {python} ended before it served (rc {process.wait(10)})")


def test_a_client_of_another_jaxlib_runs_on_this_server(other, tmp_path):
    server = server_client.start(2, 4)
    try:
        got = basics(other, server.target, str(tmp_path / "params.npz"))
    finally:
        server.stop()
    assert got["arange"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], (jaxlib_version(other), got)
    assert got["sharded_equal"] is True and got["donated"] is True, got


def test_this_client_runs_on_a_server_under_another_jaxlib(other, tmp_path):
    directory = tempfile.mkdtemp(prefix="pathways-local-")
    process, target = serve(other, f"{directory}/server.sock")
    try:
        got = basics(sys.executable, target, str(tmp_path / "params.npz"))
    finally:
        process.terminate()
        process.wait(30)
    assert got["arange"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], (jaxlib_version(other), got)
    assert got["sharded_equal"] is True and got["donated"] is True, got
