"""Pre-flight: check a Pathways proxy target before JAX's client sees it.

JAX's IFRT proxy client holds the backend lock for up to 120 s on a wrong
address, retries on every later JAX call and reports most mistakes as the same
``UNAVAILABLE`` (a silent TCP listener even takes 20 s per attempt). So before
the client is created, each step of the way to the proxy is checked here, with
one deadline for all of them (default 5 s):

1. ``scheme``: the target is ``grpc://HOST:PORT``.
2. ``resolve``: ``HOST`` resolves (DNS).
3. ``connect``: a TCP connection opens (refused / unreachable / timeout).
4. ``handshake``: the listener answers the HTTP/2 preface with a SETTINGS
   frame in plaintext (gRPC without TLS, as ``kubectl port-forward`` gives),
   or it speaks TLS, HTTP/1 or nothing at all.
5. ``grpc``: grpcio's channel becomes ready.
6. ``proxy``: the server implements the IFRT proxy service (``GetVersion``
   answers with anything but ``UNIMPLEMENTED``).

Each failure raises ``ConnectError`` naming the step and the likely fix. With
secure (ALTS) credentials only steps 1-4 run: ALTS works only on Google Cloud
VMs, so a plaintext server is a credential mismatch we can name, and anything
else is left to the client.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeAlias, TypeVar

from pathways_kernel.core.errors import BackendError, SpecError
from pathways_kernel.core.text import shown

#: Seconds for all pre-flight steps together unless the user says otherwise.
DEFAULT_TIMEOUT_S = 5.0
#: The port Pathways' proxy listens on (and the one port-forward examples use).
PROXY_PORT = 29000
#: The IFRT proxy's version handshake: cheap, side-effect free, proxy-only.
GET_VERSION = "/xla.ifrt.proxy.GrpcIfrtService/GetVersion"

_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_H2_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS_TYPE = 0x04
_TARGET = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\[\]]+):(?P<port>[0-9]{1,5})$")
#: The longest DNS name (RFC 1035), in its ASCII form.
MAX_HOST = 253

T = TypeVar("T")
#: Makes the ``ConnectError`` of a failed step: ``fail(step, what, fix)``.
Fail: TypeAlias = Callable[[str, str, str], "ConnectError"]
#: A socket address as ``getaddrinfo`` gives it (IPv4, IPv6, or IPv6 without IPv6 support).
SockAddr: TypeAlias = tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes]


class Address(Protocol):
    """Where a gRPC server listens, as a report and the gRPC step read it: a ``Target``,
    or the local server's Unix socket (``backends/local_server.SocketTarget``)."""

    @property
    def url(self) -> str: ...

    @property
    def authority(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Target:
    """A Pathways proxy address, ``grpc://HOST:PORT``."""

    host: str
    port: int

    @property
    def url(self) -> str:
        return f"grpc://{self.authority}"

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.url


class ConnectError(BackendError):
    """A pre-flight step failed; ``step`` names it (``scheme``, ``dns``, ...)."""

    def __init__(self, target: str, step: str, what: str, fix: str, elapsed_s: float = 0.0):
        self.target, self.step, self.what, self.fix, self.elapsed_s = target, step, what, fix, elapsed_s
        super().__init__(f"cannot connect to {target}: {step} failed after {elapsed_s:.1f} s: {what}. {fix}")


@dataclasses.dataclass(frozen=True)
class Report:
    """What a passed pre-flight saw."""

    target: Address
    address: str
    secure: bool
    server: str  # "pathways-proxy" (checked) or "plaintext-unchecked"/"unknown"
    elapsed_s: float


def parse_target(text: str) -> Target:
    """``grpc://HOST:PORT`` -> ``Target``; raises ``SpecError`` naming the fix."""
    raw = text.strip()
    shown_raw = shown(raw, 80)
    scheme, sep, rest = raw.partition("://")
    if not sep:
        raise SpecError(
            f"bad proxy target {shown_raw}: scheme step failed: no scheme. "
            f"Write it as grpc://HOST:PORT, e.g. grpc://{shown(raw, 80)[1:-1] if raw else 'localhost:29000'}"
        )
    if scheme.lower() != "grpc":
        raise SpecError(
            f"bad proxy target {shown_raw}: scheme step failed: {shown(scheme + '://')} is not supported; "
            f"the Pathways proxy speaks gRPC: use grpc://{shown(rest.rstrip('/'), 80)[1:-1]}"
        )
    match = _TARGET.match(rest.rstrip("/"))
    if match is None or not 0 < int(match.group("port")) < 65536:
        raise SpecError(
            f"bad proxy target {shown_raw}: expected grpc://HOST:PORT with a port in 1..65535 (digits 0-9), "
            f"e.g. grpc://localhost:{PROXY_PORT}"
        )
    host = match.group("host").strip("[]")
    try:
        # What the resolver would do: 'idna' refuses an empty label or one over 63 characters.
        fits = ":" in host or len(host.encode("idna")) <= MAX_HOST
    except UnicodeError:
        fits = False
    if not fits:
        raise SpecError(
            f"bad proxy target {shown_raw}: {shown(host)} is not a host name (at most {MAX_HOST} characters, "
            f"1 to 63 between dots); e.g. grpc://localhost:{PROXY_PORT}"
        )
    return Target(host, int(match.group("port")))


def preflight(target: Target, timeout: float = DEFAULT_TIMEOUT_S, secure: bool = False) -> Report:
    """Check every step to the proxy within ``timeout`` seconds.

    Args:
      target: where the proxy should listen.
      timeout: seconds for all steps together.
      secure: whether the client will use ALTS credentials (not ``--insecure``).

    Returns:
      A ``Report`` when nothing ruled the target out.

    Raises:
      ConnectError: the first step that failed, with the likely fix.
    """
    start = time.monotonic()
    deadline = start + timeout

    def left() -> float:
        return max(deadline - time.monotonic(), 0.0)

    def fail(step: str, what: str, fix: str) -> ConnectError:
        return ConnectError(target.url, step, what, fix, time.monotonic() - start)

    addresses = _resolve(target, left(), fail)
    sock, address = _connect(target, addresses, deadline, fail)
    with sock:
        speaks = _handshake(target, sock, left(), fail)
    if secure:
        if speaks == "h2c":
            raise fail(
                "credentials",
                "the server speaks plaintext gRPC (as kubectl port-forward gives) but the client would use ALTS "
                "credentials and fail with 'Invalid credentials'",
                "Connect with --insecure (pw.connect(..., insecure=True))",
            )
        return Report(target, address, True, "unknown", time.monotonic() - start)
    if speaks == "closed" and _speaks_tls(target, address, left()):
        speaks = "tls"
    if speaks == "tls":
        raise fail(
            "credentials",
            "the server expects TLS but --insecure uses plaintext (and the proxy client speaks plaintext or ALTS, "
            "never TLS)",
            "Point at the proxy's plaintext port through kubectl port-forward, or drop --insecure for ALTS "
            "(Google Cloud VMs only)",
        )
    if speaks == "closed":
        raise fail(
            "handshake",
            f"{target.authority} closed the connection at the plaintext HTTP/2 handshake: not a plaintext gRPC server",
            "Drop --insecure if the proxy uses ALTS (Google Cloud VMs only), or check the port (the proxy listens "
            f"on {PROXY_PORT})",
        )
    _check_grpc(target, left, fail)
    return Report(target, address, False, "pathways-proxy", time.monotonic() - start)


def _within(seconds: float, work: Callable[[], T]) -> T:
    """Run blocking ``work`` (a DNS lookup) but give up after ``seconds``."""
    values: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            values.append(work())
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="pathways-preflight-dns", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError
    if errors:
        raise errors[0]
    return values[0]


def _resolve(target: Target, seconds: float, fail: Fail) -> list[SockAddr]:
    try:
        infos = _within(seconds, lambda: socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM))
    except TimeoutError:
        raise fail(
            "dns",
            f"resolving '{target.host}' took longer than the timeout",
            "Check the host name and DNS, or raise --timeout",
        ) from None
    except socket.gaierror as exc:
        raise fail(
            "dns",
            f"'{target.host}' does not resolve ({exc.strerror})",
            "Check the host name; for a port-forwarded proxy use grpc://localhost:PORT",
        ) from None
    return [info[4] for info in infos]


