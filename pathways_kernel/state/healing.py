"""Notebook healing: after a slice loss, the notebook's variables come back.

Between cells (IPython ``pre_run_cell``, and ``post_run_cell`` so that a loss
during a cell is reported under that cell), if a slice went down since the
last check (a ``slice_down`` event in the session's log, whatever caused it),
every variable of the user namespace holding a lost array
(``sessions.is_lost``: reading it raises ``DATA_LOSS``) is restored from the
newest host snapshot of it, onto the mesh of the live slices, with the same
``PartitionSpec``s (``snapshots.restore``, which emits a ``restore`` event),
and rebound to the same name. A variable's snapshots are those filed under
its name (``%pathways snapshot``, ``%pathways autosnapshot on``) and, while
it still holds what a ``%%pathways elastic`` run left in it (even one
interrupted mid-step) or what healing restored from that run's snapshot,
that run's own snapshots; the run's other state variables then go back to
the same step with it, so that they stay consistent. Variables without a
snapshot are left as they are, unusable, and named. The user sees one short
block saying which names came back, from how long ago and which step, and
which did not.

A pass that cannot finish stays due: while no slice is up it restores
nothing and says the variables wait for a slice, and the first check after
one is back restores them; an interrupted pass (Jupyter's interrupt during
a long restore) says what is still lost, and the next cell's check goes on.
Each variable is either still lost or rebound to its restored value, never
in between, so ``pw.is_lost`` tells the truth throughout.

A new server (``%pathways reconnect`` after the old one died, ``connect
--force``) is healed onto as a repaired slice is: the snapshot store moves to
the new session, every array of the old server is lost
(``core/lost_clients.py``), and the first check in the new session restores
the variables that hold one.
"""

from __future__ import annotations

import dataclasses
import html
import weakref
from typing import Any

from pathways_kernel.core import sessions, shellhooks
from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.errors import PathwaysError, one_line
from pathways_kernel.core.eventlog import EventLog
from pathways_kernel.core.interrupts import deferred_interrupts
from pathways_kernel.state import snapshots

#: IPython's own names: the output history holds arrays but is not user state.
_IPYTHON_NAMES = frozenset({"In", "Out", "_oh", "_ih", "_dh", "exit", "quit", "get_ipython"})


@dataclasses.dataclass(frozen=True)
class Healed:
    name: str
    age_s: float
    step: int | None
    run: str | None = None  # the elastic run whose snapshot it came from


@dataclasses.dataclass(frozen=True)
class HealingReport(TextDisplay):
    """What one healing pass did; displays as one short block."""

    lost_slices: tuple[int, ...]
    live_slices: tuple[int, ...]
    restored: tuple[Healed, ...] = ()
    unusable: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()  # (name, why the restore failed)
    #: Variables with a snapshot that wait for a slice to come back (none is up).
    waiting: tuple[str, ...] = ()
    #: The pass was interrupted; these variables are still lost (the next cell restores them).
    interrupted: tuple[str, ...] | None = None

    def __bool__(self) -> bool:
        return bool(self.restored or self.unusable or self.failed or self.waiting or self.interrupted is not None)

    @property
    def due(self) -> bool:
        """Whether a later pass has work left: variables wait for a slice, or this one was interrupted."""
        return bool(self.waiting) or self.interrupted is not None

    def header(self) -> str:
        if not self.lost_slices:  # a new server: what the old one held is lost
            lost = "the previous Pathways server's arrays are lost"
            return f"{lost}: variables with data on it were healed" if self.restored else lost
        lost = ("slices " if len(self.lost_slices) > 1 else "slice ") + ", ".join(map(str, self.lost_slices))
        if self.restored:
            return f"{lost} lost: variables with data on it were healed"
        if self.unusable and not (self.failed or self.waiting or self.interrupted is not None):
            # Under a cell that ran to the end (an elastic run that recovered): about other variables, not its result.
            return f"{lost} lost: earlier variables with data on it are gone (not this cell's result)"
        return f"{lost} lost"

    def details(self) -> list[str]:
        out = []
        if self.restored:
            live = ",".join(map(str, self.live_slices))
            out.append(f"restored from snapshots onto slices [{live}]: " + ", ".join(map(_describe, self.restored)))
        for run, step in sorted({(h.run, h.step) for h in self.restored if h.run is not None}):
            out.append(f"elastic '{run}' is back at step {step}: continue with %%pathways elastic --start {step}")
        if self.waiting:
            out.append(
                f"no slice is up: {', '.join(self.waiting)} will be restored from snapshots when a slice comes back"
            )
        if self.interrupted is not None:
            still = f": {', '.join(self.interrupted)} still lost" if self.interrupted else ""
            out.append(f"healing was interrupted{still}; the next cell restores what is left")
        if self.unusable:
            out.append(
                f"no snapshot, now unusable (DATA_LOSS): {', '.join(self.unusable)}; recompute or reload them, "
                "and %pathways autosnapshot on keeps host copies from now on, so a loss restores them"
            )
        out.extend(f"could not restore {name}, now unusable: {why}" for name, why in self.failed)
        return out

    def to_text(self) -> str:
        return "\n".join([self.header()] + ["  " + line for line in self.details()])

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.details())
        # A note of its own, set apart from the cell's output above it (the run's result).
        style = "margin-top:8px;padding:2px 10px;border-left:3px solid var(--jp-warn-color1)"
        return (
            f'<div class="pathways-healing" style="{style}"><b>{html.escape(self.header())}</b><ul>{items}</ul></div>'
        )


