"""The session: the one owner of the JAX client, its topology and event log.

A process has at most one session at a time (the single controller). It is
created on first use from the kernelspec's backend (``PATHWAYS_BACKEND``), the
Pathways environment (``JAX_PLATFORMS=proxy``) or ``local:2x4``, and replaced
by ``connect``, which refuses to discard live device arrays unless forced.
"""

from __future__ import annotations

import dataclasses
import html
import importlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from pathways_kernel.core import lost_clients, meshes, sessionlog, text
from pathways_kernel.core.backend import Backend, reads_data_loss
from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.errors import BackendError, NotSupportedError, PathwaysError
from pathways_kernel.core.eventlog import EventLog, format_bytes
from pathways_kernel.core.slices import SliceState, Topology

T = TypeVar("T")


class BackendFactory(Protocol):
    """Builds, without activating, the backend a spec names (``backends.from_spec``)."""

    def __call__(
        self, spec: str, *, timeout: float | None = None, insecure: bool | None = None, server: bool = False
    ) -> Backend: ...


# The backends sit above core (core imports no other layer, .importlinter), so the package
# hands over how a spec becomes a backend when it is imported (pathways_kernel/__init__.py).
_from_spec: BackendFactory | None = None
_default_spec: Callable[[], str] | None = None


def use_backends(from_spec: BackendFactory, default_spec: Callable[[], str]) -> None:
    """Set how ``connect`` and the first ``session()`` build a backend from a spec."""
    global _from_spec, _default_spec
    _from_spec, _default_spec = from_spec, default_spec


def _backend(spec: str | None = None, **options: Any) -> Backend:
    if _from_spec is None or _default_spec is None:
        # `import pathways_kernel` is lazy (the server's process imports only what it runs), so
        # code that imports a module of the package directly has not loaded the public surface
        # that hands the factory over: load it now, by name, since core may not import it.
        importlib.import_module("pathways_kernel.public")
    if _from_spec is None or _default_spec is None:
        raise RuntimeError("no backend factory: import pathways_kernel, which sets it (sessions.use_backends)")
    return _from_spec(_default_spec() if spec is None else spec, **options)


@runtime_checkable
class HostState(Protocol):
    """A component holding state in this process's host memory (the snapshot store): it
    outlives its session, moving to the one that replaces it (a reconnect, a new server),
    where healing puts what it holds back on the new devices."""

    def moved_to(self, session: Session) -> None: ...


@dataclasses.dataclass(frozen=True)
class Status(TextDisplay):
    """What ``%pathways status`` shows."""

    backend: str
    target: str
    platform: str
    jax_version: str
    slices_up: int
    slices_total: int
    chips: int
    devices: int

    def to_text(self) -> str:
        return (
            f"backend   {self.backend}\n"
            f"target    {self.target}\n"
            f"platform  {self.platform}\n"
            f"jax       {self.jax_version}\n"
            f"slices    {self.slices_up}/{self.slices_total} up\n"
            f"chips     {self.chips}\n"
            f"devices   {self.devices}"
        )

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{k}</th><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
            for k, v in (
                ("backend", self.backend),
                ("target", self.target),
                ("platform", self.platform),
                ("jax", self.jax_version),
                ("slices", f"{self.slices_up}/{self.slices_total} up"),
                ("chips", self.chips),
                ("devices", self.devices),
            )
        )
        return f'<table class="pathways-status">{rows}</table>'


