"""``pw.steps``: mark the steps of your own training loop, for goodput.

    for batch in pw.steps(batches, name="train"):
        state = update(state, batch)           # one step: productive time

Each pass through the loop body is a step; the time spent getting the next
item from ``batches`` is ``data_wait``; compiles on this thread are
``compile``; snapshots and checkpoints taken inside count as theirs. The run
ends with the loop (or the ``break`` out of it) and emits a ``goodput`` event;
``pw.goodput("train")`` shows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

from pathways_kernel.training import goodput


def steps(
    iterable: Iterable[Any], name: str = "steps", flops: float | None = None, start: int = 0, progress: bool = True
) -> Iterator[Any]:
    """Yield the items of ``iterable``, counting each loop body as one step.

    Args:
      name: the run's name in ``pw.goodput()`` and the event log.
      flops: model FLOPs per step, for MFU (or call ``pw.flops(step_fn, ...)``
        inside the loop).
      start: number of the first step.
      progress: show the loop's progress under the cell (in a notebook);
        out of ``len(iterable)`` steps when it has a length.
    """
    stop = start + len(iterable) if isinstance(iterable, Sized) else None
    account = goodput.begin(name, "steps", first_step=start, stop_step=stop, progress=progress)
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
        account.end()


__all__ = ["steps"]
