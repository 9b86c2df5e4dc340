"""Slices that follow the Slurm job's allocation, and the job's events, by polling.

Mechanism: a daemon thread runs ``scontrol show job -o JOB`` and
``scontrol show node -o NODES`` every ``POLL_S`` seconds (two short
subprocesses; nothing listens in the kernel, and no ``strigger`` needs a
slot on the controller). A slice is up while the job is RUNNING, all its
nodes are in the job's node list, and none is DOWN, DRAIN or FAIL:

- the job not RUNNING (requeued after a node failure, preempted, cancelled,
  ended) takes every slice down: the allocation is gone. They come back when
  the job runs again, regrouped on the nodes it has then;
- a node leaving the job takes its slice down for good. That is what Slurm
  does to a job submitted with ``sbatch --no-kill`` when the node fails (the
  job runs on, its NodeList shrinks); the node's return to service leaves it
  idle, outside the job, so its slice stays down. It comes back only with a
  job that has the node: the same job growing, or a new job bound in its
  place (``SlurmBinding.bind``, which takes over the slices still down);
- a node of the job DOWN, DRAIN or FAIL takes its slice down with the node's
  state and Slurm's reason; back in service (still in the job), it is up.

Failures are judged from what Slurm records, not only from the two polled
states, so that one shorter than a poll is not missed: a node that failed
and came back between two polls has left the job's node list (``--no-kill``)
or the job has one more restart (requeued, maybe even running again).

Slurm's REQUEUE preemption leaves no mark on the job itself (it is PENDING,
reason BeginTime, one more restart, as after a node failure), so a requeue
with the job's nodes all in service and another job now running on them
counts as a preemption by that job.

``label()`` is the job's id and state or time left, which the backend
reports as its target (the monitor panel's header and ``pw.status()``).

What "a slice goes down" does is the sink's business: on the proxy backend
the session marks the slice (Pathways itself loses the arrays); on the
embedded backend bound to a job (``slurm_binding.py``) it is the
fault path of ``pw.fail_slice``.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from pathways_kernel.backends.slurm import Job, Node, Slurm, format_duration
from pathways_kernel.core import sessions
from pathways_kernel.core.backend import Backend
from pathways_kernel.core.errors import PathwaysError, SpecError
from pathways_kernel.core.eventlog import EventLog
from pathways_kernel.core.threads import ExitStop

#: Seconds between polls of the job and its nodes.
POLL_S = 0.5
#: A ``job_time_limit`` event once the job has less than this many minutes left.
WARN_MINUTES = 10.0


class SliceSink(Protocol):
    def slice_count(self) -> int: ...
    def down_slices(self) -> tuple[int, ...]: ...
    def down(self, index: int, detail: str) -> None: ...
    def up(self, index: int, detail: str) -> None: ...


def group_nodes(
    nodes: Sequence[str],
    info: dict[str, Node],
    slices: int,
    nodes_per_slice: int | None = None,
    feature: str | None = None,
) -> list[tuple[str, ...]]:
    """The job's nodes as ``slices`` groups, slice 0 first.

    By ``feature`` (nodes sharing the feature that starts with this prefix,
    e.g. ``slice`` for ``slice0``/``slice1``, in natural order), else
    ``nodes_per_slice`` consecutive nodes, else the nodes split evenly.

    Raises:
      SpecError: the nodes do not make ``slices`` slices that way.
    """
    if feature:
        by_value: dict[str, list[str]] = {}
        for name in nodes:
            found = [f for f in info[name].features if f.startswith(feature)] if name in info else []
            if not found:
                raise SpecError(f"slurm node {name} has no feature starting with '{feature}': check --feature")
            by_value.setdefault(found[0], []).append(name)
        groups = [tuple(by_value[k]) for k in sorted(by_value, key=_natural)]
    else:
        per = nodes_per_slice or (len(nodes) // slices if slices and len(nodes) % slices == 0 else 0)
        if per < 1 or len(nodes) % per:
            raise SpecError(
                f"the job's {len(nodes)} nodes do not split into {slices} slices: pass --nodes-per-slice N "
                "or --feature PREFIX (a node feature naming each node's slice)"
            )
        groups = [tuple(nodes[i : i + per]) for i in range(0, len(nodes), per)]
    if len(groups) != slices:
        raise SpecError(
            f"the job's nodes make {len(groups)} slices but the session has {slices}: match the job to the "
            f"session (e.g. local:{len(groups)}xC) or regroup with --nodes-per-slice/--feature"
        )
    return groups


def _natural(text: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


class JobWatch:
    """Polls one job and its nodes on a daemon thread; see the module docstring."""

    def __init__(
        self,
        slurm: Slurm,
        job: Job,
        events: EventLog,
        sink: SliceSink,
        nodes_per_slice: int | None = None,
        feature: str | None = None,
        period: float = POLL_S,
        warn_minutes: float = WARN_MINUTES,
    ):
        self.slurm, self.job, self.events, self.sink = slurm, job, events, sink
        self.period, self.warn_s = period, warn_minutes * 60
        self.nodes_per_slice, self.feature = nodes_per_slice, feature
        self._hostnames: tuple[str, list[str]] = ("", [])
        nodes = self.job_nodes(job)
        self.groups = group_nodes(nodes, slurm.nodes(nodes), sink.slice_count(), nodes_per_slice, feature)
        #: Slice -> why it is down: "job" (the job is not running, or was restarted),
        #: "left" (a node left the job), "node" (a node of the job out of service) or
        #: "bound" (down when the watch began: another job's, or failed by hand).
        self.down: dict[int, str] = dict.fromkeys(sink.down_slices(), "bound")
        self._warned = False
        self._last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pathways-slurm-{job.id}", daemon=True)
        # Polling stops before the interpreter ends: a slice lost while it finalizes would abort it.
        self._exit_stop = ExitStop(self, JobWatch.stop)

    def label(self) -> str:
        return self.job.label()

    def describe(self) -> str:
        return ", ".join(f"slice {i} = {','.join(g)}" for i, g in enumerate(self.groups))

    def job_nodes(self, job: Job) -> list[str]:
        """The job's node list, expanded (``scontrol show hostnames``, run again only when the list changes)."""
        if job.nodelist != self._hostnames[0]:
            self._hostnames = (job.nodelist, self.slurm.hostnames(job.nodelist))
        return self._hostnames[1]

    def start(self) -> None:
        """Check the job's time limit (and bring back the slices it has), then poll on the thread."""
        self._check_time_limit(self.job)  # a job bound close to its limit says so at once
        if self.down:
            # Slices left down by an earlier job come back before bind() returns, not a poll later.
            self._follow(self.job, self.slurm.nodes(self._group_nodes()), "")
        self._exit_stop.arm()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._exit_stop.disarm()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.poll()
                self._last_error = ""
            except PathwaysError as exc:
                # Said once, not at every poll; polling goes on until it clears.
                if str(exc) != self._last_error:
                    self._last_error = str(exc)
                    self.events.emit("job_error", detail=f"slurm job {self.job.id}: {exc}")

    def _group_nodes(self) -> list[str]:
        return [n for g in self.groups for n in g]

    def poll(self) -> None:
        """One look at the job and its nodes; emits what changed."""
        if not self.job.active:
            return  # an ended job has nothing more to say; its slices stay down
        job = self.slurm.job(self.job.id)
        # A requeue is judged once the job is off its nodes: while it is
        # COMPLETING, a job preempting it has not started on them yet.
        if job.state == "COMPLETING" and job.restarts > self.job.restarts:
            return
        info = self.slurm.nodes(self._group_nodes())
        # Set before the events, so that the target they prompt the monitor to re-send is current.
        old, self.job = self.job, job
        lost = self._job_events(old, job, info)
        if job.restarts > old.restarts:
            # Requeued since the last poll, perhaps running again already: whatever ran on the allocation is gone.
            self._lose_all(lost)
        self._follow(job, info, lost)

    def _follow(self, job: Job, info: dict[str, Node], lost: str) -> None:
        """Slices up or down as the job's state, node list and nodes say."""
        if job.state != "RUNNING":
            self._lose_all(lost or job.describe())
            return
        if any(cause in ("job", "bound") for cause in self.down.values()):
            info = self._regroup(job, info)
        in_job = set(self.job_nodes(job))
        for index, group in enumerate(self.groups):
            left = [n for n in group if n not in in_job]
            bad = [n for n in group if n in info and info[n].out_of_service]
            if left or bad:
                if index not in self.down:
                    self.down[index] = "left" if left else "node"
                    self.sink.down(index, "; ".join(self._node_detail(n, info, n in left) for n in left or bad))
            elif index in self.down and not self._stop.is_set():
                cause = self.down.pop(index)
                nodes = ",".join(group)
                if cause in ("job", "bound"):
                    detail = f"slurm job {job.id} running{' again' if cause == 'job' else ''} on {nodes}"
                elif cause == "left":
                    detail = f"slurm node{'s' if len(group) > 1 else ''} {nodes} back in slurm job {job.id}"
                else:
                    detail = f"slurm node{'s' if len(group) > 1 else ''} {nodes} back in service"
                self.sink.up(index, detail)

    def _node_detail(self, name: str, info: dict[str, Node], left: bool) -> str:
        node = info.get(name)
        said = f"slurm node {name} {node.state}: {node.reason or 'no reason given'}" if node else f"slurm node {name}"
        if not left:
            return said
        if node is not None and not node.out_of_service:
            # Failed and back in service between two polls: the job's node list is what remembers it.
            said = f"slurm node {name} ({node.state} now)"
        return f"{said}; it left slurm job {self.job.id}"

    def _regroup(self, job: Job, info: dict[str, Node]) -> dict[str, Node]:
        """The job running again (or a new one): its slices on the nodes it has now, if they make the slices.

        Returns what Slurm says of the nodes of the slices, as ``info`` does for the old ones.
        """
        nodes = self.job_nodes(job)
        if set(nodes) == set(self._group_nodes()):
            return info  # the same nodes make the same slices
        info = {**info, **self.slurm.nodes(nodes)}
        # Fewer nodes than slices: the old groups stay, and the slices without their nodes stay down.
        with contextlib.suppress(SpecError):
            self.groups = group_nodes(nodes, info, len(self.groups), self.nodes_per_slice, self.feature)
        return info

    def _job_events(self, old: Job, new: Job, info: dict[str, Node]) -> str:
        """Emits the job's events; returns why the job lost its allocation, or ``""``."""
        emit, name = self.events.emit, f"slurm job {new.id}"
        lost = ""
        if new.restarts > old.restarts or (
            old.state == "RUNNING" and new.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD")
        ):
            by = self._preemptor(info)
            if new.state == "PREEMPTED" or "preempt" in new.reason.lower() or by:
                emit("job_preempted", detail=f"{name} preempted{by} and requeued ({new.state}, {new.reason})")
                lost = f"{name} preempted{by}"
            else:
                now = "running again" if new.state == "RUNNING" else f"{new.state}, {new.reason}"
                lost = f"{name} requeued ({now}), restart {new.restarts}"
                emit("job_requeued", detail=lost)
                failed = [n for n in self._group_nodes() if n in info and info[n].out_of_service]
                lost += "".join(f"; {self._node_detail(n, info, False)}" for n in failed)
        elif new.state == "PREEMPTED" and old.state != "PREEMPTED":
            by = self._preemptor(info)
            emit("job_preempted", detail=f"{name} preempted{by} ({new.reason})")
            lost = f"{name} preempted{by}"
        elif old.active and not new.active:
            emit("job_ended", detail=new.describe())
            lost = new.describe()
        if new.state == "RUNNING" and (old.state != "RUNNING" or new.restarts > old.restarts):
            self._warned = False
            emit("job_running", detail=new.describe())
        self._check_time_limit(new)
        return lost

    def _preemptor(self, info: dict[str, Node]) -> str:
        """`` by job 43 (partition urgent)`` if another job now runs on the job's nodes, all in service; else ``""``."""
        nodes = self._group_nodes()
        if any(info[n].out_of_service for n in nodes if n in info):
            return ""
        for line in self.slurm.jobs_on(nodes):
            other, _, partition = line.strip().partition(" ")
            if other and other != self.job.id:
                return f" by job {other} (partition {partition})"
        return ""

    def _lose_all(self, detail: str) -> None:
        """Every slice down: the job's allocation is gone (requeued, preempted, ended)."""
        for index in range(len(self.groups)):
            if self.down.get(index) != "job":
                was_up = index not in self.down
                self.down[index] = "job"
                if was_up:
                    self.sink.down(index, detail)

    def _check_time_limit(self, job: Job) -> None:
        left = job.time_left_s()
        if left is not None and left <= self.warn_s and not self._warned:
            self._warned = True
            self.events.emit(
                "job_time_limit",
                detail=f"slurm job {job.id}: time limit in {format_duration(left)} (TimeLimit={job.time_limit})",
            )


class SessionSlices:
    """Sink for the proxy backend: the session marks its slices up or down."""

    def __init__(self, backend: Backend):
        self.backend = backend

    def slice_count(self) -> int:
        return len({p.slice_index for p in self.backend.placements(self.backend.devices())})

    def down_slices(self) -> tuple[int, ...]:
        s = self._session()
        return tuple(sl.index for sl in s.topology.down_slices) if s is not None else ()

    def _session(self) -> sessions.Session | None:
        current = sessions._current  # never create a session from this thread
        return current if current is not None and current.backend is self.backend else None

    def down(self, index: int, detail: str) -> None:
        if (s := self._session()) is not None:
            s.set_slice_state(index, "down", detail=detail)

    def up(self, index: int, detail: str) -> None:
        if (s := self._session()) is not None:
            s.set_slice_state(index, "up", detail=detail)
