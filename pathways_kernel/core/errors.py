"""The one family of user-facing errors.

Every failure a user can cause or fix (bad input, a backend that cannot be
reached, a refused operation) raises a ``PathwaysError`` subclass whose message
says what failed and what to do. The kernel and ``%load_ext pathways_kernel``
show these as a single line; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


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
