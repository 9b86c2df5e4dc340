"""Colocated Python sidecars: functions that run next to a slice's hosts.

A sidecar is a plain Python function that ``jax.experimental.colocated_python``
runs on the CPU devices colocated with a slice's chips: on Pathways in the
sidecar containers of that slice's TPU hosts, on the local Pathways server
(``local:``) in the server's process, on the embedded backend in this process
(the slice's chips are CPU devices already). Results come back as
``jax.Array``s placed on the slice, replicated over its chips; as on Pathways,
a sidecar's first call on a slice fixes its results' shapes there.

    @pw.sidecar(slices="all", timeout=30)
    def shard_stats(slice_index):
        return np.arange(4) * slice_index

    shard_stats()            # {0: Array([0, 0, 0, 0]), 1: Array([0, 1, 2, 3])}

Arguments travel pickled inside a small uint8 array, so one compiled sidecar
program serves every call; a function that declares a ``slice_index``
parameter receives the slice it runs for. What runs remotely is built from
nested functions that cloudpickle ships by value, so a sidecar image needs
jax, jaxlib, numpy and cloudpickle (matching the controller), not this
package.

Every call is recorded in the session's sidecar ``Activity`` (calls, bytes
produced, busy time, errors, timeouts, loader queue depth: ``activity.py``)
and as a ``sidecar`` event; each slice's calls run on a ``Worker`` thread of
their own (``worker.py``). A call that raises comes back as
``SidecarError`` naming the slice; one that does not finish within its
timeout raises ``SidecarTimeout`` while the kernel stays usable.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast, overload

from pathways_kernel.colocated.activity import activity, stats
from pathways_kernel.colocated.worker import Worker
from pathways_kernel.core import jaxcompat, parsing
from pathways_kernel.core.errors import PathwaysError, one_line, slice_down_error
from pathways_kernel.core.text import shown

if TYPE_CHECKING:
    import jax
    import numpy as np
    from IPython.lib.pretty import RepresentationPrinter
    from jax.sharding import Mesh, Sharding

    from pathways_kernel.core.sessions import Session
    from pathways_kernel.core.slices import Slice

#: What a sidecar function runs on a slice's colocated CPU devices: its argument array in, a pytree of arrays out.
Colocated = Callable[["jax.Array"], object]

#: Seconds a sidecar call may run before it is reported as hung.
DEFAULT_TIMEOUT_S = 60.0


class SidecarError(PathwaysError):
    """Code running in a sidecar raised; the message names the slice."""


class SidecarTimeout(SidecarError):
    """A sidecar did not answer within its timeout (it may still be running)."""


# -- where a sidecar runs --------------------------------------------------------


def parse_slices(slices: str | int | Sequence[int] | None) -> tuple[int, ...] | None:
    """``"all"``/``None`` -> ``None`` (every live slice); ``"0,1"``/``1``/``[0, 1]`` -> indices.

    Raises:
      PathwaysError: not ``all`` nor a list of non-negative integers.
    """
    if slices is None or (isinstance(slices, str) and slices.strip() == "all"):
        return None
    if isinstance(slices, int):
        return (slices,)
    if isinstance(slices, str):
        # ASCII digits, none empty, none twice: "١" is not slice 1, "0,0" not two sidecars on slice 0.
        try:
            return parsing.index_list(slices)
        except ValueError as exc:
            raise PathwaysError(
                f"bad --slices {shown(slices)}: {exc}; use all or comma-separated slice indices, e.g. 0,1"
            ) from None
    indices = tuple(int(p) for p in slices)
    if not indices or any(i < 0 for i in indices) or len(set(indices)) < len(indices):
        raise PathwaysError(f"bad --slices {list(slices)}: use all or distinct slice indices from 0, e.g. 0,1")
    return indices


def live_slices(chosen: tuple[int, ...] | None, session: Session | None = None) -> list[Slice]:
    """The topology ``Slice``s a sidecar runs on: the chosen ones, all up.

    Raises:
      PathwaysError: a chosen slice does not exist or is down.
    """
    from pathways_kernel.core.sessions import session as current

    topology = (session or current()).topology
    if chosen is None:
        if not topology.up_slices:
            raise PathwaysError("no slice is up: restore a slice before running a sidecar")
        return list(topology.up_slices)
    picked = []
    for index in chosen:
        try:
            s = topology.slice(index)
        except KeyError:
            raise PathwaysError(f"no slice {index}: this session has slices 0..{len(topology.slices) - 1}") from None
        if not s.up:
            raise PathwaysError(f"slice {index} is down: restore it or run the sidecar on live slices only")
        picked.append(s)
    return picked


def colocated_mesh(devices: np.ndarray, axis_names: Sequence[str]) -> Mesh:
    """A mesh of the CPU devices colocated with ``devices`` (an ndarray), same shape and axes."""
    import numpy as np
    from jax.experimental.colocated_python import colocated_cpu_devices
    from jax.sharding import Mesh

    wanted = tuple(devices.flat)
    # On the local server a CPU device is its own colocated CPU device (as colocated_cpu_devices
    # documents): its fallback for clients without colocation ids hands out the first CPU devices
    # whatever was asked, so slice 1's sidecar ran on slice 0's devices and its block was copied
    # over (a request more per block). The embedded backend keeps that fallback: its fault
    # injection loses a slice's arrays as a copy to the slice sees it (DATA_LOSS), not as a
    # sidecar on that slice would (arrays with no shards).
    here = all(d.platform == "cpu" for d in wanted) and jaxcompat.proxied_device(wanted[0])
    cpu = wanted if here else colocated_cpu_devices(wanted)
    return Mesh(np.array(cpu, dtype=object).reshape(devices.shape), tuple(axis_names))


def slice_mesh(s: Slice) -> Mesh:
    """A 1-D mesh (axis ``chips``) over slice ``s``'s devices."""
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(s.devices, dtype=object), ("chips",))