class Session:
    """The single JAX client of this process and what it knows of the cluster."""

    def __init__(self, backend: Backend, events: EventLog | None = None):
        self.backend = backend
        #: This session's own timeline: a session that replaces it starts a new one.
        self.events = events if events is not None else EventLog()
        self._lock = threading.RLock()
        self._base: Topology | None = None
        self._states: dict[int, SliceState] = {}
        self._closers: list[Callable[[], object]] = []
        self._components: dict[type, object] = {}

    # -- topology -------------------------------------------------------------
    @property
    def topology(self) -> Topology:
        """Slices, chips and their state, as of now.

        Raises ``BackendError`` when JAX's devices no longer match the backend
        (e.g. ``jax_num_cpu_devices`` changed in a cell), never a stale topology.
        """
        with self._lock:
            self.backend.check()
            if self._base is None:
                devices = list(self.backend.devices())
                platform = devices[0].platform if devices else ""
                self._base = Topology.from_placements(devices, self.backend.placements(devices), platform)
            topology = self._base
            for index, state in self._states.items():
                topology = topology.with_slice_state(index, state)
            return topology

    def devices(self) -> list[Any]:
        """All devices of the session, live or not, in topology order."""
        return self.topology.devices

    def live_devices(self) -> list[Any]:
        return [d for s in self.topology.up_slices for d in s.devices]

    def set_slice_state(self, index: int, state: SliceState, detail: str = "") -> bool:
        """Mark slice ``index`` up or down; emits ``slice_up``/``slice_down``.

        Returns whether the state changed. Raises ``PathwaysError`` for an
        unknown slice index.
        """
        with self._lock:
            topology = self.topology
            try:
                current = topology.slice(index).state
            except KeyError:
                raise PathwaysError(
                    f"no slice {index}: this session has slices 0..{len(topology.slices) - 1}"
                ) from None
            if current == state:
                return False
            before = tuple(s.index for s in topology.up_slices)
            self._states[index] = state
            after = tuple(s.index for s in self.topology.up_slices)
        self.events.emit(
            "slice_up" if state == "up" else "slice_down", slices_before=before, slices_after=after, detail=detail
        )
        return True

    # -- what users ask for ---------------------------------------------------
    def status(self) -> Status:
        import jax

        topology = self.topology
        return Status(
            backend=self.backend.spec,
            target=self.backend.target,
            platform=topology.platform,
            jax_version=jax.__version__,
            slices_up=len(topology.up_slices),
            slices_total=len(topology.slices),
            chips=len(topology.chips),
            devices=len(topology.devices),
        )

    def mesh(
        self,
        axes: Sequence[str] | None = None,
        dcn: Sequence[int] | None = None,
        ici: Sequence[int] | None = None,
        kind: str | None = None,
    ) -> Any:
        """A multi-slice ``jax.sharding.Mesh`` over the slices that are up (those of ``kind``)."""
        return meshes.build(meshes.of_kind(self.topology.up_slices, kind), axes, dcn, ici)

    def require_fault_injection(self, what: str) -> None:
        if not self.backend.supports_fault_injection:
            raise NotSupportedError(
                f"{what} is only for the local backends (local:SxC, embedded:SxC); this session runs {self.backend.spec}"
            )

    def fail_slice(self, index: int, detail: str = "fault injected") -> Any:
        """Lose slice ``index`` through the backend's fault injection (``pw.fail_slice``); returns its report.

        Raises:
          NotSupportedError: the backend cannot lose a slice on request.
          PathwaysError: no such slice.
        """
        self.require_fault_injection("fail_slice")
        return self.backend.fail_slice(self, index, detail)

    def repair_slice(self, index: int, detail: str = "repaired") -> Any:
        """Bring slice ``index`` back, empty (``pw.repair_slice``); returns the backend's report."""
        self.require_fault_injection("repair_slice")
        return self.backend.repair_slice(self, index, detail)

    # -- lifecycle ------------------------------------------------------------
    def component(self, kind: type[T], factory: Callable[[Session], T] | None = None) -> T:
        """The session's one ``kind`` (telemetry hub, snapshot store, fault injector, ...).

        Made on first use by ``factory(session)`` (default ``kind(session)``)
        and dropped with the session, so every component is per session and
        typed by its class rather than found by a string key.
        """
        with self._lock:
            found = self._components.get(kind)
            if found is None:
                make = factory if factory is not None else cast(Callable[["Session"], T], kind)
                found = self._components[kind] = make(self)
            return cast(T, found)

    def host_state(self) -> list[HostState]:
        """The components that move to the session replacing this one (``HostState``)."""
        with self._lock:
            return [c for c in self._components.values() if isinstance(c, HostState)]

    def adopt(self, state: Sequence[HostState]) -> None:
        """Take over the host state of the session this one replaces."""
        with self._lock:
            for component in state:
                self._components[type(component)] = component
        for component in state:
            component.moved_to(self)

    def on_close(self, closer: Callable[[], object]) -> None:
        self._closers.append(closer)

    def close(self) -> None:
        for closer in reversed(self._closers):
            closer()
        self._closers.clear()
        self._components.clear()
        self.backend.close()


class CopiesInFlight:
    """Host copies whose device reads are requested and not all done (``host_copy.take``).

    A copy requests every read at once, under ``lock``; a backend that injects a loss (the
    local server) takes ``lock`` too and, while copies are in flight, first lets the reads
    already requested reach its server, which then completes them from the buffers it holds.
    So a loss lands before a copy's reads are asked for or after, never between, and takes
    nothing a copy already asked for: the state an elastic run was given is kept until its
    first copy is complete, however long the copy takes.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._count = 0
        self._count_lock = threading.Lock()

    def started(self) -> None:
        with self._count_lock:
            self._count += 1

    def finished(self) -> None:
        with self._count_lock:
            self._count -= 1

    def __bool__(self) -> bool:
        with self._count_lock:
            return self._count > 0


#: The process's host copies in flight (one JAX client, one set of copies).
COPIES = CopiesInFlight()

_current: Session | None = None
_current_lock = threading.RLock()
# Process-wide because the process has one current session: who waits for a session to
# start (a monitor view opened without a backend) subscribes here and unsubscribes itself.
_start_listeners: list[Callable[[Session], None]] = []
# Host state of a closed session, waiting for the next one to start (a connect that failed
# after closing the old session must not drop the snapshots it held).
_host_state: list[HostState] = []


def on_start(listener: Callable[[Session], None]) -> Callable[[], None]:
    """Call ``listener`` with each session as it starts; returns an unsubscribe function."""
    with _current_lock:
        _start_listeners.append(listener)

    def unsubscribe() -> None:
        with _current_lock:
            if listener in _start_listeners:
                _start_listeners.remove(listener)

    return unsubscribe


def session() -> Session:
    """The process's session, created from the default spec on first use."""
    global _current
    with _current_lock:
        if _current is None:
            _current = _start(_backend())
        return _current


