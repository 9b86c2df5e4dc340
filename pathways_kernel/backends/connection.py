"""Connecting the session to a cluster, and coming back after a disconnect.

``session.connect`` switches backends; this module adds what a user of a
remote cluster needs on top: ``reconnect()`` after the proxy went away,
``connect_shared_service()`` for a shared Pathways service, the notice
that tells the user, after a ``disconnect`` event, what is gone and what to
do next, and the one line for an error of a connection that is gone
(``error_line``). Both name one command, ``%pathways reconnect``: the
snapshot store outlives the connection (``sessions.HostState``), and healing
puts what it holds back on the new server.
"""

from __future__ import annotations

from pathways_kernel import backends
from pathways_kernel.backends import local_server
from pathways_kernel.backends.local_server import RECONNECT, LocalServerBackend
from pathways_kernel.backends.proxy import ProxyBackend, clear_jax
from pathways_kernel.backends.shared_service import ServiceRequest, SharedServiceBackend
from pathways_kernel.core import lost_clients, sessions
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
            if isinstance(current.backend, LocalServerBackend):
                current.backend.gone()  # a server that just died is told now, not a cell later
            if current.events is not self._log:
                self._log, self._seen, self.pending = current.events, 0, None
            for event in self._log.since(self._seen):
                self._seen = event.seq
                if event.kind == "disconnect":
                    self.post(
                        f"Pathways connection lost ({event.detail}). Device arrays and compiled functions of that "
                        f"connection are gone. {RECONNECT} for a new connection: variables with a snapshot come back on it"
                    )
        text, self.pending = self.pending, None
        return text


NOTICE = ConnectionNotice()

#: What JAX's proxy client says once its server is gone (its words depend on where the death fell).
_GONE_WORDS = (
    "Connection to IFRT proxy server was terminated",
    "GrpcClientSession: writes no longer allowed",
    "RpcHelper::Finish() already called",
)
#: What JAX says of an eager host callback (``jax.debug.print`` outside jit) with no local CPU device.
EAGER_HOST_CALLBACK = "jax.debug.callback failed to find a local CPU device"
#: Seconds the client's error may come before the server's exit is seen.
_EXIT_SEEN_S = 2.0


def error_line(error: BaseException) -> str | None:
    """The one line for a JAX error whose own message does not say what to do, else None.

    An error of a connection that is gone says why it went (the local server's pid, how it
    ended, its last words) and the one command that recovers; once said, the notice of that
    disconnect is not said again. Others: ``local_server.error_line``.
    """
    text = str(error)
    current = sessions.current()
    backend = current.backend if current is not None else None
    name = type(error).__name__
    if isinstance(backend, LocalServerBackend):
        message = backend.gone_message()
        older = lost_clients.last_reason()
        if message is None and older is not None and any(words in text for words in _GONE_WORDS):
            # This server serves: the work used arrays or functions of one that is gone.
            return (
                f"{name}: this work used arrays of a Pathways server that is gone ({older}): their data is lost. "
                "Variables with a snapshot were restored on the new server; recompute or reload the others"
            )
        if message is None and (text.startswith("UNAVAILABLE") or any(words in text for words in _GONE_WORDS)):
            message = backend.gone_message(_EXIT_SEEN_S)
        if message is not None:
            NOTICE.take()  # said here: not again under the next cell
            return f"{name}: {message}"
    if EAGER_HOST_CALLBACK in text:
        # Outside jit JAX looks for a local CPU device to run the callback on, which a proxy
        # client has none of; inside jit the client refuses it: one line for both.
        return local_server.error_line(type(error)(local_server.HOST_CALLBACK_REFUSED))
    if not any(words in text for words in _GONE_WORDS):
        return local_server.error_line(error)
    if isinstance(backend, ProxyBackend):
        said = " ".join(text.split())[:300]
        return (
            f"{name}: the Pathways connection ({backend.address.url}) is gone ({said}): its arrays and compiled "
            f"functions are lost. {RECONNECT} for a new connection: variables with a snapshot come back on it"
        )
    return None
