"""Fault injection on the embedded backend: lose a slice the way Pathways does.

``fail_slice(i)`` makes slice ``i`` of an ``embedded`` session behave like a slice
that Pathways lost; ``repair_slice(i)`` brings it back empty. Other backends
refuse both (``NotSupportedError``) or lose slices by themselves (a real cluster;
the local Pathways server, through its backend's ``lose_slice``). So does a
jax/jaxlib outside the range the mechanism was tested with
(``jaxcompat.TESTED_JAX``): it rests on JAX internals, in ``core/jaxcompat.py``
(buffer swaps, error arrays) and ``emulator/jaxprivate.py`` (dispatch hooks,
frame walks, the host-read guard: what only this mechanism needs).

Mechanism: real error buffers, not a Python-level imitation
-----------------------------------------------------------
jaxlib can build an array whose buffers hold an error status instead of data
(``jax.experimental.transfer.make_error_array``) and swap an array's buffers
in place, keeping the Python object the user holds (see core/jaxcompat.py).
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

New work placed on a lost device fails the same way. Three narrow hooks on
JAX's Python dispatch paths (``jaxprivate.install_dispatch_hooks``), installed
at the first ``fail_slice``, do this:

- after each execution that goes through Python (jit/pmap/eager ops): while
  a slice is down, results with a shard on it get error buffers;
- an executable touching a lost device is never given the C++ fast path, so
  it always passes through the hook above; the C++ dispatch caches are
  cleared on each fail and repair so that nothing cached earlier bypasses it;
- ``jax.device_put``: putting a lost array anywhere raises ``DATA_LOSS`` at
  once (as the runtime does for any copy of it, including the no-op put onto
  its own sharding, and after the slice is back), and results placed on a
  lost device get error buffers.

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
other thread is in a host read of that array (``jaxprivate.arrays_being_read``,
checked right before the swap; the per-shard copy behind ``np.asarray`` and
``jax.device_get`` registers itself while it runs, ``install_host_read_guard``,
and none starts during a check and its swap), and the old buffers stay alive, for C++ paths
with no frame of ours (numpy's buffer protocol, ``block_until_ready``), until they are ready and
every other thread that was not idle at the swap has moved on from where it
was (``_GRACE_S`` after they are ready at most). They are kept only while
some other thread is inside a call at the swap: otherwise a loss frees its
buffers at once, and ``jax.live_arrays()`` holds no array that still reads
lost data. Without these guards, both races crash the process.

Cost: each failure walks ``jax.live_arrays()`` once or twice; the buffers kept
for readers are not live arrays of the user's (a later failure never loses or
keeps them again), so a failure costs the same after a thousand failures as
after one; they are released within ``_SWEEP_S`` of the last busy thread
moving on, so what is kept is the data of a few failures, and at worst (a
thread inside one long call) what was lost in the last ``_GRACE_S`` once ready. No wait
under the injector's lock is unbounded: a read in flight is waited for at
most ``_READ_WAIT_S``.

Limits
------
- While another thread is inside a call at the loss (not idle: not waiting
  on a lock, queue, sleep, pipe or socket), a lost array's old
  buffers live until that thread moves on (``_GRACE_S`` after they are
  ready at most), in an array ``jax.live_arrays()`` lists; and as long as a numpy view
  taken earlier with ``np.asarray`` (zero-copy on CPU) holds them; that view
  keeps reading the old bytes, as a host copy would.
- A host read in progress on another thread delays its array's loss until
  the read is done (a ``float(loss)`` waiting on a long step: that long);
  ``fail_slice`` returns after ``_READ_WAIT_S`` and a thread of ours swaps
  the array's buffers when the read ends. Until then ``pw.is_lost`` says False.
- An array computed after ``repair_slice`` from a lost input is lost too, but
  the ``jit`` call returns before the error is known (asynchronous dispatch);
  ``pw.is_lost`` waits for it.
- Executables compiled ahead of time (``jit(f).lower(...).compile()``) and
  called before the loss keep their own C++ dispatcher: their new results on a
  lost device are not marked lost (inputs that are lost still propagate).
- Arrays jaxlib cannot express as error arrays (none seen so far) are deleted
  instead; reading them raises ``RuntimeError: Array has been deleted``.

Over 600 lines: a seventh of it is this docstring, and the rest is one
mechanism (error buffers, the keepers of lost buffers for readers in flight,
the dispatch hooks, the injector) whose parts share the lost-device state and
the injector's lock.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pathways_kernel.core import jaxcompat, sessions
from pathways_kernel.core.backend import reads_data_loss
from pathways_kernel.core.errors import NotSupportedError, PathwaysError, slice_down_error
from pathways_kernel.core.interrupts import deferred_interrupts
from pathways_kernel.core.text import count
from pathways_kernel.emulator import jaxprivate
from pathways_kernel.emulator.fault_report import (
    FaultReport,
    lost_array_message,
    no_slice_up_message,
    placed_on_lost_message,
)

if TYPE_CHECKING:
    import jax

    from pathways_kernel.core.eventlog import Event
    from pathways_kernel.core.sessions import Session
    from pathways_kernel.core.slices import Slice, Topology

#: Devices of slices that are down now; read lock-free by the dispatch hooks.
_lost_devices: frozenset[jax.Device] = frozenset()
#: Device -> slice index, for the messages of the hooks.
_slice_of_device: dict[Any, int] = {}
#: While every slice is down: what work placed by default (on JAX's default
#: device, which has no live slice to move to) raises at once, one line.
_no_slice_up: str | None = None


def require_fault_injection(session: Session, what: str) -> None:
    """Refuse ``what`` unless the session is ``local`` and jax/jaxlib are in the tested range.

    Raises:
      NotSupportedError: another backend, or a jax/jaxlib outside ``jaxcompat.TESTED_JAX``.
    """
    session.require_fault_injection(what)
    if _server_side(session) is not None:
        return  # the server loses the slice: no JAX internals of this process involved
    reason = jaxcompat.fault_injection_unsupported()
    if reason:
        raise NotSupportedError(f"{what} is off: {reason}")


def _lost_slice_of(devices: Iterable[Any]) -> int | None:
    """The first lost slice among ``devices`` (``None`` if none is lost)."""
    lost = _lost_devices
    for device in devices:
        if device in lost:
            return _slice_of_device.get(device, -1)
    return None


def _make_lost(array: Any, message: str) -> None:
    """Swap ``array``'s buffers for error buffers carrying ``message``.

    Only for arrays no other thread can hold yet (fresh results); see
    ``_make_lost_when_unread`` for the others.
    """
    try:
        jaxcompat.replace_buffers(array, jaxcompat.make_error_like(array, message))
    except (TypeError, ValueError, RuntimeError, AttributeError):
        # Some exotic layout jaxlib cannot express: losing it outright is
        # still truthful, only the error text differs.
        array.delete()


@dataclasses.dataclass(eq=False)  # compared by identity: fields hold arrays
class _Grave:
    """The old buffers of one lost array, kept for a reader that may be inside them."""

    keeper: Any  # an array sharing those buffers
    positions: dict[int, tuple[int, int, int]]  # threads busy at the swap, where they were
    ready_at: float | None  # when the buffers were first seen ready

    def needed(self, now: float, current: dict[int, tuple[int, int, int]]) -> bool:
        if self.ready_at is None:
            if not self.keeper.is_ready():
                return True  # a reader may be waiting for these very buffers
            self.ready_at = now
        if now - self.ready_at >= _GRACE_S:
            return False
        return any(current.get(ident) == position for ident, position in self.positions.items())


#: Buffers of arrays lost recently, oldest first: each is kept until every thread that was
#: busy at the swap has moved on, or ``_GRACE_S`` after they are ready; see ``_make_lost_when_unread``.
_graveyard: collections.deque[_Grave] = collections.deque()
#: ``id``s of the keepers in ``_graveyard``. A keeper is a live array with
#: shards on the lost slice: without this, every later failure would find it
#: in ``jax.live_arrays()``, lose it and bury its buffers once more (the
#: graveyard, and each failure's cost, grew with every failure before).
_kept: set[int] = set()
_graveyard_lock = threading.Lock()
_sweeper: threading.Timer | None = None
#: The longest ready buffers are kept for a thread that stays inside one call. A frameless
#: read of ready buffers only waits for the GIL, which it gets within a few switch intervals
#: (5 ms each) of asking; a thread still in its call after this is in some other, long call
#: (a blocking read of a pipe, a C loop), not reading these buffers.
_GRACE_S = 0.5
#: How often buried buffers are looked at while there are some.
_SWEEP_S = 0.05
#: How long a loss waits for threads busy at its swap to move on, so it can free what it kept.
_SETTLE_S = 0.05


def _bury(array: Any, positions: dict[int, tuple[int, int, int]]) -> _Grave:
    """Keep ``array``'s current buffers alive until the threads at ``positions`` moved on."""
    keeper = jaxcompat.make_error_like(array, "DATA_LOSS: buffers kept for readers in flight")
    jaxcompat.replace_buffers(keeper, array)  # the keeper now shares array's buffers
    grave = _Grave(keeper, positions, time.monotonic() if keeper.is_ready() else None)
    _empty_at_exit()
    with _graveyard_lock:
        _graveyard.append(grave)
        _kept.add(id(keeper))
    return grave


