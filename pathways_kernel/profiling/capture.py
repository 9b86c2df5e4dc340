"""Profiler captures of one cell or block: ``%%pathways profile`` and ``pw.profile``.

One capture at a time per process: XLA's profiler is process-wide, so a
second capture (nested, or from another thread) is refused, naming the one
that runs.

- Embedded backend: ``jax.profiler`` traces; the trace is summarized from
  memory and written, as the XSpace file XProf reads, into this session's
  directory under the profile root (``$PATHWAYS_PROFILE_DIR``, default
  ``~/.cache/pathways-kernel/profiles``). XProf in JupyterLab
  (``xprof_server``, behind jupyter-server-proxy) serves that root, where a
  capture is the run ``<session dir>/<capture>``.
- Proxy backend: pathwaysutils' Pathways profiling, which also asks the
  Pathways workers to trace and needs a ``gs://`` log dir (and honours its
  ``PATHWAYS_PROFILING_ALLOWED_GCS_BUCKETS`` allowlist).

Each capture is recorded as a ``profile`` event in the session's timeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pathways_kernel.backends.local_server import LocalServerBackend
from pathways_kernel.backends.proxy import ProxyBackend
from pathways_kernel.core import jaxcompat, locations, objectstore, storage_errors
from pathways_kernel.core.backend import Backend
from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.errors import PathwaysError, StorageError
from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.server_protocol import SERVER_TRACE
from pathways_kernel.core.sessions import session
from pathways_kernel.profiling import jax_trace  # jax.profiler.trace(DIR) on local: (installs itself)
from pathways_kernel.profiling import summary as summary_lib

if TYPE_CHECKING:
    from jax.profiler import ProfileOptions

ROOT_ENV = "PATHWAYS_PROFILE_DIR"
RUNS_DIR = jax_trace.RUNS_DIR
#: What pip installs XProf for the JupyterLab tab.
EXTRA = "pip install 'pathways-kernel[profile]'"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
#: jax.profiler.ProfileOptions.host_tracer_level: 0 off, 1 user annotations, 2 +high-level runtime, 3 verbose.
HOST_TRACER_LEVELS = (0, 1, 2, 3)
#: 1, not JAX's 2: the summary reads the same ops, compiles and gaps from it, and
#: on local:2x4 a traced step cost 1.06-1.12x an untraced one (median 1.067 over 5
#: runs of bench/profile.py) against 1.08-1.17x at 2 (median 1.13 over 4, two over
#: the 1.15 goal). Level 2 adds the runtime's own events to the trace viewer.
DEFAULT_HOST_TRACER_LEVEL = 1


class ProfileError(PathwaysError):
    """A capture was refused or could not be written or read."""


def profile_root() -> Path:
    """The directory every session's local captures go under (and XProf serves)."""
    configured = os.environ.get(ROOT_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "pathways-kernel" / "profiles"


@dataclasses.dataclass
class Capture(TextDisplay):
    """One finished (or running) capture; shows its summary and an "Open in XProf" button."""

    name: str  # as given (runs are named "<when>-<name>")
    log_dir: str  # what XProf's --logdir would be: the profile root, or the gs:// dir
    run: str  # XProf's run id under log_dir
    where: str  # the run directory holding the *.xplane.pb files
    backend: str
    started: float
    wall_s: float | None = None
    size: int | None = None
    error: str = ""  # why the body or the summary failed, if it did
    served: bool = False  # under the profile root, which XProf in JupyterLab serves
    _summary: summary_lib.Summary | None = dataclasses.field(default=None, repr=False)
    # The trace as it left the profiler, until summarized (or a newer capture ends):
    # parsing it again from the file would be the slowest part of the summary's wait.
    _xspace: bytes | None = dataclasses.field(default=None, repr=False)

    @property
    def local(self) -> bool:
        return not self.log_dir.startswith("gs://")

    def summary(self) -> summary_lib.Summary:
        """Read the trace and summarize it (once)."""
        if self._summary is None:
            xspaces = [self._xspace] if self._xspace is not None else _read_xspaces(self.where)
            self._summary = summary_lib.summarize(xspaces, self.name, _slice_of())
            self._xspace = None
        return self._summary

    def _shown_summary(self) -> summary_lib.Summary | None:
        """The summary, or None with ``error`` saying why it cannot be read (a display must not raise)."""
        if self.error:
            return None
        try:
            return self.summary()
        except PathwaysError as exc:
            self.error = f"no summary: {exc}"
            return None

    def to_text(self) -> str:
        head = f"{self.name}  {format_bytes(self.size or 0)}  {self.where}"
        shown = self._shown_summary()
        if shown is None:
            return f"{head}\n  {self.error}"
        return f"{shown.to_text()}\n  trace {head}"

    def _repr_html_(self) -> str:
        shown = self._shown_summary()
        body = html.escape(self.error) if shown is None else shown.html_rows()
        button = _open_button(self, "jp-Button jp-mod-styled jp-mod-small jp-mod-accept")
        return (
            f"<div class='pathways-profile'><div><b>profile {html.escape(self.name)}</b> · "
            f"{format_bytes(self.size or 0)} · <code>{html.escape(self.where)}</code> {button}</div>{body}</div>"
        )


def _slice_of() -> dict[int, int]:
    """Device id -> slice index, from the session's topology."""
    return {d.id: s.index for s in session().topology.slices for d in s.devices}


def slices_annotation(slice_of: dict[int, int]) -> str:
    """The span a capture puts under its own in the trace: which devices are which slice, since the
    trace viewer shows XLA:CPU's devices as threads of one process, not as slices."""
    members: dict[int, list[int]] = {}
    for device, index in sorted(slice_of.items()):
        members.setdefault(index, []).append(device)
    return summary_lib.SLICES_PREFIX + " | ".join(
        f"slice {i} = devices {','.join(map(str, ds))}" for i, ds in sorted(members.items())
    )


def xprof_path(run: str) -> str:
    """XProf's trace viewer for ``run``, at jupyter-server-proxy's ``/xprof/`` on a server at ``/``
    (in JupyterLab, xprof.ts opens it under the server's real base URL)."""
    from urllib.parse import urlencode

    # XProf's page computes its base URL from the "/data/plugin/profile" in its own path.
    return "/xprof/data/plugin/profile/?" + urlencode({"run": run, "tag": "trace_viewer"})


# -- the one capture slot -----------------------------------------------------
_lock = threading.Lock()
_running: Capture | None = None
_captures: list[Capture] = []
_session_dir: str | None = None


def captures() -> list[Capture]:
    """This process's captures, oldest first."""
    with _lock:
        return list(_captures)


def _claim(capture: Capture) -> None:
    global _running
    with _lock:
        if _running is not None:
            ago = time.time() - _running.started
            raise ProfileError(
                f"profile '{_running.name}' is still capturing (started {ago:.0f} s ago): one trace at a time, "
                "since XLA's profiler is process-wide; let it finish, then profile again"
            )
        _running = capture


def _release() -> None:
    global _running
    with _lock:
        _running = None


def _this_session_dir(root: str) -> str:
    """This kernel's directory under the profile root ``root``, named by when it first profiled
    (``YYYYmmdd-HHMMSS``; ``-2``, ``-3``... when another kernel took that second: made here,
    exclusively, so two kernels never share one). Runs are named ``<this>/<their own time>-<name>``,
    which notebooks save in their XProf links: nothing of the machine (it was ``-p<pid>``)."""
    global _session_dir
    with _lock:
        if _session_dir is None:
            _make_dir(root)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for n in range(1, 100):
                name = stamp if n == 1 else f"{stamp}-{n}"
                try:
                    os.mkdir(os.path.join(root, name), 0o700)
                except FileExistsError:
                    continue
                except OSError as exc:
                    raise ProfileError(
                        f"cannot write profiles there: cannot create {root}/{name}: {exc.strerror or exc}"
                    ) from None
                _session_dir = name
                break
            else:
                raise ProfileError(f"cannot write profiles there: {root}/{stamp} and 98 more names are taken")
        return _session_dir


# -- tracers ------------------------------------------------------------------
class Tracer(Protocol):
    """Traces one capture: where the trace is taken and written depends on the backend."""

    def start(self, log_dir: str, options: ProfileOptions) -> None: ...

    def stop(self) -> bytes | None:
        """The trace as a serialized XSpace, or ``None`` where the profiler wrote it itself."""
        ...


def _options(run_name: str, host_tracer_level: int, python_tracer: bool) -> ProfileOptions:
    import jax

    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = host_tracer_level
    options.python_tracer_level = 1 if python_tracer else 0
    options.session_id = run_name  # the run's directory name
    return options


class _JaxTracer:
    """The embedded backend: jax.profiler into a local directory."""

    def start(self, log_dir: str, options: ProfileOptions) -> None:
        import jax

        try:
            jax.profiler.start_trace(log_dir, profiler_options=options)
        except RuntimeError as exc:
            raise ProfileError(
                f"a JAX profiler trace is already running outside pw.profile ({summary_line(exc)}): "
                "end it with jax.profiler.stop_trace(), then profile again"
            ) from None

    def stop(self) -> bytes | None:
        """The trace as a serialized XSpace, or ``None`` where jax.profiler wrote it itself."""
        import jax

        xspace = jaxcompat.stop_trace_in_memory()
        if xspace is None:
            jax.profiler.stop_trace()
        return xspace


class _LocalServerTracer:
    """The local Pathways server: as a Pathways worker does, the server traces its own
    process (where the devices' work runs) into the capture's run directory, sent the
    profile request pathwaysutils sends, while the kernel traces its own. The server is
    on this machine, so a local directory does (pathwaysutils' own start_trace insists on
    gs://). Both traces are files of the run, and the summary reads them all."""

    def start(self, log_dir: str, options: ProfileOptions) -> None:
        from pathwaysutils import profiling

        request = profiling._create_profile_request(log_dir, options)
        try:
            profiling._start_pathways_trace_from_profile_request(request)
        except Exception as exc:
            raise ProfileError(
                f"the local Pathways server did not start tracing into {log_dir}: {summary_line(exc)}"
            ) from None
        self._run_dir = f"{log_dir}/{RUNS_DIR}/{options.session_id}"
        try:
            profiling._original_start_trace(log_dir, profiler_options=options)  # this process, unpatched
        except RuntimeError as exc:
            self._stop_server()
            raise ProfileError(
                f"a JAX profiler trace is already running outside pw.profile ({summary_line(exc)}): "
                "end it with jax.profiler.stop_trace(), then profile again"
            ) from None

    def stop(self) -> None:
        from pathwaysutils import profiling

        try:
            xspace = jaxcompat.stop_trace_in_memory()
            if xspace is None:
                profiling._original_stop_trace()
        finally:
            self._stop_server()
        if xspace is not None:
            _write_xspace(self._run_dir, xspace)
        # The client does not wait for a profile request's result, so the server may still be
        # writing its trace: the capture's size and summary need it there.
        try:
            jax_trace.wait_for(Path(self._run_dir) / SERVER_TRACE)
        except PathwaysError as exc:
            raise ProfileError(str(exc)) from None

    @staticmethod
    def _stop_server() -> None:
        from pathwaysutils import profiling

        try:
            with profiling._profile_state.lock:
                try:
                    profiling._profile_state.call_profile_executable()
                finally:
                    profiling._profile_state.reset()
        except Exception as exc:
            raise ProfileError(f"the local Pathways server did not stop tracing cleanly: {summary_line(exc)}") from None


class PathwaysTracer:
    """The proxy backend: pathwaysutils' profiling, which also traces the Pathways workers.

    ``start`` validates the gs:// dir against pathwaysutils' bucket allowlist,
    then sends the profile request to the workers as a plugin program through
    the IFRT proxy client. That call is as far as anything runs without a
    Pathways server.
    """

    def start(self, log_dir: str, options: ProfileOptions) -> None:
        from pathwaysutils import profiling

        try:
            profiling.start_trace(log_dir, profiler_options=options)
        except ValueError as exc:  # not gs://, or not in the allowlist
            raise ProfileError(f"cannot profile into {log_dir}: {exc}") from None
        except Exception as exc:
            raise ProfileError(
                f"the Pathways workers did not start tracing into {log_dir}: {summary_line(exc)}"
            ) from None

    def stop(self) -> None:
        """Stop the workers' trace (they write it to the gs:// dir)."""
        from pathwaysutils import profiling

        try:
            profiling.stop_trace()
        except Exception as exc:
            raise ProfileError(f"the Pathways workers did not stop tracing cleanly: {summary_line(exc)}") from None


def summary_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] + "..." if len(text) > 200 else text


