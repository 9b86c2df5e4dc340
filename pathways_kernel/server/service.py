"""The gRPC service JAX's proxy client talks to (``xla.ifrt.proxy.GrpcIfrtService``).

A session is one client's ``IfrtSession`` stream. Its requests are taken in the
order they come (a request may name arrays the previous one made), but anything
that waits (compilation, a value becoming ready, a copy to the host) is answered
from a worker pool when it completes, so responses go back out of order, matched
by ``op_id``, and a slow copy does not hold up the session.

Over 700 lines for now: the request handlers by kind (arrays, programs, host
buffers) are its seams, to be split in issue #21's structure round, once the
server is the default backend and its request set has settled.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hashlib
import itertools
import logging
import queue
import threading
from collections.abc import Callable

import grpc
import numpy as np

from pathways_kernel.core.protowire import read_varint
from pathways_kernel.server import protos
from pathways_kernel.server.arrays import (
    ArrayStore,
    HostBufferStore,
    ServerArray,
    dtype_from_proto,
    dtype_to_proto,
    from_host_bytes,
    receive_buffer,
    sharding_from_proto,
    to_host_bytes,
)
from pathways_kernel.server.colocated import string_host_buffer
from pathways_kernel.server.devices import Topology
from pathways_kernel.server.errors import DATA_LOSS, INTERNAL, UNIMPLEMENTED, ServerError
from pathways_kernel.server.programs import Program, compile_program

log = logging.getLogger("pathways_kernel.server")

SERVICE = "xla.ifrt.proxy.GrpcIfrtService"
SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
STORE_METADATA = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
# Protocol versions this server answers; the client says which it speaks.
PROTOCOL_MIN, PROTOCOL_MAX = 16, 25
_CHUNK = 4 << 20
_COMPILED_KEPT = 64  # executables the server keeps for programs compiled again


class Server:
    """What all sessions share: the devices, the slices' state, the sessions."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.pool = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="pathways-local")
        self.sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        # Bytes through the host-buffer store each way and requests by kind, for
        # ``status``: what shows whether an array's bytes went through the client.
        self.counts: collections.Counter = collections.Counter()
        self._compiled: collections.OrderedDict[bytes, Program] = collections.OrderedDict()

    def count(self, key: str, amount: int = 1) -> None:
        with self._lock:
            self.counts[key] += amount

    def compile(self, request) -> Program:
        """``compile_program``, once per program and options (``_COMPILED_KEPT`` kept): as on
        Pathways, which has its own compilation cache, a client that compiles a program again
        (its caches cleared, a mesh it ran on before) gets what the server compiled then."""
        if request.program.type_name != "xla::ifrt::XlaProgram":  # plugin programs have state
            return compile_program(request, self.topology)
        options = request.compile_options.data
        if request.compile_options.type_name == "xla::ifrt::XlaCompileOptions":
            # The client's bytes order its maps differently from one compile to the next.
            options = protos.ifrt("XlaCompileOptionsProto").FromString(options).SerializeToString(deterministic=True)
        parts = (request.program.data, request.compile_options.type_name.encode(), options)
        key = hashlib.sha256(b"\0".join(parts)).digest()
        with self._lock:
            program = self._compiled.get(key)
            if program is not None:
                self._compiled.move_to_end(key)
                self.counts["compile_cache_hits"] += 1
                return program
        program = compile_program(request, self.topology)
        with self._lock:
            self._compiled[key] = program
            while len(self._compiled) > _COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return program

    def open_session(self, version) -> Session:
        with self._lock:
            session = Session(self, next(self._ids), version)
            self.sessions[session.id] = session
        return session

    def close_session(self, session: Session) -> None:
        with self._lock:
            self.sessions.pop(session.id, None)
        session.host_buffers.close()

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

    def status(self) -> dict:
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


def _failed(error: ServerError) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(error)
    return future


def _done() -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(None)
    return future


def _wait_ready(arrays: list[ServerArray]) -> None:
    for array in arrays:
        for shard in array.shards:
            shard.block_until_ready()


