"""The public Python API: one function for each ``%pathways`` subcommand.

Re-exported from ``pathways_kernel``; magics call these and only render.
"""

from __future__ import annotations

from collections.abc import Sequence

from jax import Device
from jax.sharding import Mesh

from pathways_kernel.core import namespace
from pathways_kernel.core.eventlog import Event, EventTable
from pathways_kernel.core.sessions import Session, Status, connect, is_lost, session
from pathways_kernel.core.slices import Topology

# Fault injection, chaos and the health check are implemented in their modules;
# these are the API twins of %pathways fail/repair/chaos/health.
from pathways_kernel.emulator.chaosmonkey import ChaosStatus, chaos, chaos_off, chaos_status
from pathways_kernel.emulator.fault_report import FaultReport
from pathways_kernel.emulator.faults import fail_slice, repair_slice
from pathways_kernel.emulator.healthcheck import Health, health


def status() -> Status:
    """Backend, platform, JAX version, slices up/total, chips and devices."""
    return session().status()


def topology() -> Topology:
    """The session's slices and chips, with their state."""
    return session().topology


def devices() -> list[Device]:
    """The session's JAX devices in topology order (slice by slice)."""
    return session().devices()


def mesh(
    axes: Sequence[str] | None = None,
    dcn: Sequence[int] | None = None,
    ici: Sequence[int] | None = None,
    name: str | None = None,
    overwrite: bool = False,
    kind: str | None = None,
) -> Mesh:
    """A multi-slice mesh over the live slices: DCN across slices, ICI within.

    Args:
      axes: axis names, default ``("data", "model")``.
      dcn: per-axis sizes across slices; product = live slices. Default puts
        all slices on the first axis.
      ici: per-axis sizes within a slice; product = chips per slice. Default
        puts all chips on the last axis.
      name: also bind the mesh to this name in the notebook's namespace.
      overwrite: allow ``name`` to replace a value of another type.
      kind: only the slices of this kind of chip, a generation (``"v6e"``) or a device kind
        (``"TPU v6 lite"``); needed where the live slices are of several kinds, since a program
        runs on one kind of chip.

    Raises:
      MeshError: shapes that do not fit the live devices.
      NamespaceError: ``name`` clashes with an existing value.
    """
    m: Mesh = session().mesh(axes, dcn, ici, kind)
    if name:
        namespace.bind(name, m, overwrite=overwrite)
    return m


def events(last: int | None = None, kind: str | None = None) -> list[Event]:
    """The session's event log, oldest first."""
    return session().events.last(last, kind)


def events_table(last: int | None = None, kind: str | None = None) -> EventTable:
    """The newest ``last`` rows of the event log (all: None), routine runs folded unless ``kind`` is given."""
    earlier = [e for e in session().events.earlier if kind is None or e.kind == kind]
    return EventTable(events(None, kind), kind, last, earlier)


__all__ = [
    "ChaosStatus",
    "FaultReport",
    "Health",
    "Session",
    "Status",
    "Topology",
    "chaos",
    "chaos_off",
    "chaos_status",
    "connect",
    "devices",
    "events",
    "events_table",
    "fail_slice",
    "health",
    "is_lost",
    "mesh",
    "repair_slice",
    "session",
    "status",
    "topology",
]
