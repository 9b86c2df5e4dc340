"""Notebook healing: after a slice loss, the notebook's variables come back.

Between cells (IPython ``pre_run_cell``, and ``post_run_cell`` so that a loss
during a cell is reported under that cell), if a slice went down since the
last check (a ``slice_down`` event in the session's log, whatever caused it),
every variable of the user namespace holding a lost array
(``faults.is_lost``: reading it raises ``DATA_LOSS``) is restored from the
newest host snapshot of it, onto the mesh of the live slices, with the same
``PartitionSpec``s (``snapshots.restore``, which emits a ``restore`` event),
and rebound to the same name. A variable's snapshots are those filed under
its name (``%pathways snapshot``, ``%pathways autosnapshot on``) and, while
it still holds what a ``%%pathways elastic`` run left in it (even one
interrupted mid-step), that run's own snapshots; the run's other state
variables then go back to the same step with it, so that they stay
consistent. Variables without a snapshot are left as they are, unusable, and
named. The user sees one short block saying which names came back, from how
long ago and which step, and which did not.
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.errors import PathwaysError, one_line
from pathways_kernel.emulator import faults
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

    def __bool__(self) -> bool:
        return bool(self.restored or self.unusable or self.failed)

    def header(self) -> str:
        lost = ("slices " if len(self.lost_slices) > 1 else "slice ") + ", ".join(map(str, self.lost_slices))
        return f"{lost} lost: variables with data on it were healed" if self.restored else f"{lost} lost"

    def details(self) -> list[str]:
        out = []
        if self.restored:
            live = ",".join(map(str, self.live_slices))
            out.append(f"restored from snapshots onto slices [{live}]: " + ", ".join(map(_describe, self.restored)))
        for run, step in sorted({(h.run, h.step) for h in self.restored if h.run is not None}):
            out.append(f"elastic '{run}' is back at step {step}: continue with %%pathways elastic --start {step}")
        if self.unusable:
            out.append(f"no snapshot, now unusable (DATA_LOSS): {', '.join(self.unusable)}; recompute or reload them")
        out.extend(f"could not restore {name}, now unusable: {why}" for name, why in self.failed)
        return out

    def to_text(self) -> str:
        return "\n".join([self.header()] + ["  " + line for line in self.details()])

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.details())
        return f'<div class="pathways-healing"><b>{html.escape(self.header())}</b><ul>{items}</ul></div>'


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


def heal(
    namespace: dict[str, Any], lost_slices: tuple[int, ...] = (), hidden: frozenset[str] = frozenset()
) -> HealingReport:
    """Restore every variable of ``namespace`` that holds lost data; see the module doc."""
    import jax

    from pathways_kernel.core.sessions import session

    current = session()
    store = snapshots.store(current)
    live = tuple(s.index for s in current.topology.up_slices)
    restored, unusable, failed = [], [], []
    values = snapshots.device_values(namespace)
    done: set[str] = set()
    for name, value in values.items():
        if name in hidden or name in _IPYTHON_NAMES or name in done:
            continue
        if not any(faults.is_lost(leaf) for leaf in jax.tree.leaves(value)):
            continue
        own = store.latest(name)
        origin = store.origin(name, value)
        from_run = store.latest(origin.snap_name, run=origin.run) if origin is not None else None
        if from_run is not None and (own is None or from_run.created >= own.created):
            # The run's whole state goes back to one step: each of its
            # variables that still holds what the run left in it.
            group = [n for n in origin.group if n == name or _same_run(store.origin(n, namespace.get(n)), origin)]
            try:
                tree = snapshots.restore(from_run)
            except (PathwaysError, jax.errors.JaxRuntimeError) as exc:
                failed.extend((n, one_line(exc)) for n in group)
                done.update(group)
                continue
            for n in group:
                namespace[n] = tree[n]
                restored.append(Healed(n, from_run.age_s, from_run.step, origin.snap_name.removeprefix("elastic:")))
            done.update(group)
            continue
        if own is None:
            unusable.append(name)
            continue
        try:
            namespace[name] = snapshots.restore(own)
        except (PathwaysError, jax.errors.JaxRuntimeError) as exc:
            failed.append((name, one_line(exc)))
            continue
        restored.append(Healed(name, own.age_s, own.step))
    return HealingReport(lost_slices, live, tuple(restored), tuple(unusable), tuple(failed))


def _same_run(a: snapshots.Origin | None, b: snapshots.Origin) -> bool:
    return a is not None and (a.snap_name, a.run) == (b.snap_name, b.run)


class Healer:
    """The between-cells hook of one IPython shell."""

    def __init__(self, shell: Any):
        from pathways_kernel.core.sessions import EVENTS

        self.shell = shell
        self.events = EVENTS
        self._seen = self.events.last(1)[0].seq if len(self.events) else 0
        # Unusable variables already reported, with the arrays they held then:
        # one that is still lost is not announced again at the next loss.
        self._reported: dict[str, tuple[int, ...]] = {}

    def check(self, *_: Any) -> HealingReport | None:
        """Heal if a slice went down since the last check; display the report."""
        new = self.events.since(self._seen)
        if not new:
            return None
        self._seen = new[-1].seq
        lost = tuple(
            sorted(
                {
                    i
                    for e in new
                    if e.kind == "slice_down"
                    for i in set(e.slices_before or ()) - set(e.slices_after or ())
                }
            )
        )
        if not lost:
            return None
        hidden = frozenset(getattr(self.shell, "user_ns_hidden", {}))
        report = heal(self.shell.user_ns, lost, hidden)
        report = dataclasses.replace(
            report, unusable=tuple(n for n in report.unusable if not self._already_reported(n))
        )
        if report:
            from IPython.display import display

            display(report)
        return report

    def _already_reported(self, name: str) -> bool:
        import jax

        arrays = tuple(id(leaf) for leaf in jax.tree.leaves(self.shell.user_ns.get(name)))
        seen = self._reported.get(name) == arrays
        self._reported[name] = arrays
        return seen


def install(shell: Any) -> Healer:
    """Register healing on ``shell``'s ``pre_run_cell`` and ``post_run_cell`` (once)."""
    healer = getattr(shell, "_pathways_healer", None)
    if healer is None:
        healer = Healer(shell)
        shell.events.register("pre_run_cell", healer.check)
        shell.events.register("post_run_cell", healer.check)
        shell._pathways_healer = healer
    return healer
