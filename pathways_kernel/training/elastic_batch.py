"""Batch inference across slices as an elastic job: ``pw.elastic_map``.

    def generate(params, prompts, mesh):              # one batch, on one slice's mesh
        return sample(params, prompts)                # a pytree, one row per request

    tokens = pw.elastic_map(generate, prompts, params, batch_size=8)
    pw.elastic_map.last_run                           # per slice: batches, tokens/s; losses

The requests are cut into batches of ``batch_size`` once, at the start; each
live slice (of ``slices``, default all) takes the next batch not yet done, runs
``fn(params, batch, mesh)`` on a mesh of its own devices with its own copy of
``params``, and hands the output back to the host. A slice lost mid-batch
costs only the batches it had not handed back: they go back to the queue and
the survivors take them (outputs already on the host are kept); with no slice
of the job left up, the job waits for one, saying so. A repaired slice gets
``params`` again (from a live copy, moved by the server on Pathways) and takes
batches again. The result is the outputs of all batches, in request order,
concatenated on the host: with batches cut the same way and ``fn`` a function
of its batch (seed per request), it equals a fault-free run's.

Each batch done logs ``slice<i>_tokens_per_s`` (``pw.metrics``, the monitor's
charts), counting ``tokens(output)`` (default: the elements of the output's
first leaf). Each loss is one ``retry`` event, each rejoin one ``scale_up``.

Inside another run (an ``@pw.elastic`` step: the rollout of an RL loop) the
metrics go to that run, at its current step.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pathways_kernel.core import meshes
from pathways_kernel.core.errors import PathwaysError, one_line
from pathways_kernel.core.sessions import Session, session
from pathways_kernel.core.text import count
from pathways_kernel.training import accounting
from pathways_kernel.training.elastic_loop import DEFAULT_WAIT_S, ElasticError
from pathways_kernel.training.elastic_placement import devices_of, reshard
from pathways_kernel.training.elastic_run import check_count
from pathways_kernel.training.metric_log import metric_log

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from pathways_kernel.core.eventlog import Event

#: Consecutive slice losses without a batch done in between before giving up.
DEFAULT_MAX_RETRIES = 10
#: Batches per live slice when ``batch_size`` is not given: a loss redoes at most a quarter of a slice's share.
BATCHES_PER_SLICE = 4
#: How often the job looks again at its workers while none reports (a bound, not a poll of the devices).
TICK_S = 0.5
#: How long a worker's thread is waited for once the job ends.
JOIN_S = 30.0


@dataclasses.dataclass
class SliceReport:
    """What one slice did in an ``elastic_map`` job."""

    batches: int = 0
    requests: int = 0
    tokens: int = 0
    busy_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.busy_s if self.busy_s > 0 else 0.0


@dataclasses.dataclass
class MapReport:
    """What an ``elastic_map`` job went through: ``pw.elastic_map.last_run``."""

    name: str
    requests: int = 0
    batches: int = 0
    batch_size: int = 0
    #: Batch numbers whose output a lost slice never handed back, once per loss (redone elsewhere).
    redone: list[int] = dataclasses.field(default_factory=list)
    losses: int = 0
    rejoins: int = 0
    #: True while no slice of the job is up and it waits for one.
    waiting: bool = False
    duration_s: float = 0.0
    slices: dict[int, SliceReport] = dataclasses.field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        tokens = sum(r.tokens for r in self.slices.values())
        return tokens / self.duration_s if self.duration_s > 0 else 0.0

    def summary(self) -> str:
        per = ", ".join(
            f"slice {i}: {r.batches} ({r.tokens_per_s:.0f} tokens/s)" for i, r in sorted(self.slices.items())
        )
        return (
            f"elastic_map '{self.name}': {count(self.requests, 'request')} in {count(self.batches, 'batch')} "
            f"in {self.duration_s:.1f} s ({self.tokens_per_s:.0f} tokens/s); batches per slice: {per or 'none'}; "
            f"{count(self.losses, 'slice loss')}, {count(len(self.redone), 'batch')} redone, "
            f"{count(self.rejoins, 'rejoin')}"
        )

    def __repr__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.summary())


class _Worker:
    """One slice's thread: takes batches from the job until its slice is lost or nothing is left."""

    def __init__(self, job: _Job, index: int):
        self.job, self.index = job, index
        self.lost = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"pathways-elastic-map-{job.name}-{index}", daemon=True)

    def _run(self) -> None:
        job = self.job
        try:
            mesh, params = job.place(self.index)
        except Exception as error:
            job.results.put(("failed", self.index, None, error))
            return
        while True:
            batch = job.take(self.lost)
            if batch is None:
                if self.lost.is_set():  # lost while it waited for a batch: nothing to redo
                    job.results.put(("failed", self.index, None, None))
                return
            start = time.perf_counter()
            try:
                output = job.fn(params, job.batch(batch), mesh)
                import jax

                host = jax.device_get(output)
            except Exception as error:
                job.results.put(("failed", self.index, batch, error))
                return
            if self.lost.is_set():
                # The slice went down while the batch ran: what it handed back may be half of it.
                job.results.put(("failed", self.index, batch, None))
                return
            job.results.put(("done", self.index, batch, (host, time.perf_counter() - start)))


