"""``pw.steps``: mark the steps of your own training loop, for goodput.

    for batch in pw.steps(batches, name="train"):
        state = update(state, batch)           # one step: productive time

Each pass through the loop body is a step; the time spent getting the next
item from ``batches`` is ``data_wait``; compiles on this thread are
``compile``; snapshots and checkpoints taken inside count as theirs. The run
ends with the loop (or the ``break`` out of it) and emits a ``goodput`` event;
``pw.goodput("train")`` shows it.

Inside a function decorated with pathwaysutils' ``Manager().elastic_retry``,
the loops of its attempts are one run (``goodput_jobs``): write
``pw.steps(range(resumed_step, total), name=...)`` and the steps an attempt
goes back over are counted as redone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

from pathways_kernel.training import accounting, goodput_jobs

goodput_jobs.install()  # the attempts of an elastic_retry job are one run


def steps(
    iterable: Iterable[Any],
    name: str = "steps",
    flops: float | None = None,
    start: int | None = None,
    progress: bool = True,
) -> Iterator[Any]:
    """Yield the items of ``iterable``, counting each loop body as one step.

    Args:
      name: the run's name in ``pw.goodput()`` and the event log.
      flops: model FLOPs per step, for MFU (or call ``pw.flops(step_fn, ...)``
        inside the loop).
      start: number of the first step (default: the start of a ``range``, else 0).
      progress: show the loop's progress under the cell (in a notebook);
        out of ``len(iterable)`` steps when it has a length.
    """
    if start is None:
        start = iterable.start if isinstance(iterable, range) else 0
    stop = start + len(iterable) if isinstance(iterable, Sized) else None
    job = goodput_jobs.current()
    account = job.join(name, start, stop, progress) if job is not None else None
    joined = account is not None
    if account is None:
        account = accounting.begin(name, "steps", first_step=start, stop_step=stop, progress=progress)
    if flops is not None:
        account.flops_per_step = float(flops)
    try:
        items = iter(iterable)
        step = start
        while True:
            with account.spent("data_wait"):
                try:
                    item = next(items)
                except StopIteration:
                    return
            account.step_begin(step)
            yield item
            account.step_end()
            step += 1
    finally:
        if joined:
            # The job's run goes on (its next attempt, or until the function returns).
            account.loop_left()
        else:
            account.end()


__all__ = ["steps"]
