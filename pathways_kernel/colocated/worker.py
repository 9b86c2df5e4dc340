"""The worker threads sidecars and loaders run their calls on, off the main thread.

One daemon thread per worker runs its jobs in order, each in the context of
the code that submitted it; a worker whose job hung is retired and replaced,
and at interpreter exit a worker gets ``EXIT_GRACE_S`` to finish the job in
hand (``core.threads.ExitStop``).
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from pathways_kernel.core.threads import ExitStop

_T = TypeVar("_T")


class Worker:
    """One daemon thread running submitted jobs in order.

    Daemon, so a hung sidecar never blocks interpreter exit; a worker whose
    job hung is retired (``retire``) and replaced rather than waited for.
    """

    def __init__(self, name: str):
        # Jobs of any result type share the queue; ``submit`` types each one's future.
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[Any], contextvars.Context] | None] = (
            queue.SimpleQueue()
        )
        self._retired = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._exit_stop = ExitStop(self, Worker._stop_at_exit)
        self._exit_stop.arm()
        self._thread.start()

    def submit(self, job: Callable[[], _T]) -> Future[_T]:
        future: Future[_T] = Future()
        # The submitter's context: ipykernel routes a job's prints to the cell that submitted it.
        self._jobs.put((job, future, contextvars.copy_context()))
        return future

    def retire(self) -> None:
        self._retired = True
        self._jobs.put(None)

    def _stop_at_exit(self) -> None:
        """Let the worker finish its current job before the interpreter exits.

        A daemon thread that is still inside XLA when the interpreter finalizes
        is torn down mid-C++ and aborts the process; a hung sidecar is still
        left behind after ``EXIT_GRACE_S``.
        """
        self.retire()
        self._thread.join(EXIT_GRACE_S)

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if self._retired or item is None:  # _retired is set before retire() queues its None
                if item is not None:
                    item[1].cancel()
                self._exit_stop.disarm()
                return
            job, future, context = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(context.run(job))
            except BaseException as exc:  # handed to the waiter, which re-raises it
                future.set_exception(exc)


#: Seconds the interpreter waits at exit for a worker to finish the job in hand.
EXIT_GRACE_S = 5.0