class Session:
    """One client's IfrtSession: its arrays, executables, futures and host buffers."""

    def __init__(self, server: Server, session_id: int, version):
        self.server = server
        self.id = session_id
        self.version = version
        self.arrays = ArrayStore(server.topology.check_up)
        self.host_buffers = HostBufferStore()
        self.programs: dict[int, Program] = {}
        self.futures: dict[int, concurrent.futures.Future] = {}
        # Array handles whose arrays are still being made in the background (a colocated
        # Python function running), each with the future that settles when they exist.
        self.pending: dict[int, concurrent.futures.Future] = {}
        self.background: set[concurrent.futures.Future] = set()  # gates of colocated functions running
        self._lock = threading.Lock()

    @property
    def topology(self) -> Topology:
        return self.server.topology

    # ---- the stream -------------------------------------------------------

    async def serve(self, requests):
        """Yields responses for ``requests`` as they complete. Requests are taken in order.
        Most are handled right here on the event loop as they arrive (a thread hand-off
        each way cost most of a tiny op's round trip); one that must wait for a host
        buffer still being uploaded goes to the session's own thread, and the requests
        after it follow it there until that thread has caught up."""
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        out: asyncio.Queue = asyncio.Queue()
        in_order: queue.SimpleQueue = queue.SimpleQueue()
        pending = 0
        handed_off = 0  # requests given to the session's thread and not yet taken; loop only
        reading = True

        def respond(response) -> None:
            if threading.get_ident() == loop_thread:
                out.put_nowait(response)
            else:
                loop.call_soon_threadsafe(out.put_nowait, response)

        def taken() -> None:
            nonlocal handed_off
            handed_off -= 1

        def work() -> None:
            while (request := in_order.get()) is not None:
                self._process(request, respond)
                loop.call_soon_threadsafe(taken)

        async def read() -> None:
            nonlocal pending, reading, handed_off
            try:
                async for request in requests:
                    pending += 1
                    if handed_off or self._may_wait(request):
                        handed_off += 1
                        in_order.put(request)
                    else:
                        self._process(request, respond)
            finally:
                reading = False
                in_order.put(None)
                out.put_nowait(None)

        threading.Thread(target=work, name=f"pathways-local-session-{self.id}", daemon=True).start()
        reader = asyncio.create_task(read())
        try:
            while reading or pending:
                response = await out.get()
                if response is not None:
                    pending -= 1
                    yield response
        finally:
            reader.cancel()
            self.server.close_session(self)

    def _may_wait(self, request) -> bool:
        """Whether ``request`` names a host buffer that has not arrived yet."""
        kind = request.WhichOneof("request")
        if kind == "make_array_from_host_buffer_request":
            handles = [request.make_array_from_host_buffer_request.host_buffer_handle]
        elif kind == "make_arrays_from_host_buffer_shards_request":
            specs = request.make_arrays_from_host_buffer_shards_request.specs
            handles = [buffer.host_buffer_handle for spec in specs for buffer in spec.host_buffers]
        else:
            return False
        return not all(self.host_buffers.has(handle) for handle in handles)

    def _process(self, request, respond: Callable, own: concurrent.futures.Future | None = None) -> None:
        if self.pending and self._after_pending(request, respond, own):
            return
        kind = request.WhichOneof("request")
        op_id = request.request_metadata.op_id
        log.debug("session %s op %s: %s", self.id, op_id, kind)
        self.server.count(f"requests.{kind}")
        response = protos.proxy("IfrtResponse")()
        response.response_metadata.op_id = op_id
        handler = getattr(self, f"_{kind}", None) if kind else None
        try:
            if handler is None:
                raise ServerError(
                    UNIMPLEMENTED, f"the local Pathways server does not serve {kind or 'an empty request'}"
                )
            deferred = handler(getattr(request, kind), response)
        except Exception as error:  # a bug here must reach the user, not hang the client
            if not isinstance(error, ServerError):
                log.exception("%s failed", kind)
                error = ServerError(INTERNAL, f"{kind}: {error}")
            # Handles the client named for this request's results now hold the error, so
            # later uses (and the client's destruct of them) find them; handlers need not
            # (handles the server made for them are never told to the client).
            self.arrays.poison(_result_handles(getattr(request, kind)) if kind else [], error)
            respond(_error_response(op_id, error))
            return
        if deferred is None:
            respond(response)
            return

        def finish() -> None:
            try:
                deferred()
                respond(response)
            except ServerError as error:
                respond(_error_response(op_id, error))
            except Exception as error:
                log.exception("%s failed", kind)
                respond(_error_response(op_id, ServerError(INTERNAL, f"{kind}: {error}")))

        self.server.pool.submit(finish)

    def _after_pending(self, request, respond: Callable, own: concurrent.futures.Future | None) -> bool:
        """Defers ``request`` if it names arrays still being made in the background, until
        they exist. Every handle it names or makes is pending meanwhile, so the requests
        after it that name one wait for it, as they would have in order (a destruct of one
        of its inputs must not overtake it). Other requests go on being served: a colocated
        function that runs for minutes (or hangs) holds up only what depends on it. ``own`` is
        the gate of a deferred request about to run: it still waits for arrays being made in
        the background since (a deferred execution's outputs), not for requests after it."""
        kind = request.WhichOneof("request")
        if not kind:
            return False
        inner = getattr(request, kind)
        with self._lock:
            named = _named_handles(inner)
            gates = [self.pending.get(h) for h in named]
            waits = {g for g in gates if g is not None and (own is None or (g is not own and g in self.background))}
            if not waits:
                return False
            gate: concurrent.futures.Future = concurrent.futures.Future()
            touched = named + _result_handles(inner)
            for handle in touched:
                self.pending[handle] = gate
        left = [len(waits)]
        counter = threading.Lock()

        def run() -> None:
            try:
                self._process(request, respond, gate)
            finally:
                self._settle(touched, gate, None)

        def settled(_future) -> None:
            with counter:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self.server.pool.submit(run)

        for wait in waits:
            wait.add_done_callback(settled)
        return True

    def _settle(self, handles, gate: concurrent.futures.Future, error: ServerError | None) -> None:
        with self._lock:
            self.background.discard(gate)
            for handle in handles:
                if self.pending.get(handle) is gate:
                    del self.pending[handle]
        if error is None:
            gate.set_result(None)
        else:
            gate.set_exception(error)

    def _run_in_background(self, program, args: list[ServerArray], handles: list[int]) -> concurrent.futures.Future:
        """Runs ``program`` (colocated Python) on a thread of its own; its outputs are
        pending until it returns. A slice lost while it ran loses its outputs there."""
        gate: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self.background.add(gate)
            for handle in handles:
                self.pending[handle] = gate

        def run() -> None:
            error = None
            try:
                outputs = program.run(args)
                _wait_ready(outputs)
                self.topology.check_up(program.device_ids)
                for handle, output in zip(handles, outputs, strict=True):
                    self.arrays.put(handle, output)
            except Exception as failure:  # it goes to the client as the outputs' error
                if not isinstance(failure, ServerError):
                    log.exception("%s failed", program.name)
                    failure = ServerError(INTERNAL, f"{program.name}: {failure}")
                error = failure
                self.arrays.poison(handles, error)
            self._settle(handles, gate, error)

        threading.Thread(target=run, name=f"pathways-local-{program.name}", daemon=True).start()
        return gate

    # ---- init, devices, layouts ------------------------------------------

    def _init_request(self, request, response):
        init = response.init_response
        topology = self.topology
        init.session_id = self.id
        init.platform_name = "cpu"
        init.platform_version = f"pathways-local {topology.slices}x{topology.chips}"
        init.runtime_type = "pjrt_ifrt"
        import jax

        # The client prints its devices and memories with the server's words (str is the
        # debug string, repr the other): the server's own CPU devices say what a stock
        # kernel's would (``cpu:0``, ``CpuDevice(id=0)``), whatever this jaxlib calls them.
        local = jax.devices()
        for i in range(topology.device_count):
            device = init.all_devices.add()
            device.id = device.local_device_id = device.local_hardware_id = i
            device.default_memory_id = i
            device.memory_ids.append(i)
            device.platform_name = "cpu"
            device.device_kind = "cpu"
            device.debug_string, device.to_string = str(local[i]), repr(local[i])
            attributes = device.attributes.attributes
            attributes["slice_index"].int64_value = topology.slice_of(i)
            attributes["coords"].int64_list_value.elements.extend(topology.coords(i))
            attributes["core_on_chip"].int64_value = 0
            attributes["num_cores"].int64_value = 1
            init.addressable_device_ids.append(i)
            init.primary_device_ids.append(i)
            memory = init.memories.add()
            memory.id = i
            memory.memory_space_kind = "device"
            memory.device_ids.append(i)
            own = local[i].memory("device")
            memory.debug_string, memory.to_string = str(own), repr(own)

    def _get_default_device_assignment_request(self, request, response):
        replicas, partitions = request.num_replicas, request.num_partitions
        count = self.topology.device_count
        if replicas * partitions > count:
            raise ServerError.invalid(
                f"{replicas} replicas x {partitions} partitions need more than the {count} devices here"
            )
        assignment = response.get_default_device_assignment_response.device_assignment
        assignment.replica_count, assignment.computation_count = replicas, partitions
        for partition in range(partitions):
            devices = assignment.computation_devices.add()
            devices.replica_device_ids.extend((partition * replicas + r) % count for r in range(replicas))

    def _get_default_layout_request(self, request, response):
        self.topology.check_device(request.device_id)
        rank = len(request.dims)
        minor_to_major = ",".join(str(i) for i in reversed(range(rank)))
        response.get_default_layout_response.serialized_pjrt_layout = f"{{{minor_to_major}}}".encode()

    # ---- programs ----------------------------------------------------------

    def _compile_request(self, request, response):
        def compile_() -> None:
            program = self.server.compile(request)
            handle = self.arrays.new_handle()
            ready = self.arrays.new_handle()
            with self._lock:
                self.programs[handle] = program
                self.futures[ready] = _done()
            compiled = response.compile_response
            compiled.loaded_executable_handle = handle
            compiled.name = program.name
            compiled.num_devices = len(program.device_ids)
            compiled.device_ids.extend(program.device_ids)
            compiled.addressable_device_ids.extend(program.device_ids)
            compiled.fingerprint_value = getattr(program.executable, "fingerprint", None) or b""
            compiled.ready_future_handle = ready

        return compile_

    def _program(self, handle: int) -> Program:
        with self._lock:
            program = self.programs.get(handle)
        if program is None:
            raise ServerError.not_found(f"Unknown loaded executable handle: {handle}")
        return program

    def _loaded_executable_metadata_request(self, request, response):
        program = self._program(request.loaded_executable_handle)
        metadata = response.loaded_executable_metadata_response
        executable = program.executable
        _status(
            metadata.parameter_layouts_error, UNIMPLEMENTED, "layouts are not reported by the local Pathways server"
        )
        _status(metadata.output_layouts_error, UNIMPLEMENTED, "layouts are not reported by the local Pathways server")
        _status(metadata.donated_input_indices_error, UNIMPLEMENTED, "donated inputs are not reported")
        metadata.output_memory_kinds.SetInParent()
        if executable is None:  # a plugin program: no arguments, no outputs, no XLA executable
            return
        op_sharding = protos.xla("OpSharding")
        if program.num_replicas == 1 and len(program.device_ids) > 1:
            metadata.parameter_shardings.SetInParent()
            for op in executable.get_parameter_shardings() or []:
                metadata.parameter_shardings.shardings.append(op_sharding.FromString(op.SerializeToString()))
            metadata.output_shardings.SetInParent()
            for op in executable.get_output_shardings() or []:
                metadata.output_shardings.shardings.append(op_sharding.FromString(op.SerializeToString()))
        for memory_kinds in executable.get_output_memory_kinds():
            metadata.output_memory_kinds.memory_kind_lists.add().memory_kinds.extend(memory_kinds)
        stats = executable.get_compiled_memory_stats()
        memory = metadata.compiled_memory_stats
        for name in (
            "generated_code_size_in_bytes",
            "argument_size_in_bytes",
            "output_size_in_bytes",
            "alias_size_in_bytes",
            "temp_size_in_bytes",
            "peak_memory_in_bytes",
            "host_generated_code_size_in_bytes",
            "host_argument_size_in_bytes",
            "host_output_size_in_bytes",
            "host_alias_size_in_bytes",
            "host_temp_size_in_bytes",
        ):
            setattr(memory, name, int(getattr(stats, name)))
        metadata.size_of_generated_code_in_bytes = int(executable.size_of_generated_code_in_bytes())

    def _loaded_executable_cost_analysis_request(self, request, response):
        program = self._program(request.loaded_executable_handle)
        analysis = response.loaded_executable_cost_analysis_response
        analysis.attributes.SetInParent()
        for key, value in (program.executable.cost_analysis() or {}).items():
            analysis.attributes.attributes[key].float_value = float(value)

    def _loaded_executable_human_readable_program_text_request(self, request, response):
        program = self._program(request.loaded_executable_handle)
        texts = program.executable.get_hlo_text() if hasattr(program.executable, "get_hlo_text") else ""
        response.loaded_executable_human_readable_program_text_response.human_readable_program_text = str(texts)

    def _loaded_executable_destruct_request(self, request, response):
        with self._lock:
            program = self.programs.pop(request.loaded_executable_handle, None)
        if program is None:
            raise ServerError.not_found(f"Unknown loaded executable handle: {request.loaded_executable_handle}")
        response.loaded_executable_destruct_response.SetInParent()

    def _loaded_executable_is_deleted_request(self, request, response):
        response.loaded_executable_is_deleted_response.is_deleted = False

    def _loaded_executable_delete_request(self, request, response):
        handle = self.arrays.new_handle()
        with self._lock:
            self.futures[handle] = _failed(
                ServerError(UNIMPLEMENTED, "LoadedExecutable::Delete is no longer supported")
            )
        response.loaded_executable_delete_response.future_handle = handle

    def _loaded_executable_execute_request(self, request, response):
        """Dispatches the execution. As on Pathways, a failure (a lost slice, a lost argument)
        does not fail the dispatch: the outputs hold the error and the user meets it when
        reading them, which also keeps the client, which only logs execute errors, in step."""
        program = self._program(request.loaded_executable_handle)
        handles = list(request.result_array_handle) or [self.arrays.new_handle() for _ in program.output_shapes]
        status_handle = request.result_status_handle
        if not status_handle and request.execute_options.fill_status:
            status_handle = self.arrays.new_handle()
        try:
            self.topology.check_up(program.device_ids)
            args = [self.arrays.get(h) for h in request.args_handles]
            if getattr(program, "runs_in_background", False):
                status, outputs = self._run_in_background(program, args, handles), None
            else:
                outputs = program.run(args)
                for handle, output in zip(handles, outputs, strict=True):
                    self.arrays.put(handle, output)
                # Only a status the client will ask for is waited for (a thread's wake-up each).
                status = self.server.pool.submit(_wait_ready, outputs) if status_handle else None
        except ServerError as error:
            self.arrays.poison(handles, error)
            status = _failed(error)
            outputs = None
        executed = response.loaded_executable_execute_response
        executed.SetInParent()
        if status_handle:
            executed.status_handle = status_handle
            with self._lock:
                self.futures[status_handle] = status
        if not request.result_array_handle:
            for i, handle in enumerate(handles):
                described = executed.outputs.add()
                dtype_to_proto(outputs[i].dtype if outputs else program.output_dtypes[i], described.dtype)
                described.shape.dims.extend(program.output_shapes[i])
                program.output_shardings[i].to_proto(described.sharding)
                described.array_handle = handle

    def _take_future(self, handle: int) -> concurrent.futures.Future:
        with self._lock:
            future = self.futures.pop(handle, None)
        if future is None:
            raise ServerError.not_found(f"Unknown future handle: {handle}")
        return future

    def _loaded_executable_fetch_execute_result_request(self, request, response):
        future = self._take_future(request.result_status_handle)
        response.loaded_executable_fetch_execute_result_response.SetInParent()
        return future.result

    def _check_future_request(self, request, response):
        future = self._take_future(request.future_handle)
        response.check_future_response.SetInParent()
        return future.result

    def _loaded_host_callback_poll_request(self, request, response):
        raise ServerError(UNIMPLEMENTED, "host callbacks are not served by the local Pathways server")

    # ---- arrays --------------------------------------------------------------

    def _make_array_from_host_buffer_request(self, request, response):
        handle = request.array_handle if request.HasField("array_handle") else self.arrays.new_handle()
        sharding = sharding_from_proto(request.sharding)
        for device in sharding.device_ids:
            self.topology.check_device(device)
        self.topology.check_up(sharding.device_ids)
        dtype = dtype_from_proto(request.dtype)
        data = self.host_buffers.take(request.host_buffer_handle)
        strides = list(request.byte_strides.strides) if request.HasField("byte_strides") else None
        value = from_host_bytes(data, dtype, request.shape.dims, strides)
        self.arrays.put(handle, ServerArray.from_jax(_device_put(value, sharding), sharding))
        response.make_array_from_host_buffer_response.array_handle = handle

    def _make_arrays_from_host_buffer_shards_request(self, request, response):
        handles = self.arrays.handles_for(request.array_handles, len(request.specs))
        arrays = [self._array_from_shards(spec) for spec in request.specs]
        for handle, array in zip(handles, arrays, strict=True):
            self.arrays.put(handle, array)
        response.make_arrays_from_host_buffer_shards_response.array_handles.extend(handles)

    def _array_from_shards(self, spec) -> ServerArray:
        import jax

        sharding = sharding_from_proto(spec.array_spec.sharding)
        self.topology.check_up(sharding.device_ids)
        dtype = dtype_from_proto(spec.array_spec.dtype)
        devices = jax.devices()
        shards: dict[int, object] = {}
        for indices, buffer in zip(spec.addressable_shard_indices, spec.host_buffers, strict=True):
            strides = list(buffer.byte_strides.strides) if buffer.HasField("byte_strides") else None
            value = from_host_bytes(
                self.host_buffers.take(buffer.host_buffer_handle), dtype, buffer.shape.dims, strides
            )
            for index in indices.indices:
                shards[index] = jax.device_put(value, devices[sharding.device_ids[index]])
        return ServerArray(dtype, tuple(spec.array_spec.shape.dims), sharding, [shards[i] for i in range(len(shards))])

    def _make_error_arrays_request(self, request, response):
        handles = self.arrays.handles_for(request.array_handles, len(request.array_specs))
        self.arrays.poison(handles, ServerError(request.error.code or INTERNAL, request.error.message))
        response.make_error_arrays_response.array_handles.extend(handles)

    def _copy_to_host_buffer_request(self, request, response):
        try:
            array = self.arrays.get(request.array_handle)
            array.check_live()
        except ServerError as error:
            # The client may look the buffer up without waiting for this answer.
            self.host_buffers.store(request.host_buffer_handle, error)
            raise
        strides = list(request.byte_strides.strides) if request.HasField("byte_strides") else None
        response.copy_to_host_buffer_response.SetInParent()

        def copy() -> None:
            try:
                if array.dtype.kind == "T":
                    value = string_host_buffer(array)
                else:
                    value = to_host_bytes(np.asarray(array.jax_array()), strides)
            except ServerError as error:
                value = error
            self.host_buffers.store(request.host_buffer_handle, value)
            if isinstance(value, ServerError):
                raise value

        return copy

    def _check_value_ready_request(self, request, response):
        arrays = [self.arrays.get(h) for h in request.value_handles]
        response.check_value_ready_response.SetInParent()
        if all(shard.is_ready() for array in arrays for shard in array.shards):
            return None
        return lambda: _wait_ready(arrays)

    def _disassemble_into_single_device_arrays_request(self, request, response):
        array = self.arrays.get(request.array_handle)
        array.check_live()
        handles = self.arrays.handles_for(request.result_handles, len(array.shards))
        for handle, device, shard in zip(handles, array.sharding.device_ids, array.shards, strict=True):
            single = array.sharding.with_devices([device])
            self.arrays.put(
                handle,
                ServerArray(
                    array.dtype, tuple(shard.shape), type(single)((device,), None, single.memory_kind), [shard]
                ),
            )
        response.disassemble_into_single_device_arrays_response.array_handles.extend(handles)

    def _assemble_array_from_single_device_arrays_request(self, request, response):
        handle = request.result_handle or self.arrays.new_handle()
        sharding = sharding_from_proto(request.sharding)
        pieces = [self.arrays.get(h) for h in request.single_device_array_handles]
        by_device = {}
        for piece in pieces:
            piece.check_live()
            by_device[piece.sharding.device_ids[0]] = piece.shards[0]
        missing = [d for d in sharding.device_ids if d not in by_device]
        if missing:
            raise ServerError.invalid(f"no single-device array on device {missing[0]} of the sharding")
        dtype = dtype_from_proto(request.dtype) if request.HasField("dtype") else pieces[0].dtype
        array = ServerArray(dtype, tuple(request.shape.dims), sharding, [by_device[d] for d in sharding.device_ids])
        self.arrays.put(handle, array)
        response.assemble_array_from_single_device_arrays_response.array_handle = handle

    def _fully_replicated_shard_request(self, request, response):
        array = self.arrays.get(request.array_handle)
        array.check_live()
        handle = request.result_handle or self.arrays.new_handle()
        device = array.sharding.device_ids[0]
        shard = array.shards[0]
        self.arrays.put(
            handle, ServerArray(array.dtype, tuple(shard.shape), type(array.sharding)((device,), None), [shard])
        )
        response.fully_replicated_shard_response.array_handle = handle

    def _copy_arrays_request(self, request, response):
        import jax

        handles = self.arrays.handles_for(request.result_handles, len(request.array_handles))
        targets = list(request.device_ids)
        for device in targets:
            self.topology.check_device(device)
        self.topology.check_up(targets)
        devices = jax.devices()
        copies = []
        sources = [self.arrays.get(h) for h in request.array_handles]
        for source in sources:
            source.check_live()
            destination = source.sharding.with_devices(targets) if targets else source.sharding
            shards = [jax.device_put(s, devices[d]) for s, d in zip(source.shards, destination.device_ids, strict=True)]
            copies.append(ServerArray(source.dtype, source.shape, destination, shards))
        for handle, copy in zip(handles, copies, strict=True):
            self.arrays.put(handle, copy)
        _donated(request, sources)
        response.copy_arrays_response.array_handles.extend(handles)

    def _reshard_arrays_request(self, request, response):
        handles = self.arrays.handles_for(request.result_handles, len(request.array_handles))
        results = []
        sources = [self.arrays.get(h) for h in request.array_handles]
        for source, spec in zip(sources, request.array_specs, strict=True):
            sharding = sharding_from_proto(spec.sharding)
            for device in sharding.device_ids:
                self.topology.check_device(device)
            self.topology.check_up(sharding.device_ids)
            results.append(ServerArray.from_jax(_device_put(source.jax_array(), sharding), sharding))
        for handle, result in zip(handles, results, strict=True):
            self.arrays.put(handle, result)
        _donated(request, sources)
        response.reshard_arrays_response.array_handles.extend(handles)

    def _remap_arrays_request(self, request, response):
        """Shards of the inputs become shards of the outputs, where the plan says, without
        moving (pathwaysutils' split_by_mesh_axis and concatenate_by_mesh_axis send it)."""
        plan = request.plan
        sources = [self.arrays.get(h) for h in request.array_handles]
        for source in sources:
            source.check_live()
        specs = [(spec, sharding_from_proto(spec.sharding)) for spec in plan.output_specs]
        shards: list[list] = [[None] * len(sharding.device_ids) for _, sharding in specs]
        for mapping in plan.mappings:
            source = sources[mapping.in_array].shards
            intervals = zip(
                mapping.from_start, mapping.from_end, mapping.from_step,
                mapping.to_start, mapping.to_end, mapping.to_step, strict=True,
            )  # fmt: skip
            for from_start, from_end, from_step, to_start, to_end, to_step in intervals:
                targets = range(to_start, to_end, to_step)
                for i, j in zip(range(from_start, from_end, from_step), targets, strict=True):
                    shards[mapping.out_array][j] = source[i]
        results = []
        for (spec, sharding), pieces in zip(specs, shards, strict=True):
            if any(piece is None for piece in pieces):
                raise ServerError.invalid("the remap plan leaves a shard of an output unset")
            results.append(ServerArray(dtype_from_proto(spec.dtype), tuple(spec.shape.dims), sharding, pieces))
        handles = self.arrays.handles_for(request.result_handles, len(results))
        for handle, result in zip(handles, results, strict=True):
            self.arrays.put(handle, result)
        _donated(request, sources)
        response.remap_arrays_response.array_handles.extend(handles)

    def _delete_array_request(self, request, response):
        errors = []
        for handle in request.array_handle:
            try:
                array = self.arrays.get(handle)
                array.deleted = True
                array.shards = []
            except ServerError as error:
                errors.append(error)
        future_handle = self.arrays.new_handle()
        with self._lock:
            self.futures[future_handle] = _failed(errors[0]) if errors else _done()
        response.delete_array_response.deletion_future_handle = future_handle

    def _is_array_deleted_request(self, request, response):
        response.is_array_deleted_response.deleted = self.arrays.is_deleted(request.array_handle)

    def _destruct_array_request(self, request, response):
        missing = self.arrays.destruct(request.array_handle)
        if missing:
            raise ServerError.not_found(f"Unknown array handle(s): {','.join(map(str, missing))}")
        response.destruct_array_response.SetInParent()