def _sweep_graveyard() -> None:
    """Release buried buffers no reader in flight can still be using; look
    again later while some are left."""
    global _sweeper
    # Buffers are freed under the lock, so that _empty_graveyard at exit
    # waits for a sweep in progress.
    with _graveyard_lock:
        if _graveyard:
            now = time.monotonic()
            try:
                current = jaxprivate.thread_positions()
            except Exception:
                # Inspecting other threads' frames can race with them; on a
                # sweeper thread a traceback would land in the user's cell. Keep
                # what is within its grace and look again at the next sweep.
                logging.getLogger(__name__).debug("graveyard sweep failed", exc_info=True)
                current = {ident: position for grave in _graveyard for ident, position in grave.positions.items()}
            kept = [grave for grave in _graveyard if grave.needed(now, current)]
            if len(kept) < len(_graveyard):
                _graveyard.clear()
                _graveyard.extend(kept)
                _kept.clear()
                _kept.update(id(grave.keeper) for grave in kept)
        if _sweeper is threading.current_thread():
            _sweeper = None
        if _graveyard and _sweeper is None:
            _sweeper = threading.Timer(_SWEEP_S, _sweep_graveyard)
            _sweeper.daemon = True
            _sweeper.start()


#: How long ``fail_slice`` waits for reads in flight on other threads before
#: leaving their arrays to the deferred swapper (it holds the injector's lock).
_READ_WAIT_S = 0.1
#: (array, error) pairs whose swap waits for a read in flight, and their ids.
_deferred: list[tuple[Any, Any]] = []
_deferred_ids: set[int] = set()
_deferred_lock = threading.Lock()
_deferrer: threading.Thread | None = None
_deferrer_stop = threading.Event()