def tracer_for(backend: Backend, logdir: str | None) -> tuple[Tracer, str, str]:
    """(tracer, XProf log dir, run prefix) for ``backend``, after checking the dir can be written."""

    served = isinstance(backend, LocalServerBackend)  # its server writes traces on this machine
    proxy = isinstance(backend, ProxyBackend) and not served
    chosen = logdir if logdir is not None else (os.environ.get(ROOT_ENV) if proxy else None)
    if proxy:
        if not chosen or not str(chosen).startswith("gs://"):
            raise ProfileError(
                f"on the proxy backend ({backend.spec}) the Pathways workers write traces to Cloud Storage: "
                "pass --logdir gs://BUCKET/PREFIX (or pw.profile(logdir=...), or set PATHWAYS_PROFILE_DIR)"
            )
    elif chosen and str(chosen).startswith("gs://"):
        raise ProfileError(
            f"gs:// profile dirs are for the proxy backend, whose workers write there; this session runs {backend.spec}, "
            "which traces into a local directory: drop --logdir (or give a local path)"
        )
    try:
        location = locations.parse_url(str(chosen) if chosen is not None else str(profile_root()))
        objectstore.objects_for(location).check(location)
    except StorageError as exc:
        raise ProfileError(f"cannot write profiles there: {exc}") from None
    if proxy:
        return PathwaysTracer(), location.url, ""
    tracer = _LocalServerTracer() if served else _JaxTracer()
    if logdir is not None:
        return tracer, location.url, ""
    return tracer, location.url, _this_session_dir(location.url)


