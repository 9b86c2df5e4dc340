"""Binding values into the notebook's user namespace, without clobbering."""

from __future__ import annotations

from typing import Any

from pathways_kernel.core.errors import NamespaceError


def user_namespace() -> dict[str, Any] | None:
    """The running IPython shell's namespace, or ``None`` outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return None if shell is None else shell.user_ns


def bind(name: str, value: Any, overwrite: bool = False) -> None:
    """Set ``name`` in the user namespace.

    A name that already holds a value of another type is refused unless
    ``overwrite``: a mesh must never silently replace the user's data.

    Raises:
      NamespaceError: bad identifier, clash, or no IPython shell.
    """
    if not name.isidentifier():
        raise NamespaceError(f"'{name}' is not a valid Python name")
    ns = user_namespace()
    if ns is None:
        raise NamespaceError(f"cannot bind '{name}': not running inside IPython; use the returned value instead")
    existing = ns.get(name)
    if name in ns and not overwrite and type(existing) is not type(value):
        raise NamespaceError(
            f"'{name}' already holds a value of type {type(existing).__name__}; choose another name or pass --overwrite"
        )
    ns[name] = value
