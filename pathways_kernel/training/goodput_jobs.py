"""The attempts of one retried job are one run: pathwaysutils' ``Manager().elastic_retry``.

A function decorated with ``Manager().elastic_retry`` is called again after
each slice loss (and each ``ScaleUpSignalError``). A ``pw.steps`` loop in it
would be one run per attempt, and the time between attempts (waiting for
slices, re-initialising) in none. So while pathwaysutils is imported its
``elastic_retry`` is wrapped: each call of the decorated function is one job.
The job's first ``pw.steps`` loop starts the job's run, dated from the call;
a loop of the same name in a later attempt goes on with it from its
``start`` (steps from there on are redone). Between attempts the time is
``recovery`` after a slice loss, ``scale_up`` after a ``ScaleUpSignalError``,
except what pathwaysutils' ``wait_for_slices`` takes (``slice_wait``). The run
ends when the call returns or raises. Nothing else about ``elastic_retry``
changes: the same attempts, callbacks and errors.

pathwaysutils is not imported for this: the wraps are patches of
``core/pathwaysutils_compat.py``, put in when user code first imports it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

from pathways_kernel.core import pathwaysutils_compat
from pathways_kernel.training import accounting, goodput

_local = threading.local()


def _jobs() -> list[Job]:
    jobs = getattr(_local, "jobs", None)
    if jobs is None:
        jobs = _local.jobs = []
    return jobs


def current() -> Job | None:
    """The retried job this thread is inside, if any."""
    jobs = _jobs()
    return jobs[-1] if jobs else None


class Job:
    """One call of an ``elastic_retry`` function, all its attempts."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.account: goodput.Account | None = None
        self.waited = 0.0  # slice waits before the run's ledger began

    def join(self, name: str, start: int, stop: int | None, progress: bool) -> goodput.Account | None:
        """The run a ``pw.steps`` loop named ``name`` counts in: the job's own
        (started now, or going on from ``start``); ``None`` for a loop of
        another name, which is a run of its own."""
        if self.account is None:
            self.account = accounting.begin(
                name, "steps", first_step=start, stop_step=stop, progress=progress, began=self.began
            )
            if self.waited:
                self.account.count_earlier("slice_wait", self.waited)
            return self.account
        if self.account.name != name or self.account.ended:
            return None
        self.account.next_attempt(start)
        return self.account

    def attempt_failed(self, error: BaseException) -> None:
        account = self.account
        if account is None or account.ended:
            return
        from pathwaysutils.elastic.elastic import is_error_due_to_slice_down
        from pathwaysutils.elastic.manager import ScaleUpSignalError

        if isinstance(error, ScaleUpSignalError):
            account.between_attempts("scale_up")
        elif isinstance(error, Exception) and is_error_due_to_slice_down(error, log_traceback=False):
            account.between_attempts("recovery")

    @contextlib.contextmanager
    def waiting_for_slices(self) -> Iterator[None]:
        if self.account is not None and not self.account.ended:
            with self.account.spent("slice_wait"):
                yield
            return
        started = time.perf_counter()
        try:
            yield
        finally:
            self.waited += time.perf_counter() - started

    def end(self) -> None:
        if self.account is not None:
            self.account.end()


def _wrap_elastic_retry(original: Any) -> Any:
    @functools.wraps(original)
    def elastic_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        decorator = original(self, *args, **kwargs)

        def wrap(func: Any) -> Any:
            @functools.wraps(func)
            def attempt(*a: Any, **k: Any) -> Any:
                try:
                    return func(*a, **k)
                except BaseException as error:
                    job = current()
                    if job is not None:
                        job.attempt_failed(error)
                    raise

            retried = decorator(attempt)

            @functools.wraps(func)
            def job(*a: Any, **k: Any) -> Any:
                this = Job()
                _jobs().append(this)
                try:
                    return retried(*a, **k)
                finally:
                    _jobs().remove(this)
                    this.end()

            return job

        return wrap

    return elastic_retry


def _wrap_wait_for_slices(original: Any) -> Any:
    @functools.wraps(original)
    def wait_for_slices(*args: Any, **kwargs: Any) -> Any:
        job = current()
        if job is None:
            return original(*args, **kwargs)
        with job.waiting_for_slices():
            return original(*args, **kwargs)

    return wait_for_slices


#: The two wraps, in pathwaysutils' modules (now, or when user code imports them).
_PATCHES = (
    pathwaysutils_compat.Patch(pathwaysutils_compat.MANAGER, "elastic_retry", _wrap_elastic_retry, cls="Manager"),
    pathwaysutils_compat.Patch(pathwaysutils_compat.ELASTIC, "wait_for_slices", _wrap_wait_for_slices),
)


def install() -> None:
    """Make ``elastic_retry`` jobs one run each, now or when pathwaysutils is imported.

    Process-wide, as pathwaysutils is: a function decorated under one session may be
    called under the next. Outside a job the wraps only pass the call on.
    """
    for patch in _PATCHES:
        patch.start()


def uninstall() -> None:
    """pathwaysutils' own ``elastic_retry`` and ``wait_for_slices`` back."""
    for patch in _PATCHES:
        patch.stop()
