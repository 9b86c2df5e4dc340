"""The private JAX/jaxlib API the kernel's layers use, in one place.

What remains here and why: the version gate (``TESTED_JAX``), whether JAX's
backends exist (switching backends in one process), XLA's C++ log level (the
local server's session quiets the proxy client's log of every forwarded error),
a short-lived alias for host reads and the buffer swaps it needs (snapshots),
stopping a trace in memory (profiling; also used by the local server), and joining
per-slice blocks into one array in one request (the data loader). What
only the embedded backend's fault injection needs (dispatch hooks, frame walks
of other threads, the host-read guard) went with it to ``emulator/jaxprivate.py``.
The local Pathways server (``server/``) is a separate process that builds arrays
from shards and compiles programs with jaxlib's own Python API: its private uses are
in ``server/jaxcompat.py``, checked against each jax/jaxlib by ``make test-compat``
(``tests/core/test_private_api.py`` keeps every other module off private JAX).

Each function says what it relies on. They are tested against ``TESTED_JAX``
(jax and jaxlib versions); ``fault_injection_unsupported`` names the installed
versions when they fall outside it, and fault injection (the only feature
that needs the private parts to behave exactly as here) is then refused,
while everything else keeps working. Public spellings are used wherever JAX
has one (``jax.experimental.transfer.make_error_array``,
``jax.extend.backend.clear_backends``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, cast

#: The jax/jaxlib range these shims were written and tested against.
TESTED_JAX_MIN = "0.10.1"
TESTED_JAX_BELOW = "0.11"
TESTED_JAX = f">={TESTED_JAX_MIN},<{TESTED_JAX_BELOW}"


# -- versions -----------------------------------------------------------------
def installed_versions() -> tuple[str, str]:
    """The installed ``(jax, jaxlib)`` versions."""
    import jax
    import jaxlib.version

    return jax.__version__, jaxlib.version.__version__


def _release(version: str) -> tuple[int, ...]:
    # "0.10.2", "0.10.2.dev20260101", "0.11.0rc1": the numeric release part.
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def _in_tested_range(version: str) -> bool:
    return _release(TESTED_JAX_MIN) <= _release(version) < _release(TESTED_JAX_BELOW)


def fault_injection_unsupported() -> str | None:
    """Why fault injection is off with the installed jax/jaxlib (``None``: it is on)."""
    jax_version, jaxlib_version = installed_versions()
    if _in_tested_range(jax_version) and _in_tested_range(jaxlib_version):
        return None
    return (
        f"fault injection needs jax/jaxlib {TESTED_JAX} (it relies on their internals); "
        f"installed: jax {jax_version}, jaxlib {jaxlib_version}"
    )


# -- backends -----------------------------------------------------------------
def backends_initialized() -> bool:
    """Whether JAX has created its backends (``xla_bridge.backends_are_initialized``).

    Without it, ``True``: callers then compare the devices they get, which
    initializes the backends, and clear them if they do not fit.
    """
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True


# -- arrays ---------------------------------------------------------------------
def devices_of(array: Any) -> Iterable[Any]:
    """The devices of ``array``'s sharding, in order (``Sharding._internal_device_list``,
    cached; the public ``device_set`` builds a new set on each call)."""
    return cast(Iterable[Any], array.sharding._internal_device_list)


def make_error_like(array: Any, message: str) -> Any:
    """An array of ``array``'s shape, dtype and sharding whose buffers hold ``message``."""
    import jax
    from jax.experimental import transfer

    return transfer.make_error_array(jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=array.sharding), message)


def proxied(array: Any) -> bool:
    """Whether ``array`` lives behind JAX's IFRT proxy client (runtime ``proxy/...``)."""
    devices = cast(Any, devices_of(array))
    return bool(devices) and proxied_device(next(iter(devices)))


def proxied_device(device: Any) -> bool:
    """Whether ``device`` is one of JAX's IFRT proxy client (runtime ``proxy/...``)."""
    return str(getattr(device.client, "runtime_type", "")).startswith("proxy")


def set_cpp_min_log_level(level: int) -> None:
    """XLA's C++ log threshold for this process (0 info .. 3 fatal only).

    Private (``jax._src.lib.utils``): JAX sets it only through ``jax_logging_level``,
    which also reconfigures JAX's Python loggers. The local server's session uses it:
    the proxy client logs every error it forwards (a lost array's ``DATA_LOSS``, a dead
    server) to stderr, which the kernel shows in cells, while the user sees the error
    itself where it is raised.
    """
    from jax._src.lib import utils  # type: ignore[attr-defined]

    utils.absl_set_min_log_level(level)


