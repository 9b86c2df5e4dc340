"""After an interrupted cell, the work it left queued on the local Pathways server is dropped.

Jupyter's interrupt stops the cell's Python at once, but a loop that never read its results has
handed the server many executions, and the next cell's first request would wait behind all of
them (44.9 s seen for a tiny op). Once a cell ends with ``KeyboardInterrupt`` the kernel tells
the server (``server_client.cancel``): what it has not started is dropped, its outputs read as
CANCELLED. What XLA already runs cannot be stopped; the kernel says in one line how much that is.
Before the drop, the steps the notebook's variables wait for finish, bounded (``settle.py``): a
loop's ``params`` stays readable.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from pathways_kernel.backends.local_server import LocalServerBackend
from pathways_kernel.core import sessions, shellhooks
from pathways_kernel.core.errors import PathwaysError, one_line

log = logging.getLogger("pathways_kernel")


def cancel_queued() -> int | None:
    """Drops what the session's local server has not started; returns the most executions still
    running on one device, or None if the session has no local server (or it is gone)."""
    from pathways_kernel.backends import server_client

    current = sessions.current()
    backend = current.backend if current is not None else None
    if not isinstance(backend, LocalServerBackend) or backend.server is None or backend.gone() is not None:
        return None
    try:
        running: int = server_client.cancel(backend.server.target)["running"]
    except PathwaysError as error:
        log.warning("pathways: cancelling the interrupted cell's work failed: %s", one_line(error))
        return None
    return running


def after_cell(result: Any = None) -> None:
    """IPython ``post_run_cell``: if the cell was interrupted, let the steps the notebook's variables
    wait for finish (bounded), then cancel the server's queued work."""
    if not isinstance(getattr(result, "error_in_exec", None), KeyboardInterrupt):
        return
    unready = _settle_variables(_before.copy())
    running = cancel_queued()
    if unready and running is not None:
        shown = ", ".join(unready[:3]) + (f" and {len(unready) - 3} more" if len(unready) > 3 else "")
        print(
            f"pathways: interrupted: {shown} not computed in time: the steps queued for them were dropped too "
            "(reading them says CANCELLED)",
            file=sys.stderr,
        )
    if running:
        print(
            f"pathways: interrupted: the local Pathways server dropped the work this cell had queued; "
            f"up to {running} executions it had started run to the end first (the next cell waits for them)",
            file=sys.stderr,
        )


#: The names of the notebook's variables and what they were bound to (``id()``s) when the cell began.
_before: dict[str, int] = {}


def before_cell(info: Any = None) -> None:
    """IPython ``pre_run_cell``: what the names are bound to, to tell what an interrupted cell bound."""
    from IPython import get_ipython

    from pathways_kernel.backends import settle

    shell = get_ipython()
    _before.clear()
    if shell is not None:
        _before.update(settle.identities(shell.user_ns))


def _settle_variables(before: dict[str, int]) -> list[str]:
    """Waits for the arrays of the notebook's variables on the session's live local server, the
    ones the cell bound (rebound since ``before``) first; returns the names the wait gave up on."""
    from IPython import get_ipython

    from pathways_kernel.backends import settle

    shell = get_ipython()
    current = sessions.current()
    backend = current.backend if current is not None else None
    if (
        shell is None
        or not isinstance(backend, LocalServerBackend)
        or backend.server is None
        or backend.gone() is not None
    ):
        return []
    now = settle.identities(shell.user_ns)
    bound = [name for name, identity in now.items() if before.get(name) != identity]
    return settle.settle(settle.variables_with_arrays(shell.user_ns, shell.user_ns_hidden), bound)


def install(shell: Any) -> None:
    """Cancel an interrupted cell's queued work when the cell ends (once per shell)."""
    shellhooks.of(shell).register("pre_run_cell", before_cell)
    shellhooks.of(shell).register("post_run_cell", after_cell)
