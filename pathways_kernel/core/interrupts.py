"""Holding back Jupyter's interrupt across a step that must not stop halfway."""

from __future__ import annotations

import signal
import threading
from typing import Any


class deferred_interrupts:  # used like a function: ``with deferred_interrupts():``
    """Within the block, SIGINT (Jupyter's interrupt) is held back and delivered at its end.

    For steps whose halves make no sense apart (a slice marked down but its
    arrays still readable; a variable bound but not recorded as healed).
    Only the main thread receives SIGINT, so elsewhere this does nothing. A
    held interrupt is handed to the handler that was in place (by default
    ``KeyboardInterrupt`` right at the end of the block).
    """

    def __enter__(self) -> deferred_interrupts:
        self._held: tuple[int, Any] | None = None
        # None: not the main thread, or a handler installed outside Python, which could not be put back.
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not None:
            self._previous = signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum: int, frame: Any) -> None:
        self._held = (signum, frame)

    def __exit__(self, *exc: object) -> None:
        if self._previous is None:
            return
        signal.signal(signal.SIGINT, self._previous)
        if self._held is None:
            return
        if callable(self._previous):
            self._previous(*self._held)
        elif self._previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)
