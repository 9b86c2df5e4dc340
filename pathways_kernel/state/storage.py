"""Durable snapshots: host snapshots persisted to Cloud Storage or a local path.

Layout under a prefix (``gs://BUCKET/PREFIX`` or a directory)::

    PREFIX/ID/manifest.json                 written last, only if absent
    PREFIX/ID/data.TOKEN/LLLL/zarr.json     leaf L: its bytes as a 1-D uint8 zarr3 array,
    PREFIX/ID/data.TOKEN/LLLL/c/N           8 MiB per chunk object, each with a CRC32C

A snapshot exists once its manifest does. The manifest (checksums, sizes,
dtypes, shapes, PartitionSpecs, object generations) is written last with
``if_generation_match=0`` (locally: a hard link, which fails if the name is
taken), so a crash or an outage mid-upload leaves only unreferenced data
objects: never a listed or restorable partial snapshot, and never an
overwritten one. Data objects carry a per-upload token so that two uploads of
the same id cannot touch each other's bytes; the loser of the manifest race
is refused as a duplicate.

Bulk bytes go through tensorstore (zarr3 arrays written straight from the
host arrays by its C++ threads, which do not hold the GIL: upload threads
in Python stalled the notebook for up to 0.9 s); manifests and listings through google-cloud-storage. The
manifest records every data object's size, CRC32C and generation as the
server reported them after the upload. Restore reads the manifest, checks
that the data fits in host memory and that every object is still there and
unchanged, reads the chunks (tensorstore verifies each chunk's own CRC32C)
and hands a host ``Snapshot`` to ``snapshots.restore`` for the mesh.

Pointing at an emulator: ``STORAGE_EMULATOR_HOST=http://HOST:PORT`` is enough;
the tensorstore and gcsfs settings are derived from it (``emulator_env``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pathways_kernel.core.errors import StorageError, one_line
from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.text import shown
from pathways_kernel.state.transfers import Transfer

FORMAT = "pathways-snapshot/1"
MANIFEST = "manifest.json"
#: Size of each data object: large enough for full-speed uploads, small
#: enough for a smooth progress bar and cheap retries.
CHUNK_BYTES = 8 << 20
#: Requests in flight at once.
CONCURRENCY = 16
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


# -- errors -------------------------------------------------------------------
def storage_error(exc: BaseException, what: str, where: Location | str) -> StorageError:
    """Map a client library exception to the one line a user sees."""
    if isinstance(exc, StorageError):
        return exc
    where = str(where)
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    bucket = where.split("/")[2] if where.startswith("gs://") else ""
    if isinstance(exc, gexc.RetryError) and exc.cause is not None:
        return storage_error(exc.cause, what, where)
    text = f"{type(exc).__name__}: {exc}"
    if not bucket and (local := _local_failure(exc, text)):
        return StorageError(f"{what} {where} failed: {local}")
    if isinstance(exc, gexc.TooManyRequests) or (bucket and "RESOURCE_EXHAUSTED" in text):
        return StorageError(
            f"{what} {where} failed: Cloud Storage refused it (rate limit or quota exceeded); retry later"
        )
    if isinstance(exc, aexc.DefaultCredentialsError):
        return StorageError(f"{what} {where} failed: {no_credentials(exc)}")
    if isinstance(exc, (aexc.RefreshError, aexc.TransportError)):
        # The credentials were found; the token endpoint failed (before the check on connections below,
        # which would blame Cloud Storage for it).
        return StorageError(f"{what} {where} failed: {no_token(exc)}")
    if isinstance(exc, (gexc.Forbidden, gexc.Unauthorized)) or re.search(
        r"PERMISSION_DENIED|UNAUTHENTICATED|http_response_code='40[13]'", text
    ):
        return StorageError(
            f"{what} {where} failed: permission denied; give the credentials in use "
            f"(application default credentials) storage.objects access on gs://{bucket or '...'}"
        )
    if isinstance(exc, gexc.NotFound) or text.startswith("ValueError: NOT_FOUND"):
        if bucket:
            return StorageError(f"{what} {where} failed: bucket '{bucket}' does not exist; create it or fix the URL")
        return StorageError(f"{what} {where} failed: {_short(exc)}")
    if "Digest mismatch" in text:
        return StorageError(f"{what} {where} failed: {where} is damaged: a chunk fails its CRC32C check")
    if isinstance(exc, MemoryError):
        return StorageError(f"{what} {where} failed: out of host memory")
    if _is_connection_error(exc) or re.search(r"CURL error|UNAVAILABLE|ABORTED|DEADLINE_EXCEEDED|Connection", text):
        return StorageError(
            f"{what} {where} failed: cannot reach Cloud Storage at {endpoint()} ({_short(exc)}); "
            "nothing partial was committed, retry when it is back"
        )
    if isinstance(exc, gexc.GoogleAPICallError):
        return StorageError(f"{what} {where} failed: {_short(exc)}")
    if isinstance(exc, OSError):
        return StorageError(f"{what} {where} failed: {exc.strerror or exc}")
    raise exc


#: Where google-auth reads a credentials file (a service-account key) before gcloud's own.
CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"


def no_credentials(exc: BaseException) -> str:
    """Why google-auth found no usable credentials: none at all, or a credentials file it cannot use."""
    key = os.environ.get(CREDENTIALS_ENV)
    if not key:
        return (
            "no Google Cloud credentials; run `gcloud auth application-default login` "
            "(or set STORAGE_EMULATOR_HOST to use an emulator)"
        )
    # google-auth's message names the file and what is wrong with it, never the key's contents.
    why = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    return f"the credentials file {key} ({CREDENTIALS_ENV}) cannot be used: {_short_text(why)}; fix or replace it"


def no_token(exc: BaseException) -> str:
    """The credentials were found, but getting an access token failed: which ones, from where, and why.

    Names the key file and its token endpoint, never the key: its fields are read
    here only for ``type`` and ``token_uri``.
    """
    key = os.environ.get(CREDENTIALS_ENV)
    found, token_uri = "the application default credentials were found", ""
    if key:
        try:
            with open(key, encoding="utf-8") as f:
                info = json.load(f)
            kind = "service-account key" if info.get("type") == "service_account" else "credentials file"
            token_uri = str(info.get("token_uri") or "")
        except (OSError, ValueError, AttributeError):
            kind = "credentials file"
        found = f"the {kind} {key} ({CREDENTIALS_ENV}) was found"
    source = f" from {token_uri}" if token_uri else ""
    return (
        f"{found}, but getting an access token{source} failed: {_token_failure(exc)}; check that this machine "
        "reaches the token endpoint (proxy, firewall) and that the key is still valid (not deleted or disabled)"
    )


def _token_failure(exc: BaseException) -> str:
    """The root of a token request's failure: the endpoint's own error, or the network's."""
    from google.auth import exceptions as aexc

    if isinstance(exc, aexc.RefreshError) and exc.args and isinstance(exc.args[0], str):
        return _short_text(exc.args[0])  # e.g. "invalid_grant: Invalid JWT Signature."
    root, seen = exc, set()
    while (cause := root.__cause__ or root.__context__) is not None and id(cause) not in seen:
        seen.add(id(root))
        root = cause
    if isinstance(root, OSError) and root.strerror:
        return root.strerror
    return _short(root)