def _make_dir(path: str) -> None:
    try:
        objectstore.private_dirs(path)  # a trace holds the program and its timings: its owner's only
    except OSError as exc:  # /proc, a name that is a file, a full or read-only disk
        raise ProfileError(f"cannot write profiles there: cannot create {path}: {exc.strerror or exc}") from None


def _write_xspace(run_dir: str, xspace: bytes) -> None:
    """Write the trace as jax.profiler names it (``<host>.xplane.pb``, the host XProf shows),
    through a temporary name, since XProf may list the run while it is written."""
    path = Path(run_dir) / f"{socket.gethostname()}.xplane.pb"
    partial = path.with_name(f".{path.name}.partial")
    try:
        objectstore.private_dirs(path.parent)
        try:
            with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, objectstore.PRIVATE_FILE), "wb") as f:
                f.write(xspace)
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)  # what a full disk left of it
    except OSError as exc:
        raise ProfileError(f"cannot write the trace to {run_dir}: {exc.strerror or exc}") from None


def _read_xspaces(run_dir: str) -> list[bytes]:

    location = locations.parse_url(run_dir)
    objects = objectstore.objects_for(location)
    with storage_errors.errors_as("reading the trace in", location):
        names = sorted(n for n in objects.list(location.path + "/") if n.endswith(".xplane.pb"))
        data = [objects.read(n) for n in names]
    if not data:
        raise ProfileError(f"no trace (*.xplane.pb) under {run_dir}: the profiler wrote nothing there")
    return [d for d in data if d is not None]


