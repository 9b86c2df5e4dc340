"""The control channel: fail, repair and inspect slices of a running server, and cancel the
work its clients queued (an interrupted cell).

It is served on the server's own address (so whoever may reach the server, and
no one else, may fail its slices), as ``pathways_local.Control`` with JSON bodies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from pathways_kernel.core.errors import BackendError
from pathways_kernel.server.errors import ServerError, abort

if TYPE_CHECKING:
    from pathways_kernel.server.service import Server

SERVICE = "pathways_local.Control"


def handlers(server: Server) -> grpc.GenericRpcHandler:
    """The control methods, acting on ``server``."""

    def call(action: Callable[[dict[str, Any]], dict[str, Any]]) -> grpc.RpcMethodHandler:
        def handle(body: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                return json.dumps(action(json.loads(body or b"{}"))).encode()
            except ServerError as error:
                abort(context, grpc.StatusCode.INVALID_ARGUMENT, error.message)

        return grpc.unary_unary_rpc_method_handler(handle)

    def repair(body: dict[str, Any]) -> dict[str, Any]:
        server.repair_slice(int(body["slice"]))
        return server.status()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Fail": call(lambda body: {"lost_arrays": server.fail_slice(int(body["slice"])), **server.status()}),
            "Repair": call(repair),
            "Status": call(lambda body: server.status()),
            "Cancel": call(lambda body: server.cancel()),
        },
    )


def _address(target: str) -> str:
    return target.removeprefix("grpc://")


def _call(target: str, method: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    with grpc.insecure_channel(_address(target)) as channel:
        rpc = channel.unary_unary(f"/{SERVICE}/{method}")
        try:
            result: dict[str, Any] = json.loads(rpc(json.dumps(body).encode(), timeout=timeout))
            return result
        except grpc.RpcError as error:
            detail = error.details() if hasattr(error, "details") else str(error)
            raise BackendError(f"local Pathways server at {target}: {method.lower()} failed: {detail}") from None


def fail(target: str, slice_index: int, timeout: float = 30.0) -> dict[str, Any]:
    """Loses slice ``slice_index`` on the server at ``target``; returns its status."""
    return _call(target, "Fail", {"slice": slice_index}, timeout)


def repair(target: str, slice_index: int, timeout: float = 30.0) -> dict[str, Any]:
    """Brings slice ``slice_index`` back (empty); returns the server's status."""
    return _call(target, "Repair", {"slice": slice_index}, timeout)


def cancel(target: str, timeout: float = 5.0) -> dict[str, Any]:
    """Drops the executions the server has not started (the client was interrupted); returns
    ``running``, the most executions still running on one device."""
    return _call(target, "Cancel", {}, timeout)


def status(target: str, timeout: float = 30.0) -> dict[str, Any]:
    """The server's slices, which are down, and bytes held on each device."""
    return _call(target, "Status", {}, timeout)
