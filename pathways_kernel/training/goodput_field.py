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
from typing import TYPE_CHECKING, Any

from pathways_kernel.training.goodput_logging import CloudLogging

if TYPE_CHECKING:
    from pathways_kernel.core.sessions import Session


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

    def read_cloud_logging_entries(
        self,
        start_time: datetime.datetime | None = None,
        end_time: datetime.datetime | None = None,
        last_entry_info: Any = None,
    ) -> tuple[list[dict[str, Any]], Any]:
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
    (and to Cloud Logging when the session opted in: ``goodput_logging``).

    ml-goodput-measurement imports scipy.stats (1.5-1.7 s on the 2-core development
    machine), which a kernel's first run paid inside its first step. Without Cloud Logging
    nobody reads the log before ``compute()``, so the run's calls are kept with their
    times and handed to the recorder then, each with the time it was made (every
    ``record_*`` takes one); with Cloud Logging the recorder writes as the run goes."""

    def __init__(self, name: str, session: Session):
        cloud = session.component(CloudLogging).for_run(name)
        self._lock = threading.Lock()
        self._calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self._recorder: Any = None
        if cloud is None:
            self.job_name = f"{name}-{id(self):x}"
            self.log = _MemoryLog(self.job_name)
        else:
            self.job_name = cloud[0]
            self.log = _TeeLog(self.job_name, cloud[1])
            self.recorder()

    def recorder(self) -> Any:
        """The run's ``ElasticGoodputRecorder``, every call kept so far recorded in order."""
        with self._lock:
            if self._recorder is None:
                from ml_goodput_measurement.src.goodput_elastic import ElasticGoodputRecorder

                self._recorder = ElasticGoodputRecorder(
                    self.job_name, "pathways-kernel", logging_enabled=True, cloud_logger=self.log
                )
            calls, self._calls = self._calls, []
            for method, args, kwargs in calls:
                getattr(self._recorder, method)(*args, **kwargs)
            return self._recorder

    def _record(self, method: str, *args: Any, time_arg: str, **kwargs: Any) -> None:
        kwargs[time_arg] = datetime.datetime.now(datetime.UTC)
        with self._lock:
            if self._recorder is None:
                self._calls.append((method, args, kwargs))
                return
        getattr(self._recorder, method)(*args, **kwargs)

    def job_start(self) -> None:
        self._record("record_job_start_time", time_arg="start_time")

    def job_end(self) -> None:
        self._record("record_job_end_time", time_arg="end_time")

    def step(self, step: int) -> None:
        self._record("record_step_start_time", step, time_arg="start_time")

    def custom(self, category: str, start: bool) -> None:
        if start:
            self._record(
                "record_custom_badput_event_start_time", custom_badput_event_type=category, time_arg="start_time"
            )
        else:
            self._record("record_custom_badput_event_end_time", custom_badput_event_type=category, time_arg="end_time")

    def elastic_wait(self, category: str, start: bool) -> None:
        if start:
            self._record("record_elastic_wait_start_time", category, time_arg="start_time")
        else:
            self._record("record_elastic_wait_end_time", category, time_arg="end_time")

    def reinit(self, start: bool) -> None:
        if start:
            self._record("record_elastic_reinit_start_time", time_arg="start_time")
        else:
            self._record("record_elastic_reinit_end_time", time_arg="end_time")

    def compute(self) -> dict[str, Any]:
        """Goodput (percent) and badput breakdown (percent per ``BadputType`` name)."""

        from ml_goodput_measurement.src.goodput_elastic import ElasticGoodputCalculator

        self.recorder()  # every call of the run in the log first
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
