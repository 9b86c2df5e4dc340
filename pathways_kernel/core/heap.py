"""Giving freed memory back to the system, on both sides of the local server's socket.

Two things kept a big transfer's memory after ``del`` (256 MiB, measured on a real server):

* in the server, an uploaded array's memory stayed after its destruction until the cyclic
  collector ran (what it collected then was gRPC's per-call handler state), which a quiet
  server does rarely (+264 MiB after ``del``, gone after one ``gc.collect()``);
* in the kernel, JAX's proxy client assembles a read in an ``absl::Cord`` of small heap
  blocks; freed, they stayed in glibc's heap (+264 MiB after ``del``, gone after
  ``malloc_trim``).

``Reclaimer`` (server: told what it released) and ``HeapTrimmer`` (kernel: watches the free
bytes in its heap) give it back, each at most once a second.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import time
from typing import Any

#: Bytes released (server) or lying free in the heap (kernel) before memory is given back.
THRESHOLD = 64 << 20
#: Seconds between two reclaims at most, so that a stream of frees costs one.
_INTERVAL_S = 1.0

_malloc_trim: Any
try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim  # glibc
except (OSError, AttributeError):  # another libc: nothing to trim
    _malloc_trim = None


def trim() -> None:
    """Returns the free pages of glibc's heaps to the system (a no-op without glibc)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


class Reclaimer:
    """Collects cycles and trims the heap on its own thread once ``THRESHOLD`` bytes were released."""

    def __init__(self, threshold: int = THRESHOLD):
        self._threshold = threshold
        self._released = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def released(self, nbytes: int) -> None:
        """Says that ``nbytes`` of buffers were just dropped."""
        with self._lock:
            self._released += nbytes
            if self._released < self._threshold:
                return
            self._released = 0
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pathways-heap-reclaim", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()  # until the next release past the threshold; the thread is a daemon
            time.sleep(0.1)  # the frees of one destruct request come together
            self._wake.clear()
            gc.collect()
            trim()
            time.sleep(_INTERVAL_S)


class HeapTrimmer:
    """Trims this process's heap once ``THRESHOLD`` more bytes lie free in it than after the last trim.

    The free bytes are glibc's own count (``mallinfo2``'s ``fordblks``): memory the process
    freed and the allocator kept. Checked once per ``interval_s``, on its own thread.
    """

    def __init__(self, threshold: int = THRESHOLD, interval_s: float = _INTERVAL_S):
        self._threshold = threshold
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if _mallinfo2 is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pathways-heap-trim", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._interval_s + 1.0)  # one sleep of its loop at most

    def _run(self) -> None:
        floor = free_heap_bytes()  # what a trim cannot give back (partly used pages) stays counted here
        while not self._stop.wait(self._interval_s):
            free = free_heap_bytes()
            if free - floor >= self._threshold:
                trim()
                floor = free_heap_bytes()
            elif free < floor:
                floor = free


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_mallinfo2: Any
try:
    _mallinfo2 = ctypes.CDLL(None).mallinfo2  # glibc >= 2.33
    _mallinfo2.restype = _MallInfo2
except (OSError, AttributeError):
    _mallinfo2 = None


def free_heap_bytes() -> int:
    """Bytes free in glibc's heaps (freed by the process, kept by the allocator); 0 without glibc."""
    return int(_mallinfo2().fordblks) if _mallinfo2 is not None else 0