# -- what a call came to: its outcome, or the one line for its failure ------------


def failure(name: str, slice_index: int, exc: BaseException) -> BaseException:
    """What to raise for a sidecar ``name`` that raised ``exc`` on ``slice_index``.

    A lost slice is not a bug in the sidecar: its ``JaxRuntimeError``
    (``DATA_LOSS`` and the like) is passed through unchanged, so that an
    elastic loop recognises it and recovers. Anything else becomes a one-line
    ``SidecarError`` naming the slice.
    """
    if slice_lost(exc):
        return exc
    return SidecarError(f"sidecar '{name}' failed on slice {slice_index}: {one_line(exc)}")


def slice_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is the runtime reporting a lost slice (pathwaysutils' classification)."""
    import jax
    from pathwaysutils.elastic.elastic import is_error_due_to_slice_down

    return isinstance(exc, jax.errors.JaxRuntimeError) and is_error_due_to_slice_down(exc)


def timed_out(name: str, slice_index: int, timeout: float) -> SidecarTimeout:
    return SidecarTimeout(
        f"sidecar '{name}' on slice {slice_index} did not finish within {timeout:g} s; it was abandoned "
        f"(the kernel stays usable): fix the function or raise its timeout"
    )


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """What one slice's sidecar call came to: its result or error, and how long it ran."""

    tree: Any
    error: BaseException | None
    busy_s: float

    @property
    def nbytes(self) -> int:
        return 0 if self.error is not None else nbytes(self.tree)


def _collect(futures: dict[int, Future[_Outcome]], timeout: float) -> tuple[dict[int, _Outcome], int | None]:
    """Each slice's outcome, in slice order, and the first slice still running at ``timeout`` (or ``None``)."""
    deadline = time.monotonic() + timeout
    outcomes: dict[int, _Outcome] = {}
    for index, future in sorted(futures.items()):
        try:
            outcomes[index] = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return outcomes, index
    return outcomes, None


def nbytes(tree: Any) -> int:
    import jax

    return sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree.leaves(tree))


# -- the remote side: nested so that cloudpickle ships it by value ----------------