_NO_SPACE = re.compile(r"No space left|Disk quota exceeded|os_error_code='(28|122)'")
_READ_ONLY = re.compile(r"Read-only file system|os_error_code='30'")
_DENIED = re.compile(r"Permission denied|PERMISSION_DENIED|os_error_code='(1|13)'")


def _local_failure(exc: BaseException, text: str) -> str | None:
    """What went wrong with a local directory, from an OSError or a tensorstore status."""
    code = getattr(exc, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT) or _NO_SPACE.search(text):
        return "no space left on its file system (or the disk quota is used up); free some space or choose another directory"
    if code == errno.EROFS or _READ_ONLY.search(text):
        return "it is on a read-only file system; choose a writable directory"
    if code in (errno.EACCES, errno.EPERM) or _DENIED.search(text):
        return "permission denied; fix its permissions or choose another directory"
    return None


@contextlib.contextmanager
def errors_as(what: str, where: Location | str) -> Iterator[None]:
    """Turn client library failures inside the block into one-line ``StorageError``s."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        raise storage_error(exc, what, where) from exc


def _is_connection_error(exc: BaseException) -> bool:
    import requests

    return isinstance(
        exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, socket.timeout)
    )


def _short(exc: BaseException) -> str:
    return _short_text(re.sub(r"\[http_response_body=.*", "", " ".join(str(exc).split())))


def _short_text(text: str) -> str:
    text = " ".join(text.split())
    return (text[:160] + "...") if len(text) > 160 else text


# -- where manifests live -----------------------------------------------------
class _Objects:
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

    def missing_dirs(self, location: Location) -> list[str]:
        """Directories that writing under ``location`` will create, deepest first (none in a bucket)."""
        return []

    def discard(self, prefix: str, made: Sequence[str] = ()) -> None:
        """Delete what a failed upload wrote under ``prefix``, and the directories ``made`` for it."""
        raise NotImplementedError

    def kvstore(self, location: Location) -> dict[str, Any]:
        raise NotImplementedError


class _Gcs(_Objects):
    def __init__(self, bucket: str):
        self.bucket_name = bucket
        self._client = _gcs_client()
        self.bucket = self._client.bucket(bucket)

    def _retry(self):
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY.with_deadline(retry_seconds()).with_delay(initial=0.1, maximum=2.0)

    def read(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return self.bucket.blob(key).download_as_bytes(retry=self._retry(), timeout=30)
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
        return blob.generation

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


class _Local(_Objects):
    def read(self, key: str) -> bytes | None:
        try:
            return Path(key).read_bytes()
        except FileNotFoundError:
            return None

    def create(self, key: str, data: bytes) -> int | None:
        target = Path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            with open(tmp, "wb") as f:
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

    def missing_dirs(self, location: Location) -> list[str]:
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


def remove_empty(made: Sequence[str]) -> None:
    """Remove directories ``made`` by a failed write (deepest first), up to the first one not empty."""
    for directory in made:
        try:
            os.rmdir(directory)
        except OSError:  # not empty: someone else writes there too
            break


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def _gcs_client():
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


def objects_for(location: Location) -> _Objects:
    return _Gcs(location.bucket) if location.scheme == "gs" else _Local()


def _context() -> Any:
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


# -- manifests ----------------------------------------------------------------
def _spec_to_json(spec: Any) -> list | None:
    if spec is None:
        return None
    return [None if e is None else e if isinstance(e, str) else list(e) for e in tuple(spec)]


def _spec_from_json(entries: list | None) -> Any:
    from jax.sharding import PartitionSpec

    if entries is None:
        return None
    return PartitionSpec(*(None if e is None else e if isinstance(e, str) else tuple(e) for e in entries))


def _keys_to_json(path: Sequence[Any]) -> list[list[Any]]:
    from jax import tree_util as tu

    out = []
    for key in path:
        if isinstance(key, tu.DictKey):
            k = key.key
            out.append(["dict", k if isinstance(k, (str, int)) else str(k)])
        elif isinstance(key, tu.SequenceKey):
            out.append(["seq", key.idx])
        elif isinstance(key, tu.GetAttrKey):
            out.append(["attr", key.name])
        elif isinstance(key, tu.FlattenedIndexKey):
            out.append(["seq", key.key])
        else:
            out.append(["dict", str(key)])
    return out


def _tree_from_keys(keys: list[list[list[Any]]], values: list[Any]) -> Any:
    """Rebuild nested dicts/lists from leaf key paths (attributes become dict keys)."""
    if len(keys) == 1 and not keys[0]:
        return values[0]
    root: Any = None

    def container(kind: str) -> Any:
        return [] if kind == "seq" else {}

    for path, value in zip(keys, values, strict=True):
        if root is None:
            root = container(path[0][0])
        node = root
        for depth, (_kind, k) in enumerate(path):
            last = depth == len(path) - 1
            child = value if last else container(path[depth + 1][0])
            if isinstance(node, list):
                while len(node) <= k:
                    node.append(None)
                if node[k] is None:
                    node[k] = child
                node = node[k]
            else:
                node = node.setdefault(k, child)
    return root


def tree_from_stored_keys(keys: list[Any], values: list[Any], where: str) -> Any:
    """``_tree_from_keys`` for key paths read back from storage (``where`` names it).

    Raises:
      StorageError: the paths do not form one tree holding every value once
        (a list under a dict key, a leaf that is also a parent, a duplicate).
    """
    import jax

    try:
        tree = _tree_from_keys(keys, values)
    except (AttributeError, TypeError, IndexError, KeyError, ValueError):
        tree = None
    if values and (tree is None or len(jax.tree_util.tree_leaves(tree)) != len(values)):
        raise StorageError(f"{where} is damaged: its leaves' key paths do not form one tree; restore another one")
    return tree


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    """A committed snapshot as its manifest describes it."""

    id: str
    url: str
    name: str
    step: int | None
    created: float
    committed: float
    nbytes: int
    leaves: int
    manifest: dict[str, Any] = dataclasses.field(repr=False, compare=False)

    def summary(self) -> str:
        step = "" if self.step is None else f"  step {self.step}"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created))
        return f"{self.id:<24} {format_bytes(self.nbytes):>10}  {self.leaves:>4} arrays  {when}{step}  {self.url}"


class SnapshotList(list):
    """Committed snapshots under a prefix, oldest first; renders as a table."""

    def __init__(self, url: str, infos: Sequence[SnapshotInfo]):
        super().__init__(infos)
        self.url = url

    def __repr__(self) -> str:
        if not self:
            return f"no committed snapshots under {self.url}"
        return "\n".join(info.summary() for info in self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        import html

        if not self:
            return f"<i>no committed snapshots under {html.escape(self.url)}</i>"
        head = "".join(f"<th>{h}</th>" for h in ("id", "name", "step", "size", "arrays", "created", "url"))
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(c))}</td>"
                for c in (
                    i.id,
                    i.name,
                    "" if i.step is None else i.step,
                    format_bytes(i.nbytes),
                    i.leaves,
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.created)),
                    i.url,
                )
            )
            + "</tr>"
            for i in self
        )
        return f'<table class="pathways-snapshots"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _info(location: Location, manifest: dict[str, Any]) -> SnapshotInfo:
    return SnapshotInfo(
        id=manifest["id"],
        url=location.url,
        name=manifest["name"],
        step=manifest.get("step"),
        created=manifest["created"],
        committed=manifest["committed"],
        nbytes=manifest["nbytes"],
        leaves=len(manifest["leaves"]),
        manifest=manifest,
    )


def _parse_manifest(data: bytes | None, check: bool = True) -> dict[str, Any] | None:
    """A manifest dict, or ``None`` for bytes that are not a complete manifest
    (with ``check``: nor one a restore can trust, see ``_valid_manifest``)."""
    if data is None:
        return None
    try:
        manifest = json.loads(data)
    except ValueError:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "leaves" not in manifest:
        return None
    return manifest if not check or _valid_manifest(manifest) else None


def _valid_manifest(manifest: dict[str, Any]) -> bool:
    """Whether a manifest read back from storage only names what a restore may read and build.

    It comes from a bucket or directory that others can write: its data keys
    must stay under this snapshot's ``data.TOKEN/`` (no ``../``), its dtypes
    must be plain numbers (an ``object`` view of raw bytes would be pointers),
    its shapes must match its byte counts, and its key paths must not make
    the rebuilt tree huge (a list index of 10**12).
    """
    try:
        token, leaves = manifest["token"], manifest["leaves"]
        if not (isinstance(token, str) and re.fullmatch(r"[0-9a-f]{1,64}", token) and isinstance(leaves, list)):
            return False
        if not (isinstance(manifest["id"], str) and isinstance(manifest["name"], str) and _count(manifest["nbytes"])):
            return False
        if not all(isinstance(manifest[k], (int, float)) for k in ("created", "committed")):
            return False
        return all(_valid_leaf(entry, token, len(leaves)) for entry in leaves)
    except (KeyError, TypeError):
        return False


def _valid_leaf(entry: Any, token: str, count: int) -> bool:
    if not (isinstance(entry, dict) and valid_keys(entry["keys"], count) and valid_spec(entry["spec"])):
        return False
    if not (valid_mesh_axes(entry["mesh_axes"]) and isinstance(entry["objects"], list)):
        return False
    if entry["dtype"] is None:
        return entry["array"] is None and isinstance(entry.get("value"), (type(None), bool, int, float, str))
    dtype = valid_dtype(entry["dtype"])
    shape = entry["shape"]
    if dtype is None or not (isinstance(shape, list) and all(_count(d) for d in shape)) or not _count(entry["nbytes"]):
        return False
    if int(np.prod(shape, dtype=object)) * dtype.itemsize != entry["nbytes"]:
        return False
    array = entry["array"]
    return array is None or (isinstance(array, str) and re.fullmatch(rf"data\.{token}/[0-9]{{4,9}}", array) is not None)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def valid_keys(keys: Any, count: int) -> bool:
    """Key paths as ``_keys_to_json`` writes them, with list indices below ``count`` (the leaf count)."""
    if not isinstance(keys, list):
        return False
    for pair in keys:
        if not (isinstance(pair, list) and len(pair) == 2):
            return False
        kind, key = pair
        if kind == "seq":
            if not (_count(key) and key < count):
                return False
        elif kind not in ("dict", "attr") or not isinstance(key, (str, int)) or isinstance(key, bool):
            return False
    return True


def valid_dtype(name: Any) -> np.dtype | None:
    """The numpy dtype a manifest names, if it is a plain number type (numpy's or ml_dtypes')."""
    import jax.numpy as jnp

    if not isinstance(name, str):
        return None
    try:
        dtype = np.dtype(jnp.dtype(name))
    except (TypeError, ValueError):
        return None
    return dtype if dtype.kind in "biufcV" and not dtype.hasobject and dtype.fields is None and dtype.itemsize else None


def valid_spec(entries: Any) -> bool:
    """A PartitionSpec as ``_spec_to_json`` writes it (or ``None``)."""
    if entries is None:
        return True
    return isinstance(entries, list) and all(
        e is None or isinstance(e, str) or (isinstance(e, list) and all(isinstance(a, str) for a in e)) for e in entries
    )


def valid_mesh_axes(axes: Any) -> bool:
    return isinstance(axes, list) and all(
        isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and _count(a[1]) for a in axes
    )


# -- persist ------------------------------------------------------------------
def default_id(snapshot: Any) -> str:
    return snapshot.name if snapshot.step is None else f"{snapshot.name}-step{snapshot.step}"


def _leaf_array(leaf: Any) -> tuple[np.ndarray | None, Any]:
    """(contiguous array, None) for an array leaf, (None, value) for a plain scalar/string."""
    host = leaf.host
    if not getattr(leaf, "on_device", True) and not isinstance(host, np.ndarray):
        if host is None or isinstance(host, (bool, int, float, str)):
            return None, host
        try:
            host = np.asarray(host)
        except Exception:
            host = None
        if host is None or host.dtype == object:
            raise StorageError(
                f"cannot persist leaf {leaf.path or '(root)'}: a {type(leaf.host).__name__} is neither an array "
                "nor a number/string; persist arrays only"
            )
    array = np.asarray(host)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # not np.ascontiguousarray: it turns scalars into shape (1,)
    if array.dtype == object:
        raise StorageError(
            f"cannot persist leaf {leaf.path or '(root)'}: object arrays cannot be stored; persist numeric arrays"
        )
    return array, None


def persist(
    snapshot: Any,
    url: str,
    snapshot_id: str | None = None,
    *,
    name: str | None = None,
    step: int | None = None,
    events: Any = None,
    check_timeout: float = 5.0,
) -> Transfer:
    """Upload a host snapshot under ``url``; returns a running ``Transfer``.

    ``snapshot`` is a ``Snapshot`` (pending ones are waited for on the
    storage executor, not here) or a pytree of arrays, which is snapshotted
    first (``name``, ``step``). The id defaults to ``NAME`` or
    ``NAME-stepN``.

    The data objects go first, the manifest last and only if no snapshot
    ``url/ID`` exists yet. Returns once the quick checks passed (URL, bucket,
    duplicate id; at most ``check_timeout`` s); the upload continues on the
    storage executor. ``Transfer.wait()`` returns the committed
    ``SnapshotInfo`` or raises ``StorageError``.

    Raises:
      StorageError: malformed URL or id, missing bucket, permission denied,
        duplicate id, unreachable server (when found within ``check_timeout``).
    """
    from pathways_kernel.state import snapshots

    location = parse_url(url)
    if not isinstance(snapshot, snapshots.Snapshot):
        snapshot = snapshots.snapshot(snapshot, name, step)
    snapshot_id = check_id(snapshot_id or default_id(snapshot))
    target = location.child(snapshot_id)
    transfer = Transfer("persist", f"'{snapshot_id}' -> {target.url}", int(snapshot.nbytes), _events(events))
    transfer.start(lambda t: _persist(t, snapshot, location, snapshot_id))
    transfer.wait_checked(check_timeout)
    return transfer


def _persist(transfer: Transfer, snapshot: Any, location: Location, snapshot_id: str) -> SnapshotInfo:
    target = location.child(snapshot_id)
    try:
        with errors_as("persist", target):
            return _upload(transfer, snapshot, location, target, snapshot_id)
    finally:
        transfer.checked()


def _upload(transfer: Transfer, snapshot: Any, location: Location, target: Location, snapshot_id: str) -> SnapshotInfo:
    objects = objects_for(location)
    objects.check(location)
    if _parse_manifest(objects.read(target.key(MANIFEST))) is not None:
        raise StorageError(
            f"snapshot {target.url} already exists; snapshots are never overwritten: choose another id (or name/step)"
        )
    transfer.checked()
    try:
        snapshot.wait()
    except Exception as exc:  # e.g. DATA_LOSS: a slice was lost before its bytes reached the host
        raise StorageError(
            f"persist {target.url} failed: snapshot '{snapshot.name}' never reached host memory ({one_line(exc)})"
        ) from exc
    transfer.total = snapshot.nbytes
    token = secrets.token_hex(8)
    made = objects.missing_dirs(target)
    data = target.key(f"data.{token}") + "/"
    try:
        manifest = _write_data(transfer, snapshot, objects, target, snapshot_id, token)
    except BaseException:
        # Nothing will ever refer to these bytes, and a full disk would stay full.
        objects.discard(data, made)
        raise
    body = json.dumps(manifest, indent=1).encode()
    try:
        generation = objects.create(target.key(MANIFEST), body)
    except FileExistsError:
        existing = _parse_manifest(objects.read(target.key(MANIFEST)))
        # Our own earlier attempt whose reply was lost counts as success.
        if existing is None or existing.get("token") != token:
            objects.discard(data, made)
            raise StorageError(
                f"snapshot {target.url} already exists (written meanwhile by someone else); snapshots are never overwritten"
            ) from None
        generation = None
    except BaseException:
        # link(2) either made the manifest or not; a bucket may have committed it before the reply was lost.
        if location.scheme == "file":
            objects.discard(data, made)
        raise
    manifest["manifest_generation"] = generation
    return _info(target, manifest)


def _write_data(
    transfer: Transfer, snapshot: Any, objects: _Objects, target: Location, snapshot_id: str, token: str
) -> dict[str, Any]:
    """Upload every leaf's bytes under ``data.TOKEN``; returns the manifest that will describe them."""
    import jax

    data_dir = f"data.{token}"
    paths = _leaf_key_paths(snapshot)
    context = _context()
    leaves, arrays = [], []
    for index, leaf in enumerate(snapshot.leaves):
        array, value = _leaf_array(leaf)
        entry: dict[str, Any] = {
            "path": leaf.path,
            "keys": paths[index],
            "on_device": bool(getattr(leaf, "on_device", True)),
            "spec": _spec_to_json(leaf.spec),
            "mesh_axes": [list(a) for a in leaf.mesh_axes],
        }
        leaves.append(entry)
        if array is None:
            entry.update(value=value, shape=None, dtype=None, nbytes=0, array=None, objects=[])
            continue
        flat = array.reshape(-1).view(np.uint8)
        entry.update(shape=list(array.shape), dtype=array.dtype.name, nbytes=int(flat.size), objects=[])
        if not flat.size:
            entry["array"] = None
            continue
        entry["array"] = f"{data_dir}/{index:04d}"
        arrays.append((_open_array(objects, target, entry["array"], flat.size, context, create=True), flat))
    # Every array is created before any chunk is sent: a create queued behind
    # another leaf's chunks would leave the connections idle meanwhile.
    pending = []
    try:
        for opening, flat in arrays:
            stored = opening.result()
            # One write per chunk: tensorstore copies and uploads from its own threads, without the GIL.
            for start in range(0, flat.size, CHUNK_BYTES):
                end = min(start + CHUNK_BYTES, flat.size)
                pending.append((stored[start:end].write(flat[start:end]), end - start))
        for future, size in pending:
            future.result()
            transfer.advance(size)
    except Exception:
        # Writes still in flight would recreate what the caller is about to discard: let them end first.
        for future in [opening for opening, _ in arrays] + [future for future, _ in pending]:
            with contextlib.suppress(Exception):
                future.result()
        raise
    # What the server holds now is what the manifest will promise: names, sizes, CRC32Cs, generations.
    listed = objects.list(target.key(data_dir) + "/")
    prefix = target.key("")
    for entry in leaves:
        if entry["array"]:
            entry["objects"] = [
                {"name": name[len(prefix) :], **meta}
                for name, meta in sorted(listed.items())
                if name[len(prefix) :].startswith(entry["array"] + "/")
            ]
            if len(entry["objects"]) < 2:  # zarr.json and at least one chunk
                raise StorageError(f"persist {target.url} failed: the data of {entry['path']} did not arrive; retry")
    return {
        "format": FORMAT,
        "id": snapshot_id,
        "token": token,
        "name": snapshot.name,
        "step": snapshot.step,
        "created": snapshot.created,
        "committed": time.time(),
        "nbytes": int(snapshot.nbytes),
        "chunk_bytes": CHUNK_BYTES,
        "jax": jax.__version__,
        "leaves": leaves,
    }