def current() -> Session | None:
    """The process's session if one runs, else None; never starts one.

    For work between cells and on background threads: starting a session
    there would retry a backend that could not be reached at every cell.
    """
    return _current


def _start(backend: Backend) -> Session:
    # A backend that logged before it had a session (a Slurm job's wait) hands its log over.
    events = backend.events if isinstance(backend.events, EventLog) else EventLog()
    backend.events = events
    backend.activate()
    s = Session(backend, events)
    sessionlog.keep_events(events)  # kept across a kernel restart; the earlier kernels' read back
    with _current_lock:
        carried = list(_host_state)
        _host_state.clear()
    s.adopt(carried)
    events.emit("connect", detail=f"{backend.spec} ({backend.target})")
    with _current_lock:
        listeners = list(_start_listeners)
    for listener in listeners:
        listener(s)
    return s


def is_lost(array: Any, wait: bool = True) -> bool:
    """Whether ``array``'s data is lost: it had a shard on a lost slice, or its server is gone.

    An array of a client whose server died or was replaced is lost without a
    call into that client (``lost_clients``). Otherwise asked of the session's backend (a local server knows which arrays it
    lost); without a session, of the runtime. With ``wait`` (the default), a
    pending computation is waited for: its result may be lost too; without,
    a pending array counts as not lost. Never starts a session.
    """
    if lost_clients.why_lost(array) is not None:
        return True  # its server is gone: never asked (its client's calls may wait long)
    s = _current
    return s.backend.is_lost(array, wait) if s is not None else reads_data_loss(array, wait)


def live_array_summary() -> tuple[int, int]:
    """Number and total bytes of live device arrays in the process."""
    import jax

    arrays = [a for a in jax.live_arrays() if not a.is_deleted()]
    return len(arrays), sum(a.nbytes for a in arrays)


def connect(
    spec: str, force: bool = False, *, timeout: float | None = None, insecure: bool | None = None, server: bool = False
) -> Session:
    """Switch the session to the backend ``spec`` names.

    Specs: ``local:SxC`` (the default, ``local:2x4``): S slices of C chips
    in a local Pathways server (``pathways-local``) the session starts as a
    child, reached through JAX's own proxy client as on Pathways.
    ``embedded:SxC``: the same slices emulated in this process (no second
    process, faster steps, host callbacks such as ``jax.debug.print`` work;
    the only choice where JAX already runs on ``cpu``).
    ``grpc://HOST:PORT`` (or ``proxy:grpc://...``): a Pathways proxy.
    ``slurm:JOB``: the Pathways proxy of a Slurm job.
    ``local-server:SxC`` and ``server=True`` are last wave's names for
    ``local:SxC`` and mean the same.

    Allowed freely before the first computation. Once device arrays exist,
    switching would discard them and every compiled function, so it is
    refused unless ``force=True``. ``timeout`` and ``insecure`` are the proxy
    backends' pre-flight seconds and plaintext-gRPC choice.

    Raises:
      SpecError: the spec is malformed.
      BackendError: arrays would be discarded and ``force`` is false, or the
        backend cannot be reached (the previous session is kept).
    """
    return install(_backend(spec, timeout=timeout, insecure=insecure, server=server), force)


def install(backend: Backend, force: bool = False) -> Session:
    """Switch the session to ``backend`` (built, not yet activated), as ``connect`` does."""
    global _current
    spec = backend.spec
    with _current_lock:
        old = _current
        if old is not None and old.backend.spec == backend.spec and not force:
            return old
        # A wrong address fails here, before the working session is dropped.
        backend.preflight()
        if old is not None and not force:
            arrays, nbytes = live_array_summary()
            if arrays:
                raise BackendError(
                    f"this session holds {text.count(arrays, 'device array')} ({format_bytes(nbytes)}) on {old.backend.spec}; "
                    f"switching to {backend.spec} would discard them and every compiled function. "
                    f"Snapshot or checkpoint what you need, then run `%pathways connect {spec} --force` "
                    f"(or pw.connect('{spec}', force=True)), or restart the kernel"
                )
        if old is not None:
            _host_state.extend(old.host_state())
            old.close()
            _current = None
        try:
            _current = _start(backend)
        except PathwaysError:
            if old is not None:
                # Give the user back a working session on the previous backend, whose log
                # starts with what the failed attempt logged (the client's connection updates).
                try:
                    previous = _backend(old.backend.spec)
                    previous.events = backend.events
                    _current = _start(previous)
                except PathwaysError:
                    _current = None
            raise
        return _current