# Where each request names the handles of the arrays it makes.
_RESULT_FIELDS = {
    "MakeArrayFromHostBufferRequest": "array_handle",
    "MakeArraysFromHostBufferShardsRequest": "array_handles",
    "MakeErrorArraysRequest": "array_handles",
    "AssembleArrayFromSingleDeviceArraysRequest": "result_handle",
    "RemapArraysRequest": "result_handles",
    "BitcastArraysRequest": "result_handles",
    "ReshardArraysRequest": "result_handles",
    "DisassembleIntoSingleDeviceArraysRequest": "result_handles",
    "CopyArraysRequest": "result_handles",
    "FullyReplicatedShardRequest": "result_handle",
    "LoadedExecutableExecuteRequest": "result_array_handle",
}


# Fields that name arrays a request uses (unless the field is what it makes, above).
_NAMED_FIELDS = ("args_handles", "array_handle", "array_handles", "single_device_array_handles", "value_handles")


def _named_handles(request) -> list[int]:
    """The array handles ``request`` uses."""
    made = _RESULT_FIELDS.get(request.DESCRIPTOR.name)
    fields = request.DESCRIPTOR.fields_by_name
    handles: list[int] = []
    for name in _NAMED_FIELDS:
        if name != made and name in fields:
            value = getattr(request, name)
            handles.extend([value] if isinstance(value, int) else value)
    return handles