def _remote_call(fn: Callable[..., object], name: str) -> Colocated:
    """The function colocated_python runs: unpickle arguments, call ``fn``, place results."""

    def sidecar_call(request: jax.Array) -> object:
        import pickle

        import jax
        import numpy as np
        from jax.sharding import NamedSharding, PartitionSpec

        raw = np.asarray(request.addressable_shards[0].data)
        size = int.from_bytes(raw[:8].tobytes(), "little")
        args, kwargs = pickle.loads(raw[8 : 8 + size].tobytes())
        result = fn(*args, **kwargs)
        # _request places the arguments with a NamedSharding over the slice's colocated CPUs.
        replicated = NamedSharding(cast(NamedSharding, request.sharding).mesh, PartitionSpec())

        def place(leaf: object) -> jax.Array:
            host = np.asarray(leaf)
            if host.dtype == object:
                raise TypeError(f"sidecar results must be numbers or arrays, got {type(leaf).__name__}")
            return jax.make_array_from_callback(host.shape, replicated, lambda index: host[index])

        return jax.tree.map(place, result)

    sidecar_call.__name__ = sidecar_call.__qualname__ = name
    return sidecar_call


def _request(args: tuple[object, ...], kwargs: dict[str, object], sharding: Sharding) -> jax.Array:
    """Arguments as a uint8 array (length-prefixed pickle, padded to a power of two)."""
    import cloudpickle
    import jax
    import numpy as np

    payload = cloudpickle.dumps((args, kwargs))
    size = 64
    while size < len(payload) + 8:
        size *= 2
    buffer = np.zeros(size, np.uint8)
    buffer[:8] = np.frombuffer(len(payload).to_bytes(8, "little"), np.uint8)
    buffer[8 : 8 + len(payload)] = np.frombuffer(payload, np.uint8)
    placed: jax.Array = jax.device_put(buffer, sharding)
    return placed


# -- the user-facing object ----------------------------------------------------


class SidecarResults(dict[int, Any]):
    """``{slice_index: result}``, each result a pytree of arrays on that slice.

    ``lost`` maps each slice lost while the call ran to the runtime's error;
    those slices have no result.
    """

    def __init__(self, results: dict[int, Any] | None = None, lost: dict[int, BaseException] | None = None):
        super().__init__(results or {})
        self.lost = dict(lost or {})

    def __repr__(self) -> str:
        import jax

        lines = []
        for index, tree in self.items():
            leaves = jax.tree.leaves(tree)
            if len(leaves) == 1 and getattr(leaves[0], "size", 0) <= 8:
                shown = repr(leaves[0])
            else:
                shown = ", ".join(f"{leaf.dtype}{list(leaf.shape)}" for leaf in leaves)
            lines.append(f"slice {index}: {shown}")
        lines.extend(f"slice {index}: lost while it ran (DATA_LOSS)" for index in sorted(self.lost))
        return "\n".join(lines) if lines else "no slices"

    def _repr_pretty_(self, p: RepresentationPrinter, cycle: bool) -> None:
        p.text(repr(self))


@dataclasses.dataclass(frozen=True)
class _Defaults:
    slices: tuple[int, ...] | None = None
    timeout: float = DEFAULT_TIMEOUT_S


_NO_DEFAULTS = _Defaults()
_defaults: contextvars.ContextVar[_Defaults] = contextvars.ContextVar("sidecar_defaults", default=_NO_DEFAULTS)


@contextlib.contextmanager
def defaults(slices: str | Sequence[int] | None = None, timeout: float | None = None) -> Iterator[None]:
    """Within the block, a bare ``@pw.sidecar`` runs on ``slices`` with ``timeout`` (``%%pathways sidecar``)."""
    token = _defaults.set(_Defaults(parse_slices(slices), DEFAULT_TIMEOUT_S if timeout is None else float(timeout)))
    try:
        yield
    finally:
        _defaults.reset(token)


