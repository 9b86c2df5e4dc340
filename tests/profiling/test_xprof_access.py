"""Who can read the XProf that jupyter-server-proxy starts: the Jupyter server, with its token, only.

A real ``jupyter lab`` (tests/support/lab.py) starts XProf on the first request to
``/xprof/``; the test then tries every socket that XProf process listens on as
another local user (``nobody``, through ``setpriv``): it must reach none, while the
same listing through the Jupyter server with its token works.
"""

from __future__ import annotations

import gzip
import json
import shutil
import stat
import subprocess
import urllib.request
from pathlib import Path

import lab as labtools
import pytest
from waiting import wait_until

pytestmark = [
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv is not installed: cannot act as another user"),
]

#: XProf's list of runs, as its page asks for it.
RUNS = "data/plugin/profile/runs"

#: Run as ``nobody``: GET the runs from one of XProf's sockets (``tcp:HOST:PORT`` or ``unix:PATH``).
AS_NOBODY = """
import http.client, socket, sys
kind, _, where = sys.argv[1].partition(":")
try:
    if kind == "unix":
        conn = http.client.HTTPConnection("localhost", timeout=10)
        conn.sock = socket.socket(socket.AF_UNIX)
        conn.sock.settimeout(10)
        conn.sock.connect(where)
    else:
        host, _, port = where.rpartition(":")
        conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=10)
    conn.request("GET", "/" + sys.argv[2])
    print(conn.getresponse().status)
except OSError as error:
    print(type(error).__name__)
"""


def _xprof_pids(root: Path) -> set[str]:
    found = subprocess.run(["pgrep", "-f", "pathways_kernel.profiling.xprof_server"], capture_output=True, text=True)
    return {
        pid for pid in found.stdout.split() if str(root) in Path(f"/proc/{pid}/environ").read_text(errors="replace")
    }


def _listeners(pids: set[str]) -> list[str]:
    """``tcp:ADDR:PORT`` and ``unix:PATH`` of every listening socket of ``pids``."""
    found = []
    for kind, flags in (("tcp", "-Hltnp"), ("unix", "-Hlxp")):
        out = subprocess.run(["ss", flags], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if any(f"pid={pid}," in line for pid in pids):
                local = line.split()[4] if kind == "unix" else line.split()[3]
                found.append(f"{kind}:{local}")
    return found


def test_only_the_jupyter_server_reaches_xprof(tmp_path):
    profiles = tmp_path / "profiles"
    run = profiles / "20260101-000000-p1" / "plugins" / "profile" / "20260101-000000-first"
    run.mkdir(parents=True)
    (run / "host.xplane.pb").write_bytes(b"")
    lab = labtools.Lab(tmp_path, env={"PATHWAYS_PROFILE_DIR": str(profiles)})
    try:
        base = f"http://127.0.0.1:{lab.port}/xprof/"
        # The first request starts XProf (it reads the profile root before it answers).
        with urllib.request.urlopen(f"{base}{RUNS}?token={lab.token}", timeout=120) as reply:
            assert reply.status == 200
            body = reply.read()
            runs = json.loads(gzip.decompress(body) if reply.headers.get("Content-Encoding") == "gzip" else body)
            assert "20260101-000000-p1/20260101-000000-first" in runs, runs
        # Without the token: the login page, not the runs.
        with urllib.request.urlopen(f"{base}{RUNS}", timeout=30) as reply:
            assert "/login" in reply.url and b"20260101-000000-first" not in reply.read(), reply.url

        assert wait_until(lambda: _xprof_pids(tmp_path), timeout=30), "no XProf process"
        pids = _xprof_pids(tmp_path)
        listeners = _listeners(pids)
        assert listeners, "XProf listens on nothing ss can see"
        assert not [s for s in listeners if s.startswith("tcp:")], f"XProf listens on TCP: {listeners}"
        for listener in listeners:
            path = Path(listener.removeprefix("unix:"))
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, f"{path.parent} is not private"
            as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c"]
            out = subprocess.run([*as_nobody, AS_NOBODY, listener, RUNS], capture_output=True, text=True, timeout=60)
            assert out.stdout.strip() == "PermissionError", (listener, out.stdout, out.stderr)
    finally:
        lab.stop()
    assert not _xprof_pids(tmp_path), "XProf outlived the Jupyter server"


def test_xprof_refuses_a_socket_in_a_directory_others_can_enter(tmp_path):
    from pathways_kernel.profiling import xprof_server

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(SystemExit) as refused:
        xprof_server.main(["--socket", str(shared / "xprof.sock"), "--logdir", str(tmp_path)])
    assert str(refused.value) == (
        f"pathways-xprof: {shared} must be a directory only you can enter (chmod 700): "
        "whoever reaches the socket reads every profile"
    )
    assert list(shared.iterdir()) == []