def _result_handles(request) -> list[int]:
    """The array handles the client chose for what ``request`` makes."""
    name = _RESULT_FIELDS.get(request.DESCRIPTOR.name)
    if name is None:
        return []
    value = getattr(request, name)
    return [h for h in ([value] if isinstance(value, int) else value) if h]


_DONATE = 3  # xla.ifrt.proto.ArrayCopySemantics.ARRAY_COPY_SEMANTICS_DONATE_INPUT


def _donated(request, sources: list[ServerArray]) -> None:
    """Inputs the client donated to a copy are deleted, as the client now sees them (their
    memory is freed now, not when the client gets round to destructing them)."""
    if request.copy_semantics == _DONATE:
        for source in sources:
            source.deleted = True
            source.shards = []


def _device_put(value, sharding):
    import jax

    return jax.device_put(value, sharding.jax_sharding())


def _status(proto, code: int, message: str) -> None:
    proto.code = code
    proto.message = message


def _error_response(op_id: int, error: ServerError):
    response = protos.proxy("IfrtResponse")()
    response.response_metadata.op_id = op_id
    _status(response.response_metadata.status, error.code, error.message)
    return response


# ---- the gRPC service ------------------------------------------------------------


# Host buffers are the bulk of the bytes: their messages (``bytes data = 1`` and nothing
# else) are read and written here without protobuf's extra copy of each chunk.


