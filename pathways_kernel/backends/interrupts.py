"""After an interrupted cell, the work it left queued on the local Pathways server is dropped.

Jupyter's interrupt stops the cell's Python at once, but a loop that never read its results has
handed the server many executions, and the next cell's first request would wait behind all of
them (44.9 s seen for a tiny op). Once a cell ends with ``KeyboardInterrupt`` the kernel tells
the server (``server_client.cancel``): what it has not started is dropped, its outputs read as
CANCELLED. What XLA already runs cannot be stopped; the kernel says in one line how much that is.
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
    """IPython ``post_run_cell``: cancel the server's queued work if the cell was interrupted."""
    if not isinstance(getattr(result, "error_in_exec", None), KeyboardInterrupt):
        return
    running = cancel_queued()
    if running:
        print(
            f"pathways: interrupted: the local Pathways server dropped the work this cell had queued; "
            f"up to {running} executions it had started run to the end first (the next cell waits for them)",
            file=sys.stderr,
        )


def install(shell: Any) -> None:
    """Cancel an interrupted cell's queued work when the cell ends (once per shell)."""
    shellhooks.of(shell).register("post_run_cell", after_cell)
