"""Elastic execution: a training loop that survives losing a slice.

The programming model is a *step function* and a *state*::

    @pw.elastic(snapshot_every=10)
    def train(state, step, mesh):          # one training step
        batch = make_batch(step, mesh)     # shard it with P("data", ...) on `mesh`
        return update(state, batch)

    state = train(state, steps=100)        # runs steps 0..99, returns the final state

``%%pathways elastic --steps 100 --state params`` is the same loop with the
cell as the step body: it runs once per step in the notebook's namespace with
``step`` and ``mesh`` bound, and the ``--state`` variables are what is
snapshotted and restored.

The loop owns the step boundaries. Every ``snapshot_every`` steps it takes an
asynchronous host snapshot of the state (``snapshots``), which copies while
the next steps run: the rollback point is the newest snapshot whose copy is
done. A slice going down
is seen at once, from the session's ``slice_down`` event or from the step's
``JaxRuntimeError`` (classified by ``pathwaysutils.elastic``); the loop then
builds the mesh of the surviving slices, restores the latest snapshot onto it
with the same ``PartitionSpec``s and resumes from the snapshot's step (state
wholly on surviving slices is resharded instead, losing nothing). The mesh's
``data`` axis (DCN) has one entry per live slice, so a batch sharded over it
is split across whatever slices are up; keep the *global* batch fixed and the
results do not depend on the number of slices. A ``slice_up`` event is acted
on at the next step boundary: the live state is resharded onto the larger
mesh (``ScaleUpSignalError``, as in pathwaysutils, interrupts the step loop).

A run resumes only from its own snapshots (each run has its own ``run``
number, recorded with its snapshots): an earlier run's snapshot under the
same name is of some other state. The first is of the state it was given,
taken before anything else and complete before the first step, so a run can
always go back to where it began; the last, taken as the run returns and not
waited for, is of what it returned, for healing after the cell. If the state
was already lost when the run began (or is lost while that first copy is
made), the run says which in one line instead of going back to anything.

Callbacks registered with ``on_restore(callback)`` (per session) are called
as ``callback(step, mesh)`` after every reshard or rollback, so that data
loaders follow the new mesh and replay from ``step``.

pathwaysutils (and so JAX) is imported on first use, not with the package.

What a run takes and reports (its argument checks, ``RunReport``) and the
session's restore hooks are in ``elastic_run.py``; where its state goes on a
new mesh (reshard, restore, ``abstract``) is in ``elastic_placement.py``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import numbers
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, overload

from pathways_kernel.core import meshes
from pathways_kernel.core.errors import PathwaysError, one_line
from pathways_kernel.core.sessions import Session, session
from pathways_kernel.core.text import count
from pathways_kernel.state import snapshots
from pathways_kernel.training import accounting
from pathways_kernel.training.elastic_placement import (
    abstract,
    default_device_without,
    devices_of,
    mesh_slices,
    placement,
    reshard,
    tree_nbytes,
    tree_slices,
    up_slices,
)
from pathways_kernel.training.elastic_run import Rollback, RunReport, check_count, check_steps, restore_hooks
from pathways_kernel.training.metric_log import LossFollower, metric_log
from pathways_kernel.training.run_events import RunEvents

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from pathways_kernel.core.eventlog import Event

    #: ``fn(state, step, mesh) -> state``: one step of the loop.
    StepFn: TypeAlias = Callable[[Any, int, Mesh], Any]

#: Consecutive failures (without a new good snapshot in between) before giving up.
DEFAULT_MAX_RETRIES = 10
DEFAULT_SNAPSHOT_EVERY = 10
#: Back-off before a repeated retry (doubling up to the maximum), cut short by a slice event.
RETRY_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0
#: How long to wait for a slice to come back when none is up.
DEFAULT_WAIT_S = 600.0


class ElasticError(PathwaysError, RuntimeError):
    """The elastic loop cannot go on (retries exhausted, no slice came back)."""


#: Run numbers: a run resumes only from snapshots with its own.
_RUNS = itertools.count(1)


# -- the loop -----------------------------------------------------------------
class _SliceWatch:
    """Event-driven view of slice changes: set by the session's event log."""

    def __init__(self, s: Session):
        self.down = threading.Event()
        self.up = threading.Event()
        self.changed = threading.Event()
        # Slices that went down since the loop last rebuilt its mesh: their
        # data is gone even if they are back by the next step boundary.
        self.lost: set[int] = set()
        self._unsubscribe = s.events.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.kind == "slice_down":
            self.lost.update(set(event.slices_before or ()) - set(event.slices_after or ()))
            self.down.set()
            self.changed.set()
        elif event.kind == "slice_up":
            self.up.set()
            self.changed.set()

    def close(self) -> None:
        self._unsubscribe()


