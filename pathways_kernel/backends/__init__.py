"""Backends: where the session's devices come from.

A spec names one: ``local:SxC`` (the default: S slices of C chips in a
``pathways-local`` server the session starts, reached through JAX's own proxy
client as on Pathways, ``backends/local_server.py``; ``local-server:SxC`` and
``server=True`` / ``--server`` name it too, as they did before it was the
default), ``embedded:SxC`` (the same slices emulated with CPU devices in this
process, ``emulator/local.py``: no second process, faster steps, host
callbacks work; the only choice in a process whose JAX already runs on
``cpu``), ``proxy:grpc://HOST:PORT`` / ``grpc://HOST:PORT`` (Pathways) or
``slurm:JOB`` (the Pathways proxy of a Slurm job, ``backends/slurm.py``).
"""

from __future__ import annotations

import os
import re
import sys

from pathways_kernel.core.backend import Backend, Placement
from pathways_kernel.core.errors import SpecError

DEFAULT_SPEC = "local:2x4"
#: The default where JAX already runs in this process (a stock kernel that computed before
#: ``%load_ext``): switching it to the proxy client would drop the arrays it holds.
IN_PROCESS_SPEC = "embedded:2x4"
#: Environment variable a kernelspec sets to choose the kernel's backend.
BACKEND_ENV = "PATHWAYS_BACKEND"
#: Upper bound on emulated devices; XLA's CPU client gets slow far beyond it.
MAX_LOCAL_DEVICES = 4096

# local-server: is last wave's name for local:, kept so that its commands and kernelspecs still work.
_LOCAL = re.compile(r"^local(?:-server)?(?::(?P<body>.*))?$", re.DOTALL)
_EMBEDDED = re.compile(r"^embedded(?::(?P<body>.*))?$", re.DOTALL)
_LOCAL_BODY = re.compile(r"([0-9]+)[xX]([0-9]+)")
# HOST:PORT without a scheme: a proxy address missing its grpc://.
_HOST_PORT = re.compile(r"^[\w.\-\[\]:]+:\d+$")


def default_spec() -> str:
    """The spec a new session starts with: kernelspec env, Pathways env, embedded:2x4 where
    JAX already runs in this process, else local:2x4 (a local Pathways server)."""
    if spec := os.environ.get(BACKEND_ENV):
        return spec
    if os.environ.get("JAX_PLATFORMS", "").strip() == "proxy" and os.environ.get("JAX_BACKEND_TARGET"):
        return "proxy:" + os.environ["JAX_BACKEND_TARGET"]
    if _jax_running():
        return IN_PROCESS_SPEC
    return DEFAULT_SPEC


def _jax_running() -> bool:
    """Whether this process's JAX has created its backends (never imports JAX itself)."""
    from pathways_kernel.core import jaxcompat

    return "jax" in sys.modules and jaxcompat.backends_initialized()


def parse_local(body: str | None, kind: str = "local") -> tuple[int, int]:
    """``"2x4"`` -> ``(2, 4)``; raises ``SpecError`` with the fix on bad input.

    ``kind`` (``local`` or ``embedded``) is the spec's prefix, as the message shows it.
    """
    if body is None or body == "":
        return 2, 4
    # Escaped, so that a full-width digit or a newline shows as what it is; cut, so that it stays one line.
    shown = body[:20].encode("unicode_escape").decode() + ("..." if len(body) > 20 else "")
    # ASCII digits only: str.isdigit and int() also take full-width ones.
    match = _LOCAL_BODY.fullmatch(body)
    if match is None:
        raise SpecError(
            f"bad {kind} spec '{kind}:{shown}': expected {kind}:SxC with S slices of C chips (digits 0-9), "
            f"e.g. {kind}:2x4 (local:SxC runs them in a local Pathways server, embedded:SxC in this process)"
        )
    digits = [group.lstrip("0") for group in match.groups()]
    if not all(digits):
        raise SpecError(f"bad {kind} spec '{kind}:{shown}': slices and chips must be at least 1, e.g. {kind}:2x4")
    # Numbers this long are too many devices anyway; int() of thousands of digits is slow or refused.
    if any(len(d) > 9 for d in digits):
        devices = "that many"
    else:
        slices, chips = int(digits[0]), int(digits[1])
        if slices * chips <= MAX_LOCAL_DEVICES:
            return slices, chips
        devices = str(slices * chips)
    raise SpecError(
        f"bad {kind} spec '{kind}:{shown}': {devices} devices is more than the {MAX_LOCAL_DEVICES} a local backend emulates"
    )


