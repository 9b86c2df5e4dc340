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

from ipykernel.ipkernel import IPythonKernel

from pathways_kernel import __version__
from pathways_kernel.core.errors import PathwaysError, one_line


class PathwaysKernel(IPythonKernel):
    implementation = "pathways_kernel"
    implementation_version = __version__
    banner = "Pathways (JAX): one JAX client over every slice. %pathways --help to start."

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]  # ipykernel's __init__ carries no annotations
        import pathways_kernel
        from pathways_kernel.core.sessions import session

        shell = self.shell
        assert shell is not None  # IPythonKernel.__init__ made it
        # Loaded as `%load_ext` would, so `%unload_ext pathways_kernel` takes it all off again.
        shell.extension_manager.load_extension("pathways_kernel")
        shell.user_ns.setdefault("pw", pathways_kernel)
        # Activate (configure JAX for) the backend now; devices start lazily.
        try:
            session()
        except PathwaysError as exc:
            # Start anyway: a wrong proxy address must not cost the kernel.
            from pathways_kernel.backends.connection import NOTICE

            self.log.error(one_line(exc))
            NOTICE.post(
                f"The kernel started without a backend. {one_line(exc)}. `%pathways connect local:2x4` starts a local Pathways server, `%pathways connect embedded:2x4` emulates the slices in this process."
            )
        from pathways_kernel.server import launch

        launch.discard_early()  # the server started before the imports, if the session did not take it
        from pathways_kernel.state import compile_cache

        compile_cache.from_env()  # the kernelspec's --compile-cache, if any

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