class _SliceLost(Exception):
    """Internal: the health state says a slice of the mesh is down."""


class Elastic:
    """A step function run as an elastic loop; see the module docstring."""

    def __init__(
        self,
        step_fn: StepFn,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        max_retries: int | None = DEFAULT_MAX_RETRIES,
        axes: Sequence[str] | None = None,
        name: str | None = None,
        wait_s: float = DEFAULT_WAIT_S,
        prepare: Callable[[Mesh], object] | None = None,
        state_label: str | None = None,
        slices: Sequence[int] | None = None,
        kind: str | None = None,
    ):
        snapshot_every = check_count(snapshot_every, "snapshot_every", 1)
        if max_retries is not None:
            max_retries = check_count(max_retries, "max_retries", 1)
        if isinstance(wait_s, bool) or not isinstance(wait_s, numbers.Real) or not math.isfinite(wait_s) or wait_s < 0:
            raise PathwaysError(f"wait_s must be a number of seconds, at least 0, got {wait_s!r}")
        self.step_fn: StepFn = step_fn
        self.snapshot_every: int = snapshot_every
        self.max_retries: int | None = max_retries
        self.axes: tuple[str, ...] | None = tuple(axes) if axes else None
        #: The slices the loop may use (``None``: all): an RL loop's training slices.
        self.slices: frozenset[int] | None = _check_slices(slices)
        #: The kind of chips the loop runs on (``None``: the slices' one kind), e.g. ``"v5p"``.
        self.kind: str | None = kind
        #: The slices this run may use: ``slices`` of ``kind`` (``None``: all).
        self._allowed: frozenset[int] | None = self.slices
        self.name: str = name or getattr(step_fn, "__name__", "elastic")
        #: What the state is called in messages (the magic's --state variables).
        self.state_label: str = state_label or f"the state of '{self.name}'"
        self.wait_s: float = wait_s
        self.prepare: Callable[[Mesh], object] | None = prepare
        #: Set once ``prepare`` has run for every fallback mesh of the current run.
        self.prepared: threading.Event = threading.Event()
        self.last_run: RunReport | None = None
        functools.update_wrapper(self, step_fn)

    def __call__(self, state: Any, steps: int, start: int = 0, progress: bool = True) -> Any:
        return self.run(state, steps, start, progress)

    def run(self, state: Any, steps: int, start: int = 0, progress: bool = True) -> Any:
        """Run steps ``start..steps-1`` from ``state``; returns the final state.
        ``progress``: show the run's progress under the cell (in a notebook).

        Raises:
          ElasticError: retries exhausted, or no slice came back in time.
          Exception: anything the step raises that is not a slice loss.
        """
        steps, start = check_steps(steps, start)
        began = time.perf_counter()
        s = session()
        self._allowed = self._slices_of_kind(s)
        watch = _SliceWatch(s)
        run = next(_RUNS)
        report = RunReport(self.name, run)
        self.last_run = report
        store = snapshots.store(s)
        snap_name = f"elastic:{self.name}"
        try:
            # The state as given, copied before anything else (a kernel's first
            # run spends seconds importing below, and a loss meanwhile must not
            # find nothing to go back to): what the run goes back to until its
            # next snapshot (never an earlier run's).
            first = store.snap(state, snap_name, start, run)
        except BaseException:
            watch.close()
            raise
        report.snapshots += 1
        # Where this run's time goes, from its start (and, in a notebook, its progress under the cell),
        # and the loss in each step's output: the run's followers, told its step events.
        account = accounting.begin(self.name, "elastic", s, start, steps, progress, began=began)
        account.slices = self._allowed  # its MFU counts the chips of its slices only
        self._events = RunEvents(accounting.LedgerFollower(account), LossFollower(metric_log(s), account))
        try:
            # Imported once the state is copied: the first import takes a while.
            from pathwaysutils.elastic.manager import ElasticRetryLimit, ScaleUpSignalError

            retry = ElasticRetryLimit(self.max_retries) if self.max_retries is not None else None
            mesh = self._mesh(s)
            # The slices the state as given lives on: one lost since the run began, before
            # the mesh above was built of the survivors, still holds part of it (the first
            # boundary goes back to the copy made at the start; the step would fail on it).
            held = set(tree_slices(s, state))
            self._start_prepare(s, mesh)
            step = start
            # The first step waits for that copy: a run can always go back to where it began.
            if not _wait_quietly(first, self._events):
                raise self._nothing_to_restore(lost_during_run=bool(watch.lost))
            del first
            pending: snapshots.Snapshot | None = None
            failures, resumed_at = 0, start
            # What the previous attempt left to do first: a recovery or a scale-up.
            # They run inside the try, so a slice lost meanwhile is one more retry.
            recover = scale_up = False
            while True:
                try:
                    if recover:
                        mesh, state, step = self._recover(s, watch, mesh, state, step, store, snap_name, report)
                        self._events.recovery_end(step)
                        recover, resumed_at, held = False, step, set()
                    if scale_up:
                        scale_up, held = False, set()
                        with self._events.phase("scale_up"):
                            mesh, state = self._scale_up(s, watch, mesh, state, step, report)
                    while step < steps:
                        self._check_boundary(s, watch, mesh, held)
                        self._events.step_begin(step)
                        state = self.step_fn(state, step, mesh)
                        self._events.step_end(step, state)
                        step += 1
                        report.steps_executed += 1
                        due = step % self.snapshot_every == 0 and step < steps
                        # The newest snapshot copies while the steps run; the loop
                        # waits for it only if it is still copying when the next one
                        # is due. So at most one loop snapshot is in flight, the
                        # loop runs at most snapshot_every steps ahead of the device,
                        # and until the copy is done the one before is the rollback
                        # point. A snapshot past the last recovery point proves
                        # progress (errors of asynchronous steps surface late), so
                        # failures reset.
                        if pending is not None and (due or pending.done()):
                            assert pending.step is not None  # the loop's snapshots carry their step
                            if _wait_quietly(pending, self._events) and pending.step > resumed_at:
                                failures = 0
                            pending = None
                        if due:
                            with self._events.phase("snapshot_stall"):
                                pending = store.snap(state, snap_name, step, run)
                            self._events.snapshot_started(state)
                            report.snapshots += 1
                    self._check_boundary(s, watch, mesh, held)
                    _block(state, self._events)
                    self._check_boundary(s, watch, mesh, held)
                    break
                except ScaleUpSignalError:
                    scale_up = True
                except Exception as error:
                    if not _is_slice_loss(error):
                        raise
                    failures += 1
                    self._events.recovery_begin()
                    s.events.emit("retry", step=step, detail=f"attempt {failures}: {_reason(error)}")
                    if retry is not None and not retry(failures, error):
                        raise ElasticError(
                            f"elastic '{self.name}' gave up after {count(failures, 'consecutive slice loss')} at step {step}; "
                            f"restore the slices (%pathways repair N) and run it again, or raise --max-retries"
                        ) from error
                    recover, scale_up = True, False
                    if failures > 1:
                        # Failing again right away: the cluster may be mid-change
                        # (a loss whose slice_down is not out yet). Back off until
                        # the next slice event, or briefly, so retries are not
                        # spent in a tight loop.
                        watch.changed.wait(min(RETRY_BACKOFF_S * 2 ** (failures - 2), MAX_BACKOFF_S))
            report.steps = step - start
            report.slices = mesh_slices(s, mesh)
            # What the run returns (no loop snapshot is due at the last step),
            # copied while the next cell runs, never waited for here: a later
            # loss heals to it, not to an older step.
            with self._events.phase("snapshot_stall"):
                store.snap(state, snap_name, step, run)
            report.snapshots += 1
            return state
        except KeyboardInterrupt:
            # The variables keep the state of the last step that ran (the magic binds it): let the
            # steps already queued for it finish, or the interrupt's cancel would poison it.
            _settle(state, self.state_label)
            raise
        finally:
            report.duration_s = time.perf_counter() - began
            self._events.end()  # the run's goodput figures, and its event
            watch.close()

    # -- compiling ahead ------------------------------------------------------
    def _start_prepare(self, s: Session, mesh: Mesh) -> None:
        """Run ``prepare(fallback_mesh)`` in the background for each mesh of one
        slice fewer, so a recovery finds its step already compiled."""
        self.prepared.clear()
        prepare = self.prepare
        if prepare is None:
            self.prepared.set()
            return
        import jax

        current = set(mesh_slices(s, mesh))
        fallbacks = []
        for lost in sorted(current):
            survivors = [sl for sl in s.topology.slices if sl.index in current - {lost}]
            if survivors:
                fallbacks.append((lost, meshes.build(survivors, self.axes), default_device_without(s, lost)))

        def work() -> None:
            for lost, fallback, default in fallbacks:
                start = time.perf_counter()
                try:
                    # JAX's default device is part of what a compiled step is
                    # cached under: compile under the one the loss will leave.
                    with jax.default_device(default) if default is not None else contextlib.nullcontext():
                        prepare(fallback)
                except Exception as error:  # a failed warm-up only costs a compile later
                    s.events.emit(
                        "compile", detail=f"'{self.name}' prepare for losing slice {lost} failed: {_reason(error)}"
                    )
                    continue
                s.events.emit(
                    "compile",
                    duration_s=time.perf_counter() - start,
                    slices_after=mesh_slices(s, fallback),
                    detail=f"'{self.name}' prepared for losing slice {lost}",
                )
            self.prepared.set()

        threading.Thread(target=work, name=f"pathways-elastic-prepare-{self.name}", daemon=True).start()

    # -- the slices it may use ----------------------------------------------------
    def _slices_of_kind(self, s: Session) -> frozenset[int] | None:
        """``slices`` of ``kind`` (up or not: a repaired one rejoins); a kind no slice has is one line."""
        if self.kind is None:
            return self.slices
        of_kind = {sl.index for sl in meshes.of_kind(s.topology.slices, self.kind)}
        allowed = of_kind if self.slices is None else of_kind & self.slices
        if not allowed:
            raise PathwaysError(
                f"elastic '{self.name}': none of slices {sorted(self.slices or ())} is of kind {self.kind}"
            )
        return frozenset(allowed)

    def _up(self, s: Session) -> tuple[int, ...]:
        return tuple(i for i in up_slices(s) if self._allowed is None or i in self._allowed)

    def _mesh(self, s: Session) -> Mesh:
        """The mesh of the live slices the loop may use."""
        if self._allowed is None:
            mesh: Mesh = s.mesh(self.axes)
        else:
            mesh = meshes.build([sl for sl in s.topology.up_slices if sl.index in self._allowed], self.axes)
        return mesh

    # -- boundaries -----------------------------------------------------------
    def _check_boundary(self, s: Session, watch: _SliceWatch, mesh: Mesh, held: set[int]) -> None:
        """Raise on a slice change since the last boundary; ``held``: slices the state
        lives on beyond the mesh's (the state as given, until the first recovery)."""
        if not watch.changed.is_set():
            return
        watch.changed.clear()
        up, current = set(self._up(s)), set(mesh_slices(s, mesh)) | held
        watch.down.clear()
        lost = (current - up) | (current & watch.lost)
        if lost:
            raise _SliceLost(f"slice {', '.join(map(str, sorted(lost)))} went down")
        watch.up.clear()
        if up - current:
            from pathwaysutils.elastic.manager import ScaleUpSignalError

            raise ScaleUpSignalError(f"slices {sorted(up - current)} came back")

    def _scale_up(
        self, s: Session, watch: _SliceWatch, mesh: Mesh, state: Any, step: int, report: RunReport
    ) -> tuple[Mesh, Any]:
        before = mesh_slices(s, mesh)
        start = time.perf_counter()
        new_mesh = self._mesh(s)
        # Slices joining now hold nothing of ours: earlier losses on them do not matter.
        watch.lost -= set(mesh_slices(s, new_mesh)) - set(before)
        state = reshard(state, new_mesh)
        after = mesh_slices(s, new_mesh)
        duration = time.perf_counter() - start
        nbytes = tree_nbytes(state)
        s.events.emit("scale_up", slices_before=before, slices_after=after, step=step, duration_s=duration)
        s.events.emit(
            "reshard",
            slices_before=before,
            slices_after=after,
            bytes=nbytes,
            duration_s=duration,
            step=step,
            detail=f"'{self.name}' live state",
        )
        report.scale_ups += 1
        restore_hooks(s).notify(step, new_mesh)
        return new_mesh, state

    def _nothing_to_restore(self, lost_during_run: bool | None = None) -> ElasticError:
        """``lost_during_run``: the run's copy of the state it was given failed,
        and a slice went down during the run (``True``) or before it (``False``);
        ``None``: that copy was made, and the store dropped it since."""
        when = {
            None: "the session's snapshot store dropped this run's snapshots (max_bytes too small?)",
            True: "the slice went down while the run copied the state it was given, before its first step",
            False: "it was already lost when the run began",
        }[lost_during_run]
        label = self.state_label
        return ElasticError(
            f"elastic '{self.name}': a slice was lost and there is no snapshot of {label} from this run to go back to "
            f"({when}); recompute {label} or restore it from a snapshot (%pathways snapshots), then run again"
        )

    def _recover(
        self,
        s: Session,
        watch: _SliceWatch,
        mesh: Mesh,
        state: Any,
        step: int,
        store: snapshots.SnapshotStore,
        snap_name: str,
        report: RunReport,
    ) -> tuple[Mesh, Any, int]:
        """Go on with the live slices: move the state if none of it was lost,
        else roll back to this run's newest snapshot."""
        start = time.perf_counter()
        before = mesh_slices(s, mesh)
        with self._events.phase("slice_wait"):
            self._wait_for_a_slice(s, watch)
        watch.changed.clear()
        watch.down.clear()
        watch.up.clear()
        new_mesh = self._mesh(s)
        after = mesh_slices(s, new_mesh)
        lost_slices = watch.lost | {sl.index for sl in s.topology.slices if not sl.up}
        watch.lost.clear()
        lost_ids = {d.id for sl in s.topology.slices if sl.index in lost_slices for d in sl.devices}
        if state is not None and not (devices_of(state) & lost_ids):
            # Nothing of the state lived on a lost slice: move it, lose nothing.
            try:
                state, resumed, how = reshard(state, new_mesh), step, "live state"
            except Exception as error:  # classified below
                if not _is_slice_loss(error):
                    raise
                state = None
        else:
            state = None
        if state is None:
            snap = store.latest(snap_name, run=report.run)
            if snap is None:
                raise self._nothing_to_restore()
            assert snap.step is not None  # the loop's snapshots carry their step
            placed = [placement(leaf.spec, leaf.shape, new_mesh) if leaf.on_device else None for leaf in snap.leaves]
            state = snapshots.restore(snap, new_mesh, shardings=placed)
            resumed, how = snap.step, f"snapshot of step {snap.step}"
        duration = time.perf_counter() - start
        s.events.emit(
            "reshard",
            slices_before=before,
            slices_after=after,
            bytes=tree_nbytes(state),
            duration_s=duration,
            step=resumed,
            detail=f"'{self.name}' from {how}",
        )
        report.recoveries.append(Rollback(step, resumed, before, after, duration))
        restore_hooks(s).notify(resumed, new_mesh)
        return new_mesh, state, resumed

    def _wait_for_a_slice(self, s: Session, watch: _SliceWatch) -> None:
        deadline = time.monotonic() + self.wait_s
        while not self._up(s):
            left = deadline - time.monotonic()
            if left <= 0:
                raise ElasticError(
                    f"elastic '{self.name}': no slice came back within {self.wait_s:.0f} s; restore one and rerun"
                )
            watch.up.wait(left)
            watch.up.clear()