def _describe(healed: Healed) -> str:
    step = "" if healed.step is None else f", step {healed.step}"
    if healed.run is not None:
        step += f" of elastic '{healed.run}'"
    return f"{healed.name} ({_age(healed.age_s)} ago{step})"


def _age(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


@dataclasses.dataclass(frozen=True)
class _Job:
    """Variables restored together from one snapshot."""

    names: tuple[str, ...]
    snap: snapshots.Snapshot
    origin: snapshots.Origin | None = None  # the elastic run the snapshot is of

    @property
    def run(self) -> str | None:
        return None if self.origin is None else self.origin.snap_name.removeprefix("elastic:")


def _plan(
    namespace: dict[str, Any], store: snapshots.SnapshotStore, hidden: frozenset[str]
) -> tuple[list[_Job], list[str]]:
    """What to restore from which snapshot, and the lost variables with no snapshot."""
    import jax

    jobs: list[_Job] = []
    unusable: list[str] = []
    done: set[str] = set()
    for name, value in snapshots.device_values(namespace).items():
        if name in hidden or name in _IPYTHON_NAMES or name in done:
            continue
        if not any(sessions.is_lost(leaf) for leaf in jax.tree.leaves(value)):
            continue
        own = store.latest(name)
        origin = store.origin(name, value)
        from_run = store.latest(origin.snap_name, run=origin.run) if origin is not None else None
        if origin is not None and from_run is not None and (own is None or from_run.created >= own.created):
            # The run's whole state goes back to one step: each of its
            # variables that still holds what the run left in it.
            group = tuple(n for n in origin.group if n == name or _same_run(store.origin(n, namespace.get(n)), origin))
            jobs.append(_Job(group, from_run, origin))
            done.update(group)
        elif own is not None:
            jobs.append(_Job((name,), own))
            done.add(name)
        else:
            unusable.append(name)
    return jobs, unusable


def heal(
    namespace: dict[str, Any], lost_slices: tuple[int, ...] = (), hidden: frozenset[str] = frozenset()
) -> HealingReport:
    """Restore every variable of ``namespace`` that holds lost data; see the module doc.

    Never raises ``KeyboardInterrupt``: an interrupted pass returns a report
    whose ``interrupted`` names what is still lost.
    """
    import jax

    current = sessions.session()
    store = snapshots.store(current)
    live = tuple(s.index for s in current.topology.up_slices)
    report = HealingReport(lost_slices, live)
    restored: list[Healed] = []
    failed: list[tuple[str, str]] = []
    jobs: list[_Job] = []
    try:
        jobs, unusable = _plan(namespace, store, hidden)
        report = dataclasses.replace(report, unusable=tuple(unusable))
        if not live:
            return dataclasses.replace(report, waiting=tuple(n for job in jobs for n in job.names))
        for job in jobs:
            try:
                tree = snapshots.restore(job.snap)
            except (PathwaysError, jax.errors.JaxRuntimeError) as exc:
                failed.extend((n, one_line(exc)) for n in job.names)
                continue
            with deferred_interrupts():
                _bind(namespace, store, job, tree, restored)
    except KeyboardInterrupt:
        finished = {h.name for h in restored} | {n for n, _ in failed}
        still = tuple(n for job in jobs for n in job.names if n not in finished)
        return dataclasses.replace(report, restored=tuple(restored), failed=tuple(failed), interrupted=still)
    return dataclasses.replace(report, restored=tuple(restored), failed=tuple(failed))


def _bind(
    namespace: dict[str, Any], store: snapshots.SnapshotStore, job: _Job, tree: Any, restored: list[Healed]
) -> None:
    """Rebind ``job``'s variables to their restored values (all or none: interrupts are held back)."""
    for n in job.names:
        namespace[n] = tree[n] if job.origin is not None else tree
        if job.origin is not None:
            # What healing restored from the run's snapshot is that run's state
            # again: the next loss goes back to the same snapshot.
            store.note_origin(n, namespace[n], job.origin.snap_name, job.origin.run, job.origin.group)
        restored.append(Healed(n, job.snap.age_s, job.snap.step, job.run))


def _same_run(a: snapshots.Origin | None, b: snapshots.Origin) -> bool:
    return a is not None and (a.snap_name, a.run) == (b.snap_name, b.run)


class Healer:
    """The between-cells hook of one IPython shell."""

    def __init__(self, shell: Any):
        self.shell = shell
        # The log of the session being watched: a session that replaces it brings its
        # own, whose every event is news (what the old one lost went with it).
        running = sessions.current()
        self._log: EventLog | None = running.events if running is not None else None
        self._seen = self._log.last(1)[0].seq if self._log is not None and len(self._log) else 0
        # Slices lost whose healing is not done yet (it waits for a slice, or was interrupted).
        self._due: set[int] = set()
        # The session was replaced since the last check: variables may hold the old one's arrays.
        self._replaced = False
        # Unusable variables already reported, with the arrays they held then:
        # one that is still lost is not announced again at the next loss. Weak
        # references, not ids: a new array may get a dead one's id.
        self._reported: dict[str, tuple[weakref.ref[Any], ...]] = {}

    def check(self, *_: Any) -> HealingReport | None:
        """Heal if a slice went down since the last check, or a pass is still due; display the report.

        An interrupt is never IPython's business here (it would print its
        callback-error dump): the pass stays due and the next check goes on.
        """
        try:
            return self._check()
        except KeyboardInterrupt:
            from IPython.display import display

            display(HealingReport(tuple(sorted(self._due)), (), interrupted=()))
            return None

    def _check(self) -> HealingReport | None:
        running = sessions.current()
        if running is None:
            return None
        if running.events is not self._log:
            # A new session (a reconnect, a new server): arrays of the old one held in
            # variables are lost (``sessions.is_lost``), and its snapshots came along.
            self._replaced = self._log is not None
            self._log, self._seen, self._due = running.events, 0, set()
        new = self._log.since(self._seen)
        if new:
            self._seen = new[-1].seq
        lost = {
            i for e in new if e.kind == "slice_down" for i in set(e.slices_before or ()) - set(e.slices_after or ())
        }
        if not lost and not self._due and not self._replaced:
            return None
        self._replaced = False
        self._due |= lost
        if not lost and not self._slice_up():
            return None  # still waiting for a slice; the block said so already
        hidden = frozenset(getattr(self.shell, "user_ns_hidden", {}))
        report = heal(self.shell.user_ns, tuple(sorted(self._due)), hidden)
        if not report.due:
            self._due.clear()
        report = dataclasses.replace(
            report, unusable=tuple(n for n in report.unusable if not self._already_reported(n))
        )
        if report:
            from IPython.display import display

            display(report)
        return report

    @staticmethod
    def _slice_up() -> bool:
        running = sessions.current()
        return running is not None and bool(running.topology.up_slices)

    def _already_reported(self, name: str) -> bool:
        import jax

        leaves = [leaf for leaf in jax.tree.leaves(self.shell.user_ns.get(name)) if isinstance(leaf, jax.Array)]
        before = self._reported.get(name, ())
        seen = len(before) == len(leaves) and all(ref() is leaf for ref, leaf in zip(before, leaves, strict=True))
        self._reported[name] = tuple(weakref.ref(leaf) for leaf in leaves)
        return seen


def install(shell: Any) -> Healer:
    """Register healing on ``shell``'s ``pre_run_cell`` and ``post_run_cell`` (once; ``shellhooks.remove`` undoes it)."""
    hooks = shellhooks.of(shell)
    healer = hooks.component(Healer, lambda h: Healer(h.shell))
    hooks.register("pre_run_cell", healer.check)
    hooks.register("post_run_cell", healer.check)
    return healer
