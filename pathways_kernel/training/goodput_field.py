"""The field's goodput: each run also recorded through ml-goodput-measurement's
``ElasticGoodputRecorder`` into an in-memory log (and Cloud Logging when the session
opted in, ``goodput_logging``), so ``Account.field()`` gives the figure MaxText users see."""

from __future__ import annotations

import contextlib
import datetime
import logging
import shutil
import tempfile
import threading
from typing import Any

from pathways_kernel.training.goodput_logging import CloudLogging


# -- the field's library, fed from the same run ------------------------------
class _MemoryLog:
    """The ``cloud_logger`` seam of ml-goodput-measurement, kept in memory."""

    def __init__(self, job_name: str):
        self.job_name = job_name
        self.entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.entries.append(entry)

    def flush(self) -> None:
        pass

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        with self._lock:
            entries = list(self.entries)
        if last_entry_info is not None:
            return [], last_entry_info
        last = (datetime.datetime.now(datetime.UTC), str(len(entries)))
        return entries, last


class _TeeLog(_MemoryLog):
    """The in-memory log, each entry also written to Cloud Logging (``goodput_logging``)."""

    def __init__(self, job_name: str, cloud: Any):
        super().__init__(job_name)
        self.cloud = cloud

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        super().write_cloud_logging_entry(entry)
        with contextlib.suppress(Exception):  # an upload problem is never the run's
            self.cloud.write_cloud_logging_entry(entry)


class FieldLog:
    """One run recorded through ``ElasticGoodputRecorder`` into a ``_MemoryLog``
    (and to Cloud Logging when the session opted in: ``goodput_logging``)."""

    def __init__(self, name: str, session: Any):
        from ml_goodput_measurement.src.goodput_elastic import ElasticGoodputRecorder

        cloud = session.component(CloudLogging).for_run(name)
        if cloud is None:
            self.job_name = f"{name}-{id(self):x}"
            self.log = _MemoryLog(self.job_name)
        else:
            self.job_name = cloud[0]
            self.log = _TeeLog(self.job_name, cloud[1])
        self.recorder = ElasticGoodputRecorder(
            self.job_name, "pathways-kernel", logging_enabled=True, cloud_logger=self.log
        )

    def job_start(self) -> None:
        self.recorder.record_job_start_time()

    def job_end(self) -> None:
        self.recorder.record_job_end_time()

    def step(self, step: int) -> None:
        self.recorder.record_step_start_time(step)

    def custom(self, category: str, start: bool) -> None:
        if start:
            self.recorder.record_custom_badput_event_start_time(custom_badput_event_type=category)
        else:
            self.recorder.record_custom_badput_event_end_time(custom_badput_event_type=category)

    def elastic_wait(self, category: str, start: bool) -> None:
        if start:
            self.recorder.record_elastic_wait_start_time(category)
        else:
            self.recorder.record_elastic_wait_end_time(category)

    def reinit(self, start: bool) -> None:
        if start:
            self.recorder.record_elastic_reinit_start_time()
        else:
            self.recorder.record_elastic_reinit_end_time()

    def compute(self) -> dict[str, Any]:
        """Goodput (percent) and badput breakdown (percent per ``BadputType`` name)."""

        from ml_goodput_measurement.src.goodput_elastic import ElasticGoodputCalculator

        cache = tempfile.mkdtemp(prefix="pathways-goodput-")
        # The calculator logs a warning per category it cannot compute; those
        # are its own business, not the notebook's.
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)
        try:
            calculator = ElasticGoodputCalculator(
                self.job_name, "pathways-kernel", cloud_logger=self.log, using_pathways=True, cache_dir=cache
            )
            value, breakdown, last_step = calculator.get_job_goodput(include_badput_breakdown=True)
        finally:
            logging.getLogger().setLevel(quiet)
            shutil.rmtree(cache, ignore_errors=True)
        flat: dict[str, float] = {}
        for kind, v in breakdown.items():
            if isinstance(v, dict):
                flat.update({f"custom:{k}": x for k, x in v.items()})
            else:
                flat[kind.name] = v
        return {"goodput": value, "badput": flat, "last_step": last_step}
