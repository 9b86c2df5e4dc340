"""The Pathways proxy backend: devices of a Pathways cluster over gRPC.

The notebook's JAX client talks to the Pathways proxy (``JAX_PLATFORMS=proxy``,
``JAX_BACKEND_TARGET=grpc://HOST:PORT``) through JAX's IFRT proxy client,
which pathwaysutils registers as the ``proxy`` platform. This module adds
what an interactive session needs around it:

- a pre-flight check (``preflight.py``) before the client sees the target,
  because the client holds JAX's backend lock for up to 120 s on a wrong
  address and retries on every later JAX call;
- the client's lifecycle callbacks as ``connection_update``/``disconnect``
  events in the session's log;
- placements read from the devices themselves (``slice_index``, ``coords``,
  ``core_on_chip``, ``device_kind``), so the same topology code and monitor
  draw real TPU slices;
- a guard against the client's late callback aborting the process at exit.

Utilization on this backend is the telemetry hub's client-side measure
(``telemetry.ClientSource``: live arrays' readiness and shard bytes, plus
``memory_stats()`` where the proxy's devices report it). The seam for the
chips' own figures is ``Backend.chip_metrics()`` (the local server's runtime
metric service defines it): the hub then samples through telemetry's
``ChipSource``, and nothing downstream (the protocol, the monitor) changes.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pathways_kernel.backends import preflight as preflight_lib
from pathways_kernel.core import jaxcompat, lost_clients
from pathways_kernel.core.backend import Backend, Placement
from pathways_kernel.core.errors import BackendError, SpecError
from pathways_kernel.emulator.local import grid_shape

#: The client reads this to choose plaintext gRPC over ALTS.
INSECURE_ENV = "IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS"
#: pathwaysutils' knob for the client's connect timeout (seconds, default 120).
CONNECT_TIMEOUT_ENV = "PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS"
#: Seconds after a client connect attempt during which it may still call back.
_LATE_CALLBACK_S = 1.5
#: Seconds a connect waits for the client's "Connected" callback (it lands within milliseconds).
_CONNECTED_CALLBACK_S = 0.5


def parse_spec(spec: str) -> preflight_lib.Target:
    """``proxy:grpc://HOST:PORT`` or ``grpc://HOST:PORT`` -> ``Target``."""
    text = spec.strip()
    if text.startswith("proxy:"):
        text = text[len("proxy:") :]
    return preflight_lib.parse_target(text)


def insecure_from_env() -> bool:
    return os.environ.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes")


