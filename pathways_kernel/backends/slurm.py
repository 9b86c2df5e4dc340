"""Pathways on Slurm (Cluster Director): find the job, connect through its proxy.

This module is Slurm's side: its commands, jobs and nodes, submitting and
waiting. The backend that connects through a job's proxy is in
``slurm_backend.py``, a job's watch in ``slurm_watch.py`` and the embedded
slices bound to a job in ``slurm_binding.py``.

``slurm:JOB`` (a job id or name) names a Pathways job on a Slurm cluster. The
kernel reads it with Slurm's own commands (``scontrol show job -o``,
``squeue``, ``sbatch``, ``scancel``, as subprocesses: the kernel opens no
port and needs only the client commands and munge of a login node). While
the job is PENDING its state and Slurm's reason are shown live; once it is
RUNNING the kernel connects through the proxy path (pre-flight and all).

Where the proxy is: the job's comment
-------------------------------------
A Pathways job publishes its proxy address in its Slurm comment::

    pathways-proxy=grpc://HOST:PORT

set from inside the job with ``scontrol update jobid=$SLURM_JOB_ID
comment=...`` once the proxy listens (``pathways-proxy=starting`` before
that; the shipped template ``templates/pathways-job.sbatch`` does both).
The comment rather than a file the job writes: it travels with the job
through ``scontrol``/``squeue -o %k`` to any host that can query the
controller, so the notebook host needs no shared filesystem with the job's
nodes, and it goes away with the job.

Slices from Slurm
-----------------
The job's nodes are grouped into slices (``slurm_watch.group_nodes``: by a
node feature, a nodes-per-slice count, or evenly over the session's slices)
and a background thread (``slurm_watch.JobWatch``) polls the job and its
nodes every ``POLL_S`` seconds: a slice follows the job's allocation (down
while the job is not RUNNING, when its node leaves the job, or while its node
is DOWN, DRAIN or FAIL, with Slurm's reason); requeue, preemption, the end of
the job and an approaching time limit become events.

Elastic jobs are submitted with ``sbatch --no-kill``: without it one failed
node ends the whole job (``submit_job`` warns once per script).

A job the kernel submitted (``--submit``) is cancelled when the kernel exits,
and it says so; a job it did not submit is never cancelled.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pathways_kernel.core.errors import BackendError, SpecError
from pathways_kernel.core.eventlog import EventLog

#: Seconds one Slurm command may take before the controller counts as unreachable.
COMMAND_TIMEOUT_S = 4.0
#: Seconds a RUNNING job may go without any ``pathways-proxy=`` in its comment.
ADDRESS_GRACE_S = 3.0
#: Seconds ``connect`` waits for a PENDING job to start (and publish its address).
DEFAULT_WAIT_S = 600.0
#: The job-comment key that carries the proxy address.
PROXY_KEY = "pathways-proxy"
#: What the job's comment says while its proxy is still coming up.
STARTING = "starting"
#: Shipped job scripts, by the name ``--submit`` accepts.
TEMPLATES = {"pathways-job": Path(__file__).parent / "templates" / "pathways-job.sbatch"}

ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)
_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:.\-]*)=")
_JOB_ID = re.compile(r"^(\d+)")


@dataclasses.dataclass(frozen=True)
class Job:
    """One job as ``scontrol show job -o`` reports it."""

    id: str
    name: str
    state: str
    reason: str
    nodelist: str
    comment: str
    restarts: int
    end_time: float | None
    time_limit: str

    @classmethod
    def from_record(cls, r: dict[str, str]) -> Job:
        return cls(
            id=r.get("JobId", ""),
            name=r.get("JobName", ""),
            state=r.get("JobState", "UNKNOWN"),
            reason=r.get("Reason", "None"),
            nodelist="" if r.get("NodeList", "(null)") == "(null)" else r.get("NodeList", ""),
            comment="" if r.get("Comment", "(null)") == "(null)" else r.get("Comment", ""),
            restarts=int(r.get("Restarts", "0") or 0),
            end_time=_parse_time(r.get("EndTime", "")),
            time_limit=r.get("TimeLimit", ""),
        )

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def time_left_s(self, now: float | None = None) -> float | None:
        if self.state != "RUNNING" or self.end_time is None or self.time_limit in ("UNLIMITED", "INFINITE"):
            return None
        return max(self.end_time - (time.time() if now is None else now), 0.0)

    def proxy_address(self) -> str | None:
        """The comment's ``pathways-proxy=`` value (``"starting"``, a URL), or ``None``."""
        for part in re.split(r"[\s;,]+", self.comment):
            key, sep, value = part.partition("=")
            if sep and key == PROXY_KEY:
                return value
        return None

    def label(self, now: float | None = None) -> str:
        """``slurm job 42 · 1 h 23 min left``, or the job's state when no limit runs: the monitor header's target.

        Minutes, not seconds: the monitor re-sends its topology when the
        label changes, so it changes at most once a minute while the job runs.
        """
        left = self.time_left_s(now)
        if left is not None:
            return f"slurm job {self.id} · {format_minutes(left)} left"
        return f"slurm job {self.id} · {self.state}" + (f" ({self.reason})" if self.state == "PENDING" else "")

    def describe(self) -> str:
        text = f"slurm job {self.id} ({self.name}): {self.state}"
        if self.state == "PENDING" or (self.reason not in ("None", "") and not self.active):
            text += f" ({self.reason})"
        if (left := self.time_left_s()) is not None:
            text += f", {format_duration(left)} left"
        return text