class Sidecar:
    """A Python function bound to run colocated with chosen slices.

    Call it like the function: it runs once per chosen live slice, in
    parallel, and returns ``SidecarResults``. ``.on(i, ...)`` runs it on slice
    ``i`` only and returns that slice's result.
    """

    def __init__(self, fn: Callable[..., Any], slices: tuple[int, ...] | None, timeout: float):
        if not callable(fn):
            raise PathwaysError(f"pw.sidecar needs a function, got {type(fn).__name__}")
        if timeout <= 0:
            raise PathwaysError(f"sidecar timeout must be positive, got {timeout:g} s")
        self.fn = fn
        self.name = getattr(fn, "__name__", "sidecar")
        self.slices = slices
        self.timeout = timeout
        self._takes_slice = "slice_index" in inspect.signature(fn).parameters
        # One colocated function per slice: colocated_python runs the first call of a
        # function synchronously under a lock of its own (to learn the output's shape),
        # which made the slices' first calls wait for one another.
        self._colocated: dict[int, Colocated] = {}
        self._workers: dict[int, Worker] = {}
        self._lock = threading.Lock()

    def __del__(self) -> None:
        for worker in getattr(self, "_workers", {}).values():
            worker.retire()

    def __repr__(self) -> str:
        where = "all live slices" if self.slices is None else "slices " + ",".join(map(str, self.slices))
        return f"<sidecar {self.name} on {where}, timeout {self.timeout:g} s>"

    def __call__(self, *args: Any, **kwargs: Any) -> SidecarResults:
        return self._run(live_slices(self.slices), args, kwargs)

    def on(self, slice_index: int, *args: Any, **kwargs: Any) -> Any:
        """Run on slice ``slice_index`` only; returns its result."""
        return self._run(live_slices((slice_index,)), args, kwargs)[slice_index]

    def _run(self, slices: list[Slice], args: tuple[object, ...], kwargs: dict[str, object]) -> SidecarResults:
        from jax.sharding import NamedSharding, PartitionSpec

        from pathways_kernel.core.sessions import session

        started = time.perf_counter()
        futures = {}
        for s in slices:
            call_kwargs = {**kwargs, "slice_index": s.index} if self._takes_slice else kwargs
            host_mesh = colocated_mesh(slice_mesh(s).devices, ("chips",))
            request = _request(args, call_kwargs, NamedSharding(host_mesh, PartitionSpec()))
            futures[s.index] = self._worker(s.index).submit(self._job(self._colocated_for(s.index), request, s))
        ran, hung = _collect(futures, self.timeout)
        log = activity()
        for index, future in futures.items():
            outcome = ran.get(index) or (future.result() if future.done() else None)
            if outcome is None:
                log.record(index, timeout=True)
            else:
                log.record(index, outcome.nbytes, outcome.busy_s, error=outcome.error is not None)

        def emit(detail: str, nbytes: int | None = None) -> None:
            session().events.emit("sidecar", bytes=nbytes, duration_s=time.perf_counter() - started, detail=detail)

        if hung is not None:
            self._abandon()
            error: BaseException = timed_out(self.name, hung, self.timeout)
            emit(str(error))
            raise error
        for index, outcome in sorted(ran.items()):
            if outcome.error is not None and not slice_lost(outcome.error):
                error = failure(self.name, index, outcome.error)
                emit(str(error))
                raise error from outcome.error
        lost = {index: outcome.error for index, outcome in ran.items() if outcome.error is not None}
        results = {index: outcome.tree for index, outcome in sorted(ran.items()) if outcome.error is None}
        where = "[" + ",".join(map(str, results)) + "]"
        if lost:
            gone = (
                f"slice {next(iter(lost))} was"
                if len(lost) == 1
                else f"slices {', '.join(map(str, sorted(lost)))} were"
            )
            said = f"sidecar '{self.name}': {gone} lost while it ran (DATA_LOSS); " + (
                f"results of slices {where} only" if results else "no slice finished: run it again on live slices"
            )
            emit(said)
            if not results:
                raise slice_down_error(said)
            # One line, not an exception: what the live slices produced stays the call's result.
            print(said, file=sys.stderr)
        else:
            emit(f"{self.name} on slices {where}", sum(outcome.nbytes for outcome in ran.values()))
        return SidecarResults(results, lost)

    @staticmethod
    def _job(colocated: Colocated, request: jax.Array, s: Slice) -> Callable[[], _Outcome]:
        def job() -> _Outcome:
            import jax
            from jax.sharding import NamedSharding, PartitionSpec

            started = time.perf_counter()
            try:
                tree = colocated(request)
                mesh = slice_mesh(s)
                # On Pathways the result lives on the sidecar's CPU devices; move it to the slice's chips.
                tree = jax.tree.map(
                    lambda leaf: (
                        leaf
                        if set(leaf.devices()) == set(s.devices)
                        else jax.device_put(leaf, NamedSharding(mesh, PartitionSpec()))
                    ),
                    tree,
                )
                jax.block_until_ready(tree)
            except Exception as exc:  # the caller decides: the sidecar's bug, or a lost slice
                return _Outcome(None, exc, time.perf_counter() - started)
            return _Outcome(tree, None, time.perf_counter() - started)

        return job

    def _colocated_for(self, index: int) -> Colocated:
        with self._lock:
            if index not in self._colocated:
                from jax.experimental.colocated_python import colocated_python

                self._colocated[index] = colocated_python(_remote_call(self.fn, self.name))
            return self._colocated[index]

    def _worker(self, index: int) -> Worker:
        with self._lock:
            if index not in self._workers:
                self._workers[index] = Worker(f"sidecar-{self.name}-slice{index}")
            return self._workers[index]

    def _abandon(self) -> None:
        """Drop hung workers and the colocated program (its first call may hold a lock)."""
        with self._lock:
            for worker in self._workers.values():
                worker.retire()
            self._workers.clear()
            self._colocated.clear()


