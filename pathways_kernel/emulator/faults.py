"""Fault injection on the embedded backend: lose a slice the way Pathways does.

``fail_slice(i)`` makes slice ``i`` of a ``local`` session behave like a slice
that Pathways lost; ``restore_slice(i)`` brings it back empty. Other backends
refuse both (``NotSupportedError``): a real cluster loses slices by itself.

Mechanism: real error buffers, not a Python-level imitation
-----------------------------------------------------------
jaxlib can build an array whose buffers hold an error status instead of data
(``_jax._make_error_array``, the primitive behind
``jax.experimental.transfer.make_error_array``), and ``ArrayImpl._replace_with``
swaps an array's buffers in place, keeping the Python object the user holds.
On ``fail_slice(i)``, every live array (``jax.live_arrays()``: the runtime's own
list, no ``id()`` bookkeeping) with a shard on a device of slice ``i`` gets
error buffers, with the same shape, dtype and sharding, carrying
``DATA_LOSS: slice i was lost ...``. From then on JAX's own C++ paths raise
``jax.errors.JaxRuntimeError`` on every read: ``np.asarray``, ``float``,
``repr``/printing, ``jax.device_get``, ``block_until_ready``,
``addressable_shards[k].data``, a ``device_put`` that copies it. Dispatch is
asynchronous, as on Pathways: ``x.sum()`` or ``jit(f)(x)`` return at once, and
the error flows into their results, so ``float(x.sum())`` raises. The message
reads ``INTERNAL: DATA_LOSS: ...`` (the runtime wraps it), which
``pathwaysutils.elastic.is_error_due_to_slice_down`` accepts.

New work placed on a lost device fails the same way. Three narrow hooks, on
JAX's dispatch paths only, installed at the first ``fail_slice``, do this:

- ``pxla.ExecuteReplicated.__call__`` (every jit/pmap/eager-op execution that
  goes through Python): while a slice is down, results with a shard on it get
  error buffers.
- ``pjit._get_fastpath_data``: an executable touching a lost device is never
  given the C++ fast path, so it always passes through the hook above; the C++
  dispatch caches are cleared on each fail and restore so that nothing cached
  earlier bypasses it.
- ``dispatch._batched_device_put_impl`` (``jax.device_put`` and the
  ``device_put`` primitive): putting a lost array anywhere raises
  ``DATA_LOSS`` at once (as the runtime does for any copy of it, including the
  no-op put onto its own sharding, and after the slice is back), and results
  placed on a lost device get error buffers.

So pathwaysutils' own health check (``get_active_slice_indices``: a ``pmap``
per slice, errors caught at ``block_until_ready``) reports the slice down until
it is restored. Nothing in numpy or in ``jax.Array`` is patched; arrays wholly
on live slices never touch the hooks' slow path. When a slice is lost and
JAX's default device is on it, the default moves to the first live device
(pathwaysutils' ``Manager.default_device`` does the same), and back when the
slice returns.

Losing a slice from another thread (chaos, a monitor request) while the
notebook or a snapshot thread reads an array is safe: jaxlib keeps pointers
into an array while it waits without the GIL, so each swap waits until no
other thread is in a host read of that array (seen from ``jax/_src/array.py``
frames, checked with the GIL held right before the swap), and the old buffers
stay alive ``_GRACE_S`` seconds for C++ paths with no frame of ours (numpy's
buffer protocol). Without these guards, both races crash the process.

Limits
------
- The data is not actually gone from host RAM at once: the old buffers live
  ``_GRACE_S`` (5) seconds more, and as long as a numpy view taken earlier
  with ``np.asarray`` (zero-copy on CPU) holds them; that view keeps reading
  the old bytes, as a host copy would.
- A host read in progress on another thread delays its array's loss until
  the read is done (a ``float(loss)`` waiting on a long step: that long).
- An array computed after ``restore_slice`` from a lost input is lost too, but
  the ``jit`` call returns before the error is known (asynchronous dispatch);
  ``is_lost`` waits for it.
- Executables compiled ahead of time (``jit(f).lower(...).compile()``) and
  called before the loss keep their own C++ dispatcher: their new results on a
  lost device are not marked lost (inputs that are lost still propagate).
- Arrays jaxlib cannot express as error arrays (none seen so far) are deleted
  instead; reading them raises ``RuntimeError: Array has been deleted``.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import os
import sys
import threading
import time
from typing import Any, Iterable

from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.eventlog import format_bytes

#: Devices of slices that are down now; read lock-free by the dispatch hooks.
_lost_devices: frozenset = frozenset()
#: Device -> slice index, for the messages of the hooks.
_slice_of_device: dict[Any, int] = {}
_hooks_lock = threading.Lock()
_hooks_installed = False
#: The module whose methods start host reads (see ``_arrays_being_read``).
_ARRAY_MODULE = os.path.join("jax", "_src", "array.py")


# -- the error a lost slice produces ------------------------------------------
def lost_array_message(slice_index: int) -> str:
    return (
        f"DATA_LOSS: slice {slice_index} was lost; this array had a shard on it and its data is gone. "
        f"Restore it from a snapshot or recompute it on the live slices"
    )


def placed_on_lost_message(slice_index: int, what: str) -> str:
    return f"DATA_LOSS: slice {slice_index} is down; {what} placed data on it"


def _lost_slice_of(devices: Iterable[Any]) -> int | None:
    """The first lost slice among ``devices`` (``None`` if none is lost)."""
    lost = _lost_devices
    for device in devices:
        if device in lost:
            return _slice_of_device.get(device, -1)
    return None


def _array_devices(array: Any) -> Iterable[Any]:
    return array.sharding._internal_device_list


def _error_like(array: Any, message: str) -> Any:
    """An array of ``array``'s shape, dtype and sharding whose buffers hold ``message``."""
    import jax
    from jaxlib import _jax

    sharding = array.sharding
    client = next(iter(sharding.device_set)).client
    return _jax._make_error_array(client, jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=sharding), message)