def _check_slices(slices: Sequence[int] | None) -> frozenset[int] | None:
    if slices is None:
        return None
    chosen = list(slices)
    if not chosen or any(isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0 for i in chosen):
        raise PathwaysError(f"slices must be slice indices (at least one), got {chosen!r}")
    return frozenset(int(i) for i in chosen)


def _is_slice_loss(error: BaseException) -> bool:
    import jax
    from pathwaysutils.elastic.elastic import is_error_due_to_slice_down

    if isinstance(error, _SliceLost):
        return True
    return isinstance(error, jax.errors.JaxRuntimeError) and is_error_due_to_slice_down(error)


def _reason(error: BaseException) -> str:
    text = str(error) if isinstance(error, _SliceLost) else one_line(error)
    return text if len(text) <= 120 else text[:117] + "..."


def _block(state: Any, events: RunEvents) -> None:
    import jax

    with events.device_wait():
        jax.block_until_ready(state)


def _settle(state: Any, label: str) -> None:
    """Wait for ``state``'s queued steps (at most about two snapshot intervals); after a second,
    say in one line what the interrupt waits for. Errors are the state's own, seen when it is read."""
    import jax

    notice = threading.Timer(
        1.0,
        lambda: print(
            f"pathways: interrupted: {label} keeps the last step's state; waiting for the steps already queued for it",
            file=sys.stderr,
        ),
    )
    notice.daemon = True
    notice.start()
    try:
        jax.block_until_ready(state)
    except Exception:  # a lost or failed value says so when it is read
        pass
    finally:
        notice.cancel()