def _swap_unread(pending: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Swap in the error buffers of the arrays no other thread is reading; the rest."""
    waiting = []
    # Between looking for readers and swapping, no other thread may start a
    # read: hold the GIL across both (no thread switch for the duration; the
    # check and the swap are short and never release it).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(_NO_SWITCH_S)
    try:
        # No guarded host read (np.asarray, device_get: jaxprivate.install_host_read_guard)
        # starts while a check and its swap run, even where jaxlib releases the GIL.
        with jaxprivate.no_new_host_reads():
            for array, error in pending:
                if array.is_deleted():
                    continue
                # Looked up again for each array, right before its swap: another
                # thread may have started reading it during the previous swaps.
                if id(array) in jaxprivate.arrays_being_read():
                    waiting.append((array, error))
                else:
                    jaxcompat.replace_buffers(array, error)
    finally:
        sys.setswitchinterval(interval)
    return waiting


#: Thread switch interval while swapping (s): longer than any swap batch takes.
_NO_SWITCH_S = 10.0


def _defer(pending: list[tuple[Any, Any]]) -> None:
    """Swap ``pending`` once their reads are done, on a thread of its own."""
    global _deferrer
    _empty_at_exit()
    with _deferred_lock:
        _deferred.extend(pending)
        _deferred_ids.update(id(array) for array, _ in pending)
        if _deferrer is None and not _deferrer_stop.is_set():
            _deferrer = threading.Thread(target=_swap_deferred, name="pathways-faults-deferred", daemon=True)
            _deferrer.start()


def _swap_deferred() -> None:
    global _deferrer
    while True:
        with _deferred_lock:
            _deferred[:] = _swap_unread(_deferred)
            _deferred_ids.clear()
            _deferred_ids.update(id(array) for array, _ in _deferred)
            if not _deferred or _deferrer_stop.is_set():
                _deferrer = None
                return
        _deferrer_stop.wait(0.005)


_exit_registered = False
_exit_lock = threading.Lock()


def _empty_at_exit() -> None:
    """Empty the graveyard at exit, from the first loss on (registered then, not at import).

    Process-wide, not the session's: the buffers are JAX's, kept for readers of arrays a
    user may still hold after the session that lost them was replaced.
    """
    global _exit_registered
    with _exit_lock:
        if not _exit_registered:
            _exit_registered = True
            atexit.register(_empty_graveyard)


def _empty_graveyard() -> None:
    """Release buried buffers on the main thread before the interpreter ends:
    a daemon thread freeing them during finalization aborts the process."""
    global _sweeper
    _deferrer_stop.set()
    deferrer = _deferrer
    if deferrer is not None:
        deferrer.join()
    with _deferred_lock:
        _deferred.clear()
        _deferred_ids.clear()
    with _graveyard_lock:
        sweeper, _sweeper = _sweeper, None
        _graveyard.clear()
        _kept.clear()
    if sweeper is not None:
        sweeper.cancel()
        sweeper.join()


def _make_lost_when_unread(arrays: list[Any], message: str, deadline: float) -> None:
    """``_make_lost`` each array without pulling buffers from under a reader.

    Two races with threads reading these arrays, both seen as crashes:
    - a host copy in progress uses the array's own fields: each swap waits
      until no other thread is in such a read of that array
      (``jaxprivate.arrays_being_read``), checked right before the swap. A
      read in progress delays its array's loss until it is done, as if the
      slice failed a moment later; past ``deadline`` (``time.monotonic()``)
      the swap is left to a thread of its own, so that a long read
      (``float(loss)`` of a long step) never holds up the caller.
    - numpy's buffer protocol (``np.asarray`` of a one-device array) and
      other C++ paths hold plain pointers to the buffers while they wait
      without the GIL, entered with no frame of ours to see: the old buffers
      are kept alive (``_bury``) until they are ready and every thread that
      was inside some call at the swap has left it (``_GRACE_S`` at most).
    """
    positions = jaxprivate.thread_positions()
    pending, graves = [], []
    for array in arrays:
        try:
            error = jaxcompat.make_error_like(array, message)
            # Always, even with no thread to wait for: the swap must not be what frees the
            # old buffers (freed inside _replace_with, they crashed the interpreter in
            # bench/chaos_soak.py: SystemError from weakrefobject.c, then a segfault).
            # With no thread inside a call, the sweep below frees them before we return.
            graves.append(_bury(array, positions))
        except (TypeError, ValueError, RuntimeError, AttributeError):
            array.delete()
            continue
        pending.append((array, error))
    pending = _swap_unread(pending)
    while pending and time.monotonic() < deadline:
        time.sleep(0.001)
        pending = _swap_unread(pending)
    if pending:
        _defer(pending)
    # A thread busy at the swap (a history write, a training step) usually moves on within
    # milliseconds: give it that long, so that what this loss kept is freed before we return.
    settle = time.monotonic() + _SETTLE_S
    _sweep_graveyard()
    while time.monotonic() < settle and any(grave.ready_at is not None and grave in _graveyard for grave in graves):
        time.sleep(0.001)
        _sweep_graveyard()


def _arrays_on(devices: frozenset[jax.Device]) -> list[jax.Array]:
    """Live arrays with a shard on ``devices`` that are not lost (or being lost) already."""
    import jax

    skip = _kept | _deferred_ids
    return [
        array
        for array in jax.live_arrays()
        if id(array) not in skip
        and not array.is_deleted()
        and not devices.isdisjoint(jaxcompat.devices_of(array))
        and not reads_data_loss(array, wait=False)
    ]


def _lose_results(results: Any, what: str) -> None:
    array_type = jaxprivate.concrete_array_type()
    for result in results if isinstance(results, (list, tuple)) else (results,):
        if isinstance(result, array_type) and not result.is_deleted():
            slice_index = _lost_slice_of(jaxcompat.devices_of(result))
            if slice_index is not None:
                no_slice_up = _no_slice_up
                if no_slice_up is not None and not jaxprivate.committed(result):
                    # Placed by default: nothing the user chose can make it work, and a lost
                    # array would only fail later, in a long traceback naming one slice.
                    raise slice_down_error(no_slice_up)
                _make_lost(result, placed_on_lost_message(slice_index, what))


# -- hooks on JAX's dispatch paths --------------------------------------------
def _on_execute(results: Any, name: str, devices: Iterable[Any]) -> None:
    if _lost_devices and _lost_slice_of(devices) is not None:
        _lose_results(results, f"computation '{name}'")


def _skip_fastpath(devices: Iterable[Any]) -> bool:
    return bool(_lost_devices) and _lost_slice_of(devices) is not None


def _before_device_put(xs: tuple[Any, ...]) -> None:
    # Even with every slice up again: lost data stays lost. Raise DATA_LOSS
    # now for a ready input holding lost data.
    array_type = jaxprivate.concrete_array_type()
    for x in xs:
        # is_ready is on JAX's array implementation, not declared on the jax.Array interface.
        if isinstance(x, array_type) and not x.is_deleted() and x.is_ready():  # type: ignore[attr-defined]
            x.block_until_ready()


def _after_device_put(results: Any) -> None:
    if _lost_devices:
        _lose_results(results, "device_put")


def _install_hooks() -> None:
    """Install the three dispatch hooks (once per process); see the module doc."""
    jaxprivate.install_dispatch_hooks(_on_execute, _skip_fastpath, _before_device_put, _after_device_put)
    jaxprivate.install_host_read_guard()


def _clear_dispatch_caches() -> None:
    """Drop the C++ dispatch caches, so that nothing cached earlier bypasses the hooks."""
    if jaxprivate.dispatch_hooks_installed():
        jaxprivate.clear_dispatch_caches()


# -- the injector -------------------------------------------------------------
class FaultInjector:
    """The session's injected faults (session extension ``"faults"``)."""

    def __init__(self, session: Session):
        self.session = session
        self._lock = threading.RLock()
        self._down: dict[int, frozenset[jax.Device]] = {}
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
        require_fault_injection(self.session, "fail_slice")
        # Interrupted halfway, a slice would be down with arrays on it still
        # readable, where is_lost says False and computing with them raises.
        with self._lock, deferred_interrupts():
            topology = self.session.topology
            target = _slice(topology, index)
            if not target.up:
                return FaultReport(index, "fail", False, slices_up=_up(topology))
            if (server := _server_side(self.session)) is not None:
                arrays, nbytes = server.lose_slice(index)
                self.session.set_slice_state(index, "down", detail=f"{detail}: {count(arrays, 'array')} lost")
                return FaultReport(index, "fail", True, arrays, nbytes, _up(self.session.topology))
            _install_hooks()
            devices = frozenset(target.devices)
            lost = _arrays_on(devices)
            self._down[index] = devices
            self._publish()
            _clear_dispatch_caches()
            self._move_default_device()
            self.session.set_slice_state(index, "down", detail=f"{detail}: {count(len(lost), 'array')} lost")
            message = lost_array_message(index)
            deadline = time.monotonic() + _READ_WAIT_S
            _make_lost_when_unread(lost, message, deadline)
            # Arrays that appeared while the slice was being marked down.
            _make_lost_when_unread(_arrays_on(devices), message, deadline)
            topology = self.session.topology
        return FaultReport(index, "fail", True, len(lost), sum(array.nbytes for array in lost), _up(topology))

    def repair(self, index: int, detail: str = "repaired") -> FaultReport:
        require_fault_injection(self.session, "repair_slice")
        with self._lock, deferred_interrupts():
            topology = self.session.topology
            target = _slice(topology, index)
            if target.up:
                return FaultReport(index, "repair", False, slices_up=_up(topology))
            if (server := _server_side(self.session)) is not None:
                server.restore_slice(index)
            self._down.pop(index, None)
            self._publish()
            _clear_dispatch_caches()
            self._move_default_device()
            self.session.set_slice_state(index, "up", detail=detail)
            topology = self.session.topology
        return FaultReport(index, "repair", True, slices_up=_up(topology))

    @property
    def down(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._down))

    def _publish(self) -> None:
        global _lost_devices, _no_slice_up
        for index, devices in self._down.items():
            for device in devices:
                _slice_of_device[device] = index
        _lost_devices = frozenset().union(*self._down.values())
        slices = [s.index for s in self.session.topology.slices]
        _no_slice_up = None if set(slices) - set(self._down) else no_slice_up_message(slices)

    def _move_default_device(self) -> None:
        """Keep JAX's default device on a live slice, as pathwaysutils' ``Manager``
        does; put the user's choice back once its slice is up again."""
        import jax

        devices = self.session.devices()
        moved = self._saved_default_device is not _UNSET
        # jax.config's options are attributes JAX adds at run time, unseen by mypy.
        original = self._saved_default_device if moved else jax.config.jax_default_device  # type: ignore[attr-defined]
        if (original if original is not None else devices[0]) not in _lost_devices:
            if moved:
                jax.config.update("jax_default_device", original)
                self._saved_default_device = _UNSET
            return
        if moved and jax.config.jax_default_device not in _lost_devices:  # type: ignore[attr-defined]  # as above
            return
        live = [d for d in devices if d not in _lost_devices]
        if live:
            self._saved_default_device = original
            jax.config.update("jax_default_device", live[0])

    def _on_event(self, event: Event) -> None:
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
        global _lost_devices, _no_slice_up
        self._unsubscribe()
        with self._lock:
            if self._down:
                self._down.clear()
                _lost_devices = frozenset()
                _no_slice_up = None
                _slice_of_device.clear()
                _clear_dispatch_caches()
            if self._saved_default_device is not _UNSET:
                import jax

                jax.config.update("jax_default_device", self._saved_default_device)
                self._saved_default_device = _UNSET


