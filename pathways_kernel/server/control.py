"""The control channel: fail, repair and inspect slices of a running server.

It is served on the server's own address (so whoever may reach the server, and
no one else, may fail its slices), as ``pathways_local.Control`` with JSON bodies.
"""

from __future__ import annotations

import json

import grpc

from pathways_kernel.core.errors import BackendError
from pathways_kernel.server.errors import ServerError

SERVICE = "pathways_local.Control"


def handlers(server) -> grpc.GenericRpcHandler:
    """The control methods, acting on ``server`` (a ``service.Server``)."""

    def call(action):
        def handle(body: bytes, context):
            try:
                return json.dumps(action(json.loads(body or b"{}"))).encode()
            except ServerError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)

        return grpc.unary_unary_rpc_method_handler(handle)

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Fail": call(lambda body: {"lost_arrays": server.fail_slice(int(body["slice"])), **server.status()}),
            "Repair": call(lambda body: (server.repair_slice(int(body["slice"])), server.status())[1]),
            "Status": call(lambda body: server.status()),
        },
    )


def _address(target: str) -> str:
    return target.removeprefix("grpc://")


def _call(target: str, method: str, body: dict, timeout: float) -> dict:
    with grpc.insecure_channel(_address(target)) as channel:
        rpc = channel.unary_unary(f"/{SERVICE}/{method}")
        try:
            return json.loads(rpc(json.dumps(body).encode(), timeout=timeout))
        except grpc.RpcError as error:
            detail = error.details() if hasattr(error, "details") else str(error)
            raise BackendError(f"local Pathways server at {target}: {method.lower()} failed: {detail}") from None


def fail(target: str, slice_index: int, timeout: float = 30.0) -> dict:
    """Loses slice ``slice_index`` on the server at ``target``; returns its status."""
    return _call(target, "Fail", {"slice": slice_index}, timeout)


def repair(target: str, slice_index: int, timeout: float = 30.0) -> dict:
    """Brings slice ``slice_index`` back (empty); returns the server's status."""
    return _call(target, "Repair", {"slice": slice_index}, timeout)


def status(target: str, timeout: float = 30.0) -> dict:
    """The server's slices, which are down, and bytes held on each device."""
    return _call(target, "Status", {}, timeout)
