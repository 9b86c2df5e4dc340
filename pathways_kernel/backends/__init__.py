"""Backends: where the session's devices come from.

A spec names one: ``local:SxC`` (embedded, CPU devices as S slices of C
chips) or ``proxy:grpc://HOST:PORT`` / ``grpc://HOST:PORT`` (Pathways).
"""

from __future__ import annotations

import os
import re

from pathways_kernel.backends.base import Backend, Placement
from pathways_kernel.emulator.local import LocalBackend
from pathways_kernel.core.errors import SpecError

DEFAULT_SPEC = "local:2x4"
#: Environment variable a kernelspec sets to choose the kernel's backend.
BACKEND_ENV = "PATHWAYS_BACKEND"
#: Upper bound on emulated devices; XLA's CPU client gets slow far beyond it.
MAX_LOCAL_DEVICES = 4096

_LOCAL = re.compile(r"^local(?::(?P<body>.*))?$")
# HOST:PORT without a scheme: a proxy address missing its grpc://.
_HOST_PORT = re.compile(r"^[\w.\-\[\]:]+:\d+$")


def default_spec() -> str:
    """The spec a new session starts with: kernelspec env, Pathways env, or local:2x4."""
    if spec := os.environ.get(BACKEND_ENV):
        return spec
    if os.environ.get("JAX_PLATFORMS", "").strip() == "proxy" and os.environ.get("JAX_BACKEND_TARGET"):
        return "proxy:" + os.environ["JAX_BACKEND_TARGET"]
    return DEFAULT_SPEC


def parse_local(body: str | None) -> tuple[int, int]:
    """``"2x4"`` -> ``(2, 4)``; raises ``SpecError`` with the fix on bad input."""
    if body is None or body == "":
        return 2, 4
    parts = body.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise SpecError(
            f"bad local spec 'local:{body}': expected local:SxC with S slices of C chips, e.g. local:2x4"
        )
    slices, chips = int(parts[0]), int(parts[1])
    if slices < 1 or chips < 1:
        raise SpecError(f"bad local spec 'local:{body}': slices and chips must be at least 1, e.g. local:2x4")
    if slices * chips > MAX_LOCAL_DEVICES:
        raise SpecError(
            f"bad local spec 'local:{body}': {slices * chips} devices is more than the "
            f"{MAX_LOCAL_DEVICES} the embedded backend emulates"
        )
    return slices, chips


def from_spec(spec: str, *, timeout: float | None = None, insecure: bool | None = None) -> Backend:
    """Build (but do not activate) the backend a spec names.

    ``timeout`` (pre-flight seconds) and ``insecure`` (plaintext gRPC) apply
    to the proxy backend only.

    Raises:
      SpecError: the spec is malformed or names no backend.
    """
    spec = spec.strip()
    if match := _LOCAL.match(spec):
        return LocalBackend(*parse_local(match.group("body")))
    if spec.startswith("proxy:") or "://" in spec or _HOST_PORT.match(spec):
        from pathways_kernel.backends.proxy import ProxyBackend

        return ProxyBackend.from_spec(spec, timeout=timeout, insecure=insecure)
    raise SpecError(
        f"unknown backend spec '{spec}': use local:SxC (e.g. local:2x4) or grpc://HOST:PORT for a Pathways proxy"
    )


__all__ = ["Backend", "Placement", "LocalBackend", "from_spec", "default_spec", "parse_local", "DEFAULT_SPEC"]
