"""``pw.metrics_to_tensorboard(logdir)``: the session's metrics as TensorBoard event files.

    writer = pw.metrics_to_tensorboard("runs/")   # then: tensorboard --logdir runs/

Opt-in. Each run gets a subdirectory of ``logdir`` (TensorBoard's runs, so
runs overlay), named for its label ("train #2" -> ``train_2``), with one
scalar series per metric name, by step, at the wall time each value was
logged. Points already kept are written at once, later ones as the metric
log reads them. tensorboardX writes the files (TensorBoard's TFRecord event
format); ``writer.close()`` stops it.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from pathways_kernel.training.metric_log import MetricLog, Point, metric_log


class TensorBoardWriter:
    """Writes a metric log's points under ``logdir``, one subdirectory per run."""

    def __init__(self, logdir: str | os.PathLike[str], log: MetricLog):
        self.logdir = os.fspath(logdir)
        self._writers: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._closed = False
        # Subscribed before the backlog is written: a point read in between is written
        # twice at worst (the same step and value: TensorBoard shows one).
        self._unsubscribe = log.subscribe(self._write)
        self._write(log.points())

    def run_dir(self, run: str) -> str:
        """The subdirectory a run's events go to."""
        return os.path.join(self.logdir, re.sub(r"[^\w.-]+", "_", run).strip("_") or "run")

    def _write(self, points: list[Point]) -> None:
        from tensorboardX import SummaryWriter

        with self._lock:
            if self._closed:
                return
            touched = set()
            for p in points:
                writer = self._writers.get(p.run)
                if writer is None:
                    writer = self._writers[p.run] = SummaryWriter(self.run_dir(p.run))
                writer.add_scalar(p.name, p.value, p.step, walltime=p.time)
                touched.add(p.run)
            for run in touched:
                self._writers[run].flush()

    def close(self) -> None:
        """Stop writing; the files stay."""
        self._unsubscribe()
        with self._lock:
            self._closed = True
            for writer in self._writers.values():
                writer.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "writing"
        return f"TensorBoardWriter({self.logdir!r}, {state}; runs: {sorted(self._writers)})"


def metrics_to_tensorboard(logdir: str | os.PathLike[str]) -> TensorBoardWriter:
    """Write the session's metrics (those kept, then each new one) as TensorBoard
    event files under ``logdir``; returns the writer (``.close()`` stops it)."""
    return TensorBoardWriter(logdir, metric_log())


__all__ = ["TensorBoardWriter", "metrics_to_tensorboard"]
