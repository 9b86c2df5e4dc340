"""Before an interrupted cell's queued work is dropped, the notebook's variables get their values.

The kernel drops what an interrupted cell left queued on the local Pathways server
(``interrupts.py``). But a loop of unread steps binds its variables to steps still queued
(``params = step(params, batch)``): dropped, they read CANCELLED in the next cell. So first
the steps the notebook's variables wait for finish, at most ``SETTLE_S`` seconds: after a
second one line says which variables the cell bound it waits for, and that a second interrupt
drops them.
What no variable refers to is dropped after, with whatever the bound cut short.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import types
from collections.abc import Mapping
from typing import Any

from pathways_kernel.core import lost_clients

#: Seconds an interrupted cell waits for the steps the notebook's variables wait for.
SETTLE_S = 30.0
#: Seconds after which the wait says what it waits for.
NOTICE_S = 1.0


def identities(namespace: Mapping[str, Any]) -> dict[str, int]:
    """What each name is bound to, as ``id()``s (no reference kept): taken before a cell runs."""
    return {name: id(value) for name, value in list(namespace.items()) if not name.startswith("_")}


def variables_with_arrays(namespace: Mapping[str, Any], hidden: Mapping[str, Any]) -> list[tuple[str, list[Any]]]:
    """The user's variables holding JAX arrays (alone or in a pytree), with those arrays; not
    IPython's own (``hidden``), nor arrays of a client whose server is gone (never read)."""
    import jax

    found = []
    for name, value in list(namespace.items()):
        if name.startswith("_") or (name in hidden and hidden[name] is value):
            continue
        if isinstance(value, types.ModuleType | type) or (callable(value) and not isinstance(value, jax.Array)):
            continue
        try:
            leaves = jax.tree_util.tree_leaves(value)
        except Exception:  # a value whose flattening fails holds nothing we can wait for
            continue
        arrays = [leaf for leaf in leaves if isinstance(leaf, jax.Array) and lost_clients.why_lost(leaf) is None]
        if arrays:
            found.append((name, arrays))
    return found


def settle(variables: list[tuple[str, list[Any]]], bound: list[str], bound_s: float = SETTLE_S) -> list[str]:
    """Wait, at most ``bound_s``, until every array of ``variables`` is computed; returns the names of
    ``bound`` still waited for when the bound or a second interrupt ended the wait (none when all are in).

    ``bound``: the names the interrupted cell bound, waited for first and named in the line (a
    check of any array waits behind the steps queued before it: the line cannot tell which one
    the steps are for). The wait runs on a thread of its own, so that the kernel's main thread
    stays interruptible. An array whose computation failed counts as computed: its error is seen
    when it is read.
    """
    variables = sorted(variables, key=lambda item: item[0] not in bound)
    named = [name for name, _ in variables if name in bound]
    at = [0]  # the index of the variable waited for
    # An Event, not Thread.join: a join that KeyboardInterrupt ends marks the thread stopped
    # though it runs on (CPython 3.11, threading._wait_for_tstate_lock).
    done = threading.Event()

    def wait_all() -> None:
        for index, (_, arrays) in enumerate(variables):
            at[0] = index
            for array in arrays:
                # Its error (a deleted or failed array) shows when it is read.
                with contextlib.suppress(Exception):
                    array.block_until_ready()
        done.set()

    started = time.monotonic()
    threading.Thread(target=wait_all, name="pathways-settle", daemon=True).start()
    try:
        if not done.wait(min(NOTICE_S, bound_s)):
            who = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
            who = who or "the notebook's variables"
            print(
                f"pathways: interrupted: waiting (at most {bound_s:g} s) for the steps already queued, so that "
                f"{who} can still be read; interrupt again to drop them",
                file=sys.stderr,
            )
            done.wait(max(0.0, bound_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    return [] if done.is_set() else [name for name, _ in variables[at[0] :] if name in bound]
