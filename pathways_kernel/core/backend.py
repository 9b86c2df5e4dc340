"""The interface every backend implements: where devices come from.

A backend configures JAX so that ``jax.devices()`` returns its devices, and
says where each device sits (which slice, which chip coordinates). Everything
above it (session, mesh, elastic, telemetry, views) sees only that interface.
It lives in core, below the backends (``backends/``, ``emulator/local.py``)
that implement it, because the session and the topology model are written
against it and core imports no other layer (``.importlinter``).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, cast

from pathways_kernel.core.errors import NotSupportedError


def reads_data_loss(array: Any, wait: bool = True) -> bool:
    """Whether reading ``array`` raises ``DATA_LOSS``: how the runtime says its data was on a lost slice.

    Anything but a concrete, live ``jax.Array`` is not lost. With ``wait``, a
    pending computation is waited for (its result may be lost too); without,
    a pending array counts as not lost.
    """
    import jax

    if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer) or array.is_deleted():
        return False
    # jax.Array's stub lacks is_ready, which every concrete array has.
    if not wait and not cast(Any, array).is_ready():
        return False
    try:
        array.block_until_ready()
    except jax.errors.JaxRuntimeError as exc:
        return "DATA_LOSS" in str(exc)
    return False


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one device sits in the cluster.

    Attributes:
      slice_index: the ICI-connected slice the device belongs to.
      coords: the chip's coordinates within its slice (x, y, z).
      core_on_chip: the core index when a chip exposes several devices.
      kind: the device kind, e.g. ``"TPU v5p"`` or ``"cpu"``.
    """

    slice_index: int
    coords: tuple[int, ...]
    core_on_chip: int = 0
    kind: str = ""


@dataclasses.dataclass(frozen=True)
class ChipReadings:
    """What a chip-metrics service said of the backend's chips, by device id (chips it did not
    name are left out): the fraction of its window each spent executing programs (0..1), the
    bytes in use, and the bytes it has."""

    duty_cycle: Mapping[int, float]
    memory_used: Mapping[int, int]
    memory_total: Mapping[int, int]
    #: Seconds each duty cycle is measured over (the service's resolution).
    window_s: float


class ChipMetrics(abc.ABC):
    """A service that measures the backend's chips themselves (``Backend.chip_metrics``): libtpu's
    runtime metric service, which the local server serves too, or Cloud Monitoring."""

    #: What views say measured the figures (``metrics.source``), with its resolution.
    name: str = "chip metrics"

    @abc.abstractmethod
    def read(self) -> ChipReadings:
        """The figures now; raises ``BackendError`` in one line when the service does not answer."""

    def close(self) -> None:  # noqa: B027 - optional hook, deliberately a no-op by default
        """Release the channel the reader holds."""


class Backend(abc.ABC):
    """One source of devices for the session's single JAX client."""

    #: short name used in specs and status, e.g. ``"local"`` or ``"proxy"``.
    name: ClassVar[str]
    #: whether ``fail_slice``/``repair_slice`` may be injected (emulators only).
    supports_fault_injection: ClassVar[bool] = False
    #: whether asking an array about itself (``is_ready``, ``is_deleted``) is a request to a server
    #: that JAX's client waits for without a bound, holding the GIL (the IFRT proxy): a background
    #: thread must not ask, or a stopped or stuck server freezes the whole kernel.
    array_queries_wait_on_server: ClassVar[bool] = False
    #: the log a backend reports connection lifecycle events to; set by the session.
    events: Any = None

    @property
    @abc.abstractmethod
    def spec(self) -> str:
        """The canonical spec string, e.g. ``local:2x4``."""

    @property
    def target(self) -> str:
        """Where the client connects (``embedded`` for in-process backends)."""
        return "embedded"

    def preflight(self) -> Any:
        """Check, without touching JAX, that ``activate`` can succeed.

        Runs before the session drops its current backend, so a wrong address
        leaves the working session as it was. Raises a ``PathwaysError``.
        """
        return None

    @abc.abstractmethod
    def activate(self) -> None:
        """Configure JAX so that ``jax.devices()`` returns this backend's devices.

        Called before the first JAX computation of the session; must not leave
        JAX half-configured when it raises a ``PathwaysError``.
        """

    @abc.abstractmethod
    def devices(self) -> Sequence[Any]:
        """The backend's JAX devices, in a stable order."""

    @abc.abstractmethod
    def placements(self, devices: Sequence[Any]) -> list[Placement]:
        """Where each of ``devices`` sits, in the same order."""

    def check(self) -> None:  # noqa: B027 - optional hook, deliberately a no-op by default
        """Raise ``BackendError`` if JAX no longer has the devices this backend set up."""

    def ici_shape(self) -> tuple[int, ...] | None:
        """Physical chip grid of one slice, when the backend knows it."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, deliberately a no-op by default
        """Release what ``activate`` acquired; the default holds nothing."""

    def chip_metrics(self) -> ChipMetrics | None:
        """A new reader of the chips' own figures (duty cycle, memory), or None where the backend
        has none: telemetry then measures from the client (``monitoring/telemetry.py``)."""
        return None

    # -- slice loss: what layers above ask instead of reaching into emulator/ --
    def is_lost(self, array: Any, wait: bool = True) -> bool:
        """Whether reading ``array`` raises ``DATA_LOSS`` (it had a shard on a lost slice).

        By default the runtime's answer (``reads_data_loss``); a backend that
        knows better without reading (a local server) says so itself.
        """
        return reads_data_loss(array, wait)

    def is_leftover(self, array: Any) -> bool:
        """Whether ``array`` only keeps a lost slice's buffers alive for a reader in flight (no usable data)."""
        return False

    def fail_slice(self, session: Any, index: int, detail: str) -> Any:
        """Lose slice ``index`` as Pathways does (``supports_fault_injection`` backends); returns their report."""
        raise NotSupportedError(f"fail_slice is only for the local backends; this session runs {self.spec}")

    def repair_slice(self, session: Any, index: int, detail: str) -> Any:
        """Bring slice ``index`` back, empty (``supports_fault_injection`` backends); returns their report."""
        raise NotSupportedError(f"repair_slice is only for the local backends; this session runs {self.spec}")
