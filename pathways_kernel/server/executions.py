"""XLA executions the server has dispatched and that have not finished, per device: at most
``LIMIT`` each, and a future for each that settles when it has.

Why a bound: XLA's CPU client lets 32 executions be in flight on a device; the 33rd launch
blocks, in a thread of the pool that also runs the programs. A client that never waits (a
training loop that does not read its loss) reaches that within 33 steps; on a machine with
fewer cores than devices the blocked launches then hold the threads a running collective
needs, and XLA aborts the whole process after 40 s ("Expected 4 threads to join the
rendezvous, but only 3 of them arrived"), every session with it. Below ``LIMIT`` a launch
never blocks in XLA, so the pool's threads only run programs. The session that would pass
the bound waits on its own thread instead (``session.py``), in order, where an interrupt
can cancel what it has not dispatched yet.

How the server learns that one has finished, without a thread per execution (a thread's
wake-up per execution cost a tiny op ~100 us on the loaded 2-core machine): lazily, when the
bound is reached. An execution whose outputs (weakly held, so they free as the client deletes
them) say they are ready has finished; one whose outputs are all gone (donated to the next
step) is waited for on its token, by the session thread that needs the room (jaxlib tells
Python that an execution has finished only by blocking on its token). Only an execution whose
status the client asks for is waited for by a thread of its own (``watch``), and, when the count
is asked for (``in_flight``: an interrupt's line says it), every execution with no output left to
ask: else one donated into a step long finished would be counted as running forever.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from pathways_kernel.server.errors import ServerError, from_exception

log = logging.getLogger("pathways_kernel.server")

#: Executions in flight per device. XLA's CPU client blocks a launch at 32; fewer, since an
#: interrupt cannot stop what XLA runs, and the cell after one waits for up to this many.
LIMIT = 8
#: How often a wait for room says, in the server's log, what it waits for.
_SAY_EVERY_S = 30.0
#: Seconds ``in_flight`` waits for the watcher thread to settle executions it cannot see finished:
#: one long finished settles at once; one still running is counted (the figure is an upper bound).
SETTLE_S = 0.25


class Token(Protocol):
    """jaxlib's ``ShardedToken``: the end of one execution on all its devices."""

    def block_until_ready(self) -> None: ...


Future = concurrent.futures.Future[Any]


class _Execution:
    """One execution in flight: its devices, token and (weakly) its outputs' buffers."""

    __slots__ = ("devices", "finished", "outputs", "token", "watched")

    def __init__(self, devices: tuple[int, ...], token: Token, outputs: Iterable[Any]):
        self.devices = devices
        self.token = token
        self.outputs = [weakref.ref(output) for output in outputs]
        self.finished = False
        self.watched = False  # handed to the watcher thread, which counts it out once its token is

    def seen_ready(self) -> bool:
        """Whether an output still held says the execution is done (never blocks)."""
        for ref in self.outputs:
            output = ref()
            try:
                if output is not None and not output.is_deleted():
                    return bool(output.is_ready())
            except Exception:  # an output in error: its token says more
                continue
        return False

    def orphaned(self) -> bool:
        """Whether no output is left to ask (all freed, deleted or donated; never blocks)."""
        for ref in self.outputs:
            output = ref()
            try:
                if output is not None and not output.is_deleted():
                    return False
            except Exception:  # an output in error: gone as far as asking goes
                continue
        return True