def _connect(target: Target, addresses: list[SockAddr], deadline: float, fail: Fail) -> tuple[socket.socket, str]:
    refused = unreachable = None
    for address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        family = socket.AF_INET6 if len(address) == 4 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(left)
        try:
            sock.connect(address)
            return sock, f"{address[0]}:{address[1]!s}"
        except ConnectionRefusedError:
            refused = address
        except TimeoutError:
            unreachable = "timed out"
        except OSError as exc:
            unreachable = exc.strerror or str(exc)
        sock.close()
    # On a dual-stack name one family may be unreachable while the other
    # refuses: "refused" is the one that says what to fix.
    if refused is not None:
        raise fail(
            "connect",
            f"connection refused at {target.authority}: nothing listens there",
            f"Start the port-forward (kubectl port-forward svc/PROXY_SERVICE {target.port}:{PROXY_PORT}) "
            "or check the port",
        )
    raise fail(
        "connect",
        f"{target.authority} is unreachable ({unreachable or 'timed out'})",
        "Check that the address is reachable from this machine (firewall, VPC), use kubectl port-forward "
        "and grpc://localhost:PORT, or raise --timeout",
    )


def _handshake(target: Target, sock: socket.socket, seconds: float, fail: Fail) -> str:
    """Send the HTTP/2 preface; return ``"h2c"``, ``"tls"`` or ``"closed"``."""
    sock.settimeout(max(seconds, 0.01))
    try:
        sock.sendall(_H2_PREFACE + _H2_EMPTY_SETTINGS)
        reply = sock.recv(9)
    except TimeoutError:
        raise fail(
            "handshake",
            f"{target.authority} accepted TCP but sent no HTTP/2 reply: not a gRPC server",
            f"Check the port: the Pathways proxy listens on {PROXY_PORT} (kubectl port-forward ... LOCAL:{PROXY_PORT})",
        ) from None
    except (ConnectionResetError, BrokenPipeError):
        return "closed"
    if len(reply) >= 4 and reply[3] == _H2_SETTINGS_TYPE:
        return "h2c"
    if reply[:1] in (b"\x15", b"\x16") and reply[1:2] == b"\x03":
        return "tls"
    if not reply:
        return "closed"
    shown = "HTTP/1" if reply.startswith(b"HTTP/") else repr(reply[:9])
    raise fail(
        "handshake",
        f"{target.authority} answered {shown}, not HTTP/2: not a gRPC server",
        f"Check the port: the Pathways proxy listens on {PROXY_PORT} (kubectl port-forward ... LOCAL:{PROXY_PORT})",
    )