def _size(run_dir: str) -> int:

    location = locations.parse_url(run_dir)
    with storage_errors.errors_as("listing", location):
        return sum(
            int(meta["size"] or 0) for meta in objectstore.objects_for(location).list(location.path + "/").values()
        )


def _check_host_tracer_level(level: int) -> int:
    if level not in HOST_TRACER_LEVELS:
        raise ProfileError(
            f"host tracer level {level!r} is not one of 0 (off), 1 (user, default), 2 (runtime), 3 (verbose)"
        )
    return level


@contextlib.contextmanager
def profile(
    name: str | None = None,
    logdir: str | None = None,
    host_tracer_level: int = DEFAULT_HOST_TRACER_LEVEL,
    python_tracer: bool = False,
) -> Iterator[Capture]:
    """Capture a JAX profiler trace of the ``with`` block.

    Yields the ``Capture``; once the block ends, ``capture.summary()`` reads the
    trace, and displaying the capture shows the summary with "Open in XProf".

    Args:
      name: the capture's name (letters, digits, ``.``, ``_``, ``-``); default ``profile``.
      logdir: where the trace goes. Embedded backend: a local directory
        (default: this session's directory under ``profile_root()``). Proxy
        backend: required ``gs://BUCKET/PREFIX`` (or ``$PATHWAYS_PROFILE_DIR``).
      host_tracer_level: 0-3, as ``jax.profiler.ProfileOptions`` (default 1:
        ``DEFAULT_HOST_TRACER_LEVEL`` says why; 2 adds the runtime's events).
      python_tracer: also trace Python function calls (slow; off by default).

    Raises:
      ProfileError: another capture runs, a bad name or level, a dir that
        cannot be written, a gs:// dir off the proxy backend, or the workers
        refused the trace.
    """
    import jax

    name = "profile" if name is None else name
    if not _NAME.match(name):
        raise ProfileError(f"bad profile name {name!r}: use letters, digits, '.', '_' or '-' (at most 80)")
    _check_host_tracer_level(host_tracer_level)
    tracer, log_dir, prefix = tracer_for(session().backend, logdir)
    run_name = time.strftime("%Y%m%d-%H%M%S-") + name
    target = f"{log_dir}/{prefix}" if prefix else log_dir
    run = f"{prefix}/{run_name}" if prefix else run_name
    capture = Capture(name, log_dir, run, f"{target}/{RUNS_DIR}/{run_name}", session().backend.spec, time.time())
    capture.served = bool(prefix)
    _claim(capture)
    try:
        if capture.local:
            _make_dir(target)
        tracer.start(target, _options(run_name, host_tracer_level, python_tracer))
    except BaseException:
        _release()
        raise
    started = time.perf_counter()
    try:
        with (
            jax.profiler.TraceAnnotation(summary_lib.WINDOW_PREFIX + name),
            jax.profiler.TraceAnnotation(slices_annotation(_slice_of())),
        ):
            yield capture
    except BaseException as exc:
        capture.error = f"the profiled code raised {type(exc).__name__}: {summary_line(exc)}"
        raise
    finally:
        capture.wall_s = time.perf_counter() - started
        try:
            xspace = tracer.stop()
            if xspace is not None:
                capture._xspace = xspace
                try:
                    _write_xspace(capture.where, xspace)
                except ProfileError as exc:  # not raised over what the body raised
                    capture.error = capture.error or str(exc)
        finally:
            _release()
            _record(capture)


