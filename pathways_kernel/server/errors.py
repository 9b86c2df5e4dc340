"""Status codes the server answers with, as the client reads them (absl codes)."""

from __future__ import annotations

import re
from typing import NoReturn

import grpc

from pathways_kernel.server.protos import Proto

CANCELLED = 1
INVALID_ARGUMENT = 3
NOT_FOUND = 5
ALREADY_EXISTS = 6
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
UNIMPLEMENTED = 12
INTERNAL = 13
DATA_LOSS = 15

#: absl's status codes by name, as XLA's errors start their text (``RESOURCE_EXHAUSTED: ...``).
_CODES = {code.name: code.value[0] for code in grpc.StatusCode if code is not grpc.StatusCode.OK}
_LEADING_CODE = re.compile(r"^\s*([A-Z_]+): ")


class ServerError(Exception):
    """A request failed; ``code`` and ``message`` go back to the client as its status."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def to_status(self, status: Proto) -> None:
        """Writes this error into ``status``, a status message of a response."""
        status.code = self.code
        status.message = self.message

    @classmethod
    def not_found(cls, message: str) -> ServerError:
        return cls(NOT_FOUND, message)

    @classmethod
    def invalid(cls, message: str) -> ServerError:
        return cls(INVALID_ARGUMENT, message)


def code_of(error: BaseException, default: int = INTERNAL) -> int:
    """The status code ``error`` carries: a ServerError's own, the code an XLA error's text
    starts with (jaxlib raises them as ``JaxRuntimeError('RESOURCE_EXHAUSTED: ...')``), or
    ``default``. As the reference server does, a code XLA gave is passed through unchanged."""
    if isinstance(error, ServerError):
        return error.code
    match = _LEADING_CODE.match(str(error))
    return _CODES.get(match.group(1), default) if match else default


def from_exception(error: BaseException, what: str, default: int = INTERNAL) -> ServerError:
    """``error`` as a ServerError, its code passed through (``code_of``), its text led by ``what``."""
    if isinstance(error, ServerError):
        return error
    text = " ".join(str(error).split())
    match = _LEADING_CODE.match(text)
    if match and match.group(1) in _CODES:
        text = text[match.end() :]
    return ServerError(code_of(error, default), f"{what}: {text}")


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """Ends a gRPC call with ``code``: gRPC's ``abort`` raises (no stubs say so here)."""
    context.abort(code, message)
    raise AssertionError("grpc's abort returned")