def _speaks_tls(target: Target, address: str, seconds: float) -> bool:
    """Whether the listener answers a TLS ClientHello (certificate not checked)."""
    import ssl

    if seconds <= 0:
        return False
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    host, _, port = address.rpartition(":")
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=seconds) as raw,
            context.wrap_socket(raw, server_hostname=target.host),
        ):
            return True
    except ssl.SSLError:
        return True  # a TLS alert is still TLS
    except OSError:
        return False


def _check_grpc(target: Address, left: Callable[[], float], fail: Fail) -> None:
    import grpc

    channel = grpc.insecure_channel(target.authority, options=[("grpc.enable_retries", 0)])
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=left())
        except grpc.FutureTimeoutError:
            raise fail(
                "grpc",
                "the HTTP/2 channel did not become ready",
                "Check that the port-forward is alive and points at the proxy, or raise --timeout",
            ) from None
        get_version = channel.unary_unary(GET_VERSION, request_serializer=None, response_deserializer=None)
        try:
            get_version(b"", timeout=max(left(), 0.05))
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise fail(
                    "proxy",
                    "a gRPC server answers but it is not a Pathways IFRT proxy (GetVersion is unimplemented)",
                    f"Point at the proxy's port ({PROXY_PORT} on the proxy pod), not another service",
                ) from None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise fail(
                    "credentials", f"the proxy refused the credentials ({exc.details()})", "Drop --insecure to use ALTS"
                ) from None
            if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                raise fail(
                    "proxy",
                    f"the server did not answer the IFRT proxy version check ({code.name})",
                    "Check the proxy pod's logs (kubectl logs), or raise --timeout",
                ) from None
            # Any other status means the IFRT proxy service is there (a
            # version mismatch is for the client to report).
    finally:
        channel.close()
