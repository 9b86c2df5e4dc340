"""Every patch of ipykernel's API, in one place; each returns its undo.

Written for ipykernel >=7.1,<8 (the pin in pyproject.toml: 7 brought subshells):

* ``keep_the_cell_busy``: the private ``Kernel._publish_status``, so the
  kernel's status stays the truth while a cell runs (docs/architecture.md, trap 4);
* ``before_shell_handler``: a handler of ``Kernel.shell_handlers`` (the
  monitor counts a ``comm_info_request`` as hearing from a frontend).

The monitor installs both through the shell's ``ShellHooks``
(``monitoring/comm.py``), so ``%unload_ext`` gives the kernel its own back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol


class MainShell(Protocol):
    """Where the request the main shell runs is kept (``comm.MonitorServer``)."""

    #: The request the main shell runs, between its busy and its idle; None while it is idle.
    main_shell_parent: dict[str, Any] | None


#: Requests whose status JupyterLab and jupyter_server do not take as the kernel's
#: (jupyter_server's default ``untracked_message_types`` that reach a kernel).
_UNTRACKED = frozenset(
    {"comm_info_request", "kernel_info_request", "debug_request", "shutdown_request", "interrupt_request"}
)
#: Orders a re-asserted busy before the running cell's own idle.
_status_lock = threading.Lock()


def keep_the_cell_busy(kernel: Any, main_shell: MainShell) -> Callable[[], None]:
    """After an idle published off the main shell while it runs a cell, publish the cell's busy again.

    Every request keeps its own busy/idle pair. But JupyterLab (services 7.6,
    ``_handleMessage``) and jupyter_server take every IOPub status as the kernel's,
    whatever request it answers: the idle of a monitor request handled on its subshell
    (a click on "fail" while a cell runs), of the control channel creating that subshell
    (a panel attaching mid-cell) or of a widget's comm would show the kernel Idle while
    the cell still runs. A busy whose parent is the running request follows such an idle
    at once, so the last status is the truth again.

    The main shell's own busy and idle say whether it runs a request (and which one):
    ``main_shell.main_shell_parent``.

    Returns the undo: the kernel's own ``_publish_status`` back.
    """
    publish = kernel._publish_status
    own = "_publish_status" in vars(kernel)  # already set on this kernel (not ipykernel's method)

    def _publish_status(status: str, channel: str, parent: dict[str, Any] | None = None) -> None:
        parent = parent or kernel.get_parent(channel)
        on_main = threading.current_thread() is threading.main_thread()
        with _status_lock:
            publish(status, channel, parent)
            if on_main and channel == "shell" and status in ("busy", "idle"):
                main_shell.main_shell_parent = parent if status == "busy" else None
            elif (
                status == "idle"
                and not on_main
                and main_shell.main_shell_parent
                and (parent.get("header") or {}).get("msg_type") not in _UNTRACKED
            ):
                publish("busy", "shell", main_shell.main_shell_parent)

    kernel._publish_status = _publish_status

    def undo() -> None:
        if own:
            kernel._publish_status = publish
        else:
            del kernel._publish_status  # ipykernel's method again

    return undo


def before_shell_handler(kernel: Any, msg_type: str, before: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
    """Call ``before(parent)`` ahead of the kernel's own handler of ``msg_type`` requests."""
    handler = kernel.shell_handlers[msg_type]

    def handle(stream: Any, ident: Any, parent: dict[str, Any]) -> Any:
        before(parent)
        return handler(stream, ident, parent)

    kernel.shell_handlers[msg_type] = handle

    def undo() -> None:
        kernel.shell_handlers[msg_type] = handler

    return undo
