"""Progress bars in the notebook for transfers that take more than a second.

A view over ``transfers``: when a transfer starts on the kernel's main thread
(inside a cell) an empty output is reserved in that cell; a daemon thread
per transfer turns it into a progress bar once the transfer has run for
``THRESHOLD_S`` and into a one-line summary (or the failure) when it ends.
Updates go through IPython display ids, which the frontend applies wherever
the output is, even after the cell has finished (the upload is async).
"""

from __future__ import annotations

import contextvars
import html
import threading
import time
from collections.abc import Callable
from typing import Any

from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.sessions import Session
from pathways_kernel.state import transfers

THRESHOLD_S = 1.0
INTERVAL_S = 0.25


def follow(session: Session) -> Callable[[], None]:
    """Show progress for ``session``'s transfers started inside this IPython kernel; returns the undo."""
    return session.component(transfers.TransferStarts).subscribe(_watch)


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _watch(transfer: transfers.Transfer) -> None:
    if threading.current_thread() is not threading.main_thread() or not _in_kernel():
        return
    from IPython.display import display

    handle = display({"text/plain": ""}, raw=True, display_id=True)
    # The cell's context goes with the thread, so updates carry that cell as their parent.
    context = contextvars.copy_context()
    threading.Thread(
        target=context.run, args=(_follow, transfer, handle), name="pathways-progress", daemon=True
    ).start()


def _follow(transfer: transfers.Transfer, handle: Any) -> None:
    while not transfer.done():
        time.sleep(INTERVAL_S)
        if not transfer.done() and transfer.elapsed_s() >= THRESHOLD_S:
            handle.update(render(transfer), raw=True)
    handle.update(render(transfer), raw=True)


def render(transfer: transfers.Transfer) -> dict[str, str]:
    """A MIME bundle: an HTML bar while running, a summary line when done."""
    text = transfer.summary()
    if transfer.done():
        color = "var(--jp-error-color1, #c00)" if transfer.exception() is not None else "inherit"
        return {
            "text/plain": text,
            "text/html": f'<div class="pathways-transfer" style="color:{color}">{html.escape(text)}</div>',
        }
    fraction = transfer.done_bytes / transfer.total if transfer.total else 0.0
    bar = (
        f'<div class="pathways-transfer"><progress max="1" value="{fraction:.3f}" style="width:18em"></progress> '
        f"{html.escape(transfer.kind)} {html.escape(transfer.what)}: {100 * fraction:.0f}% "
        f"({format_bytes(transfer.done_bytes)} of {format_bytes(transfer.total)}, {transfer.throughput()})</div>"
    )
    return {"text/plain": text, "text/html": bar}
