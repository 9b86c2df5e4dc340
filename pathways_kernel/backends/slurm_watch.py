"""Slices that follow Slurm's node state, and the job's events, by polling.

Mechanism: a daemon thread runs ``scontrol show job -o JOB`` and
``scontrol show node -o NODES`` every ``POLL_S`` seconds (two short
subprocesses; nothing listens in the kernel, and no ``strigger`` needs a
slot on the controller). Each poll compares with the last one:

- a slice with a node DOWN, DRAIN or FAIL goes down, its detail carrying the
  node's state and Slurm's reason; all its nodes back in service bring it up;
- the job being requeued or preempted, ending, starting again, or coming
  within ``WARN_MINUTES`` of its time limit becomes a ``job_*`` event.

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
        self.groups = group_nodes(nodes, slurm.nodes(nodes), sink.slice_count(), nodes_per_slice, feature)
        self.down: dict[int, str] = {}
        self._warned = False
        self._last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pathways-slurm-{job.id}", daemon=True)

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
        if self.job.active:
            # An ended job has nothing more to say (and is purged later); its nodes still do.
            job = self.slurm.job(self.job.id)
            self._job_events(self.job, job)
            self.job = job
        info = self.slurm.nodes([n for g in self.groups for n in g])
        for index, group in enumerate(self.groups):
            bad = [info[n] for n in group if n in info and info[n].out_of_service]
            if bad and index not in self.down:
                detail = "; ".join(f"slurm node {n.name} {n.state}: {n.reason or 'no reason given'}" for n in bad)
                self.down[index] = detail
                self.sink.down(index, detail)
            elif not bad and index in self.down and not self._stop.is_set():
                del self.down[index]
                self.sink.up(index, f"slurm node{'s' if len(group) > 1 else ''} {','.join(group)} back in service")

    def _job_events(self, old: Job, new: Job) -> None:
        emit, name = self.events.emit, f"slurm job {new.id}"
        if new.restarts > old.restarts or (
            old.state == "RUNNING" and new.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD")
        ):
            if new.state == "PREEMPTED" or "preempt" in new.reason.lower():
                emit("job_preempted", detail=f"{name} preempted and requeued ({new.state}, {new.reason})")
            else:
                emit("job_requeued", detail=f"{name} requeued ({new.state}, {new.reason}), restart {new.restarts}")
        elif new.state == "PREEMPTED" and old.state != "PREEMPTED":
            emit("job_preempted", detail=f"{name} preempted ({new.reason})")
        elif old.active and not new.active:
            emit("job_ended", detail=new.describe())
        if new.state == "RUNNING" and old.state != "RUNNING":
            self._warned = False
            emit("job_running", detail=new.describe())
        self._check_time_limit(new)

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
