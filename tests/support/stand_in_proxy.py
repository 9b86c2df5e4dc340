"""The stand-in Pathways proxy of tests/backends/test_proxy.py as a program: ``python stand_in_proxy.py PORT``.

It answers the IFRT proxy's version check (so pre-flight passes) but opens no
session, so JAX's real proxy client connects and fails: the furthest a test
gets without a Pathways server image. Run inside a Slurm job by the tests.
"""

import sys
from concurrent import futures

import grpc


def get_version(request, context):
    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "stand-in proxy: no IFRT session here")


handler = grpc.method_handlers_generic_handler(
    "xla.ifrt.proxy.GrpcIfrtService", {"GetVersion": grpc.unary_unary_rpc_method_handler(get_version)}
)
server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler])
server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
server.start()
server.wait_for_termination()
