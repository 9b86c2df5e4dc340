"""A real JupyterLab server and Debian's Chromium, for browser tests and the panel benchmark.

`Lab(root)` starts `jupyter lab` headless on a free 127.0.0.1 port with a
token, its own settings and workspace dirs, news off, and the venv's
`pathways` kernelspec and labextension on its paths. `browser()` launches
/usr/bin/chromium through Python Playwright (never a downloaded browser).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def missing() -> str | None:
    """Why browser tests cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} not installed (make test installs Debian's chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Python package playwright not installed (pip install -e '.[test]')"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def notebook(path: Path, cells: list[str], kernel: str = "pathways") -> Path:
    """Write a notebook on `kernel` with code `cells` (not executed)."""
    nb = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [], "source": src}
            for i, src in enumerate(cells)
        ],
        "metadata": {
            "kernelspec": {"name": kernel, "display_name": kernel, "language": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


class Lab:
    """`jupyter lab` serving `root`; `.url(path)` opens a file with the token."""

    def __init__(self, root: Path, env: dict[str, str] | None = None):
        self.root = root
        self.port = free_port()
        self.token = secrets.token_hex(16)
        state = root / ".lab"
        settings = state / "app-settings"
        settings.mkdir(parents=True, exist_ok=True)
        # The news toast covers the panel; the flag alone does not stop the check.
        (settings / "overrides.json").write_text(
            json.dumps(
                {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
            )
        )
        venv = Path(sys.prefix)
        self.env = {
            **os.environ,
            "JUPYTER_PATH": str(venv / "share" / "jupyter"),
            "JUPYTER_CONFIG_DIR": str(state / "config"),
            "JUPYTER_RUNTIME_DIR": str(state / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(state / "user-settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(state / "workspaces"),
            "JAX_PLATFORMS": "cpu",
            **(env or {}),
        }
        argv = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.news_url=None",
            f"--LabApp.app_settings_dir={settings}",
            # window.jupyterapp: tests run commands and read state like a user's clicks would.
            "--LabApp.expose_app_in_browser=True",
        ]
        if os.geteuid() == 0:
            argv.append("--allow-root")
        self.log = open(state / "server.log", "wb")  # noqa: SIM115 - the server writes it until stop()
        self.proc = subprocess.Popen(argv, cwd=root, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout=60)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited {self.proc.returncode}: {self.log_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.api("status"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.25)
        raise TimeoutError(f"jupyter lab not ready in {timeout} s: {self.log_text()[-2000:]}")

    def api(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/api/{path}?token={self.token}"

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/lab/tree/{path}?token={self.token}&reset"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.api(path), timeout=10) as r:
            return json.loads(r.read())

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.root / ".lab" / "server.log").read_text(errors="replace")

    def stop(self) -> None:
        # Shut kernels down through the server so none outlives the test.
        with contextlib.suppress(Exception):
            for k in self.get("kernels"):
                req = urllib.request.Request(self.api(f"kernels/{k['id']}"), method="DELETE")
                urllib.request.urlopen(req, timeout=10).close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@contextlib.contextmanager
def browser(user_data_dir: Path) -> Iterator[Any]:
    """A Playwright Chromium browser (Debian's), closed on exit."""
    from playwright.sync_api import sync_playwright

    shutil.rmtree(user_data_dir, ignore_errors=True)
    user_data_dir.mkdir(parents=True)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(user_data_dir),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


@contextlib.contextmanager
def page_of(tmp_path_factory: Any, viewport: tuple[int, int] | None = None) -> Iterator[Any]:
    """One page of a fresh Chromium (a profile of its own), waiting up to 60 s for what it is
    asked; at ``viewport`` (width, height) if given, else the browser's 1400x900."""
    with browser(tmp_path_factory.mktemp("chromium")) as context:
        page = context.new_page()
        page.set_default_timeout(60_000)
        if viewport is not None:
            page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
        yield page