def _make_lost(array: Any, message: str) -> None:
    """Swap ``array``'s buffers for error buffers carrying ``message``.

    Only for arrays no other thread can hold yet (fresh results); see
    ``_make_lost_when_unread`` for the others.
    """
    try:
        array._replace_with(_error_like(array, message))
    except (TypeError, ValueError, RuntimeError, AttributeError):
        # Some exotic layout jaxlib cannot express: losing it outright is
        # still truthful, only the error text differs.
        array.delete()


def _arrays_being_read() -> set[int]:
    """``id``s of the arrays other threads are reading to the host right now.

    jaxlib's host copy (``ArrayImpl._value``) keeps pointers into the array
    while it waits without the GIL; swapping the array's buffers at that moment
    crashes the process. Every such wait is entered from a method of
    ``jax/_src/array.py``, so a thread with that file on its stack may be in
    one: its ``self`` and the per-device arrays it reads through (``_arrays``,
    the cached fully-replicated shard) are busy.
    """
    from jaxlib import _jax

    busy: set[int] = set()
    me = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        while frame is not None and ident != me:
            if frame.f_code.co_filename.endswith(_ARRAY_MODULE):
                owner = frame.f_locals.get("self")
                if isinstance(owner, _jax.ArrayImpl):
                    busy.add(id(owner))
                    if not owner.is_deleted():
                        busy.update(id(a) for a in owner._arrays)
                        if owner.is_fully_replicated:
                            busy.add(id(owner._fully_replicated_shard()))
            frame = frame.f_back
    return busy


#: (when, array) pairs holding the buffers of arrays lost less than
#: ``_GRACE_S`` ago; see ``_make_lost_when_unread``.
_graveyard: collections.deque = collections.deque()
_graveyard_lock = threading.Lock()
_sweeper: threading.Timer | None = None
_GRACE_S = 5.0


def _bury(array: Any) -> None:
    """Keep ``array``'s current buffers alive for a grace period."""
    keeper = _error_like(array, "DATA_LOSS: buffers kept for readers in flight")
    keeper._replace_with(array)  # the keeper now shares array's buffers
    with _graveyard_lock:
        _graveyard.append((time.monotonic(), keeper))


