"""The gRPC service JAX's proxy client talks to (``xla.ifrt.proxy.GrpcIfrtService``): what
its sessions share (``Server``), and where each request goes.

A client's ``IfrtSession`` stream is a ``Session`` (``session.py``), whose requests go to
their handlers by kind (``REQUESTS``): arrays (``array_requests.py``), programs
(``program_requests.py``) and devices (``device_requests.py``). Host buffers travel on
methods of their own (``HostBufferStore``, ``HostBufferLookup``, ``HostBufferDelete``),
their bytes handled by ``host_buffers.py``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from typing import Any, NoReturn

import grpc

from pathways_kernel.server import array_requests, device_requests, host_buffers, program_requests, protos
from pathways_kernel.server.devices import Topology
from pathways_kernel.server.errors import DATA_LOSS, FAILED_PRECONDITION, ServerError, abort
from pathways_kernel.server.executions import Executions
from pathways_kernel.server.programs import CompiledPrograms, LoadedProgram
from pathways_kernel.server.protos import Proto
from pathways_kernel.server.session import Handler, Session

SERVICE = "xla.ifrt.proxy.GrpcIfrtService"
SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
STORE_METADATA = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
# Protocol versions this server answers; the client says which it speaks.
PROTOCOL_MIN, PROTOCOL_MAX = 16, 25
# IFRT SerDes versions of the messages the server reads and writes (shardings, dtypes,
# array specs): what jaxlib 0.10.1-0.10.2's clients send (their highest is 3). A client
# whose lowest is higher writes formats this server has not been checked against.
SERDES_MIN, SERDES_MAX = 0, 3


def negotiate(request: Proto) -> tuple[int, int]:
    """The protocol and SerDes versions for a client's ``GrpcGetVersionRequest``: the highest
    both speak, as the reference server picks them; FAILED_PRECONDITION in one line if none."""
    low, high = request.min_version, request.max_version
    protocol = min(high.protocol_version, PROTOCOL_MAX)
    if protocol < max(low.protocol_version, PROTOCOL_MIN):
        raise ServerError(
            FAILED_PRECONDITION,
            f"the client speaks IFRT proxy protocol {low.protocol_version}..{high.protocol_version}, "
            f"the local Pathways server {PROTOCOL_MIN}..{PROTOCOL_MAX}: install a jaxlib whose range overlaps",
        )
    serdes = min(high.ifrt_serdes_version_number, SERDES_MAX)
    if serdes < max(low.ifrt_serdes_version_number, SERDES_MIN):
        raise ServerError(
            FAILED_PRECONDITION,
            f"the client speaks IFRT SerDes versions {low.ifrt_serdes_version_number}.."
            f"{high.ifrt_serdes_version_number}, the local Pathways server {SERDES_MIN}..{SERDES_MAX}: "
            "install a jaxlib whose range overlaps",
        )
    return protocol, serdes


def check_session_version(version: Proto) -> None:
    """Refuses, in one line, a session opened with versions ``negotiate`` would not have chosen."""
    if not PROTOCOL_MIN <= version.protocol_version <= PROTOCOL_MAX:
        raise ServerError(
            FAILED_PRECONDITION,
            f"the session asks for IFRT proxy protocol {version.protocol_version}; "
            f"the local Pathways server speaks {PROTOCOL_MIN}..{PROTOCOL_MAX}",
        )
    if not SERDES_MIN <= version.ifrt_serdes_version_number <= SERDES_MAX:
        raise ServerError(
            FAILED_PRECONDITION,
            f"the session asks for IFRT SerDes version {version.ifrt_serdes_version_number}; "
            f"the local Pathways server speaks {SERDES_MIN}..{SERDES_MAX}",
        )


# The handler of each kind of IfrtRequest (the name of its field in the request's oneof).
REQUESTS: dict[str, Handler] = {
    "init_request": device_requests.init_request,
    "get_default_device_assignment_request": device_requests.get_default_device_assignment_request,
    "get_default_layout_request": device_requests.get_default_layout_request,
    "compile_request": program_requests.compile_request,
    "loaded_executable_metadata_request": program_requests.loaded_executable_metadata_request,
    "loaded_executable_cost_analysis_request": program_requests.loaded_executable_cost_analysis_request,
    "loaded_executable_human_readable_program_text_request": (
        program_requests.loaded_executable_human_readable_program_text_request
    ),
    "loaded_executable_destruct_request": program_requests.loaded_executable_destruct_request,
    "loaded_executable_is_deleted_request": program_requests.loaded_executable_is_deleted_request,
    "loaded_executable_delete_request": program_requests.loaded_executable_delete_request,
    "loaded_executable_execute_request": program_requests.loaded_executable_execute_request,
    "loaded_executable_fetch_execute_result_request": program_requests.loaded_executable_fetch_execute_result_request,
    "check_future_request": program_requests.check_future_request,
    "loaded_host_callback_poll_request": program_requests.loaded_host_callback_poll_request,
    "make_array_from_host_buffer_request": array_requests.make_array_from_host_buffer_request,
    "make_arrays_from_host_buffer_shards_request": array_requests.make_arrays_from_host_buffer_shards_request,
    "make_error_arrays_request": array_requests.make_error_arrays_request,
    "copy_to_host_buffer_request": array_requests.copy_to_host_buffer_request,
    "check_value_ready_request": array_requests.check_value_ready_request,
    "disassemble_into_single_device_arrays_request": array_requests.disassemble_into_single_device_arrays_request,
    "assemble_array_from_single_device_arrays_request": (
        array_requests.assemble_array_from_single_device_arrays_request
    ),
    "fully_replicated_shard_request": array_requests.fully_replicated_shard_request,
    "copy_arrays_request": array_requests.copy_arrays_request,
    "reshard_arrays_request": array_requests.reshard_arrays_request,
    "remap_arrays_request": array_requests.remap_arrays_request,
    "delete_array_request": array_requests.delete_array_request,
    "is_array_deleted_request": array_requests.is_array_deleted_request,
    "destruct_array_request": array_requests.destruct_array_request,
}


class Server:
    """What all sessions share: the devices, the slices' state, the sessions."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.pool = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="pathways-local")
        # Compiles on a pool of their own: a long compile holds none of the threads copies use.
        self.compiles = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pathways-local-compile")
        self.executions = Executions()
        self.sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        # Bytes through the host-buffer store each way and requests by kind, for
        # ``status``: what shows whether an array's bytes went through the client.
        self.counts: collections.Counter[str] = collections.Counter()
        self._compiled = CompiledPrograms(topology, self.count)
        #: Told of every program dispatched: (its device ids, its outputs), on the serving thread;
        #: the runtime metric service's duty cycle (``metric_service.DeviceActivity.dispatched``).
        self.program_observers: list[Callable[[Sequence[int], Sequence[Any]], None]] = []

    def program_dispatched(self, device_ids: Sequence[int], outputs: Sequence[Any]) -> None:
        for observe in self.program_observers:
            observe(device_ids, outputs)

    def count(self, key: str, amount: int = 1) -> None:
        with self._lock:
            self.counts[key] += amount

    def compile(self, request: Proto) -> LoadedProgram:
        return self._compiled.compile(request)

    def open_session(self, version: Proto | None) -> Session:
        with self._lock:
            session = Session(self, next(self._ids), version, REQUESTS)
            self.sessions[session.id] = session
        return session

    def close_session(self, session: Session) -> None:
        with self._lock:
            self.sessions.pop(session.id, None)
        session.close()

    def session(self, session_id: int) -> Session:
        with self._lock:
            session = self.sessions.get(session_id)
        if session is None:
            raise ServerError.not_found(f"Session id {session_id} does not exist")
        return session

    def fail_slice(self, slice_index: int) -> int:
        """Loses ``slice_index``: it refuses work and every array with a shard on it is gone."""
        self.topology.fail(slice_index)
        devices = {d for d in range(self.topology.device_count) if self.topology.slice_of(d) == slice_index}
        error = ServerError(DATA_LOSS, f"slice {slice_index} was lost; arrays with a shard on it are gone")
        with self._lock:
            sessions = list(self.sessions.values())
        return sum(s.arrays.lose(devices, error) for s in sessions)

    def repair_slice(self, slice_index: int) -> None:
        self.topology.repair(slice_index)

    def cancel(self) -> dict[str, Any]:
        """The client was interrupted (a kernel's cell): executions its sessions asked for and
        the server has not started are dropped, their results poisoned with CANCELLED. What
        XLA already runs cannot be stopped: how many of those there are (at most
        ``executions.LIMIT`` per device) says how long the next request may wait."""
        with self._lock:
            sessions = list(self.sessions.values())
        for session in sessions:
            session.cancel()
        devices = range(self.topology.device_count)
        return {"sessions": len(sessions), "running": self.executions.in_flight(devices)}

    def status(self) -> dict[str, Any]:
        with self._lock:
            sessions = list(self.sessions.values())
        per_device: dict[int, int] = {}
        for session in sessions:
            for device, nbytes in session.arrays.bytes_per_device().items():
                per_device[device] = per_device.get(device, 0) + nbytes
        status = self.topology.status()
        status["sessions"] = len(sessions)
        with self._lock:
            status["counts"] = dict(self.counts)
        status["bytes_per_device"] = [per_device.get(d, 0) for d in range(self.topology.device_count)]
        return status


# ---- the gRPC service ------------------------------------------------------------


async def _abort_async(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("grpc's abort returned")


def _metadata(context: grpc.ServicerContext, key: str) -> bytes | None:
    for item in context.invocation_metadata():
        if item.key == key:
            value: bytes = item.value
            return value
    return None


def handlers(server: Server) -> grpc.GenericRpcHandler:
    """The GrpcIfrtService methods, served by ``server``."""
    version_request, version_response = protos.proxy("GrpcGetVersionRequest"), protos.proxy("GrpcGetVersionResponse")
    request_type, response_type = protos.proxy("IfrtRequest"), protos.proxy("IfrtResponse")
    store_response = protos.proxy("GrpcHostBufferStoreResponse")
    lookup_request = protos.proxy("GrpcHostBufferLookupRequest")
    delete_request, delete_response = (
        protos.proxy("GrpcHostBufferDeleteRequest"),
        protos.proxy("GrpcHostBufferDeleteResponse"),
    )

    codes = {code.value[0]: code for code in grpc.StatusCode}

    def get_version(request: Proto, context: grpc.ServicerContext) -> Proto:
        try:
            protocol, serdes = negotiate(request)
        except ServerError as error:
            abort(context, codes[error.code], error.message)
        response = version_response()
        response.version.protocol_version = protocol
        response.version.ifrt_serdes_version_number = serdes
        return response

    async def ifrt_session(requests: AsyncIterable[Proto], context: grpc.aio.ServicerContext) -> AsyncIterator[Proto]:
        raw = _metadata(context, SESSION_METADATA)
        if raw is None:
            await _abort_async(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Missing metadata for GrpcIfrtService.IfrtSession: {SESSION_METADATA}",
            )
        metadata = protos.proxy("GrpcIfrtSessionMetadata").FromString(raw)
        try:
            check_session_version(metadata.version)
        except ServerError as error:
            await _abort_async(context, codes[error.code], error.message)
        session = server.open_session(metadata.version)
        async for response in session.serve(requests):
            yield response

    def host_buffer_store(chunks: Iterable[memoryview], context: grpc.ServicerContext) -> Proto:
        raw = _metadata(context, STORE_METADATA)
        if raw is None:
            abort(context, grpc.StatusCode.INTERNAL, "Missing gRPC metadata for GrpcHostBufferService.Store")
        metadata = protos.proxy("GrpcHostBufferStoreMetadata").FromString(raw)
        # Each chunk is copied once, into an array the devices can adopt as it is.
        data, received = host_buffers.receive(chunks, metadata.buffer_size)
        server.count("host_bytes_from_client", received)
        if received != metadata.buffer_size:
            abort(context, grpc.StatusCode.DATA_LOSS, f"expected {metadata.buffer_size} bytes but got {received}")
        try:
            server.session(metadata.session_id).host_buffers.store(metadata.handle, data)
        except ServerError as error:
            abort(context, codes[error.code], error.message)
        return store_response()

    async def host_buffer_lookup(request: Proto, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        # On the event loop, like the sessions' streams: each message handed from a worker
        # thread to the loop cost more than copying it. Only the wait for the buffer (a copy
        # still running) goes to a thread.
        try:
            store = server.session(request.session_id).host_buffers
            data = store.lookup(request.handle, 0) if store.has(request.handle) else None
            if data is None:
                data = await asyncio.get_running_loop().run_in_executor(None, store.lookup, request.handle)
        except ServerError as error:
            await _abort_async(context, codes[error.code], error.message)
        view = host_buffers.byte_view(data)
        server.count("host_bytes_to_client", len(view))
        for message in host_buffers.data_messages(view):
            yield message

    def host_buffer_delete(request: Proto, context: grpc.ServicerContext) -> Proto:
        try:
            server.session(request.session_id).host_buffers.delete(request.handle)
        except ServerError as error:
            abort(context, codes[error.code], error.message)
        return delete_response()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GetVersion": grpc.unary_unary_rpc_method_handler(
                get_version, version_request.FromString, version_response.SerializeToString
            ),
            "IfrtSession": grpc.stream_stream_rpc_method_handler(
                ifrt_session, request_type.FromString, response_type.SerializeToString
            ),
            "HostBufferStore": grpc.stream_unary_rpc_method_handler(
                host_buffer_store, host_buffers.data_field, store_response.SerializeToString
            ),
            "HostBufferLookup": grpc.unary_stream_rpc_method_handler(
                host_buffer_lookup, lookup_request.FromString, bytes
            ),
            "HostBufferDelete": grpc.unary_unary_rpc_method_handler(
                host_buffer_delete, delete_request.FromString, delete_response.SerializeToString
            ),
        },
    )
