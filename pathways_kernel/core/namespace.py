"""Binding values into the notebook's user namespace, without clobbering."""

from __future__ import annotations

import builtins
import keyword
import types
from typing import Any

from pathways_kernel.core.errors import NamespaceError


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def user_namespace() -> dict[str, Any] | None:
    """The running IPython shell's namespace, or ``None`` outside IPython."""
    shell = _shell()
    return None if shell is None else shell.user_ns


def check_bindable(name: str, value: Any, overwrite: bool = False) -> None:
    """Raise ``NamespaceError`` unless ``bind(name, value, overwrite)`` would succeed.

    Lets a caller binding several names refuse them all before binding any.
    """
    shown = name if len(name) <= 60 else name[:60] + "..."
    if not name.isidentifier() or keyword.iskeyword(name):
        raise NamespaceError(f"'{shown}' is not a valid Python name; use letters, digits and '_' (not a keyword)")
    shell = _shell()
    if shell is None:
        raise NamespaceError(f"cannot bind '{name}': not running inside IPython; use the returned value instead")
    ns = shell.user_ns
    existing = ns.get(name)
    # Even --overwrite never replaces these: the notebook itself depends on them.
    if isinstance(existing, types.ModuleType):
        raise NamespaceError(
            f"'{name}' is the module {existing.__name__}; a module is never replaced: choose another name"
        )
    if name in getattr(shell, "user_ns_hidden", {}):
        raise NamespaceError(f"'{name}' belongs to IPython (In, Out, _, exit, ...); choose another name")
    if name not in ns and hasattr(builtins, name):
        raise NamespaceError(f"'{name}' would shadow the Python builtin {name}; choose another name")
    if name in ns and not overwrite and type(existing) is not type(value):
        raise NamespaceError(
            f"'{name}' already holds a value of type {type(existing).__name__}; choose another name or pass --overwrite"
        )


def bind(name: str, value: Any, overwrite: bool = False) -> None:
    """Set ``name`` in the user namespace.

    A name that already holds a value of another type is refused unless
    ``overwrite``: a mesh must never silently replace the user's data. A
    module (such as ``pw``), a name IPython owns (``In``, ``Out``, ``_``,
    ...), a builtin or a keyword is refused even with ``overwrite``.

    Raises:
      NamespaceError: bad identifier, clash, or no IPython shell.
    """
    check_bindable(name, value, overwrite)
    _shell().user_ns[name] = value
