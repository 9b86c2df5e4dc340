"""The one line for a read of an array lost with a slice, on a backend whose server said so.

The embedded backend raises its own one-line ``SliceDownError``; a Pathways server (the local
one, GKE's) answers ``DATA_LOSS``, which JAX raises from deep in its array code (a 30-line
traceback). This line keeps the server's words and says what to do: the variables the failing
line read that are lost, and for each whether a snapshot brings it back (healing restores it
when the cell ends) or it must be recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

from pathways_kernel.core import sessions
from pathways_kernel.state import snapshot_store
from pathways_kernel.state.placement import is_device_array

#: Variables named in one line at most (a cell may read many).
_MAX_NAMED = 4


def lost_read_line(error: BaseException, namespace: Mapping[str, Any]) -> str | None:
    """``DATA_LOSS`` from the server as one line naming the lost variables the failing line
    used (from ``namespace``, the notebook's) and their snapshots; None for any other error."""
    import jax

    text = str(error).strip()
    if not isinstance(error, jax.errors.JaxRuntimeError) or not text.startswith("DATA_LOSS"):
        return None
    said = text.splitlines()[0].rstrip(". ")
    names = [n for n in _names_read(error.__traceback__, namespace) if _holds_lost(namespace[n])]
    if not names:
        return f"{type(error).__name__}: {said}. Restore it from a snapshot or recompute it on the live slices"
    store = snapshot_store.store() if sessions.current() is not None else None
    restored: list[str] = []
    lost: list[str] = []
    for name in names[:_MAX_NAMED]:
        snap = store.latest(name, wait=False) if store is not None else None
        (restored if snap is not None else lost).append(name)
    parts = []
    if restored:
        parts.append(
            f"{_listed(restored)} {'has a snapshot' if len(restored) == 1 else 'have snapshots'} "
            "(%pathways snapshots): restored onto the live slices when this cell ends"
        )
    if lost:
        parts.append(f"{_listed(lost)} {'has' if len(lost) == 1 else 'have'} none: recompute or reload")
    return f"{type(error).__name__}: {said}; " + "; ".join(parts)


def _names_read(tb: TracebackType | None, namespace: Mapping[str, Any]) -> list[str]:
    """Notebook variables the failing code names: those of the frames run in the notebook's
    namespace (the cell, and functions defined in it), innermost first."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    names: list[str] = []
    for frame in reversed(frames):
        if frame.f_globals is not namespace and frame.f_globals.get("__name__") != "__main__":
            continue
        for name in frame.f_code.co_names + frame.f_code.co_varnames:
            if name in namespace and name not in names and not name.startswith("_"):
                names.append(name)
    return names


def _holds_lost(value: Any) -> bool:
    import jax

    if not is_device_array(value) and not isinstance(value, (dict, list, tuple)):
        return False
    try:
        leaves = [leaf for leaf in jax.tree.leaves(value) if is_device_array(leaf)]
        return any(sessions.is_lost(leaf, wait=False) for leaf in leaves)
    except Exception:  # an odd pytree, or an array of a gone server: not one to name
        return False


def _listed(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
