"""The one family of user-facing errors.

Every failure a user can cause or fix (bad input, a backend that cannot be
reached, a refused operation) raises a ``PathwaysError`` subclass whose message
says what failed and what to do. The kernel and ``%load_ext pathways_kernel``
show these as a single line; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools


class PathwaysError(Exception):
    """Base class: a failure the user can act on, shown as one line."""


class SpecError(PathwaysError, ValueError):
    """A backend spec such as ``local:2x4`` could not be parsed."""


class MeshError(PathwaysError, ValueError):
    """A mesh shape or axis list does not fit the live devices."""


class NamespaceError(PathwaysError):
    """Binding a name into the user namespace would clobber something."""


class BackendError(PathwaysError, RuntimeError):
    """The backend refused an operation or could not be reached."""


class NotSupportedError(PathwaysError):
    """The operation exists, but not on the current backend."""


class StorageError(PathwaysError, OSError):
    """Cloud Storage or a local path refused, lost or could not hold the data."""


def one_line(exc: BaseException) -> str:
    """Render ``exc`` as the single line a user sees."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def slice_down_error(message: str) -> PathwaysError:
    """A one-line ``SliceDownError``: a ``PathwaysError`` that is also the runtime's
    ``jax.errors.JaxRuntimeError``, so that code recovering from a lost slice
    (pathwaysutils' ``is_error_due_to_slice_down``, the elastic loop) still sees
    one. ``message`` must name ``DATA_LOSS`` for that classification.
    """
    return _slice_down_type()(message)  # type: ignore[no-any-return]


@functools.cache
def _slice_down_type() -> type:
    # Built on first use: this module imports nothing of JAX.
    import jax

    return type(
        "SliceDownError",
        (PathwaysError, jax.errors.JaxRuntimeError),
        {
            "__module__": __name__,
            "__doc__": "Work met a lost slice; the message says what to do (see slice_down_error).",
        },
    )