@overload
def sidecar(
    fn: Callable[..., object], *, slices: str | Sequence[int] | None = None, timeout: float | None = None
) -> Sidecar: ...


@overload
def sidecar(
    fn: None = None, *, slices: str | Sequence[int] | None = None, timeout: float | None = None
) -> Callable[[Callable[..., object]], Sidecar]: ...


def sidecar(
    fn: Callable[..., object] | None = None, *, slices: str | Sequence[int] | None = None, timeout: float | None = None
) -> Sidecar | Callable[[Callable[..., object]], Sidecar]:
    """Bind ``fn`` to run colocated with slices; usable bare (``@pw.sidecar``) or with options.

    Args:
      fn: the function. A ``slice_index`` parameter receives the slice it runs for.
      slices: ``"all"`` (every live slice, the default), ``"0,1"`` or a list of indices.
      timeout: seconds before a call is reported hung (default 60, or the
        ``%%pathways sidecar --timeout`` of the cell).

    Returns:
      A ``Sidecar`` (or a decorator making one when ``fn`` is omitted).
    """
    current = _defaults.get()
    chosen = current.slices if slices is None else parse_slices(slices)
    limit = current.timeout if timeout is None else float(timeout)
    if fn is None:
        return lambda f: Sidecar(f, chosen, limit)
    return Sidecar(fn, chosen, limit)


def run_sidecar(
    fn: Callable[..., Any],
    *args: Any,
    slices: str | Sequence[int] | None = None,
    timeout: float | None = None,
    **kwargs: Any,
) -> SidecarResults:
    """Run ``fn(*args, **kwargs)`` once colocated with each chosen slice; ``{slice: arrays}``."""
    target = fn if isinstance(fn, Sidecar) else sidecar(fn, slices=slices, timeout=timeout)
    return target(*args, **kwargs)


def define(
    source: str, namespace: dict[str, Any], slices: str | Sequence[int] | None = None, timeout: float | None = None
) -> list[Sidecar]:
    """Run ``source`` (a cell) in ``namespace`` with ``@pw.sidecar`` defaulting to ``slices``/``timeout``.

    Returns the ``Sidecar``s the cell bound, in the order of their names.
    """
    with defaults(slices, timeout):
        before = {name: value for name, value in namespace.items() if isinstance(value, Sidecar)}
        exec(compile(source, "<%%pathways sidecar>", "exec"), namespace)
    return [value for name, value in namespace.items() if isinstance(value, Sidecar) and before.get(name) is not value]


# ``pw.sidecar`` is this function; ``pw.sidecar.stats()`` is what the monitor reads.
sidecar.stats = stats  # type: ignore[attr-defined]