def _open_array(objects: _Objects, target: Location, key: str, nbytes: int, context: Any, create: bool) -> Any:
    """Open (a future of) one leaf's bytes as a 1-D uint8 zarr3 array: CHUNK_BYTES per object, each with a CRC32C."""
    import tensorstore as ts

    kvstore = objects.kvstore(target)
    spec: dict[str, Any] = {"driver": "zarr3", "kvstore": {**kvstore, "path": kvstore["path"] + key + "/"}}
    if create:
        # Chunks that equal the fill value (all-zero leaves) are stored too: the manifest lists every object.
        spec.update(
            create=True,
            store_data_equal_to_fill_value=True,
            metadata={
                "shape": [nbytes],
                "data_type": "uint8",
                "fill_value": 0,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [min(CHUNK_BYTES, nbytes)]}},
                # Tensorstore checks each chunk's CRC32C when it reads it back.
                "codecs": [{"name": "bytes"}, {"name": "crc32c"}],
            },
        )
    else:
        spec["open"] = True
    return ts.open(spec, context=context)


def _leaf_key_paths(snapshot: Any) -> list[list[list[Any]]]:
    import jax

    indices = jax.tree_util.tree_unflatten(snapshot.treedef, list(range(len(snapshot.leaves))))
    pairs = jax.tree_util.tree_flatten_with_path(indices)[0]
    out: list[Any] = [None] * len(snapshot.leaves)
    for path, index in pairs:
        out[index] = _keys_to_json(path)
    return out


