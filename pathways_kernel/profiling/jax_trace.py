"""``jax.profiler.trace(DIR)`` on ``local:``: a local directory traces the server and the kernel.

pathwaysutils routes ``jax.profiler.start_trace``, ``stop_trace`` and ``trace`` through
its own ``start_trace``/``stop_trace`` (``monkey_patch_jax``), which refuse any directory
but ``gs://``: right on GKE, where Pathways' workers write their traces far from the
client, wrong on ``local:``, whose server runs on this machine and writes its trace into
the same local directory (``server/plugins.py``) as ``%%pathways profile`` has it do.

``install()`` (once a session on the local server starts) replaces those two functions
in pathwaysutils' module, which its patches of ``jax.profiler`` call: while the session
runs on the local server, a local directory gets the same profile request, without the
``gs://`` check, and ``stop_trace`` returns once the server's trace is written too; a
``gs://`` directory there is one line saying what to use. Any other backend gets
pathwaysutils' own functions, unchanged.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from pathlib import Path
from typing import Any

from pathways_kernel.backends import proxy
from pathways_kernel.backends.local_server import LocalServerBackend
from pathways_kernel.core import sessions
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.server_protocol import SERVER_TRACE

#: Where jax.profiler and the Pathways workers put one run under a log dir.
RUNS_DIR = "plugins/profile"
#: Seconds ``stop_trace`` waits for the server's trace after asking it to stop: the client
#: does not wait for a profile request's result, so the server may still be writing it.
SERVER_TRACE_WAIT_S = 30.0

_lock = threading.Lock()
_installed: dict[str, Any] = {}  # pathwaysutils' own start_trace and stop_trace, once replaced
_server_trace: list[Path] = []  # the server's trace file of the trace running on the local server


class TraceDirError(PathwaysError, ValueError):
    """A trace directory this backend cannot write to (a ``ValueError``, as pathwaysutils' own)."""


def on_local_server() -> bool:
    """Whether this process's session runs on the local server (never starts one)."""
    current = sessions.current()
    return current is not None and isinstance(current.backend, LocalServerBackend)


def install() -> None:
    """Replace pathwaysutils' ``start_trace``/``stop_trace`` (once per process)."""
    from pathwaysutils import profiling

    with _lock:
        if _installed:
            return
        _installed.update(start_trace=profiling.start_trace, stop_trace=profiling.stop_trace)
        profiling.start_trace = start_trace
        profiling.stop_trace = stop_trace


def _follow(session: sessions.Session) -> None:
    if isinstance(session.backend, LocalServerBackend):
        # Once pathwaysutils is initialized: by the backend's activate, or after a kernel's start.
        proxy.after_pathwaysutils(install)


def start_trace(
    log_dir: os.PathLike[str] | str,
    *,
    create_perfetto_link: bool = False,
    create_perfetto_trace: bool = False,
    profiler_options: Any = None,
    max_num_hosts: int = 1,
) -> Any:
    """pathwaysutils' ``start_trace``; on the local server, into a local directory."""
    if not on_local_server():
        return _installed["start_trace"](
            log_dir,
            create_perfetto_link=create_perfetto_link,
            create_perfetto_trace=create_perfetto_trace,
            profiler_options=profiler_options,
            max_num_hosts=max_num_hosts,
        )
    import jax
    from pathwaysutils import profiling

    text = os.fspath(log_dir)
    if "://" in text:
        raise TraceDirError(
            f"cannot trace into {text} on {sessions.session().backend.spec}: its Pathways server runs on this machine and "
            "writes traces to a local directory: use jax.profiler.trace('/tmp/trace') (or %%pathways profile); "
            "gs:// is for Pathways on GKE"
        )
    # Absolute: the server's working directory is not the kernel's.
    directory = os.path.abspath(os.path.expanduser(text))
    options = jax.profiler.ProfileOptions() if profiler_options is None else profiler_options
    if not options.session_id:
        options.session_id = datetime.datetime.now().strftime("%Y_%m_%d_%H_%M_%S")
    profiling._start_pathways_trace_from_profile_request(
        profiling._create_profile_request(directory, options, max_num_hosts=max_num_hosts)
    )
    try:
        started = profiling._original_start_trace(
            directory,
            create_perfetto_link=create_perfetto_link,
            create_perfetto_trace=create_perfetto_trace,
            profiler_options=options,
        )
    except Exception:
        with profiling._profile_state.lock:
            try:
                profiling._profile_state.call_profile_executable()  # the server stops its trace
            finally:
                profiling._profile_state.reset()
        raise
    _server_trace[:] = [Path(directory) / RUNS_DIR / options.session_id / SERVER_TRACE]
    return started


def stop_trace() -> Any:
    """pathwaysutils' ``stop_trace``; on the local server, once the server's trace is written too."""
    try:
        return _installed["stop_trace"]()
    finally:
        waiting, _server_trace[:] = list(_server_trace), []
        for path in waiting:
            wait_for(path)


def wait_for(server_trace: Path) -> None:
    """Return once the local server has written ``server_trace``, within ``SERVER_TRACE_WAIT_S``.

    Raises:
      PathwaysError: not there in time (the trace then has the kernel's side only).
    """
    deadline = time.monotonic() + SERVER_TRACE_WAIT_S
    while not server_trace.exists():
        if time.monotonic() > deadline:
            raise PathwaysError(
                f"the local Pathways server did not write its trace to {server_trace} within "
                f"{SERVER_TRACE_WAIT_S:g} s: the trace has the kernel's side only"
            )
        time.sleep(0.05)


sessions.on_start(_follow)
if on_local_server():
    proxy.after_pathwaysutils(install)
