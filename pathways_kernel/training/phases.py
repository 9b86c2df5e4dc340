"""The phases of a loop whose roles run on different meshes (RL: rollout, reward, update, sync).

    for step in pw.steps(range(100), name="grpo"):
        with pw.phase("rollout", mesh=rollout_mesh):
            samples = generate(rollout_params, prompts)
        with pw.phase("reward", mesh=rollout_mesh):
            ...
        with pw.phase("update", mesh=trainer_mesh):
            params, opt_state = update(params, opt_state, samples)
        with pw.phase("sync", mesh=trainer_mesh):
            rollout_params = sync(params)

Each block is a ``Span``: its phase, the role it works for (``trainer`` or ``rollout``,
from the phase's name unless ``role=`` says), the mesh's slices and kind of chip, when it
began and ended, and the run (``pw.steps``, ``@pw.elastic``) and step it belongs to. The
session's ``PhaseLog`` keeps the newest ``MAX_SPANS``; the monitor sends them to the
dashboard's phase lane (``phases`` messages, docs/protocol.md), and ``pw.goodput()``
splits a run's time by role (``role_split``): how long each role's mesh worked, and how
long it waited while only the other role's did.

A phase does not change the goodput ledger's category: inside a run the block is the
step's own time (productive), as it was before it was marked.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pathways_kernel.core import sessions
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.subscribers import Subscribers
from pathways_kernel.training import accounting

if TYPE_CHECKING:
    from pathways_kernel.core.sessions import Session

#: Spans a session keeps (the newest); the dashboard is replayed these.
MAX_SPANS = 20_000
#: The role a phase works for when ``role=`` does not say: the names RL loops use.
ROLE_OF = {
    "rollout": "rollout",
    "generate": "rollout",
    "sample": "rollout",
    "reward": "rollout",
    "update": "trainer",
    "train": "trainer",
    "sync": "trainer",
}
#: Longest phase, role or mesh label kept (a view's row label).
MAX_LABEL = 80


@dataclasses.dataclass(frozen=True)
class Span:
    """One marked block: ``start``/``end`` are unix times; ``run`` is '' outside a run."""

    seq: int
    run: str
    phase: str
    role: str
    mesh: str
    slices: tuple[int, ...]
    start: float
    end: float
    step: int | None

    @property
    def seconds(self) -> float:
        return self.end - self.start


class PhaseSpans(Subscribers[list[Span]]):
    """Listeners of a session's new spans (the monitor's connections), called on the loop's thread."""


class PhaseLog:
    """A session's marked phases, oldest first (a session component)."""

    def __init__(self, session: Session):
        self._lock = threading.Lock()
        self._spans: collections.deque[Span] = collections.deque(maxlen=MAX_SPANS)
        self._seq = 0
        self._listeners = PhaseSpans()

    def add(self, **fields: Any) -> Span:
        with self._lock:
            self._seq += 1
            span = Span(seq=self._seq, **fields)
            self._spans.append(span)
        self._listeners.notify([span])
        return span

    def spans(self, run: str | None = None, since: float = float("-inf"), until: float = float("inf")) -> list[Span]:
        """The kept spans (of ``run`` only, if given) that lie within ``[since, until]``, oldest first."""
        with self._lock:
            kept = list(self._spans)
        return [s for s in kept if (run is None or s.run == run) and s.start >= since and s.end <= until]

    def subscribe(self, listener: Callable[[list[Span]], None]) -> Callable[[], None]:
        return self._listeners.subscribe(listener)


def phase_log(session: Session | None = None) -> PhaseLog:
    return (session or sessions.session()).component(PhaseLog)


