"""Small-object operations on a location: manifests, listings, generations.

``objects_for(location)`` gives a Cloud Storage bucket (google-cloud-storage, one
client per endpoint) or a local directory behind one interface; bulk bytes go
through tensorstore (``kvstore``, ``tensorstore_context``).
"""

from __future__ import annotations

import builtins
import os
import secrets
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pathways_kernel.core.errors import StorageError
from pathways_kernel.core.locations import Location, emulator_env, endpoint, retry_seconds
from pathways_kernel.core.storage_errors import no_credentials

#: Requests in flight at once.
CONCURRENCY = 16
#: Modes of what a snapshot or a trace writes in a local directory: its owner's alone.
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


# -- where manifests live -----------------------------------------------------
class ObjectStore:
    """Small-object operations: manifests, listings, generations."""

    def read(self, key: str) -> bytes | None:
        raise NotImplementedError

    def create(self, key: str, data: bytes) -> int | None:
        """Write ``key`` only if absent; returns its generation, raises ``FileExistsError``."""
        raise NotImplementedError

    def list(self, prefix: str) -> dict[str, dict[str, Any]]:
        """name -> {size, crc32c, generation} for objects under ``prefix``."""
        raise NotImplementedError

    def check(self, location: Location, write: bool = True) -> None:
        """Raise a ``StorageError`` if the bucket/directory cannot be read (or written)."""

    def missing_dirs(self, location: Location) -> builtins.list[str]:  # `list` is a method here
        """Directories that writing under ``location`` will create, deepest first (none in a bucket)."""
        return []

    def discard(self, prefix: str, made: Sequence[str] = ()) -> None:
        """Delete what a failed upload wrote under ``prefix``, and the directories ``made`` for it."""
        raise NotImplementedError

    def kvstore(self, location: Location) -> dict[str, Any]:
        raise NotImplementedError

    def make_private_dirs(self, location: Location) -> None:
        """Create ``location``'s directory and the missing ones above it, each readable by its owner only
        (nothing to do in a bucket: IAM decides there)."""

    def make_private(self, location: Location) -> None:
        """Make what was written under ``location`` its owner's only (nothing to do in a bucket)."""