def _sweep_graveyard() -> None:
    """Release buried buffers once their grace period is over (and they are ready)."""
    global _sweeper
    # Buffers are freed under the lock, so that _empty_graveyard at exit
    # waits for a sweep in progress.
    with _graveyard_lock:
        now = time.monotonic()
        kept = [(when, keeper) for when, keeper in _graveyard if now - when < _GRACE_S or not keeper.is_ready()]
        _graveyard.clear()
        _graveyard.extend(kept)
        _sweeper = None
        if _graveyard:
            _sweeper = threading.Timer(_GRACE_S, _sweep_graveyard)
            _sweeper.daemon = True
            _sweeper.start()


@atexit.register
def _empty_graveyard() -> None:
    """Release buried buffers on the main thread before the interpreter ends:
    a daemon timer freeing them during finalization aborts the process."""
    global _sweeper
    with _graveyard_lock:
        sweeper, _sweeper = _sweeper, None
        _graveyard.clear()
    if sweeper is not None:
        sweeper.cancel()
        sweeper.join()


def _make_lost_when_unread(arrays: list[Any], message: str) -> None:
    """``_make_lost`` each array without pulling buffers from under a reader.

    Two races with threads reading these arrays, both seen as crashes:
    - a host copy in progress (``_value``) uses the array's own fields: each
      swap waits until no other thread is in such a read of that array
      (``_arrays_being_read``), checked right before the swap with the GIL
      held, so no read can start in between. A read in progress delays its
      array's loss until it is done, as if the slice failed a moment later.
    - numpy's buffer protocol (``np.asarray`` of a one-device array) and
      other C++ paths hold plain pointers to the buffers while they wait
      without the GIL, entered with no frame of ours to see: the old buffers
      are kept alive ``_GRACE_S`` seconds after the swap (and until ready).
    """
    pending = []
    for array in arrays:
        try:
            error = _error_like(array, message)
            _bury(array)
        except (TypeError, ValueError, RuntimeError, AttributeError):
            array.delete()
            continue
        pending.append((array, error))
    while pending:
        busy = _arrays_being_read()
        waiting = []
        for array, error in pending:
            if id(array) in busy:
                waiting.append((array, error))
            elif not array.is_deleted():
                array._replace_with(error)
        pending = waiting
        if pending:
            time.sleep(0.001)
    if _sweeper is None:
        _sweep_graveyard()


def _arrays_on(devices: frozenset) -> list[Any]:
    """Live arrays with a shard on ``devices`` that are not lost already."""
    import jax

    return [
        array for array in jax.live_arrays()
        if not array.is_deleted() and not devices.isdisjoint(_array_devices(array)) and not is_lost(array, wait=False)
    ]


def _lose_results(results: Any, what: str) -> None:
    from jaxlib import _jax

    for result in results if isinstance(results, (list, tuple)) else (results,):
        if isinstance(result, _jax.ArrayImpl) and not result.is_deleted():
            slice_index = _lost_slice_of(_array_devices(result))
            if slice_index is not None:
                _make_lost(result, placed_on_lost_message(slice_index, what))


def _check_readable(value: Any) -> None:
    """Raise DATA_LOSS now if ``value`` is a ready array holding lost data."""
    from jaxlib import _jax

    if isinstance(value, _jax.ArrayImpl) and not value.is_deleted() and value.is_ready():
        value.block_until_ready()