@dataclasses.dataclass(frozen=True)
class Node:
    """One node as ``scontrol show node -o`` reports it."""

    name: str
    state: str  # e.g. IDLE, ALLOCATED, DOWN+NOT_RESPONDING, IDLE+DRAIN
    reason: str
    features: tuple[str, ...]

    @classmethod
    def from_record(cls, r: dict[str, str]) -> Node:
        features = r.get("ActiveFeatures", "") or r.get("AvailableFeatures", "")
        return cls(
            name=r.get("NodeName", ""),
            state=r.get("State", "UNKNOWN"),
            reason=r.get("Reason", ""),
            features=tuple(f for f in features.split(",") if f and f != "(null)"),
        )

    @property
    def out_of_service(self) -> bool:
        """DOWN, DRAIN(ED/ING) or FAIL(ING): what takes a slice out of service."""
        flags = set(self.state.upper().replace("*", "").split("+"))
        return bool(flags & {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"})


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def format_minutes(seconds: float) -> str:
    hours, minutes = divmod(int(seconds) // 60, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min" if minutes else "<1 min"


def _parse_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_record(line: str) -> dict[str, str]:
    """One ``-o`` line of ``scontrol show`` -> its ``Key=value`` fields.

    Values may hold spaces (a node's ``Reason=maint [root@...]``): each value
    runs to the next ``Key=`` that follows whitespace.
    """
    matches = list(_KEY.finditer(line))
    fields = {}
    for m, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following is not None else len(line)
        fields[m.group(1)] = line[m.end() : end].strip()
    return fields


# -- the Slurm client commands -------------------------------------------------
class Slurm:
    """Slurm's client commands, each failure turned into one line that says what to do."""

    def __init__(self, timeout: float = COMMAND_TIMEOUT_S):
        self.timeout = timeout

    def run(self, *argv: str) -> str:
        """Run a Slurm command; its stdout. Raises ``BackendError`` in one line."""
        if shutil.which(argv[0]) is None:
            raise BackendError(
                f"Slurm's `{argv[0]}` is not on PATH: run the kernel where Slurm's client commands are installed "
                "(a login node; Debian: apt install slurm-client munge) or add their directory to PATH"
            )
        returncode, out, err = self._communicate(argv)
        if returncode is None:
            # With munge down, the commands retry their credential for long
            # but say why at the first try: that is enough to stop them.
            if "munge" in err.lower():
                raise self._error(argv, err)
            raise BackendError(
                f"slurmctld is unreachable (no answer to `{' '.join(argv[:3])}` within {self.timeout:.0f} s): "
                "check `scontrol ping`, the controller host and SLURM_CONF"
            )
        if returncode != 0:
            raise self._error(argv, err)
        return out

    def _communicate(self, argv: Sequence[str]) -> tuple[int | None, str, str]:
        """Run ``argv``: its exit status (``None`` if stopped: timed out, or munge named on stderr), stdout, stderr."""
        out: list[bytes] = []
        err: list[bytes] = []
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            with selectors.DefaultSelector() as streams:
                streams.register(proc.stdout, selectors.EVENT_READ, out)
                streams.register(proc.stderr, selectors.EVENT_READ, err)
                deadline = time.monotonic() + self.timeout
                stopped = False
                while streams.get_map() and not stopped:
                    left = deadline - time.monotonic()
                    for key, _ in streams.select(max(left, 0)):
                        chunk = os.read(key.fd, 65536)
                        if chunk:
                            key.data.append(chunk)
                        else:
                            streams.unregister(key.fileobj)
                    stopped = left <= 0 or b"munge" in b"".join(err).lower()
            if stopped:
                proc.kill()
            returncode = None if stopped else proc.wait()
        return returncode, b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace")

    @staticmethod
    def _error(argv: Sequence[str], stderr: str) -> BackendError:
        text = " ".join(stderr.split())
        lowered = text.lower()
        if "munge" in lowered:
            return BackendError(
                "munge is not running on this host, so Slurm cannot authenticate: start munged "
                "(`munge -n | unmunge` should say Success)"
            )
        if "unable to contact slurm controller" in lowered or "socket timed out" in lowered:
            return BackendError(
                "slurmctld is unreachable (Unable to contact slurm controller): check `scontrol ping`, "
                "the controller host and SLURM_CONF"
            )
        if "invalid job id" in lowered:
            job = next((a for a in reversed(argv) if a[:1].isdigit()), "?")
            return BackendError(f"no Slurm job {job}: it does not exist or finished long ago (see `squeue --me`)")
        if "access/permission denied" in lowered or "permission denied" in lowered or "not the owner" in lowered:
            return BackendError(f"Slurm refused `{' '.join(argv[:2])}`: permission denied (the job is not yours)")
        if "could not establish a configuration source" in lowered or "s_p_parse_file" in lowered:
            return BackendError("Slurm's configuration was not found: set SLURM_CONF to the cluster's slurm.conf")
        return BackendError(f"`{' '.join(argv[:3])}` failed: {text[:300] or 'no message'}")

    # -- reading ---------------------------------------------------------------
    def job(self, job_id: str) -> Job:
        lines = [line for line in self.run("scontrol", "show", "job", "-o", job_id).splitlines() if line.strip()]
        if not lines:
            raise BackendError(f"no Slurm job {job_id}: it does not exist or finished long ago (see `squeue --me`)")
        # A heterogeneous or array job prints one line per component: the first is the job.
        return Job.from_record(parse_record(lines[0]))

    def resolve(self, job: str) -> str:
        """A job id, or the id of the one active job named ``job``."""
        if job.isdigit():
            return job
        ids = self.run("squeue", "-h", "--name", job, "-o", "%i").split()
        if not ids:
            raise BackendError(
                f"no active Slurm job is named '{job}' (see `squeue --me`); give a job id or submit one with --submit"
            )
        if len(ids) > 1:
            raise BackendError(
                f"{len(ids)} active Slurm jobs are named '{job}' ({', '.join(ids)}): connect to one by id"
            )
        return ids[0]

    def hostnames(self, nodelist: str) -> list[str]:
        return self.run("scontrol", "show", "hostnames", nodelist).split() if nodelist else []

    def nodes(self, names: Sequence[str]) -> dict[str, Node]:
        if not names:
            return {}
        out = self.run("scontrol", "show", "node", "-o", ",".join(names))
        found = [Node.from_record(parse_record(line)) for line in out.splitlines() if line.strip()]
        return {n.name: n for n in found}

    def jobs_on(self, nodes: Sequence[str]) -> list[str]:
        """``"ID PARTITION"`` of each job running (or starting) on any of ``nodes``."""
        return self.run("squeue", "-h", "-t", "R,CF", "-w", ",".join(nodes), "-o", "%i %P").splitlines()

    # -- acting ----------------------------------------------------------------
    def submit(self, script: str, options: Sequence[str] = (), name: str = "") -> str:
        """``sbatch --parsable``; returns the new job's id."""
        path = script_path(script)
        argv = ["sbatch", "--parsable", *([f"--job-name={name}"] if name else []), *options, str(path)]
        match = _JOB_ID.match(self.run(*argv).strip())
        if match is None:
            raise BackendError(f"sbatch {path.name} printed no job id")
        return match.group(1)

    def cancel(self, job_id: str) -> None:
        self.run("scancel", job_id)


def script_path(script: str) -> Path:
    """The job script ``--submit`` names: a shipped template's name or a path."""
    path = Path(TEMPLATES.get(script, script)).expanduser()
    if not path.is_file():
        shipped = ", ".join(TEMPLATES)
        raise SpecError(f"--submit {script}: no such job script (give a path, or a shipped template: {shipped})")
    return path


def sbatch_directives(path: Path) -> list[str]:
    """The options of the script's ``#SBATCH`` lines (sbatch reads them up to the first command)."""
    options: list[str] = []
    for line in path.read_text(errors="replace").splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            options += stripped[len("#SBATCH") :].split("#")[0].split()
        elif stripped and not stripped.startswith("#"):
            break
    return options


def kills_on_node_failure(path: Path, options: Sequence[str] = ()) -> bool:
    """Whether the job would be ended by one failed node: submitted without ``--no-kill`` (``-k``)."""
    if os.environ.get("SBATCH_NO_KILL", "").lower() not in ("", "off"):
        return False
    given = [*sbatch_directives(path), *options]  # the command line overrides the script
    no_kill = [o for o in given if o in ("-k", "--no-kill") or o.startswith("--no-kill=")]
    return not no_kill or no_kill[-1] == "--no-kill=off"


# -- jobs this kernel submitted --------------------------------------------------
_submitted: dict[str, Slurm] = {}
#: Scripts already warned about for lacking --no-kill (once each per kernel).
_warned_kill: set[Path] = set()


def submitted_jobs() -> tuple[str, ...]:
    return tuple(_submitted)


def cancel_submitted() -> None:
    """Cancel every job this kernel submitted, saying so (at kernel exit)."""
    # The process's own stderr: at exit no cell is there to show it, and ipykernel's
    # stream may already be cut off from the frontend.
    while _submitted:
        job_id, slurm = _submitted.popitem()
        try:
            slurm.cancel(job_id)
            print(f"pathways-kernel: cancelled Slurm job {job_id} (submitted by this kernel)", file=sys.__stderr__)
        except BackendError as exc:
            print(f"pathways-kernel: could not cancel Slurm job {job_id}: {exc}", file=sys.__stderr__)


def submit_job(script: str, options: Sequence[str] = (), name: str = "", slurm: Slurm | None = None) -> str:
    """Submit a Pathways job (a script path or a shipped template); cancelled at kernel exit.

    Warns once per script, on stderr, when it is submitted without
    ``--no-kill``: Slurm would then end the whole job when one node fails,
    leaving elastic training nothing to reshard onto.
    """
    slurm = slurm or Slurm()
    path = script_path(script).resolve()
    if path not in _warned_kill and kills_on_node_failure(path, options):
        _warned_kill.add(path)
        print(
            f"pathways-kernel: warning: {path.name} is submitted without --no-kill, so Slurm ends the whole job when "
            "one node fails and elastic training has nothing left to reshard onto; add `#SBATCH --no-kill` to it "
            "(or pass --no-kill) so that only that node's slice is lost",
            file=sys.stderr,
        )
    job_id = slurm.submit(script, options, name)
    if not _submitted:
        # The kernel's promise, not a session's: jobs it submitted end with the process.
        atexit.unregister(cancel_submitted)
        atexit.register(cancel_submitted)
    _submitted[job_id] = slurm
    return job_id


# -- waiting for a job -------------------------------------------------------------
def wait_running(
    slurm: Slurm,
    job_id: str,
    wait: float = DEFAULT_WAIT_S,
    need_address: bool = True,
    on_change: Callable[[Job, float], None] | None = None,
    period: float = 0.5,
) -> Job:
    """Poll the job until it runs (and, with ``need_address``, has published its proxy).

    ``on_change(job, waited_s)`` is called at each poll (the live progress
    line). Raises ``BackendError`` in one line: the job ended, it has no
    proxy convention, or ``wait`` seconds passed.
    """
    start = time.monotonic()
    address_since: float | None = None
    while True:
        job = slurm.job(job_id)
        waited = time.monotonic() - start
        if on_change is not None:
            on_change(job, waited)
        if not job.active:
            raise BackendError(
                f"slurm job {job.id} ({job.name}) has ended ({job.state}, {job.reason}): submit it again "
                "(`%pathways connect slurm: --submit SCRIPT`) or connect to a running one"
            )
        if job.state == "RUNNING":
            address = job.proxy_address()
            if not need_address or (address and address != STARTING):
                return job
            if address is None:
                address_since = address_since if address_since is not None else time.monotonic()
                if time.monotonic() - address_since > ADDRESS_GRACE_S:
                    raise BackendError(
                        f"slurm job {job.id} ({job.name}) is running but does not follow the Pathways convention: "
                        f"its comment should say {PROXY_KEY}=grpc://HOST:PORT (the shipped template "
                        "pathways-job.sbatch sets it), or use `%pathways connect grpc://HOST:PORT`"
                    )
        if waited > wait:
            raise BackendError(f"{job.describe()} after waiting {waited:.0f} s: connect again later, or raise --wait")
        time.sleep(period)


class LiveLine:
    """The progress line of a wait: one output in the cell, updated in place."""

    def __init__(self, events: EventLog):
        self.events = events
        self.handle: Any = None
        self.last: tuple[str, str] | None = None

    def __call__(self, job: Job, waited: float) -> None:
        if (job.state, job.reason) != self.last:
            self.last = (job.state, job.reason)
            if job.state == "PENDING" and self.events is not None:
                self.events.emit("job_pending", detail=job.describe())
        text = f"{job.describe()}, waited {waited:.0f} s"
        if not _in_kernel():
            return
        from IPython.display import display

        bundle = {"text/plain": text}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
