"""The embedded backend: S slices of C chips made of this process's CPU devices.

``embedded:2x4`` asks XLA's CPU client for 8 devices (``jax_num_cpu_devices``)
and groups them, in id order, into 2 slices of 4 chips. Why it stays next to
the default ``local:SxC`` (the same slices in a ``pathways-local`` server,
``backends/local_server.py``): it runs in the kernel's own process, so there
is no second process, a step costs no round trip, host callbacks
(``jax.debug.print``, ``pure_callback``) work, which JAX's proxy client refuses
on a ``cpu`` platform; and a process whose JAX already runs on ``cpu`` (the
test process, a stock kernel after ``%load_ext``) can only use it. CPU devices carry no
``slice_index`` or ``coords``, so the placement lives here, in our topology
model, not on the devices. Chips of a slice are laid out on the most square
2D grid that holds them, like a TPU slice's ICI torus.

Activating the backend also
- sizes XLA's CPU thread pools so that an unblocked training loop cannot
  deadlock its collectives (``_client_threads``);
- lets pathwaysutils' elastic tools see these slices
  (``core/pathwaysutils_compat.py``), until the backend is closed.

The devices JAX has are checked against the spec on every topology read, so a
``jax_num_cpu_devices`` changed behind the session's back is reported in one
line instead of showing a stale ``local:SxC``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pathways_kernel.core import jaxcompat, pathwaysutils_compat
from pathways_kernel.core.backend import Backend, Placement
from pathways_kernel.core.errors import BackendError
from pathways_kernel.emulator.faults import InjectedFaults

#: Read by XLA (``DefaultThreadPoolSize``) when it creates the CPU client.
_POOL_ENV = "PJRT_NPROC"


def grid_shape(chips: int) -> tuple[int, int, int]:
    """The most square ``(x, y, 1)`` grid holding ``chips`` chips."""
    y = int(math.isqrt(chips))
    while chips % y:
        y -= 1
    return (chips // y, y, 1)


class LocalBackend(InjectedFaults, Backend):
    """Slices emulated with the CPU devices of this process."""

    name: ClassVar[str] = "embedded"
    supports_fault_injection: ClassVar[bool] = True

    def __init__(self, num_slices: int, chips_per_slice: int):
        self.num_slices = num_slices
        self.chips_per_slice = chips_per_slice
        #: ``(value before,)`` of ``PJRT_NPROC`` while ours is set.
        self._pool_env_before: tuple[str | None] | None = None
        #: pathwaysutils' elastic tools see these slices while the backend is active.
        self._slice_groups = pathwaysutils_compat.slice_groups(self.slice_map)
        #: Set while the slices are bound to a Slurm job (``slurm_binding``): the job's id and time left.
        self.job_label: Callable[[], str] | None = None

    @property
    def spec(self) -> str:
        return f"embedded:{self.num_slices}x{self.chips_per_slice}"

    @property
    def target(self) -> str:
        return self.job_label() if self.job_label is not None else "embedded"

    @property
    def num_devices(self) -> int:
        return self.num_slices * self.chips_per_slice

    def activate(self) -> None:
        import jax

        self._slice_groups.start()
        if jaxcompat.backends_initialized():
            # jax.config's options are attributes JAX adds at run time, unseen by mypy.
            if jax.config.jax_num_cpu_devices == self.num_devices and _cpu_count() == self.num_devices:  # type: ignore[attr-defined]
                return
            # Safe only because the session refuses to switch once arrays
            # exist; clearing costs ~3 ms.
            from jax.extend import backend as jax_backend

            jax_backend.clear_backends()
            jax.clear_caches()
        if self._pool_env_before is None:
            self._pool_env_before = (os.environ.get(_POOL_ENV),)
        os.environ[_POOL_ENV] = str(_client_threads(self.num_devices))
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", self.num_devices)

    def close(self) -> None:
        self._slice_groups.stop()
        if self._pool_env_before is not None:
            (before,), self._pool_env_before = self._pool_env_before, None
            if before is None:
                os.environ.pop(_POOL_ENV, None)
            else:
                os.environ[_POOL_ENV] = before

    def check(self) -> None:
        """Raise ``BackendError`` if JAX has (or will create) other CPU devices than the spec's."""
        import jax

        if jaxcompat.backends_initialized():
            found = _cpu_count()
            if found != self.num_devices:
                raise BackendError(
                    f"JAX now has {found} CPU devices, not the {self.num_devices} of this session's {self.spec}: "
                    f"jax_num_cpu_devices was changed behind the session's back. {self._fix(found)}"
                )
        elif (found := jax.config.jax_num_cpu_devices) != self.num_devices:  # type: ignore[attr-defined]  # as above
            raise BackendError(
                f"jax_num_cpu_devices is now {found}, not the {self.num_devices} of this session's {self.spec}. "
                f"{self._fix(found)}"
            )

    def _fix(self, found: int) -> str:
        if found < 1:
            return "Remove that setting and restart the kernel"
        chips = self.chips_per_slice if found % self.chips_per_slice == 0 else found
        fits = f"embedded:{found // chips}x{chips}"
        return (
            f"Run `%pathways connect {fits} --force` (pw.connect('{fits}', force=True)) to use them, "
            f"or remove that setting and restart the kernel"
        )

    def devices(self) -> Sequence[Any]:
        import jax

        self.check()
        return sorted(jax.devices("cpu"), key=lambda d: d.id)

    def slice_map(self) -> dict[Any, int]:
        """Device -> index of the slice it belongs to."""
        devices = self.devices()
        return {device: p.slice_index for device, p in zip(devices, self.placements(devices), strict=True)}

    def placements(self, devices: Sequence[Any]) -> list[Placement]:
        x, _, _ = self.ici_shape()
        placements = []
        for position, _device in enumerate(devices):
            slice_index, chip = divmod(position, self.chips_per_slice)
            placements.append(Placement(slice_index, (chip % x, chip // x, 0), 0, "cpu"))
        return placements

    def ici_shape(self) -> tuple[int, int, int]:
        return grid_shape(self.chips_per_slice)


def _client_threads(num_devices: int) -> int:
    """Threads for each of XLA's CPU client pools: twice the devices, at least.

    XLA sizes its dispatch pool to ``max(cores, devices)``, enough for the one
    multi-device program it runs at a time: each device's share holds a thread
    until all meet at a collective. But launching a program's shares runs on
    the same pool, and a launch blocks there once 32 executions are in flight
    on its device. An unblocked loop reaches that at step 33; on a machine with
    fewer cores than devices the blocked launches then hold threads the running
    collective needs, and XLA aborts the process after 40 s ("Expected 8
    threads to join the rendezvous, but only 7 of them arrived"). The thread
    dispatching waits for all shares of one launch, so a pool of twice the
    devices always leaves the running collective its threads.
    """
    base = os.environ.get(_POOL_ENV) or os.environ.get("NPROC")
    cores = int(base) if base and base.isdigit() else len(os.sched_getaffinity(0))
    return max(cores, 2 * num_devices)


def _cpu_count() -> int:
    import jax

    return len(jax.devices("cpu"))