# -- hooks on JAX's dispatch paths --------------------------------------------
def _install_hooks() -> None:
    """Install the three dispatch hooks (once per process); see the module doc."""
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        from jax._src import dispatch, pjit
        from jax._src.interpreters import pxla

        execute = pxla.ExecuteReplicated.__call__

        @functools.wraps(execute)
        def execute_replicated(self, *args):
            results = execute(self, *args)
            if _lost_devices and _lost_slice_of(self._local_devices) is not None:
                _lose_results(results, f"computation '{self.name}'")
            return results

        fastpath = pjit._get_fastpath_data

        @functools.wraps(fastpath)
        def get_fastpath_data(executable, *args, **kwargs):
            if _lost_devices and executable is not None:
                call = getattr(executable, "unsafe_call", None)
                if _lost_slice_of(getattr(call, "_local_devices", ())) is not None:
                    return None
            return fastpath(executable, *args, **kwargs)

        device_put = dispatch._batched_device_put_impl

        @functools.wraps(device_put)
        def batched_device_put(*xs, **params):
            # Even with every slice up again: lost data stays lost.
            for x in xs:
                _check_readable(x)
            results = device_put(*xs, **params)
            if _lost_devices:
                _lose_results(results, "device_put")
            return results

        pxla.ExecuteReplicated.__call__ = execute_replicated
        pjit._get_fastpath_data = get_fastpath_data
        dispatch._batched_device_put_impl = batched_device_put
        _hooks_installed = True


def _clear_dispatch_caches() -> None:
    """Drop JAX's C++ dispatch caches (not the compiled executables)."""
    from jax._src import pjit
    from jaxlib import _jax

    pjit._cpp_pjit_cache_fun_only.clear()
    pjit._cpp_pjit_cache_explicit_attributes.clear()
    _jax.PjitFunctionCache.clear_all()


# -- the injector -------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FaultReport(TextDisplay):
    """What one ``fail_slice``/``restore_slice`` did."""

    slice_index: int
    action: str  # "fail" | "restore"
    changed: bool
    arrays: int = 0
    nbytes: int = 0
    slices_up: tuple[int, ...] = ()

    def to_text(self) -> str:
        up = "[" + ",".join(map(str, self.slices_up)) + "]"
        if self.action == "fail":
            if not self.changed:
                return f"slice {self.slice_index} is already down; live slices {up}"
            return (
                f"slice {self.slice_index} down: {self.arrays} arrays ({format_bytes(self.nbytes)}) with a shard on it "
                f"are lost (DATA_LOSS); live slices {up}"
            )
        if not self.changed:
            return f"slice {self.slice_index} is already up; live slices {up}"
        return f"slice {self.slice_index} up again (empty: lost arrays stay lost); live slices {up}"


