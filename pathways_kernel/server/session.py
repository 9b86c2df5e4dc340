"""One client's ``IfrtSession``: its arrays, executables, futures and host buffers, and the
stream its requests come in on.

Requests are taken in the order they come (a request may name arrays the previous one
made), on the event loop or, from one that must wait on, on the session's own thread
(``serve``). Anything that takes time is answered when it completes: a copy to the host
on the server's worker pool, a compile on its compile pool, a wait for an execution or a
colocated function from its future's done callback (no thread blocks on it); responses
go back out of order, matched by ``op_id``, and a slow copy does not hold up the session.
A request that names arrays still being made in the background (a colocated Python
function running) waits for them while the requests that do not go on being served.
``docs/architecture.md`` ("The local server: which context runs what") says why.

Each request goes to its handler (``service.REQUESTS``: array, program and device
requests), which fills the response, or returns the work to finish in the pool or the
future whose settling finishes it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from pathways_kernel.server import protos
from pathways_kernel.server.arrays import ArrayStore, ServerArray
from pathways_kernel.server.devices import Topology
from pathways_kernel.server.errors import CANCELLED, UNIMPLEMENTED, ServerError, from_exception
from pathways_kernel.server.executions import Executions
from pathways_kernel.server.host_buffers import HostBufferStore
from pathways_kernel.server.programs import LoadedProgram
from pathways_kernel.server.protos import Proto

log = logging.getLogger("pathways_kernel.server")

Future = concurrent.futures.Future[Any]
# What a handler leaves to finish: work for the pool (waiting for it is why it was left), or
# a future whose settling answers the request (from its callback: no thread waits on it).
# The response goes back once it has returned or settled.
Deferred = Callable[[], object] | Future
# A request's handler: (session, the request's own message, the IfrtResponse to fill).
Handler = Callable[["Session", Proto, Proto], Deferred | None]
Respond = Callable[[Proto], None]


class Shared(Protocol):
    """What a session uses of the server that holds it (``service.Server``)."""

    topology: Topology
    pool: concurrent.futures.ThreadPoolExecutor
    compiles: concurrent.futures.ThreadPoolExecutor
    executions: Executions

    def count(self, key: str, amount: int = 1) -> None: ...
    def compile(self, request: Proto) -> LoadedProgram: ...
    def program_dispatched(self, device_ids: Sequence[int], outputs: Sequence[Any]) -> None: ...
    def close_session(self, session: Session) -> None: ...


def failed(error: ServerError) -> Future:
    future: Future = concurrent.futures.Future()
    future.set_exception(error)
    return future


def done() -> Future:
    future: Future = concurrent.futures.Future()
    future.set_result(None)
    return future


def wait_ready(arrays: list[ServerArray]) -> None:
    for array in arrays:
        for shard in array.shards:
            shard.block_until_ready()


class Session:
    """One client's IfrtSession: its arrays, executables, futures and host buffers."""

    def __init__(self, server: Shared, session_id: int, version: Proto | None, requests: Mapping[str, Handler]):
        self.server = server
        self.id = session_id
        self.version = version
        self.arrays = ArrayStore(server.topology.check_up)
        self.host_buffers = HostBufferStore()
        self.programs: dict[int, LoadedProgram] = {}
        self.futures: dict[int, Future] = {}
        # Array handles whose arrays are still being made in the background (a colocated
        # Python function running), each with the future that settles when they exist.
        self.pending: dict[int, Future] = {}
        self.background: set[Future] = set()  # gates of colocated functions running
        self._requests = requests
        self._lock = threading.Lock()
        # Interrupts of the client so far (``cancel``): a request read before the latest one
        # that has not started an execution yet is dropped (``cancelled``).
        self._cancels = 0
        self._current = threading.local()  # the cancel count when the request being handled was read
        self.dropped = 0  # executions dropped by a cancel
        self.closed = False

    @property
    def topology(self) -> Topology:
        return self.server.topology

    # ---- what handlers keep in the session ----------------------------------

    def add_program(self, handle: int, program: LoadedProgram) -> None:
        with self._lock:
            self.programs[handle] = program

    def program(self, handle: int) -> LoadedProgram:
        with self._lock:
            program = self.programs.get(handle)
        if program is None:
            raise ServerError.not_found(f"Unknown loaded executable handle: {handle}")
        return program

    def drop_program(self, handle: int) -> None:
        with self._lock:
            program = self.programs.pop(handle, None)
        if program is None:
            raise ServerError.not_found(f"Unknown loaded executable handle: {handle}")

    def add_future(self, handle: int, future: Future) -> None:
        with self._lock:
            self.futures[handle] = future

    def take_future(self, handle: int) -> Future:
        with self._lock:
            future = self.futures.pop(handle, None)
        if future is None:
            raise ServerError.not_found(f"Unknown future handle: {handle}")
        return future

    # ---- the stream -------------------------------------------------------

    async def serve(self, requests: AsyncIterable[Proto]) -> AsyncIterator[Proto]:
        """Yields responses for ``requests`` as they complete. Requests are taken in order.
        Most are handled right here on the event loop as they arrive (a thread hand-off
        each way cost most of a tiny op's round trip); one that must wait (for a host
        buffer still being uploaded, or for room among the executions in flight) goes to
        the session's own thread, and the requests after it follow it there until that
        thread has caught up. A client that leaves closes the session (``close``)."""
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        out: asyncio.Queue[Proto | None] = asyncio.Queue()
        in_order: queue.SimpleQueue[tuple[Proto, int] | None] = queue.SimpleQueue()
        pending = 0
        handed_off = 0  # requests given to the session's thread and not yet taken; loop only
        reading = True

        def respond(response: Proto) -> None:
            if threading.get_ident() == loop_thread:
                out.put_nowait(response)
            else:
                loop.call_soon_threadsafe(out.put_nowait, response)

        def taken() -> None:
            nonlocal handed_off
            handed_off -= 1

        def work() -> None:
            while (item := in_order.get()) is not None:
                self._process(item[0], respond, epoch=item[1])
                loop.call_soon_threadsafe(taken)

        async def read() -> None:
            nonlocal pending, reading, handed_off
            try:
                async for request in requests:
                    pending += 1
                    if handed_off or self._may_wait(request):
                        handed_off += 1
                        in_order.put((request, self._cancels))
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

    def _may_wait(self, request: Proto) -> bool:
        """Whether ``request`` names a host buffer that has not arrived yet, or executes on
        devices with as many executions in flight as the server allows (``executions.py``)."""
        kind = request.WhichOneof("request")
        if kind == "loaded_executable_execute_request":
            with self._lock:
                program = self.programs.get(request.loaded_executable_execute_request.loaded_executable_handle)
            return program is not None and not self.server.executions.has_room(program.device_ids)
        handles = _uploads(request)
        return bool(handles) and not all(self.host_buffers.has(handle) for handle in handles)

    def close(self) -> None:
        """The client's stream ended: what it queued and has not started is dropped
        (``cancel``), its host buffers are released and refused from now on, and a colocated
        function still running keeps none of its outputs."""
        with self._lock:
            self.closed = True
        self.cancel()
        self.host_buffers.close()

    def cancel(self) -> None:
        """The client was interrupted: executions it asked for that have not started are
        dropped, their results poisoned with CANCELLED (``cancelled``)."""
        with self._lock:
            self._cancels += 1
        self.server.executions.wake()

    def cancelled(self) -> ServerError | None:
        """CANCELLED if the request being handled was read before the client's latest interrupt."""
        if getattr(self._current, "epoch", self._cancels) >= self._cancels:
            return None
        with self._lock:
            self.dropped += 1
        return ServerError(CANCELLED, "the execution was cancelled: the client was interrupted before it started")

    def _process(self, request: Proto, respond: Respond, own: Future | None = None, epoch: int | None = None) -> None:
        """Handles ``request``, read when the client had been interrupted ``epoch`` times (now if None)."""
        if epoch is None:
            epoch = self._cancels
        if self.pending and self._after_pending(request, epoch, respond, own):
            return
        self._current.epoch = epoch
        kind = request.WhichOneof("request")
        op_id = request.request_metadata.op_id
        log.debug("session %s op %s: %s", self.id, op_id, kind)
        self.server.count(f"requests.{kind}")
        response = protos.proxy("IfrtResponse")()
        response.response_metadata.op_id = op_id
        handler = self._requests.get(kind) if kind else None
        try:
            if handler is None or kind is None:
                raise ServerError(
                    UNIMPLEMENTED, f"the local Pathways server does not serve {kind or 'an empty request'}"
                )
            deferred = handler(self, getattr(request, kind), response)
        except Exception as error:  # a bug here must reach the user, not hang the client
            if not isinstance(error, ServerError):
                log.exception("%s failed", kind)
                error = from_exception(error, kind or "request")
            # Handles the client named for this request's results now hold the error, so
            # later uses (and the client's destruct of them) find them; handlers need not
            # (handles the server made for them are never told to the client).
            self.arrays.poison(_result_handles(getattr(request, kind)) if kind else [], error)
            # A refused request's uploads are taken by nothing else: released now, or on arrival.
            self.host_buffers.discard(_uploads(request))
            respond(error_response(op_id, error))
            return
        if deferred is None:
            respond(response)
            return
        if isinstance(deferred, concurrent.futures.Future):

            def settled(future: Future) -> None:
                error = future.exception()
                if error is None:
                    respond(response)
                else:
                    respond(error_response(op_id, from_exception(error, kind or "request")))

            deferred.add_done_callback(settled)
            return
        work = deferred

        def finish() -> None:
            try:
                work()
                respond(response)
            except ServerError as error:
                respond(error_response(op_id, error))
            except Exception as error:
                log.exception("%s failed", kind)
                respond(error_response(op_id, from_exception(error, kind or "request")))

        self.server.pool.submit(finish)

    def _after_pending(self, request: Proto, epoch: int, respond: Respond, own: Future | None) -> bool:
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
            gate: Future = concurrent.futures.Future()
            touched = named + _result_handles(inner)
            for handle in touched:
                self.pending[handle] = gate
        left = [len(waits)]
        counter = threading.Lock()

        def run() -> None:
            try:
                self._process(request, respond, gate, epoch)
            finally:
                self._settle(touched, gate, None)

        def settled(_future: Future) -> None:
            with counter:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self.server.pool.submit(run)

        for wait in waits:
            wait.add_done_callback(settled)
        return True

    def _settle(self, handles: list[int], gate: Future, error: ServerError | None) -> None:
        with self._lock:
            self.background.discard(gate)
            for handle in handles:
                if self.pending.get(handle) is gate:
                    del self.pending[handle]
        if error is None:
            gate.set_result(None)
        else:
            gate.set_exception(error)

    def run_in_background(self, program: LoadedProgram, args: list[ServerArray], handles: list[int]) -> Future:
        """Runs ``program`` (colocated Python) on a thread of its own; its outputs are
        pending until it returns. A slice lost while it ran loses its outputs there."""
        gate: Future = concurrent.futures.Future()
        with self._lock:
            self.background.add(gate)
            for handle in handles:
                self.pending[handle] = gate

        def run() -> None:
            error = None
            try:
                outputs = program.run(args)
                wait_ready(outputs)
                self.topology.check_up(program.device_ids)
                if self.closed:  # its client left while it ran: nothing may keep its outputs
                    raise ServerError(CANCELLED, f"{program.name}: the session closed while it ran")
                for handle, output in zip(handles, outputs, strict=True):
                    self.arrays.put(handle, output)
            except Exception as failure:  # it goes to the client as the outputs' error
                if not isinstance(failure, ServerError):
                    log.exception("%s failed", program.name)
                error = from_exception(failure, program.name)
                self.arrays.poison(handles, error)
            self._settle(handles, gate, error)

        threading.Thread(target=run, name=f"pathways-local-{program.name}", daemon=True).start()
        return gate