_UNSET = object()


class ServerSideSlices(Protocol):
    """A backend whose server loses and restores slices itself (``backends/local_server.py``)."""

    def lose_slice(self, index: int) -> tuple[int, int]: ...

    def restore_slice(self, index: int) -> None: ...


def _server_side(session: Session) -> ServerSideSlices | None:
    """The session's backend when it loses slices on its server (``backends/local_server.py``), else None."""
    backend = getattr(session, "backend", None)
    return backend if callable(getattr(backend, "lose_slice", None)) else None


def _slice(topology: Topology, index: int) -> Slice:
    try:
        return topology.slice(index)
    except KeyError:
        raise PathwaysError(f"no slice {index}: this session has slices 0..{len(topology.slices) - 1}") from None


def _up(topology: Topology) -> tuple[int, ...]:
    return tuple(s.index for s in topology.up_slices)


def injector(session: Session | None = None) -> FaultInjector:
    """The session's ``FaultInjector``."""
    if session is None:
        session = sessions.session()
    return session.component(FaultInjector)


# -- public API ---------------------------------------------------------------
def fail_slice(index: int) -> FaultReport:
    """Lose slice ``index`` (embedded ``local`` backend only).

    Every array with a shard on it becomes unusable: each read raises
    ``jax.errors.JaxRuntimeError`` with ``DATA_LOSS``; new work placed on its
    devices fails the same way until ``repair_slice``. Emits ``slice_down``.

    Raises:
      NotSupportedError: the session's backend is not ``local``.
      PathwaysError: no such slice.
    """
    return injector().fail(index)


