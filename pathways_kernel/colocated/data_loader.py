"""Colocated data loading: each slice's shard of a global batch from its own sidecar.

    def make_batches(step, shard, num_shards):
        # rows [shard * B/num_shards, (shard + 1) * B/num_shards) of global batch `step`
        ...
        return {"x": x, "y": y}              # numpy arrays (any pytree)

    batches = pw.loader(make_batches, mesh=mesh, spec=P("data"), prefetch=2)
    for step, batch in zip(range(100), batches):
        state = train_step(state, batch)

A batch is a pure function of ``(step, shard, num_shards)``: ``make_batches``
returns shard ``shard`` of ``num_shards`` equal blocks of the batch dimension
(dimension 0) of global batch ``step``. Each slice's block is produced by a
sidecar colocated with that slice (``jax.experimental.colocated_python``),
on one worker thread per slice, ``prefetch`` steps ahead of the step being
consumed; the blocks are joined into one ``jax.Array`` on ``mesh`` with
``spec`` without copying.

Because a batch depends only on its step, the loader is exactly elastic:
when a reshard or rollback calls ``reset(step, mesh)`` (registered with
``elastic.on_restore``), prefetched work is dropped, the loader lays the
batch out over the new mesh (fewer slices -> fewer, larger shards) and
replays from ``step``. The samples seen by committed steps are those of a
fault-free run: none skipped, none doubled.

This module is the loader object (scheduling steps, handing batches over,
following meshes); how a batch is laid out in per-slice blocks, produced
and joined is ``loader_blocks.py``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypedDict

from pathways_kernel.colocated.activity import activity
from pathways_kernel.colocated.loader_blocks import Block, Layout, MakeBatches, Part, Pending, remote_producer
from pathways_kernel.colocated.sidecars import (
    DEFAULT_TIMEOUT_S,
    Colocated,
    SidecarError,
    SidecarTimeout,
    slice_lost,
    timed_out,
)
from pathways_kernel.colocated.worker import Worker
from pathways_kernel.core.errors import PathwaysError, slice_down_error
from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.sessions import session
from pathways_kernel.core.text import count
from pathways_kernel.training import accounting, elastic_run

if TYPE_CHECKING:
    from typing import TypeAlias

    from jax.sharding import Mesh, PartitionSpec

    #: A ``PartitionSpec``, or what ``_parse_spec`` makes one of: one axis name, or per-dimension entries.
    SpecLike: TypeAlias = PartitionSpec | str | Sequence[str | tuple[str, ...] | None] | None

#: Seconds between the loader's periodic ``sidecar`` summary events.
SUMMARY_EVERY_S = 5.0


class _Counters(TypedDict):
    batches: int
    waits: int
    wait_s: float
    bytes: int


class _Summary(TypedDict):
    time: float
    batches: int
    bytes: int
    busy_s: float


def _parse_spec(spec: SpecLike, mesh: Mesh) -> PartitionSpec:
    from jax.sharding import PartitionSpec

    if spec is None:
        return PartitionSpec(mesh.axis_names[0])
    if isinstance(spec, PartitionSpec):
        return spec
    if isinstance(spec, str):
        return PartitionSpec(spec)
    return PartitionSpec(*spec)


class Loader:
    """An iterator of globally sharded batches, produced by per-slice sidecars.

    ``next(loader)`` returns batch ``loader.step`` and advances; ``batch(step)``
    returns any step's batch (a rollback replays by asking for old steps);
    ``reset(step, mesh)`` follows a new mesh from ``step``.
    """

    def __init__(
        self,
        make_batches: MakeBatches,
        mesh: Mesh | None = None,
        spec: SpecLike = None,
        prefetch: int = 2,
        start: int = 0,
        timeout: float = DEFAULT_TIMEOUT_S,
        name: str | None = None,
        follow_elastic: bool = True,
    ):
        from jax.experimental.colocated_python import colocated_python

        if not callable(make_batches):
            raise PathwaysError(
                f"pw.loader needs make_batches(step, shard, num_shards), got {type(make_batches).__name__}"
            )
        if prefetch < 0:
            raise PathwaysError(f"prefetch must be >= 0 steps, got {prefetch}")
        if timeout <= 0:
            raise PathwaysError(f"loader timeout must be positive, got {timeout:g} s")
        self._session = session()
        mesh = self._session.mesh() if mesh is None else mesh
        self.spec = _parse_spec(spec, mesh)
        default_name: str = getattr(make_batches, "__name__", "loader")
        self.name = name or default_name
        self.prefetch = prefetch
        self.timeout = timeout
        self.step = start
        self._lock = threading.RLock()
        self._layout = Layout(mesh, self.spec, self._session.topology)
        # One colocated function per number of shards: colocated_python fixes a function's output
        # shapes by its first call on inputs of the same shapes (on Pathways and the local server;
        # its in-process fallback does not), and a block's rows depend on the number of shards.
        self._colocated: dict[int, Colocated] = {}
        self._make_colocated: Callable[[], Colocated] = lambda: colocated_python(
            remote_producer(make_batches, self.spec, self.name)
        )
        self._pending: dict[int, Pending] = {}
        self._workers: dict[int, Worker] = {}
        self._closed = True  # until the hooks below exist, there is nothing to close
        self._counters: _Counters = {"batches": 0, "waits": 0, "wait_s": 0.0, "bytes": 0}
        self._summary: _Summary = {"time": time.monotonic(), "batches": 0, "bytes": 0, "busy_s": 0.0}
        # Weak references only: a loader the notebook drops is collected, and closes.
        ref = weakref.ref(self)
        self._unwatch = activity(self._session).watch_queue(self.name, lambda: _state_of(ref))
        self._unhook = _follow_elastic(self) if follow_elastic else None
        self._closed = False
        self._session.events.emit(
            "sidecar",
            slices_after=self._layout.slices,
            step=start,
            detail=f"loader {self.name}: {count(self._layout.num_shards, 'shard')}, prefetch {prefetch}",
        )
        self._schedule(start, self.prefetch)

    # -- consuming ----------------------------------------------------------------
    @property
    def mesh(self) -> Mesh:
        return self._layout.mesh

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> Any:
        accounting.loop_next(self, f"loader {self.name}")  # a bare `for batch in loader` is a run of its own
        with self._lock:
            step = self.step
            self.step += 1
        try:
            batch = self.batch(step)
        except BaseException:
            with self._lock:
                if self.step == step + 1:  # not reset meanwhile: the step was not delivered
                    self.step = step
            raise
        accounting.loop_step(self)
        return batch

    def batch(self, step: int, mesh: Mesh | None = None) -> Any:
        """The global batch of ``step`` on the loader's mesh; prefetches the next ones.

        ``mesh`` (e.g. the one an elastic step function receives) makes the
        loader follow it first if it is not the loader's mesh already.

        Raises:
          SidecarError: ``make_batches`` raised on a slice (named).
          SidecarTimeout: a slice's sidecar did not answer within ``timeout``.
        """
        if self._closed:
            raise PathwaysError(f"loader {self.name} is closed; create a new pw.loader")
        if mesh is not None and mesh is not self._layout.mesh and mesh != self._layout.mesh:
            self.reset(step, mesh)
        down = [i for i in self._layout.slices if not self._session.topology.slice(i).up]
        if down:
            # Whatever was made or prefetched for a lost slice is lost with it.
            raise self._lost(step, down)
        with self._lock:
            self._schedule(step, 1 + self.prefetch)
            pending = self._pending.pop(step)
        waiting = not pending.joined.done()
        started = time.perf_counter()
        try:
            with accounting.spent("data_wait", owner=self):
                batch, sizes = pending.joined.result(timeout=self.timeout)
        except TimeoutError:
            hung = min(i for i, f in pending.blocks.items() if not f.done())
            exc = timed_out(self.name, hung, self.timeout)
            self._failed(pending.blocks, exc)
            raise exc from None
        except Exception as exc:
            if isinstance(exc, SidecarError) or slice_lost(exc):
                self._failed(pending.blocks, exc)
            if slice_lost(exc):
                down = [i for i in self._layout.slices if not self._session.topology.slice(i).up]
                raise self._lost(step, down or [min(pending.blocks)]) from None
            raise
        log = activity(self._session)
        for index, (size, busy) in sizes.items():
            log.record(index, size, busy)
            self._summary["busy_s"] += busy
        with self._lock:
            c = self._counters
            c["batches"] += 1
            c["bytes"] += sum(size for size, _busy in sizes.values())
            if waiting:
                c["waits"] += 1
                c["wait_s"] += time.perf_counter() - started
        self._maybe_summarize(step)
        return batch

    def _lost(self, step: int, down: list[int]) -> BaseException:
        """The one line for a batch whose slices are down: what to do (still a slice-loss
        error, so an elastic loop recovers from it)."""
        which = f"slice {down[0]} is" if len(down) == 1 else f"slices {', '.join(map(str, down))} are"
        return slice_down_error(
            f"loader {self.name}: {which} down and batches are laid out over slices "
            f"[{','.join(map(str, self._layout.slices))}] (DATA_LOSS); follow the live slices with "
            f"loader.reset({step}, pw.mesh()) and go on from step {step}, or run the loop under pw.elastic "
            f"and pass its mesh (loader.batch(step, mesh)), which does that for you"
        )

    def reset(self, step: int, mesh: Mesh | None = None) -> None:
        """Follow ``mesh`` (default: a mesh over the live slices, same axes) and continue from ``step``."""
        with self._lock:
            before = self._layout.slices
            self._drop_pending()
            if mesh is None:
                mesh = self._session.mesh(self._layout.mesh.axis_names)
            self._layout = Layout(mesh, self.spec, self._session.topology)
            self.step = step
            self._schedule(step, self.prefetch)
        self._session.events.emit(
            "sidecar",
            slices_before=before,
            slices_after=self._layout.slices,
            step=step,
            detail=f"loader {self.name}: replay from step {step} on {count(self._layout.num_shards, 'shard')}",
        )

    def close(self) -> None:
        """Stop prefetching and release the worker threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._drop_pending()
            for worker in self._workers.values():
                worker.retire()
            self._workers.clear()
        accounting.end_loop(self)
        self._unwatch()
        if self._unhook is not None:
            self._unhook()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state(self) -> dict[str, Any]:
        """Step, prefetch, queue depth (batches ready ahead), batches, waits and bytes so far."""
        with self._lock:
            ready = sum(1 for pending in self._pending.values() if pending.joined.done())
            return {
                "step": self.step,
                "slices": list(self._layout.slices),
                "prefetch": self.prefetch,
                "queue_depth": ready,
                **self._counters,
                "wait_s": round(self._counters["wait_s"], 4),
            }

    def __repr__(self) -> str:
        s = self.state()
        return (
            f"<loader {self.name}: step {s['step']}, slices {s['slices']}, prefetch {self.prefetch}, "
            f"{s['queue_depth']} ready, {count(s['batches'], 'batch')} ({format_bytes(s['bytes'])}), {count(s['waits'], 'wait')}>"
        )

    # -- producing ----------------------------------------------------------------
    def _schedule(self, step: int, count: int) -> None:
        """Have steps ``step .. step + count - 1`` submitted; drop any others (caller holds the lock)."""
        wanted = range(step, step + count)
        for stale in [s for s in self._pending if s not in wanted]:
            self._pending.pop(stale).cancel()
        for s in wanted:
            if s not in self._pending:
                blocks = {
                    part.slice_index: self._worker(part.slice_index).submit(self._job(s, part))
                    for part in self._layout.parts
                }
                self._pending[s] = Pending(blocks, self._layout, self.name)

    def _job(self, step: int, part: Part) -> Callable[[], Block]:
        colocated = self._colocated_for(part.num_shards)
        spec = self.spec

        def job() -> Block:
            import jax
            import numpy as np
            from jax.sharding import NamedSharding, PartitionSpec

            started = time.perf_counter()
            request = jax.device_put(
                np.array([step, part.shard, part.num_shards], np.int64), NamedSharding(part.host_mesh, PartitionSpec())
            )
            tree = colocated(request)
            if part.host_mesh.devices.tolist() != part.mesh.devices.tolist():
                # Pathways: the block is on the sidecar's CPU devices; move it to the slice's chips.
                tree = jax.device_put(tree, NamedSharding(part.mesh, spec))
            jax.block_until_ready(tree)
            return tree, time.perf_counter() - started

        return job

    def _colocated_for(self, num_shards: int) -> Colocated:
        with self._lock:
            if num_shards not in self._colocated:
                self._colocated[num_shards] = self._make_colocated()
            return self._colocated[num_shards]

    def _worker(self, index: int) -> Worker:
        if index not in self._workers:
            self._workers[index] = Worker(f"loader-{self.name}-slice{index}")
        return self._workers[index]

    def _drop_pending(self) -> None:
        for pending in self._pending.values():
            pending.cancel()
        self._pending.clear()

    def _failed(self, futures: dict[int, Future[Block]], exc: BaseException) -> None:
        log = activity(self._session)
        timeout = isinstance(exc, SidecarTimeout)
        for index, future in futures.items():
            if not future.done():
                log.record(index, timeout=True)
            elif not future.cancelled() and future.exception() is not None:
                log.record(index, error=True)
        with self._lock:
            self._drop_pending()
            if timeout:
                # The hung thread cannot be stopped; later steps get fresh workers.
                for worker in self._workers.values():
                    worker.retire()
                self._workers.clear()
        self._session.events.emit("sidecar", detail=f"loader {self.name}: {exc}")

    def _maybe_summarize(self, step: int) -> None:
        now = time.monotonic()
        s = self._summary
        if now - s["time"] < SUMMARY_EVERY_S:
            return
        with self._lock:
            c = self._counters.copy()
        depth = self.state()["queue_depth"]
        self._session.events.emit(
            "sidecar",
            bytes=c["bytes"] - s["bytes"],
            duration_s=s["busy_s"],
            step=step,
            detail=f"loader {self.name}: {count(c['batches'] - s['batches'], 'batch')}, queue depth {depth}, {count(c['waits'], 'wait')}",
        )
        self._summary = {"time": now, "batches": c["batches"], "bytes": c["bytes"], "busy_s": 0.0}