def error_response(op_id: int, error: ServerError) -> Proto:
    response = protos.proxy("IfrtResponse")()
    response.response_metadata.op_id = op_id
    error.to_status(response.response_metadata.status)
    return response


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


def _uploads(request: Proto) -> list[int]:
    """The host buffers (uploads) an IfrtRequest makes arrays of."""
    kind = request.WhichOneof("request")
    if kind == "make_array_from_host_buffer_request":
        return [request.make_array_from_host_buffer_request.host_buffer_handle]
    if kind == "make_arrays_from_host_buffer_shards_request":
        specs = request.make_arrays_from_host_buffer_shards_request.specs
        return [buffer.host_buffer_handle for spec in specs for buffer in spec.host_buffers]
    return []


def _named_handles(request: Proto) -> list[int]:
    """The array handles ``request`` uses."""
    made = _RESULT_FIELDS.get(request.DESCRIPTOR.name)
    fields = request.DESCRIPTOR.fields_by_name
    handles: list[int] = []
    for name in _NAMED_FIELDS:
        if name != made and name in fields:
            value = getattr(request, name)
            handles.extend([value] if isinstance(value, int) else value)
    return handles


def _result_handles(request: Proto) -> list[int]:
    """The array handles the client chose for what ``request`` makes."""
    name = _RESULT_FIELDS.get(request.DESCRIPTOR.name)
    if name is None:
        return []
    value = getattr(request, name)
    return [h for h in ([value] if isinstance(value, int) else value) if h]
