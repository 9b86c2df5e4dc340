"""The embedded backend bound to a real Slurm job: ``local:SxC --slurm JOB``.

The emulated slices are mapped onto the nodes of a running job (grouped as
``slurm_watch.group_nodes`` says), and the job's watch turns a slice's loss
(a node DOWN, DRAIN or FAIL, a node leaving the job, the job not running)
into ``injector(session).fail(i)``: the same fault path as ``pw.fail_slice``
(arrays lost with DATA_LOSS, healing, elastic recovery), with Slurm's reason
in the ``slice_down`` event. ``repair(i)`` brings a slice back once the job
has its nodes in service again: the job running again, or a new job bound
in the same session (``bind`` again), which takes over the slices the old
one left down. So elastic loops and notebook healing are rehearsed against a
real cluster manager's failures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

from pathways_kernel.backends import slurm as slurm_lib
from pathways_kernel.backends.slurm_watch import JobWatch
from pathways_kernel.core.sessions import Session
from pathways_kernel.emulator.faults import injector


class _JobLabelled(Protocol):
    """A local backend (``embedded:``, ``local:``): its spec names the job it is bound to."""

    job_label: Callable[[], str] | None


def _labelled(session: Session) -> _JobLabelled:
    # Only a local backend binds (bind() requires fault injection), and both local ones carry job_label.
    return cast(_JobLabelled, session.backend)


class InjectorSlices:
    """Sink: a node out of service loses its emulated slice through the fault injector."""

    def __init__(self, session: Session):
        self.session = session

    def slice_count(self) -> int:
        return len(self.session.topology.slices)

    def down_slices(self) -> tuple[int, ...]:
        return tuple(sl.index for sl in self.session.topology.down_slices)

    def down(self, index: int, detail: str) -> None:
        injector(self.session).fail(index, detail=detail)

    def up(self, index: int, detail: str) -> None:
        injector(self.session).repair(index, detail=detail)


class SlurmBinding:
    """The session's binding to a Slurm job (a session component)."""

    def __init__(self, session: Session):
        self.session = session
        self.watch: JobWatch | None = None
        session.on_close(self.unbind)

    def bind(
        self,
        job: str,
        *,
        nodes_per_slice: int | None = None,
        feature: str | None = None,
        wait: float | None = None,
        slurm: slurm_lib.Slurm | None = None,
    ) -> JobWatch:
        """Wait for ``job`` to run, then follow its nodes; returns the watch.

        Raises:
          NotSupportedError: the session is not on the embedded backend.
          BackendError / SpecError: Slurm or the job said no (one line).
        """
        self.session.require_fault_injection("--slurm")
        slurm = slurm or slurm_lib.Slurm()
        job_id = slurm.resolve(job)
        running = slurm_lib.wait_running(
            slurm,
            job_id,
            slurm_lib.DEFAULT_WAIT_S if wait is None else wait,
            need_address=False,
            on_change=slurm_lib.LiveLine(self.session.events),
        )
        # The old job's watch stops first: the new one takes over the slices it left down.
        self.unbind()
        watch = JobWatch(slurm, running, self.session.events, InjectorSlices(self.session), nodes_per_slice, feature)
        self.watch = watch
        self.session.events.emit(
            "job_bound", detail=f"{self.session.backend.spec} on {running.describe()}: {watch.describe()}"
        )
        _labelled(self.session).job_label = watch.label
        watch.start()
        return watch

    def unbind(self) -> None:
        if self.watch is not None:
            watch, self.watch = self.watch, None
            watch.stop()
            if getattr(self.session.backend, "job_label", None) == watch.label:
                _labelled(self.session).job_label = None


def binding(session: Session) -> SlurmBinding:
    return session.component(SlurmBinding)
