"""Status codes the server answers with, as the client reads them (absl codes)."""

from __future__ import annotations

from typing import NoReturn

import grpc

from pathways_kernel.server.protos import Proto

INVALID_ARGUMENT = 3
NOT_FOUND = 5
UNIMPLEMENTED = 12
INTERNAL = 13
DATA_LOSS = 15


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


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """Ends a gRPC call with ``code``: gRPC's ``abort`` raises (no stubs say so here)."""
    context.abort(code, message)
    raise AssertionError("grpc's abort returned")
