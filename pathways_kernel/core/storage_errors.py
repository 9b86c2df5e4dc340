"""Storage failures in one line: a client library's exception -> the ``StorageError`` a user sees.

Says what failed and what to do (credentials, permissions, a missing bucket, a full
disk, an unreachable server), never the client library's traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
from collections.abc import Iterator

from pathways_kernel.core.errors import StorageError
from pathways_kernel.core.locations import Location, endpoint


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
        return StorageError(f"{what} {where} failed: {short(exc)}")
    if "Digest mismatch" in text:
        return StorageError(f"{what} {where} failed: {where} is damaged: a chunk fails its CRC32C check")
    if isinstance(exc, MemoryError):
        return StorageError(f"{what} {where} failed: out of host memory")
    if _is_connection_error(exc) or re.search(r"CURL error|UNAVAILABLE|ABORTED|DEADLINE_EXCEEDED|Connection", text):
        return StorageError(
            f"{what} {where} failed: cannot reach Cloud Storage at {endpoint()} ({short(exc)}); "
            "nothing partial was committed, retry when it is back"
        )
    if isinstance(exc, gexc.GoogleAPICallError):
        return StorageError(f"{what} {where} failed: {short(exc)}")
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
    return short(root)


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


def short(exc: BaseException) -> str:
    return _short_text(re.sub(r"\[http_response_body=.*", "", " ".join(str(exc).split())))


def _short_text(text: str) -> str:
    text = " ".join(text.split())
    return (text[:160] + "...") if len(text) > 160 else text
