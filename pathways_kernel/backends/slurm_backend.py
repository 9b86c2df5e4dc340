"""The Slurm backend: ``slurm:JOB``, a Pathways job's proxy found through the job's comment.

Also ``connect``, which binds the embedded slices to a job instead
(``local:SxC --slurm JOB``, ``slurm_binding.py``). Slurm's commands, jobs
and nodes are in ``slurm.py``, whose docstring describes the whole flow.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from pathways_kernel.backends import preflight as preflight_lib
from pathways_kernel.backends import slurm_watch
from pathways_kernel.backends.proxy import ProxyBackend
from pathways_kernel.backends.slurm import DEFAULT_WAIT_S, Job, LiveLine, Slurm, submit_job, wait_running
from pathways_kernel.backends.slurm_binding import binding
from pathways_kernel.core import sessions
from pathways_kernel.core.errors import BackendError, SpecError
from pathways_kernel.core.eventlog import EventLog


def parse_spec(spec: str) -> str:
    """``slurm:JOB`` -> ``JOB`` (id or name; empty with --submit)."""
    body = spec.strip()[len("slurm:") :].strip()
    if body and not re.fullmatch(r"[\w.\-]+", body):
        raise SpecError(f"bad Slurm job '{body}': give a job id or a job name, e.g. slurm:12345 or slurm:pathways")
    return body


class SlurmBackend(ProxyBackend):
    """The Pathways proxy of a Slurm job, found through the job's comment."""

    name: ClassVar[str] = "slurm"

    def __init__(
        self,
        job: str,
        *,
        timeout: float | None = None,
        insecure: bool | None = None,
        wait: float | None = None,
        nodes_per_slice: int | None = None,
        feature: str | None = None,
        slurm: Slurm | None = None,
    ):
        super().__init__(preflight_lib.Target("127.0.0.1", preflight_lib.PROXY_PORT), timeout, insecure)
        if not job:
            raise SpecError("slurm: needs a job: slurm:JOB_ID, slurm:JOB_NAME, or --submit SCRIPT")
        self.job_ref = job
        self.wait = DEFAULT_WAIT_S if wait is None else float(wait)
        if not self.wait >= 0:
            raise SpecError(f"bad --wait {wait}: give the seconds to wait for a pending job, e.g. 600")
        self.nodes_per_slice, self.feature = nodes_per_slice, feature
        self.slurm = slurm or Slurm()
        # The wait for the job comes before there is a session: it logs here, and the
        # session this backend starts takes this log as its own.
        self.events = EventLog()
        self.job: Job | None = None
        self.watch: Any = None

    @property
    def spec(self) -> str:
        return f"slurm:{self.job.id if self.job else self.job_ref}"

    @property
    def target(self) -> str:
        if self.job is None:
            return f"slurm job {self.job_ref}"
        job = self.watch.job if self.watch is not None else self.job
        return f"{self.address.url} ({job.label()})"

    def preflight(self) -> preflight_lib.Report | None:
        job_id = self.slurm.resolve(self.job_ref)
        self.job = wait_running(self.slurm, job_id, self.wait, on_change=LiveLine(self.events))
        address = self.job.proxy_address() or ""
        try:
            self.address = preflight_lib.parse_target(address)
        except SpecError as exc:
            raise BackendError(f"slurm job {job_id} published a bad proxy address: {exc}") from None
        return super().preflight()

    def activate(self) -> None:
        super().activate()
        assert self.job is not None
        self.watch = slurm_watch.JobWatch(
            self.slurm, self.job, self.events, slurm_watch.SessionSlices(self), self.nodes_per_slice, self.feature
        )
        self.watch.start()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None
        super().close()


def connect(
    job: str = "",
    *,
    submit: str | None = None,
    sbatch: Sequence[str] = (),
    local: str | None = None,
    force: bool = False,
    timeout: float | None = None,
    insecure: bool | None = None,
    wait: float | None = None,
    nodes_per_slice: int | None = None,
    feature: str | None = None,
) -> sessions.Session:
    """Connect the session to a Pathways job on Slurm, or bind a local backend to one.

    Args:
      job: job id or name (with ``submit``: the name to give the new job).
      submit: submit this job script (or shipped template ``pathways-job``)
        with ``sbatch`` options first, and wait for it; the kernel cancels it
        when it exits.
      local: ``local:SxC``: run the local Pathways server with its slices bound to
        the job's nodes instead of connecting to the job's proxy.
      force, timeout, insecure: as for ``pw.connect``.
      wait: seconds to wait for a pending job (default 600).
      nodes_per_slice, feature: how the job's nodes group into slices.

    Returns:
      The session.

    Raises:
      SpecError, BackendError: one line saying what Slurm or the job lacks.
    """
    slurm = Slurm()
    submitted = None
    if submit:
        job = submit_job(submit, sbatch, name=job, slurm=slurm)
        submitted = f"slurm job {job} ({submit}): cancelled when this kernel exits"
    if local is not None:
        if not job:
            raise SpecError(f"--slurm needs a job: {local} --slurm JOB_ID (or --submit SCRIPT)")
        session = sessions.connect(local, force=force)
        if submitted is not None:
            session.events.emit("job_submitted", detail=submitted)
        binding(session).bind(job, nodes_per_slice=nodes_per_slice, feature=feature, wait=wait, slurm=slurm)
        return session
    backend = SlurmBackend(
        job,
        timeout=timeout,
        insecure=insecure,
        wait=wait,
        nodes_per_slice=nodes_per_slice,
        feature=feature,
        slurm=slurm,
    )
    if submitted is not None:
        backend.events.emit("job_submitted", detail=submitted)
    return sessions.install(backend, force)
