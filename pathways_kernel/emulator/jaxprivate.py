"""The private JAX only the embedded backend needs, for its fault injection.

The embedded backend (``embedded:SxC``) loses a slice inside the kernel's own
JAX: it swaps a lost array's buffers for error buffers, must not swap one that
another thread is copying to the host (jaxlib aborts), and hooks JAX's Python
dispatch to fail work placed on a lost slice. That takes frame walks of other
threads, wrappers around ``pxla``/``pjit``/``dispatch`` internals and around
jaxlib's host copy: what this module holds. It went with the embedded backend
when the local Pathways server became ``local:`` (the server loses slices in its
own process, with no hook in the client's JAX); ``core/jaxcompat.py`` keeps what
other layers still need. Everything here is used by ``emulator/faults.py`` only,
behind ``jaxcompat.fault_injection_unsupported`` (tested with ``jaxcompat.TESTED_JAX``).
"""

from __future__ import annotations

import functools
import gc
import linecache
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import jax


# -- arrays ---------------------------------------------------------------------
def concrete_array_type() -> type[jax.Array]:
    """The class of arrays backed by buffers (``jaxlib._jax.ArrayImpl``): no tracers."""
    from jaxlib import _jax

    # ArrayImpl is JAX's buffer-backed jax.Array; jaxlib ships no stubs to say so.
    return cast("type[jax.Array]", _jax.ArrayImpl)


def committed(array: Any) -> bool:
    """Whether ``array`` was placed on its devices by the user (``ArrayImpl._committed``);
    uncommitted arrays live on JAX's default device."""
    return bool(array._committed)


#: The module whose methods start host reads (see ``arrays_being_read``).
_ARRAY_MODULE = os.path.join("jax", "_src", "array.py")


def arrays_being_read() -> set[int]:
    """``id``s of the arrays other threads are reading to the host right now.

    jaxlib's host copy (``ArrayImpl._value``) keeps pointers into the array
    while it waits without the GIL. Every such wait is entered from a method
    of ``jax/_src/array.py`` (seen through ``sys._current_frames``), so a
    thread with that file on its stack may be in one: its ``self`` and the
    per-device arrays it reads through (``_arrays``, the cached
    fully-replicated shard) are busy; so is every array a guarded read
    (``install_host_read_guard``) has registered.
    """
    array_type: Any = concrete_array_type()
    with _host_reads_lock:
        busy: set[int] = set(_host_reads)
    owners = [owner for owner in _frame_locals("self", _ARRAY_MODULE) if isinstance(owner, array_type)]
    for owner in owners:
        busy.add(id(owner))
        if not owner.is_deleted():
            busy.update(id(a) for a in owner._arrays)
            if owner.is_fully_replicated:
                busy.add(id(owner._fully_replicated_shard()))
    return busy


def _other_threads_frames() -> dict[int, FrameType]:
    """The innermost frame of every thread but this one, by thread ident.

    This thread's own frame is never held: a frame that holds itself is a cycle,
    which kept its callers' arrays alive until the next collection.
    """
    me = threading.get_ident()
    return {ident: frame for ident, frame in sys._current_frames().items() if ident != me}


def _frame_locals(name: str, module: str) -> list[Any]:
    """The local ``name`` of every frame of other threads running code of ``module``.

    Other threads' frames are only safe to walk while they cannot run: a
    thread that runs meanwhile frees the interpreter frames ``f_back`` reads
    (once seen as a code object where a frame should be). Nothing here may
    let go of the GIL: the cyclic collector, whose finalizers can, is off for
    the walk, and the arrays found are inspected by the caller afterwards.
    """
    found: list[Any] = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for top in _other_threads_frames().values():
            frame: FrameType | None = top
            while frame is not None:
                if frame.f_code.co_filename.endswith(module):
                    found.append(frame.f_locals.get(name))
                frame = frame.f_back
    finally:
        if collecting:
            gc.enable()
    return found