def _private(capture: Capture) -> None:
    """The run's directory and files (the server's and JAX's own, written with the umask's modes),
    and the two directories above it, its owner's only."""
    run = Path(capture.where)
    if not capture.local or not run.is_dir():
        return
    objectstore.make_private(run)
    for above in (run.parent, run.parent.parent):  # <log dir>/plugins/profile, <log dir>/plugins
        with contextlib.suppress(OSError):  # another user's
            above.chmod(objectstore.PRIVATE_DIR)


def _record(capture: Capture) -> None:
    _private(capture)
    try:
        capture.size = _size(capture.where)
    except StorageError as exc:
        capture.error = capture.error or str(exc)
    with _lock:
        for older in _captures:
            older._xspace = None  # one trace at a time in memory: the one shown next
        _captures.append(capture)
    session().events.emit(
        "profile", bytes=capture.size, duration_s=capture.wall_s, detail=f"{capture.name} -> {capture.where}"
    )


# -- listing ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CaptureTable(TextDisplay):
    """What ``%pathways profiles`` shows: name, when, size, where."""

    rows: tuple[Capture, ...]

    def to_text(self) -> str:
        if not self.rows:
            return "no profiles captured yet: %%pathways profile (or `with pw.profile():`) captures one"
        return "\n".join(
            f"{c.name:<40} {time.strftime('%H:%M:%S', time.localtime(c.started))}  {format_bytes(c.size or 0):>10}  {c.where}"
            for c in self.rows
        )

    def _repr_html_(self) -> str:
        if not self.rows:
            return f"<i>{html.escape(self.to_text())}</i>"
        rows = "".join(
            f"<tr><td>{html.escape(c.name)}</td><td>{time.strftime('%H:%M:%S', time.localtime(c.started))}</td>"
            f"<td>{format_bytes(c.size or 0)}</td><td><code>{html.escape(c.where)}</code></td>"
            f"<td>{_open_button(c, '')}</td></tr>"
            for c in self.rows
        )
        return (
            "<table class='pathways-profiles'><thead><tr><th>name</th><th>when</th><th>size</th><th>where</th>"
            f"<th></th></tr></thead><tbody>{rows}</tbody></table>"
        )


