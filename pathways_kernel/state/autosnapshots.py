"""Autosnapshot: after each cell, snapshot the notebook variables that changed.

A variable is a name in the user namespace whose value is a pytree holding
jax arrays. Arrays are immutable, so "changed" means "bound to other array
objects than at the last snapshot". Each is filed in the session's snapshot
store under its own name, which is what notebook healing restores from after
a slice is lost between cells. ``max_bytes`` bounds the host memory these
snapshots may hold (the store keeps ``keep`` per name); a variable that does
not fit is skipped and listed in the status.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pathways_kernel.core import sessions, shellhooks
from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.text import count
from pathways_kernel.state import snapshots


@dataclasses.dataclass
class AutoStatus(TextDisplay):
    on: bool
    max_bytes: int | None
    names: list[str]
    skipped: list[str]
    held_bytes: int

    def to_text(self) -> str:
        if not self.on:
            return "autosnapshot off"
        limit = "no limit" if self.max_bytes is None else f"at most {format_bytes(self.max_bytes)}"
        text = f"autosnapshot on ({limit}); {count(len(self.names), 'variable')} held, {format_bytes(self.held_bytes)}"
        if self.skipped:
            text += f"; skipped (too large): {', '.join(self.skipped)}"
        return text

    def __repr__(self) -> str:
        return self.to_text()


class AutoSnapshot:
    """The post-run-cell hook of one IPython shell."""

    def __init__(self, hooks: shellhooks.ShellHooks):
        self.shell = hooks.shell
        self._hooks = hooks
        self.max_bytes: int | None = None
        self.on = False
        self._seen: dict[str, tuple[int, ...]] = {}
        self.skipped: list[str] = []

    def enable(self, max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise PathwaysError(f"--max-bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        if not self.on:
            self._hooks.register("post_run_cell", self.after_cell)
            self.on = True

    def disable(self) -> None:
        if self.on:
            self._hooks.unregister("post_run_cell", self.after_cell)
            self.on = False

    def after_cell(self, result: Any = None) -> None:
        # Without a backend (unreachable at start) no device holds anything, and starting
        # a session here would retry that backend after every cell.
        if sessions.current() is not None:
            self.run(self.shell.user_ns)

    def run(self, namespace: dict[str, Any]) -> list[snapshots.Snapshot]:
        """Snapshot the changed variables of ``namespace``; returns the snapshots started."""
        import jax

        store = snapshots.store()
        taken = []
        self.skipped = []
        for name, value in snapshots.device_values(namespace).items():
            leaves = [leaf for leaf in jax.tree.leaves(value) if isinstance(leaf, jax.Array)]
            ids = tuple(id(leaf) for leaf in leaves)
            if self._seen.get(name) == ids:
                continue
            if any(leaf.is_deleted() or snapshots.is_known_lost(leaf) for leaf in leaves):
                continue
            nbytes = sum(leaf.nbytes for leaf in leaves)
            if self.max_bytes is not None:
                held = sum(s.nbytes for s in store.list() if s.name in self._seen and s.name != name)
                if held + nbytes * store.keep > self.max_bytes:
                    self.skipped.append(name)
                    continue
            try:
                taken.append(store.snap(value, name))
            except Exception as error:
                # A value we cannot read (lost slice, deleted buffer) has nothing to snapshot.
                if not isinstance(error, (jax.errors.JaxRuntimeError, RuntimeError, PathwaysError)):
                    raise
                continue
            self._seen[name] = ids
        return taken

    def status(self) -> AutoStatus:
        store = snapshots.store()
        held = [s for s in store.list() if s.name in self._seen]
        return AutoStatus(
            self.on, self.max_bytes, sorted({s.name for s in held}), list(self.skipped), sum(s.nbytes for s in held)
        )


def _shell() -> Any:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise PathwaysError("autosnapshot needs an IPython shell (a notebook or ipython); call pw.snapshot() instead")
    return shell


def autosnapshot(on: bool = True, max_bytes: int | None = None) -> AutoStatus:
    """Turn snapshot-after-every-cell on or off; returns the status.

    Args:
      on: whether to snapshot changed jax variables after each cell.
      max_bytes: host bytes these snapshots may hold in all (``None``: no limit).
    """
    shell = _shell()
    auto = for_shell(shell)
    if on:
        auto.enable(max_bytes)
    else:
        auto.disable()
    return auto.status()


def for_shell(shell: Any) -> AutoSnapshot:
    """The autosnapshot hook of ``shell`` (created off on first use; ``shellhooks.remove`` removes it)."""
    return shellhooks.of(shell).component(AutoSnapshot, AutoSnapshot)