# -- list ---------------------------------------------------------------------
def list_snapshots(url: str) -> SnapshotList:
    """Committed snapshots directly under ``url``, oldest first.

    Only ids with a complete manifest are listed: interrupted uploads leave
    data objects that nothing refers to, and they never show up here.
    """
    location = parse_url(url)
    infos = []
    with errors_as("listing", location):
        objects = objects_for(location)
        objects.check(location, write=False)
        base = location.key("") if location.path else ""
        for key in sorted(objects.list(base)):
            rest = key[len(base) :]
            parts = rest.split("/")
            if len(parts) == 2 and parts[1] == MANIFEST:
                manifest = _parse_manifest(objects.read(key))
                if manifest is not None:
                    infos.append(_info(location.child(parts[0]), manifest))
    return SnapshotList(location.url, sorted(infos, key=lambda i: (i.created, i.committed)))


# -- load & restore -----------------------------------------------------------
def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _resolve(location: Location, objects: _Objects) -> tuple[Location, dict[str, Any]]:
    """The snapshot ``location`` names, or the newest committed one under it."""
    data = objects.read(location.key(MANIFEST))
    manifest = _parse_manifest(data)
    if manifest is not None:
        return location, manifest
    if _parse_manifest(data, check=False) is not None:
        raise StorageError(
            f"snapshot {location.url} is damaged: its manifest names data outside the snapshot, non-numeric dtypes "
            "or shapes that do not match its sizes; restore another snapshot"
        )
    found = list_snapshots(location.url)
    if not found:
        raise StorageError(
            f"no committed snapshot at {location.url}: persist one first, or list them with %pathways snapshots list"
        )
    newest = found[-1]
    return parse_url(newest.url), newest.manifest


