"""Background threads that must stop before the interpreter ends."""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def stopped_at_exit(stop: Callable[[T], object]) -> weakref.WeakSet[T]:
    """A set whose members get ``stop(member)`` at interpreter exit; add an object once its
    thread is started.

    A daemon thread still inside jaxlib when the interpreter stops its threads aborts the
    process ("FATAL: exception not rethrown"). The exit hook is registered by this call, so
    hooks run in the reverse of the order the modules made their sets (atexit's order).
    """
    members: weakref.WeakSet[T] = weakref.WeakSet()

    def stop_all() -> None:
        for member in list(members):
            stop(member)

    atexit.register(stop_all)
    return members