def _wait_quietly(snap: snapshots.Snapshot, events: RunEvents) -> bool:
    """Wait for a snapshot; returns whether it succeeded (a failed copy only
    means an older one is used)."""
    try:
        with events.snapshot_wait():
            snap.wait()
    except Exception as error:
        if not _is_slice_loss(error):
            raise
        return False
    return True


@overload
def elastic(
    fn: StepFn,
    *,
    snapshot_every: int = ...,
    max_retries: int | None = ...,
    axes: Sequence[str] | None = ...,
    name: str | None = ...,
    wait_s: float = ...,
    prepare: Callable[[Mesh], object] | None = ...,
    slices: Sequence[int] | None = ...,
    kind: str | None = ...,
) -> Elastic: ...
@overload
def elastic(
    fn: None = None,
    *,
    snapshot_every: int = ...,
    max_retries: int | None = ...,
    axes: Sequence[str] | None = ...,
    name: str | None = ...,
    wait_s: float = ...,
    prepare: Callable[[Mesh], object] | None = ...,
    slices: Sequence[int] | None = ...,
    kind: str | None = ...,
) -> Callable[[StepFn], Elastic]: ...
def elastic(
    fn: StepFn | None = None,
    *,
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    max_retries: int | None = DEFAULT_MAX_RETRIES,
    axes: Sequence[str] | None = None,
    name: str | None = None,
    wait_s: float = DEFAULT_WAIT_S,
    prepare: Callable[[Mesh], object] | None = None,
    slices: Sequence[int] | None = None,
    kind: str | None = None,
) -> Elastic | Callable[[StepFn], Elastic]:
    """Make ``fn(state, step, mesh) -> state`` an elastic training loop.

    Use as ``@pw.elastic`` or ``@pw.elastic(snapshot_every=10)``; call the
    result as ``train(state, steps=N)``. See the module docstring.

    Args:
      snapshot_every: steps between host snapshots: a slice loss costs at
        most this many steps once the newest snapshot is copied. The copy
        runs while the steps do (the loop waits for it only if it is not
        done when the next snapshot is due); a loss while it copies goes
        back to the snapshot before, at most twice this many steps.
      max_retries: consecutive slice losses without progress (a new good
        snapshot) in between before giving up (``None``: never).
      axes: mesh axis names (default ``("data", "model")``: ``data`` across
        slices, ``model`` within one).
      name: name for events and snapshots (default: the function's).
      wait_s: how long to wait for a slice when none is up.
      prepare: called as ``prepare(mesh)`` in a background thread at the
        start of a run, once per mesh of one slice fewer, to compile the step
        for it ahead of a loss (see ``abstract``); ``.prepared`` is set when
        done.
      slices: the slices the loop may use (default all): an RL loop's
        training slices, with ``pw.elastic_map(..., slices=...)`` rolling out
        on the others. A loss or a repair of another slice does not touch it.
      kind: run on the slices of this kind of chips only (``"v5p"``, or a device kind,
        ``"TPU v5"``), as ``pw.mesh(kind=...)``: on slices of several kinds a program runs on one.
    """

    def wrap(f: StepFn) -> Elastic:
        return Elastic(f, snapshot_every, max_retries, axes, name, wait_s, prepare, slices=slices, kind=kind)

    return wrap(fn) if fn is not None else wrap


# ``pw.elastic.abstract(tree, mesh)`` is public API: the shapes a ``prepare``
# callback compiles for, reachable from the decorator users already have.
elastic.abstract = abstract  # type: ignore[attr-defined]


__all__ = ["Elastic", "ElasticError", "abstract", "elastic"]