def local_kinds(body: str, timeout: float | None = None) -> Backend:
    """``local:v5p:2x2x1*2,v6e:2x2``: slices of TPU generations and shapes in a local server
    (``core/tpu_kinds.py``); raises ``SpecError`` with the fix on bad input."""
    from pathways_kernel.backends.local_server import LocalServerBackend
    from pathways_kernel.core.tpu_kinds import format_slices, parse_slices

    shapes = parse_slices(body, "local:")
    return LocalServerBackend(len(shapes), max(s.chips for s in shapes), timeout, kinds=format_slices(shapes))


def from_spec(
    spec: str, *, timeout: float | None = None, insecure: bool | None = None, server: bool = False
) -> Backend:
    """Build (but do not activate) the backend a spec names.

    ``timeout`` (pre-flight seconds) and ``insecure`` (plaintext gRPC) apply
    to the proxy backends only. ``server`` only says what ``local:SxC``
    already means (the slices in a local Pathways server process); it is
    kept so that last wave's ``--server`` commands still work.

    Raises:
      SpecError: the spec is malformed or names no backend.
    """
    spec = spec.strip()
    if server and not _LOCAL.match(spec):
        raise SpecError(
            f"--server (server=True) runs local slices in a local Pathways server, as local:SxC does by itself: "
            f"use local:SxC, e.g. local:2x4, not '{spec[:40]}' (embedded:SxC runs them in this process)"
        )
    if match := _LOCAL.match(spec):
        from pathways_kernel.backends.local_server import LocalServerBackend

        if ":" in (match.group("body") or ""):
            return local_kinds(match.group("body"), timeout)
        return LocalServerBackend(*parse_local(match.group("body")), timeout=timeout)
    if match := _EMBEDDED.match(spec):
        from pathways_kernel.emulator.local import LocalBackend  # JAX's own import: only when asked for

        return LocalBackend(*parse_local(match.group("body"), "embedded"))
    # Before HOST:PORT, which `slurm:4` (a job id) also matches.
    if spec.startswith("slurm:"):
        from pathways_kernel.backends.slurm_backend import SlurmBackend, parse_spec

        return SlurmBackend(parse_spec(spec), timeout=timeout, insecure=insecure)
    if spec.startswith("proxy:") or "://" in spec or _HOST_PORT.match(spec):
        from pathways_kernel.backends.proxy import ProxyBackend

        return ProxyBackend.from_spec(spec, timeout=timeout, insecure=insecure)
    raise SpecError(
        f"unknown backend spec '{spec}': use local:SxC (e.g. local:2x4, a local Pathways server), embedded:SxC "
        "(the same slices in the kernel's process), grpc://HOST:PORT for a Pathways proxy or slurm:JOB for a Pathways job on Slurm"
    )


def _default_local() -> tuple[int, int] | None:
    """Slices and chips of the default spec when it is ``local:SxC``, else None."""
    match = _LOCAL.match(default_spec().strip())
    if match is None:
        return None
    try:
        return parse_local(match.group("body"))
    except SpecError:
        return None


def default_start_label() -> str | None:
    """What starting the default backend is, when it is ``local:SxC`` (``core/startup.py``), else None."""
    local = _default_local()
    if local is None:
        return None
    slices, chips = local
    return (
        f"starting the local Pathways server ({slices} slice{'s' * (slices != 1)} x {chips} chip{'s' * (chips != 1)})"
    )


def start_server_early() -> None:
    """Starts the local Pathways server of the default spec (``local:SxC``), without waiting for it.

    The kernel calls it before its own imports (JAX, IPython), so that the server starts beside
    them; the session's ``local:SxC`` backend adopts it (``server_client.start``). Any other spec, or a
    malformed one (the session says why in one line), starts nothing.
    """
    local = _default_local()
    if local is None:
        return
    slices, chips = local
    from pathways_kernel.backends import server_client

    server_client.start_early(slices, chips, server_client.kernel_env())


__all__ = [
    "Backend",
    "Placement",
    "from_spec",
    "default_spec",
    "parse_local",
    "start_server_early",
    "default_start_label",
    "DEFAULT_SPEC",
]
