"""Slices that follow Slurm's node state, and the job's events, by polling.

Mechanism: a daemon thread runs ``scontrol show job -o JOB`` and
``scontrol show node -o NODES`` every ``POLL_S`` seconds (two short
subprocesses; nothing listens in the kernel, and no ``strigger`` needs a
slot on the controller). Each poll compares with the last one:

- a slice with a node DOWN, DRAIN or FAIL goes down, its detail carrying the
  node's state and Slurm's reason; all its nodes back in service bring it up;
- the job being requeued or preempted, ending, starting again, or coming
  within ``WARN_MINUTES`` of its time limit becomes a ``job_*`` event;
- a preempted job has lost all its nodes to another job, so every slice goes
  down (its nodes stay in service, which alone would leave the slices up),
  and comes back when the job runs again.

Slurm's REQUEUE preemption leaves no mark on the job itself (it is PENDING,
reason BeginTime, one more restart, as after a node failure), so a requeue
with the job's nodes all in service and another job now running on them
counts as a preemption by that job.

``label()`` is the job's id and time left, which the backend reports as its
target (the monitor panel's header).

What "a slice goes down" does is the sink's business: on the proxy backend
the session marks the slice (Pathways itself loses the arrays); on the
embedded backend bound to a job (``emulator/slurm_binding.py``) it is the
fault path of ``pw.fail_slice``.
"""

from __future__ import annotations

import atexit
import re
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from pathways_kernel.backends.slurm import Job, Node, Slurm, format_duration
from pathways_kernel.core.errors import PathwaysError, SpecError

#: Seconds between polls of the job and its nodes.
POLL_S = 0.5
#: A ``job_time_limit`` event once the job has less than this many minutes left.
WARN_MINUTES = 10.0


class SliceSink(Protocol):
    def slice_count(self) -> int: ...
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


_running: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """Stop polling before the interpreter ends: a slice lost while it finalizes would abort it."""
    for watch in list(_running):
        watch.stop()


class JobWatch:
    """Polls one job and its nodes on a daemon thread; see the module docstring."""

    def __init__(
        self,
        slurm: Slurm,
        job: Job,
        events: Any,
        sink: SliceSink,
        nodes_per_slice: int | None = None,
        feature: str | None = None,
        period: float = POLL_S,
        warn_minutes: float = WARN_MINUTES,
    ):
        self.slurm, self.job, self.events, self.sink = slurm, job, events, sink
        self.period, self.warn_s = period, warn_minutes * 60
        nodes = slurm.hostnames(job.nodelist)
        # The slices keep the nodes they started on: when a node fails Slurm
        # may take it out of the job (or requeue the job), and it is that
        # node's return that brings the slice back.
        self.nodes_per_slice, self.feature = nodes_per_slice, feature
        self.groups = group_nodes(nodes, slurm.nodes(nodes), sink.slice_count(), nodes_per_slice, feature)
        self.down: dict[int, str] = {}
        #: Slices down because the job was preempted: they return with the job, not with their nodes.
        self.preempted: set[int] = set()
        self._warned = False
        self._last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pathways-slurm-{job.id}", daemon=True)

    def label(self) -> str:
        return self.job.label()

    def describe(self) -> str:
        return ", ".join(f"slice {i} = {','.join(g)}" for i, g in enumerate(self.groups))

    def start(self) -> None:
        self._check_time_limit(self.job)  # a job bound close to its limit says so at once
        _running.add(self)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

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

    def poll(self) -> None:
        """One look at the job and its nodes; emits what changed."""
        info = self.slurm.nodes([n for g in self.groups for n in g])
        if self.job.active:
            # An ended job has nothing more to say (and is purged later); its nodes still do.
            job = self.slurm.job(self.job.id)
            # A requeue is judged once the job is off its nodes: while it is
            # COMPLETING, a job preempting it has not started on them yet.
            if not (job.state == "COMPLETING" and job.restarts > self.job.restarts):
                # Set before the events, so that the target they prompt the monitor to re-send is current.
                old, self.job = self.job, job
                self._job_events(old, job, info)
        for index, group in enumerate(self.groups):
            if index in self.preempted:
                continue
            bad = [info[n] for n in group if n in info and info[n].out_of_service]
            if bad and index not in self.down:
                detail = "; ".join(f"slurm node {n.name} {n.state}: {n.reason or 'no reason given'}" for n in bad)
                self.down[index] = detail
                self.sink.down(index, detail)
            elif not bad and index in self.down and not self._stop.is_set():
                del self.down[index]
                self.sink.up(index, f"slurm node{'s' if len(group) > 1 else ''} {','.join(group)} back in service")

    def _job_events(self, old: Job, new: Job, info: dict[str, Node]) -> None:
        emit, name = self.events.emit, f"slurm job {new.id}"
        if new.restarts > old.restarts or (
            old.state == "RUNNING" and new.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD")
        ):
            by = self._preemptor(info)
            if new.state == "PREEMPTED" or "preempt" in new.reason.lower() or by:
                emit("job_preempted", detail=f"{name} preempted{by} and requeued ({new.state}, {new.reason})")
                self._lose_all(f"{name} preempted{by}")
            else:
                emit("job_requeued", detail=f"{name} requeued ({new.state}, {new.reason}), restart {new.restarts}")
        elif new.state == "PREEMPTED" and old.state != "PREEMPTED":
            by = self._preemptor(info)
            emit("job_preempted", detail=f"{name} preempted{by} ({new.reason})")
            self._lose_all(f"{name} preempted{by}")
        elif old.active and not new.active:
            emit("job_ended", detail=new.describe())
        if new.state == "RUNNING" and old.state != "RUNNING":
            self._warned = False
            emit("job_running", detail=new.describe())
            self._rejoin(new)
        self._check_time_limit(new)

    def _preemptor(self, info: dict[str, Node]) -> str:
        """`` by job 43 (partition urgent)`` if another job now runs on the job's nodes, all in service; else ``""``."""
        nodes = [n for g in self.groups for n in g]
        if any(info[n].out_of_service for n in nodes if n in info):
            return ""
        for line in self.slurm.jobs_on(nodes):
            other, _, partition = line.strip().partition(" ")
            if other and other != self.job.id:
                return f" by job {other} (partition {partition})"
        return ""

    def _lose_all(self, detail: str) -> None:
        for index in range(len(self.groups)):
            if index not in self.down:
                self.down[index] = detail
                self.preempted.add(index)
                self.sink.down(index, detail)

    def _rejoin(self, job: Job) -> None:
        """A preempted job running again: its slices come back, on the nodes it runs on now."""
        if not self.preempted:
            return
        nodes = self.slurm.hostnames(job.nodelist)
        self.groups = group_nodes(nodes, self.slurm.nodes(nodes), len(self.groups), self.nodes_per_slice, self.feature)
        for index in sorted(self.preempted):
            self.preempted.discard(index)
            del self.down[index]
            self.sink.up(index, f"slurm job {job.id} running again on {','.join(self.groups[index])}")

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

    def __init__(self, backend: Any):
        self.backend = backend

    def slice_count(self) -> int:
        return len({p.slice_index for p in self.backend.placements(self.backend.devices())})

    def _session(self) -> Any:
        from pathways_kernel.core import sessions

        current = sessions._current  # never create a session from this thread
        return current if current is not None and current.backend is self.backend else None

    def down(self, index: int, detail: str) -> None:
        if (s := self._session()) is not None:
            s.set_slice_state(index, "down", detail=detail)

    def up(self, index: int, detail: str) -> None:
        if (s := self._session()) is not None:
            s.set_slice_state(index, "up", detail=detail)
