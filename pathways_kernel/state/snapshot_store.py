"""The session's snapshots: ``SnapshotStore`` keeps the last ``keep`` completed per name
(and, optionally, at most ``max_bytes`` in all), so host memory stays bounded however
long a training loop or a notebook runs; and where notebook variables came from
(``Origin``: the elastic run that left its state in them).
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.eventlog import EventLog, format_bytes
from pathways_kernel.core.sessions import Session
from pathways_kernel.core.sessions import session as current
from pathways_kernel.core.text import count
from pathways_kernel.state.host_copy import DEFAULT_NAME, Snapshot, take
from pathways_kernel.state.placement import is_device_array

if TYPE_CHECKING:
    import jax

#: Completed snapshots kept per name unless configured otherwise.
DEFAULT_KEEP = 2


class SnapshotStore:
    """The session's snapshots: last ``keep`` completed per name, at most
    ``max_bytes`` in all (oldest dropped first; ``None`` = no total bound).

    A session that replaces this one (a reconnect, a new server) takes the store over."""

    def __init__(self, events: EventLog | None = None, keep: int = DEFAULT_KEEP, max_bytes: int | None = None):
        self.events = events
        self._lock = threading.Lock()
        self._done: dict[str, collections.deque[Snapshot]] = {}
        self._pending: list[Snapshot] = []
        self._origins: dict[str, Origin] = {}
        self.keep = keep
        self.max_bytes = max_bytes

    def moved_to(self, session: Session) -> None:
        """Go on in the session replacing this one's (``sessions.HostState``): the snapshots are
        host memory, and outlive the server whose arrays they copied."""
        self.events = session.events

    def configure(self, keep: int | None = None, max_bytes: int | None | str = "unchanged") -> None:
        if keep is not None:
            if keep < 1:
                raise PathwaysError(f"keep must be at least 1, got {keep}")
            self.keep = keep
        if max_bytes != "unchanged":
            self.max_bytes = max_bytes  # type: ignore[assignment]
        with self._lock:
            self._evict()

    def snap(self, tree: Any, name: str, step: int | None = None, run: int | None = None) -> Snapshot:
        """Take a snapshot of ``tree`` and add it; returns it pending."""
        snap = take(tree, name, step, on_done=self._completed, run=run)
        with self._lock:
            self._pending.append(snap)
        # A weak reference: no cycle snapshot -> future -> callback -> snapshot,
        # so snapshots die when dropped, not at some garbage collection.
        ref = weakref.ref(snap)
        snap.when_done(lambda: self._forget_pending(ref()))
        return snap

    def add(self, snap: Snapshot) -> Snapshot:
        """File a snapshot made elsewhere (e.g. ``Snapshot.from_host``)."""
        if snap.done():
            self._file(snap)
        else:
            with self._lock:
                self._pending.append(snap)
            ref = weakref.ref(snap)
            snap.when_done(lambda: self._filed_when_done(ref()))
        return snap

    def _filed_when_done(self, snap: Snapshot | None) -> None:
        if snap is not None:
            self._forget_pending(snap)
            if snap.ok():
                self._file(snap)

    def _completed(self, snap: Snapshot) -> None:
        self._file(snap)
        if self.events is not None:
            self.events.emit(
                "snapshot",
                bytes=snap.nbytes,
                duration_s=snap.duration_s,
                step=snap.step,
                detail=f"'{snap.name}' {count(len(snap.leaves), 'array')}, {_throughput(snap)}",
            )

    def _file(self, snap: Snapshot) -> None:
        with self._lock:
            queue = self._done.setdefault(snap.name, collections.deque())
            # Two copies run at once: an elastic run's snapshot done after a
            # later one of the same run (its final one) goes before it.
            at = len(queue)
            while at and _later_in_run(queue[at - 1], snap):
                at -= 1
            queue.insert(at, snap)
            self._evict()

    def _forget_pending(self, snap: Snapshot | None) -> None:
        with self._lock:
            if snap is not None and snap in self._pending:
                self._pending.remove(snap)

    def _evict(self) -> None:
        # Completed snapshots only: a pending one may still fail (its slice
        # lost mid-copy), and then the older one is what we restore.
        for queue in self._done.values():
            while len(queue) > self.keep:
                queue.popleft()
        if self.max_bytes is not None:
            while self._total() > self.max_bytes:
                oldest = min((q[0] for q in self._done.values() if q), key=lambda s: s.created, default=None)
                if oldest is None:
                    break
                self._done[oldest.name].popleft()
        for name in [n for n, q in self._done.items() if not q]:
            del self._done[name]

    def _total(self) -> int:
        return sum(s.nbytes for q in self._done.values() for s in q)

    # -- queries ------------------------------------------------------------
    def latest(self, name: str = DEFAULT_NAME, wait: bool = True, run: int | None = None) -> Snapshot | None:
        """The newest good snapshot of ``name`` (``None`` if none); with
        ``run``, the newest that elastic run took.

        With ``wait``, pending snapshots of that name are waited for first;
        ones whose copy failed are skipped.
        """
        if wait:
            with self._lock:
                pending = [s for s in self._pending if s.name == name and (run is None or s.run == run)]
            for snap in pending:
                snap.settle()
        with self._lock:
            queue = self._done.get(name, ())
            return next((s for s in reversed(queue) if run is None or s.run == run), None)

    # -- where notebook variables came from ------------------------------------
    def note_origin(self, variable: str, value: Any, snap_name: str, run: int, group: Sequence[str]) -> None:
        """Record that ``variable``, while it holds ``value`` (these very
        arrays), is entry ``variable`` of the state of elastic run ``run``,
        whose snapshots are filed as ``snap_name`` and hold ``group``."""
        import jax

        arrays = [weakref.ref(leaf) for leaf in jax.tree.leaves(value) if is_device_array(leaf)]
        with self._lock:
            self._origins[variable] = Origin(variable, snap_name, run, tuple(group), arrays)

    def origin(self, variable: str, value: Any) -> Origin | None:
        """The elastic run ``variable``'s current ``value`` came from, if it
        still holds the arrays that run left in it (reassigning it forgets
        the run: its snapshots are of some other value)."""
        with self._lock:
            origin = self._origins.get(variable)
        return origin if origin is not None and origin.holds(value) else None

    def list(self) -> builtins.list[Snapshot]:
        """Every kept and pending snapshot, oldest first."""
        with self._lock:
            return sorted([s for q in self._done.values() for s in q] + list(self._pending), key=lambda s: s.created)

    def names(self) -> builtins.list[str]:
        with self._lock:
            return sorted(self._done)

    @property
    def nbytes(self) -> int:
        """Host bytes held by kept snapshots."""
        with self._lock:
            return self._total()

    def drop(self, name: str) -> None:
        with self._lock:
            self._done.pop(name, None)

    def clear(self) -> None:
        with self._lock:
            self._done.clear()


@dataclasses.dataclass(frozen=True)
class Origin:
    """A notebook variable that an elastic run left its state in (``SnapshotStore.origin``)."""

    variable: str
    snap_name: str
    run: int
    group: tuple[str, ...]  # the run's state variables: a rollback takes them all back together
    arrays: list[weakref.ref[jax.Array]]  # the arrays the run left in the variable

    def holds(self, value: Any) -> bool:
        import jax

        leaves = [leaf for leaf in jax.tree.leaves(value) if is_device_array(leaf)]
        return (
            bool(leaves)
            and len(leaves) == len(self.arrays)
            and all(ref() is leaf for ref, leaf in zip(self.arrays, leaves, strict=True))
        )


def _later_in_run(a: Snapshot, b: Snapshot) -> bool:
    """Whether ``a`` is of a later step of the elastic run that took ``b``."""
    return b.run is not None and a.run == b.run and a.step is not None and b.step is not None and a.step > b.step


def _throughput(snap: Snapshot) -> str:
    if not snap.duration_s:
        return ""
    return f"{format_bytes(snap.nbytes / snap.duration_s)}/s"


def store(session: Session | None = None) -> SnapshotStore:
    """The session's ``SnapshotStore`` (session extension ``"snapshots"``)."""
    if session is None:
        session = current()
    return session.component(SnapshotStore, lambda s: SnapshotStore(s.events))
