"""Where the monitor's chip figures come from, when the user chooses (``pw.chip_metrics``,
``%pathways connect ... --metrics cloud-monitoring``).

    pw.chip_metrics("cloud-monitoring", project="my-project", cluster="my-cluster")
    pw.chip_metrics("runtime")   # the backend's own chip service (libtpu's runtime metrics on local:)
    pw.chip_metrics("client")    # the client-side measure

Cloud Monitoring is read once at once, so that a missing permission, an unknown project or no
TPU series is said in one line now; the monitor then keeps the client-side figure, and its
source (``metrics.source``) says why.
"""

from __future__ import annotations

from pathways_kernel.backends.cloud_monitoring import CloudMonitoring
from pathways_kernel.core.errors import BackendError, PathwaysError
from pathways_kernel.core.sessions import session as current
from pathways_kernel.monitoring import sources, telemetry

SOURCES = ("client", "runtime", "cloud-monitoring")


def chip_metrics(
    source: str = "cloud-monitoring",
    *,
    project: str | None = None,
    cluster: str | None = None,
    workers: str | None = None,
) -> str:
    """Makes the session's monitor read chips from ``source``; returns the one line that says what it reads.

    ``cloud-monitoring`` reads the TPU series of ``project`` (default: the credentials' project)
    with Application Default Credentials: GKE's, of ``cluster`` (a Pathways JobSet's worker pods),
    else Cloud TPU VMs' (a Slurm job's nodes); of the pods or nodes named ``workers*`` when given.
    """
    if source not in SOURCES:
        raise PathwaysError(f"chip metrics source {source!r}: choose one of {', '.join(SOURCES)}")
    session = current()
    hub = telemetry.hub(session)
    backend = session.backend
    if source == "runtime":
        metrics = backend.chip_metrics()
        if metrics is None:
            raise PathwaysError(f"{backend.spec} has no chip service of its own; use cloud-monitoring or client")
        hub.use_source(sources.ChipSource(backend, metrics))
        return f"monitor: chips from {metrics.name}"
    if source == "client":
        hub.use_source(sources.ClientSource(backend.is_leftover))
        return "monitor: chips measured by the client (live arrays' readiness and bytes)"

    def slices() -> list[list[int]]:
        return [[chip.device.id for chip in s.chips] for s in session.topology.slices]

    try:
        reader = CloudMonitoring(project, slices, cluster=cluster, workers=workers)
        readings = reader.check()
    except BackendError as error:
        fallback = sources.ClientSource(backend.is_leftover)
        fallback.name = f"client ({CloudMonitoring.name} unavailable)"
        hub.use_source(fallback)
        return f"{error}; the monitor keeps the client-side figure"
    hub.use_source(sources.ChipSource(backend, reader))
    where = f"cluster {cluster}, " if cluster else ""
    return f"monitor: chips from {reader.name} ({where}project {reader.project}): {len(readings.duty_cycle)} chips"
