"""The pool of host buffers that snapshot copies write into (``HostBuffers``), and the
ownership mark (``Owned``) that says which of a dead leaf's buffers may come back."""

from __future__ import annotations

import collections
import threading

import numpy as np


class Owned:
    """A leaf's host value and whether the pool may take it back."""

    __slots__ = ("array", "reusable")

    def __init__(self, array: object, reusable: bool = False) -> None:
        self.array = array
        self.reusable = reusable


class HostBuffers:
    """Host buffers of dead snapshot leaves, reused by new ones of the same shapes.

    Writing into fresh memory costs a page fault per page, which on a busy
    host is most of a snapshot's time; a training loop takes same-shaped
    snapshots over and over, so the buffers of the leaves that died are
    recycled, as runtimes reuse pinned staging buffers. Only buffers the
    copier filled and nobody was ever handed (``Leaf`` explains ownership)
    come back, and the pool holds at most as many bytes as the largest
    snapshot taken.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self._dead: collections.deque[Owned] = collections.deque()
        self._bytes = 0
        self.limit = 0

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            free = self._free.get((shape, np.dtype(dtype).str))
            if free:
                buffer = free.pop()
                self._bytes -= buffer.nbytes
                return buffer
        return np.empty(shape, dtype)

    def on_leaf_dead(self, owned: Owned) -> None:
        # A finalizer may run anywhere, even inside a lock this module holds
        # (a garbage collection during ``submit``): only queue the buffer
        # (``deque.append`` takes no lock); the copy thread recycles it.
        self._dead.append(owned)

    def recycle_dead(self) -> None:
        while True:
            try:
                owned = self._dead.popleft()
            except IndexError:
                return
            self.recycle(owned)

    def recycle(self, owned: Owned) -> None:
        """Take back a dead leaf's buffer if it was the copier's and never handed out."""
        host = owned.array
        if not owned.reusable or not isinstance(host, np.ndarray):
            return
        with self._lock:
            if self._bytes + host.nbytes > self.limit:
                return
            owned.array, owned.reusable = None, False
            self._free.setdefault((host.shape, host.dtype.str), []).append(host)
            self._bytes += host.nbytes

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._bytes = 0

    def note_snapshot(self, nbytes: int) -> None:
        with self._lock:
            self.limit = max(self.limit, nbytes)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes


#: The process's pool: the snapshot copier takes from it, dead leaves give back to it.
BUFFERS = HostBuffers()
