"""The shared Pathways service: a proxy of your own on a shared cluster.

pathwaysutils' shared-service flow (``isc_pathways.connect``) checks the
service, deploys a proxy job for this user on the GKE cluster, port-forwards
to it and points JAX at ``grpc://127.0.0.1:PORT``. It is a context manager
meant to wrap a script; here it is entered once and held for the session's
lifetime (closed when the session switches backend, or by the flow's own
``atexit`` hook when the kernel exits).

One adaptation: the flow installs SIGINT/SIGTERM/SIGHUP handlers that delete
the proxy and exit. In a kernel, SIGINT is Jupyter's "interrupt", which must
stop the running cell, not the cluster connection, so the kernel's SIGINT
handler is put back; SIGTERM/SIGHUP keep the flow's clean-up.

Needs ``pip install 'pathways-kernel[sps]'`` (the flow's kubernetes client)
and the ``gcloud`` and ``kubectl`` tools.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import re
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from pathways_kernel.backends import preflight as preflight_lib
from pathways_kernel.backends.proxy import ProxyBackend
from pathways_kernel.core.errors import BackendError, SpecError

#: Modules the shared-service flow imports beyond pathways-kernel's own needs.
EXTRA_MODULES = ("kubernetes", "portpicker")
TOOLS = ("gcloud", "kubectl")
_TPU = re.compile(r"^(?P<type>[a-z0-9]+):(?P<topology>\d+(?:x\d+){1,2})$")


@dataclasses.dataclass(frozen=True)
class ServiceRequest:
    """What ``%pathways connect sps`` asks the shared service for."""

    cluster: str
    project: str
    region: str
    service: str
    tpu: str
    count: int
    bucket: str
    proxy_image: str | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        missing = [f for f in ("cluster", "project", "region", "service", "tpu", "bucket") if not getattr(self, f)]
        if missing:
            flags = " ".join(f"--{m} ..." for m in missing)
            raise SpecError(f"%pathways connect sps needs {flags} (see %pathways connect --help)")
        if not _TPU.match(self.tpu):
            raise SpecError(
                f"bad --tpu '{self.tpu}': expected TYPE:TOPOLOGY as the shared service names them, e.g. tpuv6e:2x2"
            )
        if self.count < 1:
            raise SpecError(f"bad --count {self.count}: ask for at least 1 slice")
        host, _, port = self.service.rpartition(":")
        if not host or not port.isdigit():
            raise SpecError(
                f"bad --service '{self.service}': expected HOST:PORT of the Pathways head, e.g. pathways-head:29001"
            )

    @property
    def spec(self) -> str:
        return f"sps:{self.cluster}/{self.service}/{self.tpu}x{self.count}"


def check_requirements(which: Callable[[str], str | None] = shutil.which) -> None:
    """Raise ``BackendError`` naming what the shared-service flow lacks here."""
    tools = [t for t in TOOLS if which(t) is None]
    if tools:
        raise BackendError(
            f"the shared Pathways service needs {' and '.join(tools)} on PATH: install the Google Cloud CLI "
            "(https://cloud.google.com/sdk/docs/install) and `gcloud components install kubectl`"
        )
    modules = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if modules:
        raise BackendError(
            f"the shared Pathways service needs {', '.join(modules)}: pip install 'pathways-kernel[sps]' "
            "and restart the kernel"
        )


@contextlib.contextmanager
def kernel_keeps_sigint() -> Iterator[None]:
    """Within the block, whatever SIGINT handler gets installed is undone.

    Only SIGINT: it is Jupyter's interrupt. Must run on the main thread,
    like any signal handler change.
    """
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None
    try:
        yield
    finally:
        if on_main and previous is not None:
            signal.signal(signal.SIGINT, previous)


class SharedServiceBackend(ProxyBackend):
    """A proxy deployed for this session on a shared Pathways service."""

    name: ClassVar[str] = "sps"

    def __init__(self, request: ServiceRequest, timeout: float | None = None):
        # The real address is known once the flow has port-forwarded.
        super().__init__(preflight_lib.Target("127.0.0.1", preflight_lib.PROXY_PORT), timeout, request.insecure)
        self.request = request
        self._stack: contextlib.ExitStack | None = None
        self.service: Any = None

    @property
    def spec(self) -> str:
        return self.request.spec

    @property
    def target(self) -> str:
        return f"{self.address.url} (shared service {self.request.service} on {self.request.cluster})"

    def preflight(self) -> preflight_lib.Report | None:
        check_requirements()
        if self._stack is None:
            self._enter()
        try:
            return super().preflight()
        except Exception:
            self.close()  # do not leave a proxy job running for nothing
            raise

    def _enter(self) -> None:
        from pathwaysutils.experimental.shared_pathways_service import isc_pathways

        r = self.request
        stack = contextlib.ExitStack()
        options = ["use_insecure_credentials:true"] if r.insecure else None
        try:
            with kernel_keeps_sigint():
                self.service = stack.enter_context(
                    isc_pathways.connect(
                        cluster=r.cluster,
                        project=r.project,
                        region=r.region,
                        gcs_bucket=r.bucket,
                        pathways_service=r.service,
                        expected_tpu_instances={r.tpu: r.count},
                        proxy_server_image=r.proxy_image,
                        proxy_options=options,
                    )
                )
        except Exception as exc:
            stack.close()
            raise BackendError(
                f"the shared Pathways service flow failed: {' '.join(str(exc).split())[:300]}. "
                "Check `kubectl get pods` on the cluster and the flow's log lines above"
            ) from None
        self._stack = stack
        import jax

        self.address = preflight_lib.parse_target(jax.config.read("jax_backend_target"))

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._stack is not None:
                stack, self._stack = self._stack, None
                stack.close()
