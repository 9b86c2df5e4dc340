"""Connecting the session to a cluster, and coming back after a disconnect.

``session.connect`` switches backends; this module adds what a user of a
remote cluster needs on top: ``reconnect()`` after the proxy went away,
``connect_shared_service()`` for a shared Pathways service, and the notice
that tells the user, after a ``disconnect`` event, what is gone and what to
do next.
"""

from __future__ import annotations

from pathways_kernel import backends
from pathways_kernel.backends.proxy import ProxyBackend, clear_jax
from pathways_kernel.backends.shared_service import ServiceRequest, SharedServiceBackend
from pathways_kernel.core import sessions
from pathways_kernel.core.errors import BackendError
from pathways_kernel.core.eventlog import EventLog, format_bytes
from pathways_kernel.core.sessions import Session, install, live_array_summary, session


def reconnect(timeout: float | None = None) -> Session:
    """Drop JAX's clients and caches, then connect again to the same backend.

    Device arrays and compiled functions of the old connection are gone
    either way; rebuild the mesh and restore state from a snapshot or
    checkpoint afterwards.

    Args:
      timeout: pre-flight seconds for a proxy backend (default: as before).

    Raises:
      ConnectError: the backend cannot be reached (the session is left
        without a backend; ``%pathways connect local:2x4`` works).
    """

    old = session().backend
    if isinstance(old, SharedServiceBackend):
        return connect_shared_service(old.request, timeout=old.timeout if timeout is None else timeout, force=True)
    if isinstance(old, ProxyBackend):
        timeout = old.timeout if timeout is None else timeout
        new = backends.from_spec(old.spec, timeout=timeout, insecure=old.insecure)
    else:
        new = backends.from_spec(old.spec)
    # Check first: with JAX's clients cleared, the next JAX call would make a
    # new proxy client, which waits its full connect timeout on a dead address.
    new.preflight()
    clear_jax()
    return install(new, force=True)


def connect_shared_service(
    request: ServiceRequest | None = None,
    *,
    cluster: str = "",
    project: str = "",
    region: str = "",
    service: str = "",
    tpu: str = "",
    count: int = 1,
    bucket: str = "",
    proxy_image: str | None = None,
    insecure: bool = False,
    timeout: float | None = None,
    force: bool = False,
) -> Session:
    """Connect the session to a shared Pathways service (``%pathways connect sps``).

    Deploys a proxy for this session with pathwaysutils' shared-service flow
    and holds it until the session switches backend or the kernel exits.

    Args:
      cluster, project, region: the GKE cluster running the service.
      service: ``HOST:PORT`` of the Pathways head.
      tpu: ``TYPE:TOPOLOGY`` as the service names it, e.g. ``tpuv6e:2x2``.
      count: number of slices of that type.
      bucket: ``gs://`` scratch location for the proxy.
      proxy_image: proxy server image (the flow picks a compatible one).
      insecure: plaintext gRPC to the proxy.
      timeout: pre-flight seconds once the proxy is port-forwarded.
      force: switch even if device arrays would be discarded.

    Raises:
      SpecError: a missing or malformed option.
      BackendError: missing gcloud/kubectl/extras, or the flow failed.
    """
    if request is None:
        request = ServiceRequest(cluster, project, region, service, tpu, count, bucket, proxy_image, insecure)
    count_arrays, nbytes = live_array_summary()
    if count_arrays and not force:
        # Refuse before the flow deploys a proxy job, not after.
        raise BackendError(
            f"this session holds {count_arrays} device arrays ({format_bytes(nbytes)}); connecting to the shared "
            "service would discard them and every compiled function. Snapshot or checkpoint what you need, then "
            "add --force (force=True)"
        )
    return install(SharedServiceBackend(request, timeout), force=force)


class ConnectionNotice:
    """One pending notice about the connection, shown before the next cell.

    Posted on a ``disconnect`` event in the current session's log (a session
    that replaces it clears it), or by the kernel when its backend could not
    be reached at start. Read from the log when taken, so it subscribes to
    no session and nothing of it outlives one.
    """

    def __init__(self) -> None:
        self.pending: str | None = None
        self._log: EventLog | None = None
        self._seen = 0

    def post(self, text: str) -> None:
        self.pending = text

    def take(self) -> str | None:
        """The notice, once, if one was posted since the last call."""
        current = sessions.current()
        if current is not None:
            if current.events is not self._log:
                self._log, self._seen, self.pending = current.events, 0, None
            for event in self._log.since(self._seen):
                self._seen = event.seq
                if event.kind == "disconnect":
                    self.post(
                        f"Pathways connection lost ({event.detail}). Device arrays and compiled functions of that "
                        "connection are gone. Run `%pathways reconnect` (pw.reconnect()), then rebuild the mesh and "
                        "restore state from a snapshot or checkpoint."
                    )
        text, self.pending = self.pending, None
        return text


NOTICE = ConnectionNotice()
