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

pathwaysutils is not imported for this: an import hook wraps it when user
code first imports its manager.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from pathways_kernel.training import accounting, goodput

_MANAGER = "pathwaysutils.elastic.manager"
_ELASTIC = "pathwaysutils.elastic.elastic"
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

    elastic_retry._pathways_jobs = True  # type: ignore[attr-defined]
    return elastic_retry


def _wrap_wait_for_slices(original: Any) -> Any:
    @functools.wraps(original)
    def wait_for_slices(*args: Any, **kwargs: Any) -> Any:
        job = current()
        if job is None:
            return original(*args, **kwargs)
        with job.waiting_for_slices():
            return original(*args, **kwargs)

    wait_for_slices._pathways_jobs = True  # type: ignore[attr-defined]
    return wait_for_slices


def _patch(manager: Any) -> None:
    if not getattr(manager.Manager.elastic_retry, "_pathways_jobs", False):
        manager.Manager.elastic_retry = _wrap_elastic_retry(manager.Manager.elastic_retry)
    # pathwaysutils' module, as loaded: its attributes are not known ahead.
    elastic: Any = sys.modules.get(_ELASTIC)
    if elastic is not None and not getattr(elastic.wait_for_slices, "_pathways_jobs", False):
        elastic.wait_for_slices = _wrap_wait_for_slices(elastic.wait_for_slices)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds pathwaysutils' manager module as usual and wraps it once executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _MANAGER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


_FINDER = _PatchOnImport()


def install() -> None:
    """Make ``elastic_retry`` jobs one run each, now or when pathwaysutils is imported."""
    if (module := sys.modules.get(_MANAGER)) is not None:
        _patch(module)
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
