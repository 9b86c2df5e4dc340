"""Listeners of one kind of thing a session does (a transfer starts, a run starts).

Made a session component by a subclass per kind (``state.transfers.TransferStarts``,
``training.accounting.RunStarts``), so a subscription goes with the session it was
made on: a view subscribes to each session it follows, and nothing is left in a
module list when the session closes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Subscribers(Generic[T]):
    """Thread-safe listeners, called in order on the notifying thread; they must not block."""

    def __init__(self, session: object = None) -> None:
        self._lock = threading.Lock()
        self._listeners: list[Callable[[T], None]] = []

    def subscribe(self, listener: Callable[[T], None]) -> Callable[[], None]:
        """Call ``listener`` with each new item; returns an unsubscribe function."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def listeners(self) -> list[Callable[[T], None]]:
        """The listeners now, in order (for a notifier that handles their errors itself)."""
        with self._lock:
            return list(self._listeners)

    def notify(self, item: T) -> None:
        for listener in self.listeners():
            listener(item)

    def __len__(self) -> int:
        with self._lock:
            return len(self._listeners)
