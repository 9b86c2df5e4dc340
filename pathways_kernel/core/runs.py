"""The run in progress on this thread, as the layers below training see it.

Training's goodput ledger (``training/goodput.py``) keeps one ``Account`` per
run on a per-thread stack, kept here, so that state (a checkpoint's blocking
save) can book its time to the run without importing training: core is the
ground every layer reaches, training sits above state.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol


class Run(Protocol):
    """What a thread's run offers the layers below it: time booked to a badput category."""

    ended: bool

    def spent(self, category: str) -> contextlib.AbstractContextManager[Any]: ...


_local = threading.local()


def stack() -> list[Any]:
    """This thread's runs in progress, innermost last (the ledger pushes and pops them)."""
    runs: list[Any] | None = getattr(_local, "stack", None)
    if runs is None:
        runs = _local.stack = []
    return runs


def current() -> Any:
    """The innermost run in progress on this thread, if any."""
    runs = stack()
    return runs[-1] if runs else None


@contextlib.contextmanager
def spent(category: str) -> Iterator[None]:
    """Count the block as ``category`` (a goodput badput category) in this thread's run; no-op without one."""
    run: Run | None = current()
    if run is None or run.ended:
        yield
        return
    with run.spent(category):
        yield