def read_info(url: str) -> SnapshotInfo:
    location = parse_url(url)
    with errors_as("reading", location):
        target, manifest = _resolve(location, objects_for(location))
    return _info(target, manifest)


def load(url: str, events: Any = None, memory_limit: int | None = None, like: Any = None) -> Any:
    """Download a committed snapshot into host memory; returns a done ``Snapshot``.

    ``url`` names a snapshot (``PREFIX/ID``) or a prefix (its newest
    snapshot). Every chunk is checked against its manifest CRC32C. The tree
    is rebuilt as nested dicts and lists from the leaves' key paths, or with
    the structure of ``like`` when given.

    Raises:
      StorageError: nothing committed there, the data does not fit in host
        memory, a chunk is missing or corrupt, the server is unreachable.
    """
    from pathways_kernel.state import transfers

    location = parse_url(url)
    with errors_as("restore", location):
        objects = objects_for(location)
        target, manifest = _resolve(location, objects)
    # A manifest states its total, but the leaves are what gets allocated.
    nbytes = max(manifest["nbytes"], sum(entry["nbytes"] for entry in manifest["leaves"]))
    limit = _available_memory() if memory_limit is None else memory_limit
    if nbytes > limit:
        raise StorageError(
            f"snapshot {target.url} needs {format_bytes(nbytes)} of host memory but only {format_bytes(limit)} is available; "
            "restore it on a machine with more memory or free some first"
        )
    treedef = None
    if like is not None:
        import jax

        treedef = jax.tree_util.tree_structure(like)
        if treedef.num_leaves != len(manifest["leaves"]):
            raise StorageError(
                f"snapshot {target.url} has {len(manifest['leaves'])} leaves but `like` has {treedef.num_leaves}"
            )
    return transfers.run_sync(
        "restore", f"{target.url}", lambda t: _download(t, objects, target, manifest, treedef), events, total=nbytes
    )


