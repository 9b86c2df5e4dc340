"""The Pathways kernel: an ipykernel that hosts the session's single JAX client.

It loads the ``%pathways`` magics and activates the kernelspec's backend at
start, so that a plain ``jax.devices()`` in the first cell already sees the
session's slices.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ipykernel.ipkernel import IPythonKernel

from pathways_kernel import __version__
from pathways_kernel.core.errors import PathwaysError, one_line

if TYPE_CHECKING:
    from pathways_kernel.profiling.hold import ProfilerHold


class PathwaysKernel(IPythonKernel):
    implementation = "pathways_kernel"
    implementation_version = __version__
    banner = "Pathways (JAX): one JAX client over every slice. %pathways --help to start."

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]  # ipykernel's __init__ carries no annotations
        import pathways_kernel

        shell = self.shell
        assert shell is not None  # IPythonKernel.__init__ made it
        # Loaded as `%load_ext` would, so `%unload_ext pathways_kernel` takes it all off again.
        shell.extension_manager.load_extension("pathways_kernel")
        shell.user_ns.setdefault("pw", pathways_kernel)
        from pathways_kernel.backends import default_start_label

        label = default_start_label()
        if label is None:
            _PATHWAYSUTILS_READY.set()  # initialized in the backend's activate, as without a kernel
            _activate(self.log)  # configure JAX for the backend now, before the first cell
        else:
            # The local server (started before the imports) comes up beside the kernel, which answers
            # the frontend meanwhile and says how far the start is (core/startup.py); a cell waits for it.
            from pathways_kernel.backends import server_client
            from pathways_kernel.core import startup

            startup.begin(label, startup.LOCAL_SERVER_STEPS, started=server_client.early_started())
            threading.Thread(target=_activate, args=(self.log,), name="pathways-backend-start", daemon=True).start()
        from pathways_kernel.state import compile_cache

        compile_cache.from_env()  # the kernelspec's --compile-cache, if any

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        """Runs the cell once the backend has started (at kernel start the local server may not be up yet)."""
        if not _wait_for_start(silent):
            sys.stderr.write(f"KeyboardInterrupt: {_INTERRUPTED}\n")
            return {
                "status": "error",
                "execution_count": self.execution_count,
                "ename": "KeyboardInterrupt",
                "evalue": _INTERRUPTED,
                "traceback": [],
            }
        # ipykernel's do_execute carries no annotations: its reply is the execute_reply's content.
        reply: dict[str, Any] = await super().do_execute(  # type: ignore[no-untyped-call]
            code, silent, store_history, user_expressions, allow_stdin, cell_meta=cell_meta, cell_id=cell_id
        )
        return reply

    # IPythonKernel's do_shutdown is synchronous, its base Kernel's a coroutine (ipykernel awaits
    # the reply only if it is awaitable): this overrides IPythonKernel's.
    def do_shutdown(self, restart: bool) -> dict[str, object]:  # type: ignore[override]
        """Stop what runs beside the cells before the interpreter ends.

        Open monitor views get ``closed: shutdown``; the session closes (telemetry,
        Slurm watches, the backend, a shared service's proxy job) and the Slurm jobs this
        kernel submitted are cancelled, so no thread of ours is inside jaxlib when Python
        stops its threads, and nothing is left for the exit to wait on.
        """
        from pathways_kernel.core import sessions
        from pathways_kernel.monitoring import comm

        comm.server().close_all()
        current = sessions.current()
        if current is not None:
            try:
                current.close()
            except Exception:
                self.log.exception("pathways: closing the session at shutdown failed")
        # Jobs this kernel submitted are cancelled here, not by their atexit hook: the exit
        # below leaves with os._exit, which runs no atexit hook.
        from pathways_kernel.backends import slurm

        slurm.cancel_submitted()
        # ipykernel's do_shutdown carries no annotations: its reply is {"status": "ok", "restart": ...}.
        reply: dict[str, object] = super().do_shutdown(restart)  # type: ignore[no-untyped-call]
        # Registered last, so the first handler to run at exit, once ipykernel has sent its reply.
        atexit.register(_leave_now, self.shell)
        return reply


_INTERRUPTED = "interrupted while the local Pathways server was starting: the cell did not run (run it again)"
#: Set once pathwaysutils' profiling hooks are in (or were not deferred): jax.profiler waits for it.
_PATHWAYSUTILS_READY = threading.Event()
#: Seconds a jax.profiler call waits for pathwaysutils after the start (its import: 1-2 s, more under load).
_PATHWAYSUTILS_WAIT_S = 120.0
#: Seconds between the updates of the line under a cell that waits for the backend's start.
_WAIT_TICK_S = 1.0


def _activate(log: Any) -> None:
    """Starts the session's default backend; a failure is one line before the next cell, not a dead kernel."""
    from pathways_kernel.backends import proxy, server_client
    from pathways_kernel.core import startup
    from pathways_kernel.core.sessions import session

    error: str | None = "the start was cut short"
    deferred = not _PATHWAYSUTILS_READY.is_set()
    hold: ProfilerHold | None = None
    if deferred:
        proxy.defer_pathwaysutils()
    try:
        session()
        error = None
    except PathwaysError as exc:
        # Start anyway: a wrong proxy address must not cost the kernel.
        from pathways_kernel.backends.connection import NOTICE

        error = one_line(exc)
        log.error(error)
        NOTICE.post(
            f"The kernel started without a backend. {error}. `%pathways connect local:2x4` starts a local Pathways server, `%pathways connect embedded:2x4` emulates the slices in this process."
        )
    except Exception as exc:  # a bug: the cells that wait must not wait for ever
        error = one_line(exc)
        log.exception("pathways: starting the backend failed")
    finally:
        if deferred and error is None:
            hold = _hold_the_profiler(log)  # in before the first cell runs
        startup.finish(error)
        server_client.discard_early()  # the server started before the imports, if the session did not take it
    if not deferred:
        return
    # After the first cell may run: pathwaysutils' import (orbax, FastAPI) and its profiling hooks.
    try:
        if error is None:
            proxy.initialize_pathwaysutils()
        else:
            proxy.defer_pathwaysutils(False)  # a later connect initializes it, as without a kernel
    except Exception:
        log.exception("pathways: initializing pathwaysutils failed")
    finally:
        _PATHWAYSUTILS_READY.set()
        if hold is not None:
            hold.stop()


def _hold_the_profiler(log: Any) -> ProfilerHold | None:
    """Until pathwaysutils is in, a jax.profiler call waits for its hooks (``profiling/hold.py``)."""
    from pathways_kernel.profiling.hold import ProfilerHold

    hold = ProfilerHold(_PATHWAYSUTILS_READY, _wait_in_any_thread, _PATHWAYSUTILS_WAIT_S)
    try:
        hold.start()
    except Exception:  # a bug: the profiler then runs as it would have without the hold
        log.exception("pathways: holding jax.profiler for pathwaysutils failed")
        hold.stop()
        return None
    return hold


def _wait_for_start(silent: bool) -> bool:
    """Waits for the backend's start, under a line that counts the seconds (removed once it ends).

    Returns False when interrupted. The wait is bounded by the start's own bound (the server's
    120 s, the client's connect timeout), after which the start has ended, ready or failed.
    """
    from pathways_kernel.core import startup

    if not startup.starting():
        return True

    def line() -> str | None:
        progress = startup.wait(_WAIT_TICK_S)
        if progress is None or progress.state != startup.STARTING:
            return None
        return (
            f"waiting for the local Pathways server to start ({progress.elapsed_s:.0f} s)... "
            f"{progress.step} ({progress.done}/{len(progress.steps)})"
        )

    return _wait_under_a_line(line, silent)


def _wait_in_any_thread(line: Callable[[], str | None], done: Callable[[], str]) -> bool:
    """``_wait_under_a_line`` for a wait inside a running cell, whose output so far stays: the line
    becomes ``done()`` at the end. Library code may start it on a thread of its own, whose line would
    land in whichever cell ran last: there it waits without one."""
    return _wait_under_a_line(line, silent=threading.current_thread() is not threading.main_thread(), done=done)


def _wait_under_a_line(line: Callable[[], str | None], silent: bool, done: Callable[[], str] | None = None) -> bool:
    """Calls ``line`` (it waits up to a tick) until it returns None, showing each text it returns as
    one line under the cell, updated in place and at the end cleared (the cell's output), or with
    ``done`` made ``done()``. Returns False when interrupted."""
    from IPython.display import clear_output, display, update_display

    display_id = None
    try:
        while (text := line()) is not None:
            if silent:
                continue
            if display_id is None:
                display_id = display({"text/plain": text}, raw=True, display_id=True).display_id
            else:
                update_display({"text/plain": text}, raw=True, display_id=display_id)
    except KeyboardInterrupt:
        return False
    finally:
        if display_id is not None and done is None:
            clear_output()
        elif display_id is not None and done is not None:
            update_display({"text/plain": done()}, raw=True, display_id=display_id)
    return True


def _leave_now(shell: object) -> None:
    """End the process once the session is closed and the reply sent, without the teardown.

    What is left after ``do_shutdown`` is the interpreter's teardown: the proxy client's exit
    guard (1.5 s after the server it talked to went away), IPython's own exit (its history's
    last write, a reset and a full gc.collect) and JAX's clients. At load 20 with two CPU hogs
    that took 3.9-10.5 s of a local: kernel's exit, past jupyter_client's 5 s, after which it is
    SIGTERMed (issue #27 item 10). Nothing of ours runs by now, and the session's server is
    stopped: the cell history is written out, the streams flushed, and the process leaves.
    """
    history = getattr(shell, "history_manager", None)
    with contextlib.suppress(Exception):  # the history is a convenience; the exit must not wait on it
        if history is not None:
            history.writeout_cache()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(argv=argv, kernel_class=PathwaysKernel)