def replace_buffers(array: Any, other: Any) -> None:
    """Make ``array`` (the same Python object) use ``other``'s buffers
    (``ArrayImpl._replace_with``; shape, dtype and sharding must match)."""
    array._replace_with(other)


def alias(array: Any) -> Any:
    """A new array object on ``array``'s buffers, for reading them to the host.

    A host read (``copy_to_host_async``, ``np.asarray``, ``addressable_shards``)
    caches one single-device array per shard on the array read, live as long
    as it is (``jax.live_arrays()`` lists them, a loss counts them); reading an
    alias leaves those on the alias, which dies after the read. Where the
    shims are off (``fault_injection_unsupported``), and for an array of a
    proxy client (which cannot make error arrays), ``array`` itself.
    """
    if fault_injection_unsupported() or proxied(array):
        return array
    view = make_error_like(array, "alias")
    replace_buffers(view, array)
    return view


def concatenate_by_mesh_axis(
    arrays: list[tuple[Any, ...]],
    mesh_axis_idx: int,
    mesh_axis_sizes: tuple[int, ...],
    mesh_axis_sections: list[int],
    out_shardings: list[Any],
) -> list[Any] | None:
    """Join each ``arrays[i]`` (one array per mesh block, in block order, all sharded on
    dimension 0 along mesh axis ``mesh_axis_idx``) into one array on ``out_shardings[i]``,
    without copying, donating the inputs; ``None`` where this jaxlib lacks it.

    Private (``jaxlib._pathways._concatenate_by_mesh_axis``, jaxlib >= 0.10.0, what
    pathwaysutils' ``concatenate_by_mesh_axis`` calls; importing pathwaysutils costs
    ~0.7 s): one IFRT ``RemapArrays`` for all the arrays, where the public
    ``jax.make_array_from_single_device_arrays`` takes one disassemble per input
    and one assemble per output (requests each, behind the proxy client).
    """
    try:
        from jaxlib import _pathways  # type: ignore[attr-defined]

        concatenate = _pathways._concatenate_by_mesh_axis
    except (ImportError, AttributeError):
        return None
    return cast(
        list[Any],
        concatenate(
            arrays=arrays,
            sharded_dim_idxs=[0] * len(arrays),
            mesh_axis_sizes=mesh_axis_sizes,
            mesh_axis_idx=mesh_axis_idx,
            mesh_axis_sections=mesh_axis_sections,
            out_shardings=out_shardings,
            donate=True,
        ),
    )


# -- profiler -------------------------------------------------------------------
def stop_trace_in_memory() -> bytes | None:
    """Stop the trace ``jax.profiler.start_trace`` began and return it as a serialized
    XSpace, writing nothing.

    ``jax.profiler.stop_trace`` would also convert the trace to a
    ``trace.json.gz`` (which XProf does not read) and write both files, about
    half of its time. Relies on ``jax._src.profiler._profile_state`` (its
    ``lock``, ``profile_session`` and ``reset``) holding the
    ``jaxlib._profiler.ProfilerSession`` that ``start_trace`` made, whose
    ``stop()`` collects the trace and returns the XSpace bytes.

    Returns:
      The XSpace bytes, or ``None`` with the trace still running (jax/jaxlib
      outside ``TESTED_JAX``, or those parts not found): the caller then stops
      it with ``jax.profiler.stop_trace``.

    Raises:
      RuntimeError: no trace runs (as ``jax.profiler.stop_trace``).
    """
    jax_version, jaxlib_version = installed_versions()
    if not (_in_tested_range(jax_version) and _in_tested_range(jaxlib_version)):
        return None
    try:
        from jax._src import profiler

        state = profiler._profile_state
        lock, clear_metadata = state.lock, profiler.clear_metadata
    except (ImportError, AttributeError):
        return None
    with lock:
        session = getattr(state, "profile_session", None)
        if session is None:
            raise RuntimeError("No profile started")
        if not hasattr(session, "stop"):
            return None
        xspace: bytes = session.stop()
        state.reset()
        clear_metadata()
    return xspace
