"""JAX clients whose server is gone, and how an array is known to be one of theirs.

JAX's IFRT proxy client never reconnects: once its server dies, every call it
makes fails (``FAILED_PRECONDITION: writes no longer allowed``), and some wait
long before they do (a read of an old array after a reconnect waited > 120 s,
then the process aborted). So a client is *lost* when its server dies or when
the session that made it closes (a reconnect replaces it), and every array it
made is lost from then on: known here from the array's devices alone, without
a call into that client. Healing restores such arrays from their snapshots on
the new server; everything else reports them lost and never reads them.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_lock = threading.Lock()
# client -> why it is lost (weak: a client goes once its last array does).
_lost: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_last_reason: str | None = None


def mark_lost(client: Any, reason: str) -> None:
    """Record that ``client``'s server is gone (``reason``: what happened to it, e.g. its pid and signal)."""
    global _last_reason
    with _lock:
        _lost.setdefault(client, reason)
        _last_reason = _lost[client]


def client_of(array: Any) -> Any:
    """The JAX client that made ``array`` (``None`` for anything but a concrete jax array)."""
    import jax

    if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer):
        return None
    try:
        device = next(iter(array.sharding.device_set))
    except (StopIteration, AttributeError):
        return None
    return getattr(device, "client", None)


def why_lost(array: Any) -> str | None:
    """Why ``array``'s client is lost, or ``None`` when it is not (or ``array`` is no device array)."""
    client = client_of(array)
    if client is None:
        return None
    with _lock:
        try:
            return _lost.get(client)
        except TypeError:  # an unhashable client is none we marked
            return None


def last_reason() -> str | None:
    """Why the last client was lost (``None`` if none was), for errors that do not name their array."""
    with _lock:
        return _last_reason