def _state_of(ref: weakref.ref[Loader]) -> dict[str, Any]:
    target = ref()
    return target.state() if target is not None else {}


def _follow_elastic(loader: Loader) -> Callable[[], None] | None:
    """Register ``loader.reset`` with elastic's restore hooks, weakly (a dropped loader unhooks itself)."""
    ref = weakref.ref(loader)

    def follow(step: int, mesh: Mesh) -> None:
        target = ref()
        if target is not None and not target._closed:
            target.reset(step, mesh)

    unhook = elastic_run.on_restore(follow, loader._session)
    return unhook if callable(unhook) else None


def loader(
    make_batches: MakeBatches,
    mesh: Mesh | None = None,
    spec: SpecLike = None,
    prefetch: int = 2,
    start: int = 0,
    timeout: float | None = None,
    name: str | None = None,
    follow_elastic: bool = True,
) -> Loader:
    """Globally sharded batches, each slice's block produced by a sidecar colocated with it.

    Args:
      make_batches: ``make_batches(step, shard, num_shards)`` -> pytree of
        numpy arrays: block ``shard`` of ``num_shards`` equal blocks of the
        batch dimension of global batch ``step``. Must be pure (same inputs,
        same data) and return the same shapes every step.
      mesh: the mesh to lay batches out on (default: ``pw.mesh()`` over live slices).
      spec: ``PartitionSpec`` of every leaf (default: batch dimension over the
        mesh's first axis).
      prefetch: steps produced ahead of the one being consumed.
      start: the first step ``next()`` returns.
      timeout: seconds a slice's sidecar may take for one block (default 60).
      name: shown in events and stats (default: ``make_batches.__name__``).
      follow_elastic: follow every elastic reshard or rollback
        (``elastic.on_restore``) until closed; ``batch(step, mesh)`` follows
        the mesh it is given either way.

    Raises:
      MeshError: the mesh/spec does not split batches into per-slice blocks.
    """
    return Loader(
        make_batches,
        mesh,
        spec,
        prefetch,
        start,
        DEFAULT_TIMEOUT_S if timeout is None else timeout,
        name,
        follow_elastic,
    )