def _download(transfer: Transfer, objects: _Objects, target: Location, manifest: dict[str, Any], treedef: Any) -> Any:
    import jax
    import jax.numpy as jnp

    from pathways_kernel.state.snapshots import Snapshot

    transfer.checked()
    with errors_as("restore", target):
        _verify_objects(objects, target, manifest)
        context = _context()
        values: list[Any] = []
        pending = []
        for index, entry in enumerate(manifest["leaves"]):
            if entry["dtype"] is None:
                values.append(entry["value"])
                continue
            dtype = np.dtype(jnp.dtype(entry["dtype"]))
            if not entry["array"]:
                values.append(np.zeros(entry["shape"], dtype))
                continue
            stored = _open_array(objects, target, entry["array"], entry["nbytes"], context, create=False).result()
            if stored.shape != (entry["nbytes"],):
                raise StorageError(
                    f"snapshot {target.url} is damaged: {entry['path']} holds {stored.shape[0]} of {entry['nbytes']} bytes"
                )
            pending.append((index, stored.read(), dtype))
            values.append(None)
        for index, future, dtype in pending:
            entry = manifest["leaves"][index]
            values[index] = future.result().view(dtype).reshape(entry["shape"])
            transfer.advance(entry["nbytes"])
    specs = [_spec_from_json(e["spec"]) for e in manifest["leaves"]]
    if treedef is None:
        tree = tree_from_stored_keys(
            [e["keys"] for e in manifest["leaves"]], list(range(len(values))), f"snapshot {target.url}"
        )
        treedef = jax.tree_util.tree_structure(tree)
        order = jax.tree_util.tree_leaves(tree)  # manifest leaf index, in the rebuilt tree's order
    else:
        order = list(range(len(values)))
    mesh_axes = next((tuple(tuple(a) for a in e["mesh_axes"]) for e in manifest["leaves"] if e["mesh_axes"]), ())
    snap = Snapshot.from_host(
        jax.tree_util.tree_unflatten(treedef, [values[i] for i in order]),
        [specs[i] for i in order],
        mesh_axes,
        manifest["name"],
        manifest.get("step"),
        manifest["created"],
    )
    for leaf, i in zip(snap.leaves, order, strict=True):
        entry = manifest["leaves"][i]
        leaf.path = entry["path"]
        if not entry.get("on_device", True):
            leaf.on_device = False
            leaf.host = values[i]
    return snap


