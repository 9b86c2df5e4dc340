"""JAX's persistent compilation cache, in Cloud Storage or a local directory.

``enable("gs://BUCKET/cache")`` points JAX's cache there (JAX reaches gs://
through etils and gcsfs), so a fresh kernel loads compiled programs instead
of recompiling them. A kernelspec can turn it on at start through
``PATHWAYS_COMPILE_CACHE``. Every compilation while the cache is on becomes a
``compile`` event: hit (with the retrieval time and the compile time it
saved) or miss (with the compile time). On the Pathways proxy backend JAX's
cache is off: Pathways keeps its own, so ``enable`` refuses and says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
import threading
from typing import Any

from pathways_kernel.core import locations, objectstore, shellhooks, storage_errors
from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.errors import NotSupportedError, PathwaysError, StorageError, one_line
from pathways_kernel.core.sessions import session
from pathways_kernel.core.text import count, shown

#: Environment variable a kernelspec sets to turn the cache on at start.
ENV = "PATHWAYS_COMPILE_CACHE"
#: Programs that compile faster than this are not worth a round trip to storage.
DEFAULT_MIN_COMPILE_S = 0.2
#: Backends where Pathways compiles, and caches, on its side.
PATHWAYS_BACKENDS = ("proxy", "sps")

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT = "/jax/compilation_cache/cache_hits"
_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
_RETRIEVAL = "/jax/compilation_cache/cache_retrieval_time_sec"
_SAVED = "/jax/compilation_cache/compile_time_saved_sec"


@dataclasses.dataclass
class CacheStatus(TextDisplay):
    """Where the cache is and what it did in this session."""

    location: str | None
    hits: int = 0
    misses: int = 0
    saved_s: float = 0.0

    def to_text(self) -> str:
        if self.location is None:
            return "persistent compilation cache: off"
        return (
            f"persistent compilation cache: {self.location}  "
            f"({count(self.hits, 'hit')}, {count(self.misses, 'miss')}, {self.saved_s:.1f} s of compiling saved)"
        )

    def __repr__(self) -> str:
        return self.to_text()


_status = CacheStatus(None)
_local = threading.local()
_listening = False
_lock = threading.Lock()


def _on_event(event: str, **kwargs: Any) -> None:
    if event == _REQUEST:
        _local.outcome = "miss"
    elif event == _HIT:
        _local.outcome = "hit"


def _on_duration(event: str, duration_secs: float, **kwargs: str | int) -> None:
    if event == _RETRIEVAL:
        _local.retrieval = duration_secs
    elif event == _SAVED:
        _local.saved = duration_secs
    elif event == _COMPILE_EVENT:
        outcome = getattr(_local, "outcome", None)
        _local.outcome = None
        if _status.location is None or outcome is None:
            return
        name = kwargs.get("fun_name", "")
        if outcome == "hit":
            _status.hits += 1
            saved = max(0.0, getattr(_local, "saved", 0.0))
            _status.saved_s += saved
            detail = f"{name}: cache hit (loaded in {getattr(_local, 'retrieval', duration_secs) * 1000:.0f} ms, saved {saved:.2f} s)"
        else:
            _status.misses += 1
            detail = f"{name}: cache miss, compiled in {duration_secs:.2f} s"
        session().events.emit("compile", duration_s=duration_secs, detail=detail)


def _listen() -> None:
    """Listen to JAX's cache events; again if a library dropped every listener since
    (Tunix's ``MetricsLogger.close()`` calls ``jax.monitoring.clear_event_listeners()``)."""
    global _listening
    with _lock:
        from jax import monitoring

        if _listening:
            # Absent after a clear: JAX asserts it is present (ValueError under -O).
            with contextlib.suppress(AssertionError, ValueError):
                monitoring.unregister_event_listener(_on_event)
            with contextlib.suppress(AssertionError, ValueError):
                monitoring.unregister_event_duration_listener(_on_duration)
        monitoring.register_event_listener(_on_event)
        monitoring.register_event_duration_secs_listener(_on_duration)
        _listening = True


def _cell_started(*args: Any) -> None:
    if _status.location is not None:
        _listen()


def install(shell: Any) -> None:
    """Count the cache's hits and misses again at each cell's start, should a library have
    dropped JAX's listeners in the cell before (``shellhooks.remove`` undoes it)."""
    shellhooks.of(shell).register("pre_run_cell", _cell_started)


def enable(location: str, min_compile_s: float = DEFAULT_MIN_COMPILE_S) -> CacheStatus:
    """Use ``location`` (``gs://BUCKET/PREFIX``, a directory, or ``off``) as JAX's cache.

    Raises:
      NotSupportedError: on the Pathways proxy backend (Pathways manages its
        own compilation cache).
      StorageError: a malformed URL, a bucket that does not exist, a
        directory that cannot be written.
      PathwaysError: a negative or non-finite ``min_compile_s``.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    if location.strip().lower() == "off":
        return disable()
    if not math.isfinite(min_compile_s) or min_compile_s < 0:
        raise PathwaysError(f"bad minimum compile time {min_compile_s!r}: give a finite number of seconds, at least 0")
    if session().backend.name in PATHWAYS_BACKENDS:
        raise NotSupportedError(
            "Pathways manages its own persistent compilation cache on the proxy backend (JAX's is turned off there); "
            "nothing to configure"
        )
    where = locations.parse_url(location)
    if where.scheme == "gs":
        locations.emulator_env()
    with storage_errors.errors_as("compile cache at", where):
        objectstore.objects_for(where).check(where)
        if where.scheme == "file":
            os.makedirs(where.path, exist_ok=True)
            _check_writable(where.path, location)
    _listen()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    cc.reset_cache()
    cc.set_cache_dir(where.url)
    _status.location = where.url
    return status()


def _check_writable(path: str, typed: str) -> None:
    """Write and remove a file in ``path``: JAX's cache fails to write silently (every program
    a miss), and a directory can refuse writes its permissions allow (``/proc``, as root).

    Raises:
      StorageError: naming the directory, and what was typed when that was a relative path.
    """
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        came_from = "" if typed.strip() in (path, "file://" + path) else f" (from {shown(typed)})"
        raise StorageError(
            f"cannot write JAX's compilation cache to {path}{came_from}: {exc.strerror or exc}; "
            "choose a directory you can write, or gs://BUCKET/PREFIX"
        ) from None


def disable() -> CacheStatus:
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    jax.config.update("jax_enable_compilation_cache", False)
    cc.reset_cache()
    _status.location = None
    return status()


def status() -> CacheStatus:
    return dataclasses.replace(_status)


def cache(location: str | None = None, min_compile_s: float = DEFAULT_MIN_COMPILE_S) -> CacheStatus:
    """``%pathways cache``: ``enable(location)``, ``disable()`` for ``"off"``, or the status for ``None``."""
    return status() if location is None else enable(location, min_compile_s)


def from_env() -> CacheStatus | None:
    """Turn the cache on from ``PATHWAYS_COMPILE_CACHE`` (kernel start); ``None`` if unset.

    A kernel must start even when the cache cannot be used: the reason is
    printed as one line and the kernel runs without it.
    """
    import sys

    location = os.environ.get(ENV, "").strip()
    if not location:
        return None
    try:
        return enable(location)
    except PathwaysError as exc:
        print(f"{ENV}={location} not used: {one_line(exc)}", file=sys.stderr)
        return None