class ProxyBackend(Backend):
    """A Pathways cluster reached through its IFRT proxy."""

    name: ClassVar[str] = "proxy"
    array_queries_wait_on_server: ClassVar[bool] = True

    def __init__(
        self,
        target: preflight_lib.Target,
        timeout: float | None = None,
        insecure: bool | None = None,
    ):
        self.address = target
        self.timeout = preflight_lib.DEFAULT_TIMEOUT_S if timeout is None else float(timeout)
        if self.timeout <= 0:
            raise SpecError(f"bad --timeout {timeout}: give the pre-flight a positive number of seconds, e.g. 5")
        self.insecure = insecure_from_env() if insecure is None else bool(insecure)
        self.report: preflight_lib.Report | None = None
        self._previous: tuple[Any, Any, str | None] | None = None
        #: JAX's client for this backend while it is active: its arrays are lost once it closes.
        self.client: Any = None
        #: Set by the client's own "Connected to IFRT proxy server" callback (on its thread).
        self._connected = threading.Event()

    @classmethod
    def from_spec(cls, spec: str, timeout: float | None = None, insecure: bool | None = None) -> ProxyBackend:
        return cls(parse_spec(spec), timeout, insecure)

    @property
    def spec(self) -> str:
        return f"proxy:{self.address.url}"

    @property
    def target(self) -> str:
        return self.address.url + (" (insecure)" if self.insecure else "")

    # -- connecting -----------------------------------------------------------
    def preflight(self) -> preflight_lib.Report | None:
        """Check the target without touching JAX; raises ``ConnectError``. ``None``: nothing
        to check yet (the local server's backend, before its server exists)."""
        self.report = preflight_lib.preflight(self.address, self.timeout, secure=not self.insecure)
        return self.report

    def activate(self) -> None:
        import jax

        if self.report is None:
            self.preflight()
        # jax.config's options are attributes JAX adds at run time, unseen by mypy.
        platforms = jax.config.jax_platforms  # type: ignore[attr-defined]
        self._previous = (platforms, jax.config.read("jax_backend_target"), os.environ.get(INSECURE_ENV))
        clear_jax()
        if self.insecure:
            os.environ[INSECURE_ENV] = "true"
        else:
            os.environ.pop(INSECURE_ENV, None)
        jax.config.update("jax_platforms", "proxy")
        jax.config.update("jax_backend_target", self.address.url)
        if not _defer_pathwaysutils:
            _initialize_pathwaysutils()
        _register_factory(self)
        try:
            # Connect now, so a failure shows here and not in the user's next cell.
            self.client = jax.devices()[0].client
            # The client says "Connected" on its own thread just after it returns: waited for
            # (briefly), its line comes before the session's `connect` event, not after it.
            self._connected.wait(_CONNECTED_CALLBACK_S)
        except Exception as exc:  # the client raises RuntimeError/JaxRuntimeError
            self._restore()
            raise BackendError(
                f"cannot connect to {self.address.url}: the Pathways client failed after pre-flight passed: "
                f"{_first_line(exc)}. Check the proxy pod's logs (kubectl logs) and `%pathways connect "
                f"{self.address.url}{' --insecure' if self.insecure else ''}` again"
            ) from None

    def close(self) -> None:
        self._restore()

    def _restore(self) -> None:
        """Leave JAX as it was before ``activate`` (clients dropped)."""
        if self._previous is None:
            return
        import jax

        platforms, target, insecure = self._previous
        self._previous = None
        if self.client is not None:
            # The client never reconnects: what it made is lost with this connection.
            lost_clients.mark_lost(self.client, f"the connection to {self.address.url} was closed")
            self.client = None
        clear_jax()
        jax.config.update("jax_platforms", platforms)
        jax.config.update("jax_backend_target", target)
        if insecure is None:
            os.environ.pop(INSECURE_ENV, None)
        else:
            os.environ[INSECURE_ENV] = insecure

    # -- lifecycle callbacks (called on the client's threads) -----------------
    def _on_connection_update(self, message: str) -> None:
        _EXIT_GUARD.touch()
        if self.events is not None:
            self.events.emit("connection_update", detail=_strip_timestamp(message))
        if "Connected to IFRT proxy server" in message:
            self._connected.set()

    def _on_disconnect(self, status: Any) -> None:
        _EXIT_GUARD.touch()
        if self.events is not None:
            reason = _strip_timestamp(str(status)) or "disconnected"
            self.events.emit("disconnect", detail=f"{self.address.url}: {reason}")

    # -- devices --------------------------------------------------------------
    def devices(self) -> Sequence[Any]:
        import jax

        devices = jax.devices()
        placements = device_placements(devices)
        order = sorted(range(len(devices)), key=lambda i: (placements[i].slice_index, devices[i].id))
        return [devices[i] for i in order]

    def placements(self, devices: Sequence[Any]) -> list[Placement]:
        return device_placements(devices)

    def ici_shape(self) -> tuple[int, ...] | None:
        placements = device_placements(self.devices())
        first = [p.coords for p in placements if p.slice_index == placements[0].slice_index] if placements else []
        if not first:
            return None
        return tuple(max(c[d] for c in first) + 1 for d in range(len(first[0])))


def device_placements(devices: Sequence[Any]) -> list[Placement]:
    """Where each device sits, from the attributes TPU devices carry.

    ``slice_index`` (default 0), ``coords`` (the chip's position in its
    slice), ``core_on_chip`` (default 0) and ``device_kind``. Devices without
    coordinates (e.g. CPU devices behind a test proxy) are laid out on the
    most square grid per slice, in id order.
    """
    by_slice: dict[int, int] = {}
    placements: list[Placement] = []
    missing = [d for d in devices if getattr(d, "coords", None) is None]
    widths: dict[int, int] = {}
    if missing:
        counts: dict[int, int] = {}
        for d in missing:
            counts[device_slice(d)] = counts.get(device_slice(d), 0) + 1
        widths = {s: grid_shape(n)[0] for s, n in counts.items()}
    for device in devices:
        slice_index = device_slice(device)
        coords = getattr(device, "coords", None)
        if coords is None:
            position = by_slice.get(slice_index, 0)
            by_slice[slice_index] = position + 1
            x = widths[slice_index]
            coords = (position % x, position // x, 0)
        placements.append(
            Placement(
                slice_index,
                tuple(int(c) for c in coords),
                int(getattr(device, "core_on_chip", 0) or 0),
                str(getattr(device, "device_kind", "") or ""),
            )
        )
    return placements


def device_slice(device: Any) -> int:
    """The slice a proxy device belongs to (0 where the server does not say)."""
    value = getattr(device, "slice_index", None)
    return 0 if value is None else int(value)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:400] or type(exc).__name__


def _strip_timestamp(message: str) -> str:
    # The client prefixes updates with an RFC 3339 timestamp; the event has its own time.
    head, sep, rest = message.partition(": ")
    return rest if sep and head[:4].isdigit() and "T" in head else message