class Executions:
    """The executions in flight on each device, shared by every session of a server."""

    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self._lock = threading.Condition()
        self._in_flight: collections.Counter[int] = collections.Counter()
        self._order: collections.deque[_Execution] = collections.deque()  # dispatch order
        self._watched: queue.SimpleQueue[tuple[_Execution, Future | None] | None] | None = None

    def _room(self, devices: Iterable[int]) -> bool:
        return all(self._in_flight[d] < self.limit for d in devices)

    def _finish(self, execution: _Execution) -> None:
        """Counts ``execution`` out (once); the lock is held."""
        if not execution.finished:
            execution.finished = True
            for d in execution.devices:
                self._in_flight[d] -= 1
            self._lock.notify_all()

    def _prune(self) -> None:
        """Counts out the executions seen finished; the lock is held."""
        for execution in self._order:
            if not execution.finished and execution.seen_ready():
                self._finish(execution)
        self._order = collections.deque(e for e in self._order if not e.finished)

    def has_room(self, devices: Iterable[int]) -> bool:
        """Whether one more execution on ``devices`` may start now (never blocks)."""
        devices = tuple(devices)
        with self._lock:
            if self._room(devices):
                return True
            self._prune()
            return self._room(devices)

    def in_flight(self, devices: Iterable[int], settle_s: float = SETTLE_S) -> int:
        """The most executions not finished on any of ``devices`` (an upper bound). Those with no
        output left to ask are handed to the watcher thread, which waits on their tokens; this
        waits up to ``settle_s`` for it (what has long finished settles at once)."""
        devices = tuple(devices)
        deadline = time.monotonic() + settle_s
        with self._lock:
            self._prune()
            orphans = [e for e in self._order if not e.finished and not e.watched and e.orphaned()]
            for execution in orphans:
                execution.watched = True
            watched = self._watcher() if orphans else None
        for execution in orphans:
            assert watched is not None
            watched.put((execution, None))
        with self._lock:
            while (left := deadline - time.monotonic()) > 0 and any(
                e.watched and not e.finished and not set(e.devices).isdisjoint(devices) for e in self._order
            ):
                self._lock.wait(left)
            self._order = collections.deque(e for e in self._order if not e.finished)
            return max((self._in_flight[d] for d in devices), default=0)

    def enter(self, devices: tuple[int, ...], cancelled: Callable[[], ServerError | None]) -> None:
        """Waits until one more execution on ``devices`` may start, and counts it in.
        Raises ``cancelled()``'s error if it returns one meanwhile (checked after each
        execution it waited for, and on ``wake``). The wait is as long as the oldest
        executions on these devices run: a line in the server's log every ``_SAY_EVERY_S``
        says what it waits for."""
        started = said = time.monotonic()
        while True:
            with self._lock:
                if (error := cancelled()) is not None:
                    raise error
                if not self._room(devices):
                    self._prune()
                if self._room(devices):
                    for d in devices:
                        self._in_flight[d] += 1
                    return
                oldest = next(
                    (e for e in self._order if not e.finished and not set(e.devices).isdisjoint(devices)), None
                )
                if oldest is None:  # counted in by another thread, not started yet
                    self._lock.wait(1.0)
            if oldest is not None:
                # Its error, if any, is its outputs' and its status's to tell.
                with contextlib.suppress(Exception):
                    oldest.token.block_until_ready()
                with self._lock:
                    self._finish(oldest)
            if time.monotonic() - said >= _SAY_EVERY_S:
                said = time.monotonic()
                log.warning(
                    "an execution on devices %s has waited %.0f s for one of the %d in flight there to finish",
                    list(devices),
                    said - started,
                    self.limit,
                )

    def leave(self, devices: tuple[int, ...]) -> None:
        """Counts out an execution that ``enter`` counted in and that never started."""
        with self._lock:
            for d in devices:
                self._in_flight[d] -= 1
            self._lock.notify_all()

    def wake(self) -> None:
        """Makes every ``enter`` waiting for another thread check whether it was cancelled."""
        with self._lock:
            self._lock.notify_all()

    def started(self, devices: tuple[int, ...], token: Token, outputs: Iterable[Any]) -> None:
        """An execution ``enter`` counted in has started; ``outputs`` are its single-device
        buffers (held weakly)."""
        with self._lock:
            self._order.append(_Execution(devices, token, outputs))

    def watch(self, devices: tuple[int, ...], token: Token, outputs: Iterable[Any]) -> Future:
        """``started``, and a future that settles (None, or the execution's error, its code
        passed through) when it has finished: for a status the client will ask for."""
        execution = _Execution(devices, token, outputs)
        execution.watched = True
        future: Future = concurrent.futures.Future()
        with self._lock:
            self._order.append(execution)
            watched = self._watcher()
        watched.put((execution, future))
        return future

    def _watcher(self) -> queue.SimpleQueue[tuple[_Execution, Future | None] | None]:
        """The queue of the thread that waits on watched executions' tokens (started once); the
        lock is held."""
        watched = self._watched
        if watched is None:
            watched = self._watched = queue.SimpleQueue()
            threading.Thread(target=self._watch, args=(watched,), name="pathways-local-executions", daemon=True).start()
        return watched

    def _watch(self, watched: queue.SimpleQueue[tuple[_Execution, Future | None] | None]) -> None:
        while (item := watched.get()) is not None:
            execution, future = item
            try:
                execution.token.block_until_ready()
                if future is not None:
                    future.set_result(None)
            except Exception as failure:  # the execution's own error: its status says it
                if future is not None:
                    future.set_exception(from_exception(failure, "execute"))
            finally:
                with self._lock:
                    self._finish(execution)

    def close(self) -> None:
        """Ends the thread that settles watched executions' futures, once they have settled."""
        with self._lock:
            watched, self._watched = self._watched, None
        if watched is not None:
            watched.put(None)