class FaultInjector:
    """The session's injected faults (session extension ``"faults"``)."""

    def __init__(self, session: Any):
        self.session = session
        self._lock = threading.RLock()
        self._down: dict[int, frozenset] = {}
        self._saved_default_device: Any = _UNSET
        # The session's slice states are the truth: a slice marked up or down
        # by anyone (a test fixture, the monitor) moves the hooks along.
        self._unsubscribe = session.events.subscribe(self._on_event)
        session.on_close(self._reset)

    def fail(self, index: int, detail: str = "fault injected") -> FaultReport:
        """Lose slice ``index``; see ``fail_slice``.

        The slice is marked down (hooks armed, ``slice_down`` emitted) before
        its arrays get their error buffers: that can wait for reads in flight
        on other threads, and meanwhile nothing new may land on the slice nor
        anyone see it up while data on it already raises.
        """
        self.session.require_fault_injection("fail_slice")
        with self._lock:
            topology = self.session.topology
            target = _slice(topology, index)
            if not target.up:
                return FaultReport(index, "fail", False, slices_up=_up(topology))
            _install_hooks()
            devices = frozenset(target.devices)
            lost = _arrays_on(devices)
            self._down[index] = devices
            self._publish()
            _clear_dispatch_caches()
            self._move_default_device()
            self.session.set_slice_state(index, "down", detail=f"{detail}: {len(lost)} arrays lost")
            message = lost_array_message(index)
            _make_lost_when_unread(lost, message)
            # Arrays that appeared while the slice was being marked down.
            _make_lost_when_unread(_arrays_on(devices), message)
            topology = self.session.topology
        return FaultReport(index, "fail", True, len(lost), sum(array.nbytes for array in lost), _up(topology))

    def restore(self, index: int, detail: str = "repaired") -> FaultReport:
        self.session.require_fault_injection("restore_slice")
        with self._lock:
            topology = self.session.topology
            target = _slice(topology, index)
            if target.up:
                return FaultReport(index, "restore", False, slices_up=_up(topology))
            self._down.pop(index, None)
            self._publish()
            _clear_dispatch_caches()
            self._move_default_device()
            self.session.set_slice_state(index, "up", detail=detail)
            topology = self.session.topology
        return FaultReport(index, "restore", True, slices_up=_up(topology))

    @property
    def down(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._down))

    def _publish(self) -> None:
        global _lost_devices
        for index, devices in self._down.items():
            for device in devices:
                _slice_of_device[device] = index
        _lost_devices = frozenset().union(*self._down.values())

    def _move_default_device(self) -> None:
        """Keep JAX's default device on a live slice, as pathwaysutils' ``Manager``
        does; put the user's choice back once its slice is up again."""
        import jax

        devices = self.session.devices()
        moved = self._saved_default_device is not _UNSET
        original = self._saved_default_device if moved else jax.config.jax_default_device
        if (original if original is not None else devices[0]) not in _lost_devices:
            if moved:
                jax.config.update("jax_default_device", original)
                self._saved_default_device = _UNSET
            return
        if moved and jax.config.jax_default_device not in _lost_devices:
            return
        live = [d for d in devices if d not in _lost_devices]
        if live:
            self._saved_default_device = original
            jax.config.update("jax_default_device", live[0])

    def _on_event(self, event: Any) -> None:
        if event.kind in ("slice_up", "slice_down"):
            self._sync()

    def _sync(self) -> None:
        """Follow the session's slice states, however they were set."""
        with self._lock:
            down = {s.index: frozenset(s.devices) for s in self.session.topology.slices if not s.up}
            if down != self._down:
                self._down = down
                self._publish()
                _clear_dispatch_caches()
                self._move_default_device()

    def _reset(self) -> None:
        global _lost_devices
        self._unsubscribe()
        with self._lock:
            if self._down:
                self._down.clear()
                _lost_devices = frozenset()
                _slice_of_device.clear()
                _clear_dispatch_caches()
            if self._saved_default_device is not _UNSET:
                import jax

                jax.config.update("jax_default_device", self._saved_default_device)
                self._saved_default_device = _UNSET


_UNSET = object()


def _slice(topology: Any, index: int) -> Any:
    try:
        return topology.slice(index)
    except KeyError:
        raise PathwaysError(f"no slice {index}: this session has slices 0..{len(topology.slices) - 1}") from None


def _up(topology: Any) -> tuple[int, ...]:
    return tuple(s.index for s in topology.up_slices)


def injector(session: Any = None) -> FaultInjector:
    """The session's ``FaultInjector``."""
    if session is None:
        from pathways_kernel.core.sessions import session as current

        session = current()
    return session.component(FaultInjector)


# -- public API ---------------------------------------------------------------
def fail_slice(index: int) -> FaultReport:
    """Lose slice ``index`` (embedded ``local`` backend only).

    Every array with a shard on it becomes unusable: each read raises
    ``jax.errors.JaxRuntimeError`` with ``DATA_LOSS``; new work placed on its
    devices fails the same way until ``restore_slice``. Emits ``slice_down``.

    Raises:
      NotSupportedError: the session's backend is not ``local``.
      PathwaysError: no such slice.
    """
    return injector().fail(index)


def restore_slice(index: int) -> FaultReport:
    """Bring slice ``index`` back, empty: new arrays work on it, lost ones stay lost.

    Emits ``slice_up``.

    Raises:
      NotSupportedError: the session's backend is not ``local``.
      PathwaysError: no such slice.
    """
    return injector().restore(index)


def is_lost(array: Any, wait: bool = True) -> bool:
    """Whether reading ``array`` raises ``DATA_LOSS`` (it had a shard on a lost slice).

    With ``wait`` (the default), a pending computation is waited for: its
    result may be lost too; without, a pending array counts as not lost.
    """
    import jax

    if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer) or array.is_deleted():
        return False
    if not wait and not array.is_ready():
        return False
    try:
        array.block_until_ready()
    except jax.errors.JaxRuntimeError as exc:
        return "DATA_LOSS" in str(exc)
    return False