def _data_field(raw: bytes) -> memoryview:
    """The ``data`` of a serialized GrpcHostBufferStoreRequest, without copying it."""
    view = memoryview(raw)
    if not raw:
        return view
    if raw[0] != 0x0A:
        return memoryview(protos.proxy("GrpcHostBufferStoreRequest").FromString(raw).data)
    length, i = read_varint(raw, 1)
    return view[i : i + length]


def _data_message(chunk: memoryview) -> bytes:
    """A serialized GrpcHostBufferLookupResponse carrying ``chunk``."""
    length, header = len(chunk), bytearray(b"\x0a")
    while True:
        byte = length & 0x7F
        length >>= 7
        header.append(byte | (0x80 if length else 0))
        if not length:
            break
    return b"".join((header, chunk))


def _metadata(context, key: str) -> bytes | None:
    for item in context.invocation_metadata():
        if item.key == key:
            return item.value
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

    def get_version(request, context):
        low = max(request.min_version.protocol_version, PROTOCOL_MIN)
        high = min(request.max_version.protocol_version, PROTOCOL_MAX)
        if low > high:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the client speaks IFRT proxy protocol {request.min_version.protocol_version}.."
                f"{request.max_version.protocol_version}, the local Pathways server {PROTOCOL_MIN}..{PROTOCOL_MAX}: "
                "install a jaxlib whose range overlaps",
            )
        response = version_response()
        response.version.protocol_version = high
        response.version.ifrt_serdes_version_number = request.max_version.ifrt_serdes_version_number
        return response

    async def ifrt_session(requests, context):
        raw = _metadata(context, SESSION_METADATA)
        if raw is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Missing metadata for GrpcIfrtService.IfrtSession: {SESSION_METADATA}",
            )
        metadata = protos.proxy("GrpcIfrtSessionMetadata").FromString(raw)
        session = server.open_session(metadata.version)
        async for response in session.serve(requests):
            yield response

    codes = {code.value[0]: code for code in grpc.StatusCode}

    def _abort(context, error: ServerError):
        context.abort(codes[error.code], error.message)

    def host_buffer_store(chunks, context):
        raw = _metadata(context, STORE_METADATA)
        if raw is None:
            context.abort(grpc.StatusCode.INTERNAL, "Missing gRPC metadata for GrpcHostBufferService.Store")
        metadata = protos.proxy("GrpcHostBufferStoreMetadata").FromString(raw)
        # Each chunk is copied once, into an array the devices can adopt as it is.
        data, received = receive_buffer(metadata.buffer_size), 0
        for chunk in chunks:
            if received + len(chunk) <= len(data):
                data[received : received + len(chunk)] = chunk
            received += len(chunk)
        server.count("host_bytes_from_client", received)
        if received != metadata.buffer_size:
            context.abort(grpc.StatusCode.DATA_LOSS, f"expected {metadata.buffer_size} bytes but got {received}")
        try:
            server.session(metadata.session_id).host_buffers.store(metadata.handle, data)
        except ServerError as error:
            _abort(context, error)
        return store_response()

    async def host_buffer_lookup(request, context):
        # On the event loop, like the sessions' streams: each message handed from a worker
        # thread to the loop cost more than copying it. Only the wait for the buffer (a copy
        # still running) goes to a thread.
        try:
            store = server.session(request.session_id).host_buffers
            data = store.lookup(request.handle, 0) if store.has(request.handle) else None
            if data is None:
                data = await asyncio.get_running_loop().run_in_executor(None, store.lookup, request.handle)
        except ServerError as error:
            await context.abort(codes[error.code], error.message)
        view = memoryview(data).cast("B")
        server.count("host_bytes_to_client", len(view))
        for offset in range(0, max(len(view), 1), _CHUNK):
            yield _data_message(view[offset : offset + _CHUNK])

    def host_buffer_delete(request, context):
        try:
            server.session(request.session_id).host_buffers.delete(request.handle)
        except ServerError as error:
            _abort(context, error)
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
                host_buffer_store, _data_field, store_response.SerializeToString
            ),
            "HostBufferLookup": grpc.unary_stream_rpc_method_handler(
                host_buffer_lookup, lookup_request.FromString, bytes
            ),
            "HostBufferDelete": grpc.unary_unary_rpc_method_handler(
                host_buffer_delete, delete_request.FromString, delete_response.SerializeToString
            ),
        },
    )