class GcsObjects(ObjectStore):
    def __init__(self, bucket: str):
        self.bucket_name = bucket
        self._client = _gcs_client()
        self.bucket = self._client.bucket(bucket)

    def _retry(self) -> Any:
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY.with_deadline(retry_seconds()).with_delay(initial=0.1, maximum=2.0)

    def read(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            data: bytes = self.bucket.blob(key).download_as_bytes(retry=self._retry(), timeout=30)
            return data
        except NotFound:
            # Tell a missing bucket from a missing object.
            self.check(None)
            return None

    def create(self, key: str, data: bytes) -> int | None:
        from google.api_core.exceptions import PreconditionFailed

        blob = self.bucket.blob(key)
        try:
            # A retried create may find its own earlier attempt: callers compare contents.
            blob.upload_from_string(
                data,
                content_type="application/json",
                if_generation_match=0,
                retry=self._retry(),
                timeout=30,
                checksum="crc32c",
            )
        except PreconditionFailed:
            raise FileExistsError(key) from None
        generation: int | None = blob.generation
        return generation

    def list(self, prefix: str) -> dict[str, dict[str, Any]]:
        out = {}
        for blob in self._client.list_blobs(self.bucket_name, prefix=prefix, retry=self._retry(), timeout=30):
            out[blob.name] = {"size": blob.size, "crc32c": blob.crc32c, "generation": blob.generation}
        return out

    def check(self, location: Location | None, write: bool = True) -> None:
        from google.api_core.exceptions import Forbidden, NotFound

        try:
            self.bucket.reload(retry=self._retry(), timeout=30)
        except Forbidden:
            # Object-level roles (e.g. roles/storage.objectAdmin) may not read bucket
            # metadata; the object operations that follow tell whether access is denied.
            return
        except NotFound:
            raise StorageError(
                f"bucket '{self.bucket_name}' does not exist: create it (gcloud storage buckets create "
                f"gs://{self.bucket_name}) or fix the URL"
            ) from None

    def discard(self, prefix: str, made: Sequence[str] = ()) -> None:
        try:
            # One quick attempt: when the server is gone the objects stay, unreferenced and never listed.
            for blob in self._client.list_blobs(self.bucket_name, prefix=prefix, retry=None, timeout=5):
                blob.delete(retry=None, timeout=5)
        except Exception:  # the upload's own failure is what gets reported
            pass

    def kvstore(self, location: Location) -> dict[str, Any]:
        return {"driver": "gcs", "bucket": location.bucket, "path": location.path + "/"}


class LocalObjects(ObjectStore):
    def read(self, key: str) -> bytes | None:
        try:
            return Path(key).read_bytes()
        except FileNotFoundError:
            return None

    def create(self, key: str, data: bytes) -> int | None:
        target = Path(key)
        private_dirs(target.parent)
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            # link(2) fails if the name exists: the local if_generation_match=0.
            os.link(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return None

    def list(self, prefix: str) -> dict[str, dict[str, Any]]:
        root = Path(prefix)
        if not root.is_dir():
            return {}
        return {
            str(p): {"size": p.stat().st_size, "crc32c": None, "generation": None}
            for p in root.rglob("*")
            if p.is_file()
        }

    def check(self, location: Location | None, write: bool = True) -> None:
        if location is None:
            return
        existing = Path(location.path)
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise StorageError(f"cannot use {location.url}: {existing} is a file, not a directory")
        if not write:
            # A path that does not exist yet holds nothing to read: listing it is empty, not an error.
            if existing == Path(location.path) and not os.access(existing, os.R_OK | os.X_OK):
                raise StorageError(f"cannot read {location.url}: permission denied")
            return
        if not os.access(existing, os.W_OK | os.X_OK):
            if os.statvfs(existing).f_flag & os.ST_RDONLY:
                raise StorageError(
                    f"cannot write under {location.url}: {existing} is on a read-only file system; choose a writable directory"
                )
            raise StorageError(f"cannot write under {location.url}: permission denied on {existing}")

    def missing_dirs(self, location: Location) -> builtins.list[str]:
        missing = []
        path = Path(location.path)
        while not path.exists():
            missing.append(str(path))
            path = path.parent
        return missing

    def discard(self, prefix: str, made: Sequence[str] = ()) -> None:
        shutil.rmtree(prefix, ignore_errors=True)
        remove_empty(made)

    def kvstore(self, location: Location) -> dict[str, Any]:
        return {"driver": "file", "path": location.path + "/"}

    def make_private_dirs(self, location: Location) -> None:
        private_dirs(location.path)

    def make_private(self, location: Location) -> None:
        make_private(location.path)


def private_dirs(path: str | Path) -> None:
    """Create ``path`` and its missing parents, each ``PRIVATE_DIR`` (``mkdir(parents=True)`` and
    ``os.makedirs`` give the parents the umask's mode, 0755 as a rule)."""
    missing = []
    directory = Path(path)
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for made in reversed(missing):
        made.mkdir(mode=PRIVATE_DIR, exist_ok=True)  # exist_ok: made meanwhile by another writer


def make_private(path: str | Path) -> None:
    """Directories under ``path`` (itself included) ``PRIVATE_DIR``, files ``PRIVATE_FILE``: what
    tensorstore and the profiler wrote there has the umask's modes (0755, 0644 as a rule)."""
    root = Path(path)
    for entry in [root, *root.rglob("*")]:
        if entry.is_symlink():
            continue
        try:
            entry.chmod(PRIVATE_DIR if entry.is_dir() else PRIVATE_FILE)
        except (FileNotFoundError, PermissionError):  # gone meanwhile, or another user's
            continue


def remove_empty(made: Sequence[str]) -> None:
    """Remove directories ``made`` by a failed write (deepest first), up to the first one not empty."""
    for directory in made:
        try:
            os.rmdir(directory)
        except OSError:  # not empty: someone else writes there too
            break


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def _gcs_client() -> Any:
    """One google-cloud-storage client per endpoint (anonymous on an emulator)."""
    from google.auth import exceptions as aexc
    from google.cloud import storage

    emulator_env()
    key = endpoint()
    with _clients_lock:
        if key not in _clients:
            if os.environ.get("STORAGE_EMULATOR_HOST"):
                from google.auth.credentials import AnonymousCredentials

                client = storage.Client(
                    project=os.environ.get("GOOGLE_CLOUD_PROJECT", "emulator"), credentials=AnonymousCredentials()
                )
            else:
                try:
                    client = storage.Client()
                except aexc.DefaultCredentialsError as exc:
                    raise StorageError(f"gs:// needs Google Cloud credentials: {no_credentials(exc)}") from None
            _clients[key] = client
        return _clients[key]


def objects_for(location: Location) -> ObjectStore:
    return GcsObjects(location.bucket) if location.scheme == "gs" else LocalObjects()


def tensorstore_context() -> Any:
    import tensorstore as ts

    retries = retry_seconds()
    return ts.Context(
        {
            # ~retries seconds of exponential backoff, capped at 2 s per wait.
            "gcs_request_retries": {
                "max_retries": max(1, int(retries / 2) + 3),
                "initial_delay": "0.1s",
                "max_delay": "2s",
            },
            "gcs_request_concurrency": {"limit": CONCURRENCY},
        }
    )