def repair_slice(index: int) -> FaultReport:
    """Bring slice ``index`` back, empty: new arrays work on it, lost ones stay lost.

    Emits ``slice_up``.

    Raises:
      NotSupportedError: the session's backend is not ``local``.
      PathwaysError: no such slice.
    """
    return injector().repair(index)


class InjectedFaults:
    """What the local backends (``embedded:``, ``local:``) add to the backend protocol: slices
    lost on request through the session's ``FaultInjector``. Layers above ask the session or
    its backend (``Session.fail_slice``, ``Backend.is_leftover``), never this module."""

    supports_fault_injection: ClassVar[bool] = True

    def fail_slice(self, session: Any, index: int, detail: str) -> FaultReport:
        return injector(session).fail(index, detail=detail)

    def repair_slice(self, session: Any, index: int, detail: str) -> FaultReport:
        return injector(session).repair(index, detail=detail)

    def is_leftover(self, array: Any) -> bool:
        return is_leftover(array)


def is_leftover(array: Any) -> bool:
    """Whether ``array`` is what a loss left behind: a keeper of lost buffers for
    readers in flight, or an array whose loss waits for a read to end. Neither
    holds data anyone can use (memory figures count them nowhere)."""
    return id(array) in _kept or id(array) in _deferred_ids