def _open_button(c: Capture, classes: str) -> str:
    """The "Open in XProf" link of a capture under the profile root: labextension/src/xprof.ts
    opens it in a JupyterLab tab; elsewhere the href opens XProf in a browser tab."""
    if not c.local:
        return ""
    if not c.served:
        return f"<i>{html.escape(f'XProf in JupyterLab shows {profile_root()}; for this one: xprof --logdir {c.log_dir}')}</i>"
    if not xprof_installed():
        return f"<i>{html.escape(XPROF_MISSING)}</i>"
    return (
        f"<a class='pathways-open-xprof {classes}' data-pathways-xprof-run='{html.escape(c.run, quote=True)}' "
        f"href='{html.escape(xprof_path(c.run), quote=True)}' target='_blank'>Open in XProf</a>"
    )


#: What "Latest profile in XProf" says for a kernel that has not captured (it must not show another's).
NO_CAPTURE = "no capture in this kernel yet: %%pathways profile (or `with pw.profile():`) captures one"


def latest_for_xprof() -> dict[str, Any]:
    """What "Latest profile in XProf" opens for this kernel (the monitor protocol's
    ``latest_profile`` reply): its newest capture XProf in JupyterLab serves, or ``run``
    None and ``message`` saying why. Never a capture of another kernel."""
    served = [c for c in captures() if c.served]
    if served:
        c = served[-1]
        return {"run": c.run, "name": c.name, "where": c.where, "time": c.started, "message": f"profile {c.name}"}
    others = captures()
    message = (
        f"this kernel's captures are not under {profile_root()}, which XProf in JupyterLab shows; "
        f"the newest is {others[-1].where}"
        if others
        else NO_CAPTURE
    )
    return {"run": None, "name": None, "where": None, "time": None, "message": message}


def profiles() -> CaptureTable:
    """The captures of this process (``%pathways profiles``)."""
    return CaptureTable(tuple(captures()))


XPROF_MISSING = f"XProf is not installed here: {EXTRA} (xprof and jupyter-server-proxy), then restart JupyterLab"


def xprof_installed() -> bool:
    import importlib.util

    return (
        importlib.util.find_spec("xprof") is not None and importlib.util.find_spec("jupyter_server_proxy") is not None
    )
