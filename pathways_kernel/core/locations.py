"""Where durable bytes live: ``gs://BUCKET/PREFIX`` and local-directory URLs, and the
storage environment (an emulator's address, how long to retry).

In core because every layer that keeps bytes (snapshots, checkpoints, the compile
cache, profiles) and the local Pathways server reach the same places the same way.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from pathways_kernel.core.errors import StorageError
from pathways_kernel.core.text import shown

#: Seconds of retries before an unreachable server is reported (env override).
RETRY_ENV = "PATHWAYS_STORAGE_RETRY_S"
DEFAULT_RETRY_S = 60.0
MAX_RETRY_S = 3600.0

#: Longest gs:// prefix: a snapshot adds up to 256 bytes of names under it
#: (id, data token, leaf, chunk), and Cloud Storage object names end at 1024.
MAX_GCS_PREFIX = 1024 - 256
#: Linux's PATH_MAX and NAME_MAX.
MAX_LOCAL_PATH = 4095
MAX_LOCAL_NAME = 255

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}$")


# -- URLs ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Location:
    """A parsed ``gs://BUCKET/PREFIX`` or local directory."""

    scheme: str  # "gs" or "file"
    bucket: str  # "" for local paths
    path: str  # object prefix (gs) or absolute directory (file), no trailing slash

    @property
    def url(self) -> str:
        if self.scheme == "gs":
            return f"gs://{self.bucket}/{self.path}" if self.path else f"gs://{self.bucket}"
        return self.path

    def child(self, name: str) -> Location:
        joined = f"{self.path}/{name}" if self.path else name
        return dataclasses.replace(self, path=joined)

    def key(self, name: str) -> str:
        """The object name (gs) or file path (local) of ``name`` under this location."""
        return f"{self.path}/{name}" if self.path else name

    def __str__(self) -> str:
        return self.url


def parse_url(url: str) -> Location:
    """``gs://bucket/prefix``, ``file:///dir`` or a path -> ``Location``.

    Local paths are made absolute and normalised (``/x/../y`` is ``/y``), so
    every command names one directory the same way. A Cloud Storage prefix
    must leave room under it for the object names a snapshot needs.

    Raises:
      StorageError: an unsupported scheme, a malformed bucket name, an empty
        URL, control characters, a name too long for the store, ``..`` in a
        Cloud Storage prefix.
    """
    if not isinstance(url, (str, os.PathLike)) or not str(url).strip():
        raise StorageError(f"no storage URL given ({url!r}): use gs://BUCKET/PREFIX or a local directory")
    url = str(url).strip()
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise StorageError(f"malformed storage URL {_shown(url)}: it contains control characters (NUL, newline, ...)")
    scheme, sep, rest = url.partition("://")
    if not sep:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", url):
            raise StorageError(f"malformed storage URL {_shown(url)}: use gs://BUCKET/PREFIX or a local directory")
        return _local(url, url)
    if scheme == "file":
        return _local(rest, url)
    if scheme != "gs":
        raise StorageError(
            f"unsupported storage URL {_shown(url)}: use gs://BUCKET/PREFIX (Cloud Storage) or a local directory"
        )
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise StorageError(
            f"malformed Cloud Storage URL {_shown(url)}: {_shown(bucket)} is not a bucket name "
            "(3-63 lowercase letters, digits, '-', '_' or '.'); use gs://BUCKET/PREFIX"
        )
    prefix = prefix.strip("/")
    if "//" in prefix or any(part in (".", "..") for part in prefix.split("/") if prefix):
        raise StorageError(f"malformed Cloud Storage URL {_shown(url)}: empty or relative path segments in the prefix")
    if len(prefix.encode()) > MAX_GCS_PREFIX:
        raise StorageError(
            f"Cloud Storage prefix of {len(prefix.encode())} bytes in {_shown(url)} is too long: at most {MAX_GCS_PREFIX}, "
            "so that the object names under it fit in the 1024 bytes Cloud Storage allows"
        )
    return Location("gs", bucket, prefix)


def _local(path: str, url: str) -> Location:
    normal = os.path.normpath(os.path.abspath(os.path.expanduser(path)))
    encoded = normal.encode()
    if len(encoded) > MAX_LOCAL_PATH or any(len(part) > MAX_LOCAL_NAME for part in encoded.split(b"/")):
        raise StorageError(
            f"local path {_shown(url)} is too long: at most {MAX_LOCAL_PATH} bytes, {MAX_LOCAL_NAME} per directory name"
        )
    return Location("file", "", normal)


def _shown(text: str) -> str:
    return shown(text, 80)


def check_id(snapshot_id: str) -> str:
    if not _ID.match(snapshot_id):
        raise StorageError(
            f"bad snapshot id '{snapshot_id}': use letters, digits, '.', '_', '-' or '=' (no '/'), at most 200 characters"
        )
    return snapshot_id


# -- environment --------------------------------------------------------------
def emulator_env() -> None:
    """Derive tensorstore's and gcsfs's emulator settings from STORAGE_EMULATOR_HOST.

    google-cloud-storage needs only ``STORAGE_EMULATOR_HOST``; tensorstore
    and gcsfs each want their own variables. Existing
    values win.
    """
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    # Without it gcsfs probes for hierarchical namespaces and stalls 60 s per probe.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    if not host:
        return
    if not host.startswith("http"):
        host = f"http://{host}"
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", host)
    os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
    os.environ.setdefault("FSSPEC_GCS_TOKEN", "anon")


def retry_seconds() -> float:
    """``PATHWAYS_STORAGE_RETRY_S``, or the default when it is not a finite number of seconds."""
    try:
        seconds = float(os.environ.get(RETRY_ENV, DEFAULT_RETRY_S))
    except ValueError:
        return DEFAULT_RETRY_S
    # inf would overflow the retry counts given to tensorstore; nan compares false with everything.
    return min(max(0.0, seconds), MAX_RETRY_S) if math.isfinite(seconds) else DEFAULT_RETRY_S


def endpoint() -> str:
    return os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