@contextlib.contextmanager
def phase(name: str, mesh: Any = None, role: str | None = None) -> Iterator[None]:
    """Mark the block as phase ``name`` of the loop, working for ``role`` on ``mesh``.

    Args:
      name: the phase, e.g. ``"rollout"``, ``"reward"``, ``"update"``, ``"sync"``.
      mesh: the ``jax.sharding.Mesh`` the phase runs on (its slices and kind label the lane).
      role: whose time it is, e.g. ``"trainer"`` or ``"rollout"``; default from ``name``
        (``ROLE_OF``: rollout, generate, sample and reward work for the rollout; update,
        train and sync for the trainer).

    The block's end is when it returns: to count the device's work, end it with
    ``jax.block_until_ready`` on what it computed.

    Raises:
      PathwaysError: no ``role`` and a ``name`` that does not say one.
    """
    role = role if role is not None else ROLE_OF.get(name)
    if not role:
        known = ", ".join(sorted(ROLE_OF))
        raise PathwaysError(f"pw.phase({name!r}): say whose time it is with role=... (known phases: {known})")
    slices, label = _where(mesh, sessions.session())
    account = accounting.running()
    run = account.name if account is not None and not account.ended else ""
    step = account.first_step + account.steps if run and account is not None else None
    log = phase_log()
    start = time.time()
    try:
        yield
    finally:
        log.add(
            run=run,
            phase=name[:MAX_LABEL],
            role=role[:MAX_LABEL],
            mesh=label,
            slices=slices,
            start=start,
            end=time.time(),
            step=step,
        )


def _where(mesh: Any, session: Session) -> tuple[tuple[int, ...], str]:
    """A mesh's slices and its label: ``slice 1 · TPU v6 lite``, ``slices 0-1 · TPU v5p``."""
    if mesh is None:
        return (), ""
    topology = session.topology
    devices = list(mesh.devices.flat)
    slices = tuple(sorted({topology.slice_of(d) for d in devices}))
    kinds = sorted({topology.slice(i).kind for i in slices} - {"", "cpu"})
    if len(slices) == 1:
        where = f"slice {slices[0]}"
    elif slices == tuple(range(slices[0], slices[-1] + 1)):
        where = f"slices {slices[0]}-{slices[-1]}"
    else:
        where = "slices " + ",".join(map(str, slices))
    return slices, " · ".join([where, *kinds])[:MAX_LABEL]


# -- goodput by role ---------------------------------------------------------------
@dataclasses.dataclass
class RoleTime:
    """One role's share of a span of time: its phases, and its waits on the other roles."""

    role: str
    mesh: str
    wall_s: float
    busy_s: float
    phases: dict[str, float]
    waited_s: dict[str, float]  # per other role: time only that role's phases ran

    @property
    def idle_s(self) -> float:
        return max(0.0, self.wall_s - self.busy_s - sum(self.waited_s.values()))

    def to_text(self) -> str:
        wall = self.wall_s or 1.0
        phases = ", ".join(f"{p} {100 * s / wall:.1f}%" for p, s in self.phases.items())
        waits = "".join(f" · waited for {r} {100 * s / wall:.1f}%" for r, s in self.waited_s.items())
        where = f" ({self.mesh})" if self.mesh else ""
        return f"{self.role}{where}: busy {100 * self.busy_s / wall:.1f}% ({phases}){waits} · neither {100 * self.idle_s / wall:.1f}%"


def role_split(spans: Iterable[Span], start: float, end: float) -> dict[str, RoleTime]:
    """Each role's busy time in ``[start, end]`` (the union of its phases), and, per other
    role, the time that role's phases ran while this one's did not: the waits."""
    spans = [s for s in spans if s.end > start and s.start < end]
    roles: dict[str, list[Span]] = {"trainer": [], "rollout": []}  # in this order, when present
    for s in spans:
        roles.setdefault(s.role, []).append(s)
    roles = {role: own for role, own in roles.items() if own}
    busy = {role: _union((max(s.start, start), min(s.end, end)) for s in own) for role, own in roles.items()}
    split = {}
    for role, own in roles.items():
        phases: dict[str, float] = {}
        for s in own:
            phases[s.phase] = phases.get(s.phase, 0.0) + min(s.end, end) - max(s.start, start)
        meshes = list(dict.fromkeys(s.mesh for s in own if s.mesh))
        waited = {other: _length(_minus(busy[other], busy[role])) for other in roles if other != role}
        split[role] = RoleTime(role, " + ".join(meshes), end - start, _length(busy[role]), phases, waited)
    return split


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _minus(these: list[tuple[float, float]], those: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``these`` less ``those`` (both merged, sorted)."""
    out = []
    for a, b in these:
        cursor = a
        for c, d in those:
            if d <= cursor or c >= b:
                continue
            if c > cursor:
                out.append((cursor, c))
            cursor = max(cursor, d)
        if cursor < b:
            out.append((cursor, b))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


__all__ = ["MAX_SPANS", "ROLE_OF", "PhaseLog", "RoleTime", "Span", "phase", "phase_log", "role_split"]