class _Job:
    """One ``elastic_map`` call: the batch queue, the slices' workers and their copies of the params."""

    def __init__(self, fn: Callable[..., Any], requests: Any, params: Any, batch_size: int, axes: Any, name: str):
        self.fn, self.requests, self.params = fn, requests, params
        self.batch_size, self.axes, self.name = batch_size, axes, name
        self.batches = math.ceil(len(requests) / batch_size)
        self._lock = threading.Condition()
        self._queue: list[int] = list(range(self.batches))
        self.closed = False
        self.placed: dict[int, Any] = {}  # slice -> its copy of params
        self.results: queue.Queue[tuple[str, int, int | None, Any]] = queue.Queue()

    def batch(self, i: int) -> Any:
        return self.requests[i * self.batch_size : (i + 1) * self.batch_size]

    def take(self, lost: threading.Event) -> int | None:
        """The next batch to run; waits while none is queued (a batch may come back from a lost
        slice) until the job ends or the worker's slice is lost (``None``)."""
        with self._lock:
            while not self._queue and not self.closed and not lost.is_set():
                self._lock.wait()
            if self.closed or lost.is_set():
                return None
            return self._queue.pop(0)

    def give_back(self, i: int) -> None:
        with self._lock:
            self._queue.append(i)
            self._queue.sort()
            self._lock.notify_all()

    def wake(self, close: bool = False) -> None:
        """Workers look again: a slice was lost, or (``close``) the job ended."""
        with self._lock:
            self.closed = self.closed or close
            self._lock.notify_all()

    def waiting(self) -> bool:
        with self._lock:
            return bool(self._queue)

    def place(self, index: int) -> tuple[Mesh, Any]:
        """Slice ``index``'s mesh and its copy of the params: from a live copy, else from those given."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        s = session()
        sl = next(sl for sl in s.topology.slices if sl.index == index)
        mesh = meshes.build([sl], self.axes)
        if self.params is None:
            return mesh, None
        lost = {d.id for sl in s.topology.slices if not sl.up for d in sl.devices}
        with self._lock:
            sources = [tree for i, tree in self.placed.items() if i != index]
        sources.append(self.params)
        source = next((tree for tree in sources if not devices_of(tree) & lost), None)
        if source is None:
            raise ElasticError(
                f"elastic_map '{self.name}': the params were on a lost slice and no slice of the job holds a copy; "
                f"put them on a live slice and run it again"
            )
        leaves, treedef = jax.tree.flatten(reshard(source, mesh))  # the arrays, moved by the server on Pathways
        replicated = NamedSharding(mesh, PartitionSpec())
        placed = jax.tree.unflatten(
            treedef, [leaf if isinstance(leaf, jax.Array) else jax.device_put(leaf, replicated) for leaf in leaves]
        )
        with self._lock:
            self.placed[index] = placed
        return mesh, placed

    def forget(self, index: int) -> None:
        with self._lock:
            self.placed.pop(index, None)


def _count_tokens(output: Any) -> int:
    import jax

    leaves = jax.tree.leaves(output)
    return int(getattr(leaves[0], "size", 1)) if leaves else 0


def _concatenate(outputs: list[Any]) -> Any:
    import jax
    import numpy as np

    return jax.tree.map(lambda *parts: np.concatenate([np.asarray(p) for p in parts]), *outputs)


def _check(requests: Any, batch_size: Any, wait_s: Any, max_retries: Any) -> None:
    if not hasattr(requests, "__len__") or not hasattr(requests, "__getitem__") or isinstance(requests, (str, bytes)):
        raise PathwaysError(
            f"requests must be a list or an array of requests (one per row), got {type(requests).__name__}"
        )
    if len(requests) == 0:
        raise PathwaysError("elastic_map needs at least one request; the request list is empty")
    if batch_size is not None:
        check_count(batch_size, "batch_size", 1)
    if max_retries is not None:
        check_count(max_retries, "max_retries", 1)
    if isinstance(wait_s, bool) or not isinstance(wait_s, numbers.Real) or not math.isfinite(wait_s) or wait_s < 0:
        raise PathwaysError(f"wait_s must be a number of seconds, at least 0, got {wait_s!r}")


def _role(s: Session, slices: Sequence[int] | None) -> tuple[int, ...]:
    known = [sl.index for sl in s.topology.slices]
    if slices is None:
        return tuple(known)
    role = tuple(slices)
    bad = [i for i in role if isinstance(i, bool) or not isinstance(i, numbers.Integral) or i not in known]
    if not role or bad or len(set(role)) != len(role):
        raise PathwaysError(f"slices must name each slice of the job once, from {known}, got {list(role)!r}")
    return tuple(int(i) for i in role)


def elastic_map(
    fn: Callable[[Any, Any, Mesh], Any],
    requests: Any,
    params: Any = None,
    *,
    batch_size: int | None = None,
    slices: Sequence[int] | None = None,
    axes: Sequence[str] | None = None,
    tokens: Callable[[Any], int] | None = None,
    name: str | None = None,
    wait_s: float = DEFAULT_WAIT_S,
    max_retries: int | None = DEFAULT_MAX_RETRIES,
) -> Any:
    """Run ``fn(params, batch, mesh)`` over ``requests`` in batches, on every live slice at once,
    through slice losses; returns the outputs of all batches in request order (numpy, on the host).

    Args:
      fn: one batch on one slice: ``params`` is that slice's copy, ``batch`` a
        slice of ``requests`` (``requests[i:i + batch_size]``), ``mesh`` the
        slice's own mesh. Returns a pytree of arrays with one row per request.
      requests: a list or array, one request per row; at least one.
      params: a pytree (the model's weights) each slice gets a copy of
        (arrays keep their PartitionSpec, fitted to the slice; numpy leaves
        are replicated). ``None``: ``fn`` gets ``None``.
      batch_size: requests per call of ``fn`` (default: the requests split in
        4 batches per live slice of the job). Batches are cut once, so a loss
        does not change them.
      slices: the slices the job may use (default all): an RL loop's rollout slices.
      axes: the axis names of each slice's mesh (default ``("data", "model")``).
      tokens: ``tokens(output)``, the tokens one batch's host output counts
        for tokens/s (default: the elements of its first leaf).
      name: the job's name in events and metrics (default ``fn``'s).
      wait_s: how long to wait for one of the job's slices when none is up.
      max_retries: consecutive losses with no batch done in between before
        giving up (``None``: never).

    Raises:
      PathwaysError: bad arguments (one line); nothing runs.
      ElasticError: retries exhausted, or no slice of the job came back in time.
      Exception: anything ``fn`` raises that is not a slice loss.

    Example (docs/rl.md, "Inference on its own", runs it whole)::

        def generate(params, batch, mesh):  # one batch of requests, on one slice's own mesh
            return greedy(params, batch)  # a jitted generate loop: arrays with one row per request

        tokens = pw.elastic_map(generate, prompts, params, batch_size=8)  # numpy, in request order
        print(pw.elastic_map.last_run)  # batches and tokens/s per slice, losses, batches redone
    """
    _check(requests, batch_size, wait_s, max_retries)
    began = time.perf_counter()
    s = session()
    role = _role(s, slices)
    name = str(name or getattr(fn, "__name__", "elastic_map"))
    live = [i for i in role if _is_up(s, i)]
    if batch_size is None:
        batch_size = max(1, math.ceil(len(requests) / (BATCHES_PER_SLICE * max(1, len(live)))))
    job = _Job(fn, requests, params, int(batch_size), tuple(axes) if axes else None, name)
    report = MapReport(name, len(requests), job.batches, job.batch_size)
    elastic_map.last_run = report  # type: ignore[attr-defined]
    outputs: list[Any] = [None] * job.batches
    workers: dict[int, _Worker] = {}
    woken = threading.Event()

    def on_event(event: Event) -> None:
        if event.kind == "slice_down":
            for i in set(event.slices_before or ()) - set(event.slices_after or ()):
                worker = workers.get(i)  # this thread only reads; the job's thread adds and removes
                if worker is not None:
                    worker.lost.set()
            job.wake()
            woken.set()
        elif event.kind == "slice_up":
            woken.set()

    outer = accounting.running()
    account = outer
    if account is None:
        account = accounting.begin(name, "elastic_map", s, 0, job.batches, began=began)
        account.slices = frozenset(role)  # its MFU counts the chips of its slices only
    unsubscribe = s.events.subscribe(on_event)
    done, failures, waiting_since = 0, 0, None
    try:
        if account is not outer:
            account.step_begin(0)
        while done < job.batches:
            for i in role:
                if i not in workers and _is_up(s, i) and job.waiting():
                    if report.slices.get(i) is not None and i not in live:
                        report.rejoins += 1
                        s.events.emit(
                            "scale_up",
                            slices_after=tuple(sorted([*workers, i])),
                            detail=f"'{name}': slice {i} takes requests again",
                        )
                    if i not in live:
                        live.append(i)
                    report.slices.setdefault(i, SliceReport())
                    workers[i] = _Worker(job, i)
                    workers[i].thread.start()
            if not workers:
                report.waiting = True
                waiting_since = _wait_for_a_slice(s, name, role, job, waiting_since, wait_s, woken)
                continue
            waiting_since, report.waiting = None, False
            try:
                kind, index, batch, value = job.results.get(timeout=TICK_S)
            except queue.Empty:  # a bound on the wait: slices that came back are looked at above
                continue
            if kind == "done":
                assert batch is not None
                host, seconds = value
                if outputs[batch] is None:
                    outputs[batch] = host
                    done += 1
                failures = 0
                n = tokens(host) if tokens is not None else _count_tokens(host)
                r = report.slices[index]
                r.batches += 1
                r.requests += len(job.batch(batch))
                r.tokens += n
                r.busy_s += seconds
                metric_log(s).log(account, {f"slice{index}_tokens_per_s": n / seconds if seconds > 0 else 0.0})
                if account is not outer:
                    account.step_end()
                    if done < job.batches:
                        account.step_begin(done)
                continue
            # "failed": the worker has ended; its batch goes back to the queue if the slice was lost.
            error = value
            workers.pop(index, None)
            job.forget(index)
            if index in live:
                live.remove(index)
            if error is not None and not _is_slice_loss(error):
                raise error
            failures += 1
            report.losses += 1
            if batch is not None:
                job.give_back(batch)
                report.redone.append(batch)
            rows = job.batch(batch) if batch is not None else ()
            left = sorted(i for i in workers if not workers[i].lost.is_set())
            if batch is not None:
                last = batch * job.batch_size + len(rows) - 1
                where = f"slices {left}" if left else "the next slice up"
                what = f"lost mid-batch, batch {batch} (requests {batch * job.batch_size}-{last}) redone on {where}"
            else:
                what = "lost with no batch of it in flight, nothing redone"
            reason = one_line(error) if error is not None else f"slice {index} went down"
            s.events.emit(
                "retry",
                slices_before=tuple(sorted([*left, index])),
                slices_after=tuple(left),
                detail=f"'{name}': slice {index} {what}; outputs done kept ({_short(reason)})",
            )
            if account is not outer:
                account.recovery_begin()
                account.step_begin(done)
            if max_retries is not None and failures > max_retries:
                raise ElasticError(
                    f"elastic_map '{name}' gave up after {count(failures, 'consecutive slice loss')} "
                    f"with {count(job.batches - done, 'batch')} left; restore the slices (%pathways repair N) "
                    f"and run it again, or raise max_retries"
                )
        report.duration_s = time.perf_counter() - began
        return _concatenate(outputs)
    finally:
        report.duration_s = time.perf_counter() - began
        unsubscribe()
        job.wake(close=True)  # no new batch; one in flight ends by itself
        for worker in workers.values():
            worker.thread.join(JOIN_S)
        if account is not outer:
            account.end()


elastic_map.last_run = None  # type: ignore[attr-defined]


def _is_up(s: Session, index: int) -> bool:
    return any(sl.index == index and sl.up for sl in s.topology.slices)


def _wait_for_a_slice(
    s: Session,
    name: str,
    role: tuple[int, ...],
    job: _Job,
    since: float | None,
    wait_s: float,
    woken: threading.Event,
) -> float:
    """No slice of the job is up: say so once, then wait for a ``slice_up`` (at most ``wait_s`` in all)."""
    now = time.monotonic()
    if since is None:
        print(
            f"pathways: elastic_map '{name}': no slice of its slices {list(role)} is up; waiting up to "
            f"{wait_s:.0f} s for one to come back (%pathways repair N)",
            file=sys.stderr,
            flush=True,
        )
        since = now
    left = since + wait_s - now
    if left <= 0:
        raise ElasticError(
            f"elastic_map '{name}': no slice of {list(role)} came back within {wait_s:.0f} s; restore one and rerun"
        )
    woken.wait(min(left, TICK_S))
    woken.clear()
    return since


def _short(text: str) -> str:
    return text if len(text) <= 120 else text[:117] + "..."


def _is_slice_loss(error: BaseException) -> bool:
    import jax
    from pathwaysutils.elastic.elastic import is_error_due_to_slice_down

    return isinstance(error, jax.errors.JaxRuntimeError) and is_error_due_to_slice_down(error)


__all__ = ["MapReport", "SliceReport", "elastic_map"]