def clear_jax() -> None:
    import jax
    from jax.extend import backend as jax_backend

    if jaxcompat.backends_initialized():
        jax_backend.clear_backends()
    jax.clear_caches()


_pathwaysutils_initialized = False
_pathwaysutils_lock = threading.Lock()
_pathwaysutils_hooks: list[Callable[[], None]] = []
_defer_pathwaysutils = False


def defer_pathwaysutils(defer: bool = True) -> None:
    """The next ``activate`` connects without initializing pathwaysutils; its caller calls
    ``initialize_pathwaysutils`` once the session is up.

    A kernel's start does this: importing pathwaysutils (orbax, FastAPI) took ~1-2 s of every
    start before the first cell could run, for profiling hooks a first cell rarely needs (until
    they are in, the kernel holds ``jax.profiler``'s calls, ``profiling/hold.py``).
    """
    global _defer_pathwaysutils
    _defer_pathwaysutils = defer and not _pathwaysutils_initialized


def initialize_pathwaysutils() -> None:
    """Initialize pathwaysutils now, if it was deferred, and run what waited for it."""
    global _defer_pathwaysutils
    _defer_pathwaysutils = False
    _initialize_pathwaysutils()


def after_pathwaysutils(hook: Callable[[], None]) -> None:
    """Call ``hook`` once pathwaysutils is initialized: now if it is, else right after."""
    with _pathwaysutils_lock:
        if not _pathwaysutils_initialized:
            _pathwaysutils_hooks.append(hook)
            return
    hook()


def _initialize_pathwaysutils() -> None:
    """pathwaysutils' set-up for Pathways (profiling hooks, no JAX compile cache).

    ``initialize()`` acts only on its first call and only when
    ``jax_platforms`` says ``proxy``, so it is called here, after that is set.
    """
    global _pathwaysutils_initialized
    with _pathwaysutils_lock:
        if _pathwaysutils_initialized:
            return
        import jax
        import pathwaysutils

        # A deferred initialize must not undo a compile cache turned on since (the kernelspec's).
        # jax.config's options are attributes JAX adds at run time, unseen by mypy.
        cache = jax.config.jax_compilation_cache_dir and jax.config.jax_enable_compilation_cache  # type: ignore[attr-defined]
        if jaxcompat.backends_initialized():
            # Deferred past the connect: this backend's factory (``_register_factory``) made the
            # client, and JAX refuses a factory for a platform already up: the rest as it is.
            from pathwaysutils import proxy_backend

            register = proxy_backend.register_backend_factory
            proxy_backend.register_backend_factory = lambda: None
            try:
                pathwaysutils.initialize()
            finally:
                proxy_backend.register_backend_factory = register
        else:
            pathwaysutils.initialize()
        if cache:
            jax.config.update("jax_enable_compilation_cache", True)
        _pathwaysutils_initialized = True
        hooks = list(_pathwaysutils_hooks)
        _pathwaysutils_hooks.clear()
    for hook in hooks:
        hook()


def _register_factory(backend: ProxyBackend) -> None:
    """Register the ``proxy`` platform with this backend's callbacks.

    pathwaysutils' own factory (``proxy_backend.register_backend_factory``)
    sets no lifecycle callbacks; this one is the same plus them.
    """
    import jax
    from jax.extend import backend as jax_backend
    from jax.extend.backend import ifrt_proxy

    # The IFRT proxy client: JAX names its type only in jax._src (xla_client.Client).
    def make_client() -> Any:
        options = ifrt_proxy.ClientConnectionOptions()
        if seconds := os.environ.get(CONNECT_TIMEOUT_ENV):
            options.connection_timeout_in_seconds = int(seconds)
        options.on_connection_update = backend._on_connection_update
        options.on_disconnect = backend._on_disconnect
        _EXIT_GUARD.touch()
        try:
            return ifrt_proxy.get_client(jax.config.read("jax_backend_target"), options)
        finally:
            _EXIT_GUARD.touch()

    jax_backend.register_backend_factory("proxy", make_client, priority=-1)


class _ExitGuard:
    """Hold interpreter exit until the client's last callback has landed.

    The IFRT proxy client may call ``on_connection_update`` about a second
    after a failed connect; if Python is finalizing then, the process aborts
    (exit 134). Waiting out that window at exit costs at most 1.5 s and only
    after a recent connect attempt.
    """

    def __init__(self) -> None:
        self._last = 0.0
        self._lock = threading.Lock()
        self._registered = False

    def touch(self) -> None:
        with self._lock:
            self._last = time.monotonic()
            if not self._registered:
                atexit.register(self.wait)
                self._registered = True

    def wait(self) -> None:
        left = self._last + _LATE_CALLBACK_S - time.monotonic()
        if left > 0:
            time.sleep(left)


_EXIT_GUARD = _ExitGuard()