#: Innermost functions a thread sits in while it waits without touching any
#: array (file, function): such a thread is idle, not in a read.
_IDLE_FRAMES = {
    ("threading.py", "wait"),
    ("threading.py", "_wait_for_tstate_lock"),
    ("selectors.py", "select"),
    # An idle ThreadPoolExecutor worker, in SimpleQueue.get (C); its work runs in deeper frames.
    (os.path.join("concurrent", "futures", "thread.py"), "_worker"),
    (os.path.join("zmq", "sugar", "poll.py"), "poll"),
    (os.path.join("ipykernel", "heartbeat.py"), "run"),
    # The heartbeat's zmq.device (a C loop forwarding pings) and ipykernel's
    # watchers of the process's stdout/stderr pipes (a blocking os.read):
    # a kernel's threads that never leave their call.
    (os.path.join("zmq", "sugar", "__init__.py"), "device"),
    (os.path.join("ipykernel", "iostream.py"), "_watch_pipe_fd"),
    # IPython's history thread writing the cell's input and output text to sqlite.
    (os.path.join("IPython", "core", "history.py"), "_writeout_input_cache"),
    (os.path.join("IPython", "core", "history.py"), "_writeout_output_cache"),
}
#: A line that waits in a blocking C call (``time.sleep``, ``queue.get``,
#: ``select``...) and reads no array: a thread stopped on it is idle. Loops
#: that poll this way would otherwise look like a read that never ends.
_IDLE_LINE = re.compile(r"\b(sleep|get|get_nowait|wait|select|poll|recv\w*|accept|join|acquire)\(")
_READ_LINE = re.compile(
    r"\b(asarray|array|device_get|block_until_ready|item|tolist|tobytes|_value|float|int|copy)\b|\b(np|numpy|jax|jnp)\."
)


def _idle(frame: Any) -> bool:
    code = frame.f_code
    if any(code.co_name == name and code.co_filename.endswith(file) for file, name in _IDLE_FRAMES):
        return True
    # f_lineno is None while a frame is between lines (seen from a thread calling fail_slice).
    line = linecache.getline(code.co_filename, frame.f_lineno or 0)
    return bool(_IDLE_LINE.search(line)) and not _READ_LINE.search(line)


def thread_positions() -> dict[int, tuple[int, int, int]]:
    """Where each other thread that is not idle is now: its innermost frame
    (``id``, code ``id``, instruction), from ``sys._current_frames``.

    A thread inside a C++ call (a read without the GIL) stays at the same
    position until the call returns; once its position changes, or it is
    gone, whatever it was doing then is over.
    """
    # Read every position before looking at source lines (``_idle`` may read a
    # file, letting other threads run and move on meanwhile).
    tops = _other_threads_frames()
    positions = {ident: (id(frame), id(frame.f_code), frame.f_lasti) for ident, frame in tops.items()}
    return {ident: position for ident, position in positions.items() if not _idle(tops[ident])}


# -- dispatch -------------------------------------------------------------------
_hooks_lock = threading.Lock()
_hooks_installed = False


def install_dispatch_hooks(
    on_execute: Callable[[Any, str, Iterable[Any]], None],
    skip_fastpath: Callable[[Iterable[Any]], bool],
    before_device_put: Callable[[tuple[Any, ...]], None],
    after_device_put: Callable[[Any], None],
) -> None:
    """Wrap JAX's Python dispatch paths (once per process).

    - ``pxla.ExecuteReplicated.__call__`` (every jit/pmap/eager execution that
      goes through Python): ``on_execute(results, name, devices)`` after it.
    - ``pjit._get_fastpath_data``: when ``skip_fastpath(devices)`` (the
      executable's ``unsafe_call._local_devices``), the C++ fast path is not
      given, so calls keep coming through the wrapper above.
    - ``dispatch._batched_device_put_impl`` (``jax.device_put`` and the
      ``device_put`` primitive): ``before_device_put(xs)``, then
      ``after_device_put(results)``.
    """
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        from jax._src import dispatch, pjit
        from jax._src.interpreters import pxla

        execute = pxla.ExecuteReplicated.__call__

        @functools.wraps(execute)
        def execute_replicated(self: Any, *args: Any) -> Any:
            results = execute(self, *args)
            on_execute(results, self.name, self._local_devices)
            return results

        fastpath = pjit._get_fastpath_data

        @functools.wraps(fastpath)
        def get_fastpath_data(executable: Any, *args: Any, **kwargs: Any) -> Any:
            if executable is not None:
                call = getattr(executable, "unsafe_call", None)
                if skip_fastpath(getattr(call, "_local_devices", ())):
                    return None
            return fastpath(executable, *args, **kwargs)

        device_put = dispatch._batched_device_put_impl

        @functools.wraps(device_put)
        def batched_device_put(*xs: Any, **params: Any) -> Any:
            before_device_put(xs)
            results = device_put(*xs, **params)
            after_device_put(results)
            return results

        pxla.ExecuteReplicated.__call__ = execute_replicated  # type: ignore[method-assign]
        pjit._get_fastpath_data = get_fastpath_data
        dispatch._batched_device_put_impl = batched_device_put
        _hooks_installed = True


