"""Background threads that must stop before the interpreter ends."""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ExitStop(Generic[T]):
    """Calls ``stop(owner)`` at interpreter exit while ``owner`` runs: ``arm()`` as it starts,
    ``disarm()`` once it stopped.

    A daemon thread still inside jaxlib when the interpreter stops its threads aborts the
    process ("FATAL: exception not rethrown"), so whatever runs one stops it at exit. Each
    running thing has its own ``atexit`` entry, removed when it stops, so a closed session
    leaves none. Entries run in reverse order of arming: what armed last stops first (a
    monitor sender re-arms after each subscribe, so it stops before the hub it reads).
    The entry holds ``owner`` weakly.
    """

    def __init__(self, owner: T, stop: Callable[[T], object]) -> None:
        ref = weakref.ref(owner)

        def at_exit() -> None:
            if (alive := ref()) is not None:
                stop(alive)

        self._at_exit = at_exit
        self._lock = threading.Lock()
        self._armed = False

    def arm(self) -> None:
        """Register the stop at exit, or move it after every entry armed so far."""
        with self._lock:
            if self._armed:
                atexit.unregister(self._at_exit)
            atexit.register(self._at_exit)
            self._armed = True

    def disarm(self) -> None:
        with self._lock:
            if self._armed:
                atexit.unregister(self._at_exit)
                self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed
