"""Goodput to Cloud Logging, when the user opts in on Pathways on GKE.

Every run is recorded through ``ml-goodput-measurement``'s recorder into an
in-memory log (``goodput_field.FieldLog``). ``pw.goodput_cloud_logging(JOB)`` (or
``%pathways goodput --cloud-logging JOB``) makes each later run of the session
write the same entries to Cloud Logging too, through the library's own
``_CloudLogger`` (asynchronous, batched, drained at exit): the entries its
recorder writes for a MaxText job, named as follows:

    job name   JOB-RUN-N   (RUN the run's name, N counting the session's runs)
    log name   goodput_JOB (MaxText writes ``goodput_<run_name>`` the same way)

One job per run, because the library's calculator reads one job as one
training run whose step numbers only go up. ``pw.goodput_cloud_logging(None)``
(``--cloud-logging off``) stops it for runs started afterwards.

It is refused on the embedded backend (there is no GKE job to attribute the
time to) and without Google Cloud credentials, each in one line. Credentials
are looked up once, when opting in: a run never stalls on them, and a failed
upload later is the library's background thread's to log, never the run's.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pathways_kernel.core.errors import NotSupportedError, PathwaysError
from pathways_kernel.core.sessions import session as current_session

if TYPE_CHECKING:
    from pathways_kernel.core.sessions import Session

#: What Cloud Logging and the library's filters accept in a job name, kept short.
_JOB = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
LOG_PREFIX = "goodput_"


def _library_logger(job_name: str, log_name: str) -> Any:
    """The library's Cloud Logging writer for one job (needs credentials)."""
    from ml_goodput_measurement.src.goodput import _CloudLogger

    return _CloudLogger(job_name, log_name)


class CloudLogging:
    """A session's opt-in (a session component): where its new runs also write."""

    def __init__(self, _session: Session | None = None) -> None:
        self._lock = threading.Lock()
        self.job: str | None = None
        self.project: str | None = None
        self._factory: Callable[[str, str], Any] = _library_logger
        self._runs = itertools.count(1)

    def enable(self, job: str, factory: Callable[[str, str], Any]) -> None:
        # Credentials and project are found now, in one line if not.
        probe = _try(lambda: factory(f"{job}-check", LOG_PREFIX + job))
        with self._lock:
            self.job, self._factory = job, factory
            self.project = getattr(probe, "project_id", None)

    def disable(self) -> None:
        with self._lock:
            self.job = None

    def for_run(self, name: str) -> tuple[str, Any] | None:
        """``(job_name, writer)`` for a run starting now, or ``None`` when off."""
        with self._lock:
            job, factory = self.job, self._factory
            if job is None:
                return None
            job_name = f"{job}-{_safe(name)}-{next(self._runs)}"
        try:
            return job_name, factory(job_name, LOG_PREFIX + job)
        except Exception:  # the run goes on; pw.goodput() still has it
            return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:40] or "run"


def _try(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except ImportError as error:
        raise PathwaysError(
            f"Cloud Logging needs google-cloud-logging ({error.name or error}); pip install google-cloud-logging"
        ) from None
    except Exception as error:  # google.auth's DefaultCredentialsError and kin
        kind = type(error).__name__
        first = str(error).strip().splitlines()[0] if str(error).strip() else kind
        if "credentials" in kind.lower() or "credentials" in first.lower():
            raise PathwaysError(
                "no Google Cloud credentials for Cloud Logging: on GKE use Workload Identity, "
                "elsewhere gcloud auth application-default login"
            ) from None
        raise PathwaysError(f"Cloud Logging is not reachable: {kind}: {first[:160]}") from None


def cloud_logging(
    job: str | None, session: Session | None = None, logger_factory: Callable[[str, str], Any] | None = None
) -> str:
    """Also record each new run of this session to Cloud Logging as job ``JOB-RUN-N``
    (``job=None``: stop). Returns a line saying what is now on.

    ``logger_factory(job_name, log_name)``: the writer (default: the library's
    ``_CloudLogger``); tests give their own, as no Cloud Logging runs here.

    Raises:
      NotSupportedError: the session is not on the Pathways proxy backend.
      PathwaysError: a bad job name, no credentials, no google-cloud-logging.
    """
    s = session or current_session()
    opt_in = s.component(CloudLogging)
    if job is None:
        opt_in.disable()
        return "goodput: Cloud Logging off; runs keep their in-memory log (pw.goodput())"
    if not isinstance(job, str) or not _JOB.fullmatch(job):
        raise PathwaysError(
            f"goodput job name must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit; got {job!r}"
        )
    if s.backend.name != "proxy":
        raise NotSupportedError(
            f"Cloud Logging of goodput is for Pathways on GKE (the proxy backend); this session runs {s.backend.spec} "
            f"and keeps each run's goodput log in memory (pw.goodput())"
        )
    opt_in.enable(job, logger_factory or _library_logger)
    where = f" in project {opt_in.project}" if opt_in.project else ""
    return f"goodput: new runs also write to Cloud Logging{where}, log {LOG_PREFIX}{job}, job {job}-<run>-<n>"


__all__ = ["CloudLogging", "cloud_logging"]
