"""The control channel: fail, repair and inspect slices of a running server, and cancel the
work its clients queued (an interrupted cell).

It is served on the server's own address (so whoever may reach the server, and
no one else, may fail its slices), as ``pathways_local.Control`` with JSON bodies. Its
clients call it through ``core/server_protocol.py``'s ``control_call``: the kernel
(``backends/server_client.py``) and ``pathways-local fail|repair|status``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from pathways_kernel.core.server_protocol import CONTROL_SERVICE
from pathways_kernel.server.errors import ServerError, abort

if TYPE_CHECKING:
    from pathways_kernel.server.service import Server


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
        CONTROL_SERVICE,
        {
            "Fail": call(lambda body: {"lost_arrays": server.fail_slice(int(body["slice"])), **server.status()}),
            "Repair": call(repair),
            "Status": call(lambda body: server.status()),
            "Cancel": call(lambda body: server.cancel()),
        },
    )
