"""What pathways_kernel installs on one IPython shell, in one object that removes it all.

``of(shell)`` is the shell's one ``ShellHooks``: the cell hooks registered
through it (``register``), its typed components (the healer, the autosnapshot
hook, the goodput cell hooks: ``component``) and the undo of every other change
(``on_close``: the magics, the exception handler, the monitor's comm target).
``remove(shell)`` (``%unload_ext pathways_kernel``) closes it: the shell is left
as it was, with nothing of ours on it. The shell itself carries no attribute of
ours: the objects are kept here, by a weak reference to the shell.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")


class ShellHooks:
    """The hooks of one shell; see the module doc."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._lock = threading.RLock()
        self._registered: list[tuple[str, Callable[..., Any]]] = []
        self._components: dict[type, object] = {}
        self._undo: list[Callable[[], None]] = []

    def register(self, event: str, callback: Callable[..., Any]) -> None:
        """Register ``callback`` on the shell's ``event`` (``pre_run_cell``, ...) once."""
        with self._lock:
            if (event, callback) not in self._registered:
                self.shell.events.register(event, callback)
                self._registered.append((event, callback))

    def unregister(self, event: str, callback: Callable[..., Any]) -> None:
        with self._lock:
            if (event, callback) in self._registered:
                self._registered.remove((event, callback))
                self.shell.events.unregister(event, callback)

    def component(self, kind: type[T], factory: Callable[[ShellHooks], T]) -> T:
        """The shell's one ``kind``, made by ``factory(self)`` on first use."""
        with self._lock:
            found = self._components.get(kind)
            if found is None:
                found = self._components[kind] = factory(self)
            return cast(T, found)

    def on_close(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the hooks are removed (in reverse order of ``on_close`` calls)."""
        with self._lock:
            self._undo.append(undo)

    def close(self) -> None:
        with self._lock:
            undo, self._undo = self._undo, []
            registered, self._registered = self._registered, []
            self._components.clear()
        for step in reversed(undo):
            step()
        for event, callback in reversed(registered):
            self.shell.events.unregister(event, callback)


_hooks: weakref.WeakKeyDictionary[Any, ShellHooks] = weakref.WeakKeyDictionary()
_hooks_lock = threading.Lock()


def of(shell: Any) -> ShellHooks:
    """The one ``ShellHooks`` of ``shell``, made on first use."""
    with _hooks_lock:
        hooks = _hooks.get(shell)
        if hooks is None:
            hooks = _hooks[shell] = ShellHooks(shell)
        return hooks


def installed(shell: Any) -> bool:
    """Whether anything of ours is on ``shell``."""
    with _hooks_lock:
        return shell in _hooks


def remove(shell: Any) -> None:
    """Remove everything of ours from ``shell`` (nothing if there is none)."""
    with _hooks_lock:
        hooks = _hooks.pop(shell, None)
    if hooks is not None:
        hooks.close()