# -- host reads ------------------------------------------------------------------
#: ``id`` -> count of the arrays some thread is copying to the host now, through
#: ``ArrayImpl._single_device_array_to_np_array_did_copy`` (see ``install_host_read_guard``).
_host_reads: dict[int, int] = {}
#: Held to register a read, and by a swap across its check and the swap itself.
_host_reads_lock = threading.RLock()
_host_read_guard_installed = False


def install_host_read_guard() -> None:
    """Register every host read of a per-device array while it runs (once per process).

    ``ArrayImpl._value`` (``np.asarray``, ``jax.device_get``, printing) copies
    each shard with the C++ method ``_single_device_array_to_np_array_did_copy``,
    which waits for the buffer without the GIL while using the array's host-value
    state; ``_replace_with`` on another thread meanwhile resets that state and
    jaxlib aborts (``Check failed: buffer != nullptr``). The method is wrapped
    here: the array (and, if it is fully replicated, the shard the copy reads)
    is registered under ``_host_reads_lock`` for the duration, and
    ``no_new_host_reads`` lets a swap check and swap with no read starting.
    """
    global _host_read_guard_installed
    with _hooks_lock:
        if _host_read_guard_installed:
            return
        array_type: Any = concrete_array_type()
        read = array_type._single_device_array_to_np_array_did_copy

        def guarded_read(self: Any) -> Any:
            ids = [id(self)]
            if not self.is_deleted() and self.is_fully_replicated:
                ids.append(id(self._fully_replicated_shard()))
            with _host_reads_lock:
                for ident in ids:
                    _host_reads[ident] = _host_reads.get(ident, 0) + 1
            try:
                return read(self)
            finally:
                with _host_reads_lock:
                    for ident in ids:
                        left = _host_reads[ident] - 1
                        if left:
                            _host_reads[ident] = left
                        else:
                            del _host_reads[ident]

        guarded_read.__name__ = guarded_read.__qualname__ = "_single_device_array_to_np_array_did_copy"
        guarded_read.__doc__ = read.__doc__
        array_type._single_device_array_to_np_array_did_copy = guarded_read
        _host_read_guard_installed = True


def no_new_host_reads() -> Any:
    """Hold while checking ``arrays_being_read`` and swapping: no guarded read starts meanwhile."""
    return _host_reads_lock


def clear_dispatch_caches() -> None:
    """Drop JAX's C++ dispatch caches, not the compiled executables
    (``pjit._cpp_pjit_cache_*`` and ``PjitFunctionCache.clear_all``;
    ``jax.clear_caches`` would also drop every compiled executable)."""
    from jax._src import pjit
    from jaxlib import _jax

    pjit._cpp_pjit_cache_fun_only.clear()
    pjit._cpp_pjit_cache_explicit_attributes.clear()
    _jax.PjitFunctionCache.clear_all()


def dispatch_hooks_installed() -> bool:
    """Whether ``install_dispatch_hooks`` ran (until then no cache can bypass them)."""
    return _hooks_installed