def _verify_objects(objects: _Objects, target: Location, manifest: dict[str, Any]) -> None:
    """Every object the manifest names is there, unchanged since the commit."""
    listed = objects.list(target.key(f"data.{manifest['token']}") + "/")
    for entry in manifest["leaves"]:
        for obj in entry["objects"]:
            meta = listed.get(target.key(obj["name"]))
            if meta is None:
                raise StorageError(f"snapshot {target.url} is damaged: object {obj['name']} is missing")
            for field in ("size", "crc32c", "generation"):
                if obj.get(field) is not None and meta[field] != obj[field]:
                    raise StorageError(
                        f"snapshot {target.url} is damaged: object {obj['name']} changed since the commit ({field}); "
                        "restore another snapshot"
                    )


def restore(source: Any, mesh: Any = None, *, like: Any = None, events: Any = None) -> Any:
    """Put a snapshot back on ``mesh`` (default: the live slices); returns the pytree.

    ``source`` is a URL (a snapshot ``PREFIX/ID``, or a prefix: its newest
    committed snapshot) or an in-memory ``Snapshot``. Leaves keep their
    PartitionSpecs; axes the mesh lacks, or that no longer divide a
    dimension, become replicated. ``like`` (a pytree of the same structure)
    gives the result that structure instead of nested dicts and lists.

    Raises:
      StorageError: see ``load``.
    """
    from pathways_kernel.state import snapshots

    if isinstance(source, snapshots.Snapshot):
        return snapshots.restore(source, mesh)
    return snapshots.restore(load(source, events=_events(events), like=like), mesh)


def _events(events: Any) -> Any:
    if events is not None:
        return events
    from pathways_kernel.core.sessions import session

    return session().events
