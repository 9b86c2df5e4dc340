"""``pw.log(loss=...)``: the latest values of a run's own metrics, for its progress view.

    for batch in pw.steps(batches, name="train"):
        state, loss = update(state, batch)
        pw.log(loss=loss)                      # shown under the cell as "loss 0.1234"

Works in any run the goodput ledger counts on this thread: ``pw.steps``
loops, ``@pw.elastic`` step functions, ``%%pathways elastic`` cells and bare
``pw.loader`` loops. Values may be device arrays still being computed: they
are read once ready, never waited for while the run goes on.
"""

from __future__ import annotations

from typing import Any

from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.training import goodput


def log(**metrics: Any) -> None:
    """Record the latest value of each named metric (a scalar) of the run in progress.

    Raises:
      PathwaysError: no run is in progress on this thread.
    """
    account = goodput.running()
    if account is None or account.ended:
        raise PathwaysError(
            "pw.log records metrics of a run in progress: call it inside a pw.steps(...) loop, "
            "an @pw.elastic step, a %%pathways elastic cell or a pw.loader loop"
        )
    account.metrics.update(metrics)


__all__ = ["log"]
