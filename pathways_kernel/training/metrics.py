"""``pw.log(loss=...)``: the latest values of a run's own metrics, for its progress view.

    for batch in pw.steps(batches, name="train"):
        state, loss = update(state, batch)
        pw.log(loss=loss)                      # shown under the cell as "loss 0.1234"

Works in any run the goodput ledger counts on this thread: ``pw.steps``
loops, ``@pw.elastic`` step functions, ``%%pathways elastic`` cells and bare
``pw.loader`` loops. Values may be device arrays still being computed: they
are read once ready, never waited for while the run goes on. Every value is
kept with its run, step and time (``training.metric_log``):
``pw.metrics()`` gives them as a DataFrame, ``pw.metrics_to_tensorboard(dir)``
writes them where TensorBoard reads them.
"""

from __future__ import annotations

from typing import Any

from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.training import accounting
from pathways_kernel.training.metric_log import metric_log


def log(**metrics: Any) -> None:
    """Record the latest value of each named metric (a scalar) of the run in progress.

    Raises:
      PathwaysError: no run is in progress on this thread.
    """
    account = accounting.running()
    if account is None or account.ended:
        raise PathwaysError(
            "pw.log records metrics of a run in progress: call it inside a pw.steps(...) loop, "
            "an @pw.elastic step, a %%pathways elastic cell or a pw.loader loop"
        )
    account.metrics.update(metrics)
    metric_log(account._session).log(account, metrics)


def metrics(run: str | None = None) -> Any:
    """The session's metrics as a ``pandas.DataFrame``: one row per run and step, in
    the order logged, with columns ``run`` ("train #2": its name and its number
    among the runs of that name), ``step``, ``time`` (UTC), ``elapsed_s`` (since
    the run started) and one per metric name. Waits for values still being computed.

    Args:
      run: only this run: a label ("train #2") or a name (all runs of that name).

    Raises:
      PathwaysError: ``run`` has recorded no metrics.
    """
    import pandas as pd

    log = metric_log()
    log.flush()
    points = log.points(run)
    if run is not None and not points:
        known = ", ".join(f"'{r}'" for r in log.runs()) or "none yet"
        raise PathwaysError(
            f"no metrics for run '{run}' (runs with metrics: {known}); pw.log(name=value) inside a run records them"
        )
    rows: list[dict[str, Any]] = []
    for p in points:
        row = rows[-1] if rows else None
        # A new row for each step; a step run again (after a rollback) gets a row of its own.
        if row is None or (row["run"], row["step"]) != (p.run, p.step) or p.name in row:
            row = {"run": p.run, "step": p.step, "time": p.time, "elapsed_s": p.elapsed_s}
            rows.append(row)
        row[p.name] = p.value
    frame = pd.DataFrame(rows, columns=["run", "step", "time", "elapsed_s"] if not rows else None)
    frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
    return frame


__all__ = ["log", "metrics"]
