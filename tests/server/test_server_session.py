"""The local Pathways server's session, on its own, in this process (as XLA's
``ifrt_backend_test``, ``host_buffer_test`` and ``version_test`` check theirs): executions in
flight, cancelling what has not started, status codes passed through, host buffers filled once
and released on every path, versions negotiated."""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest

from pathways_kernel.server import protos, service
from pathways_kernel.server.arrays import ServerArray, Sharding
from pathways_kernel.server.devices import Topology
from pathways_kernel.server.errors import (
    ALREADY_EXISTS,
    CANCELLED,
    DATA_LOSS,
    FAILED_PRECONDITION,
    INTERNAL,
    RESOURCE_EXHAUSTED,
    ServerError,
    code_of,
    from_exception,
)
from pathways_kernel.server.executions import Executions
from pathways_kernel.server.host_buffers import HostBufferStore
from pathways_kernel.server.programs import Program


class Token:
    """An execution that finishes when told to (``finish``), or fails with ``error``."""

    def __init__(self, error: Exception | None = None):
        self.done = threading.Event()
        self.error = error

    def finish(self) -> None:
        self.done.set()

    def block_until_ready(self) -> None:
        assert self.done.wait(30)
        if self.error is not None:
            raise self.error


def never() -> None:
    return None


# ---- executions in flight -------------------------------------------------------------


class Output:
    """A single-device output as the server holds it: ready when its execution is done."""

    def __init__(self, token: Token):
        self.token = token
        self.deleted = False

    def is_deleted(self) -> bool:
        return self.deleted

    def is_ready(self) -> bool:
        return self.token.done.is_set()


def test_executions_are_bounded_per_device_and_counted_out_when_seen_finished():
    executions = Executions(limit=2)
    tokens = [Token(), Token()]
    outputs = [Output(token) for token in tokens]
    for token, output in zip(tokens, outputs, strict=True):
        executions.enter((0, 1), never)
        executions.started((0, 1), token, [output])
    assert not executions.has_room((0,)) and not executions.has_room((1, 2))
    assert executions.has_room((2, 3))  # another slice's devices
    assert executions.in_flight(range(4)) == 2
    tokens[0].finish()
    assert executions.has_room((0, 1))  # its output says so: no thread waited for it
    tokens[1].finish()
    assert executions.in_flight(range(4)) == 0


def test_an_execution_whose_outputs_were_donated_is_waited_for_on_its_token():
    executions = Executions(limit=1)
    token = Token()
    output = Output(token)
    executions.enter((0,), never)
    executions.started((0,), token, [output])
    output.deleted = True  # donated to the next step: it can no longer say
    token.finish()
    assert not executions.has_room((0,))  # not seen without waiting
    executions.enter((0,), never)  # waits on the token, which has finished
    assert executions.in_flight((0,)) == 1


def test_executions_whose_outputs_were_donated_or_dropped_count_out_once_finished():
    """An interrupt's line says how many executions still run: one whose outputs were donated
    into the next step or dropped said 'running' forever (6 after a cell that slept 60 s)."""
    executions = Executions(limit=8)
    tokens = [Token() for _ in range(6)]
    for i, token in enumerate(tokens):
        output = Output(token)
        executions.enter((0, 1), never)
        executions.started((0, 1), token, [output])
        output.deleted = i % 2 == 0  # donated into the next step; the others are dropped (freed)
        del output
    for token in tokens[:5]:
        token.finish()
    assert executions.in_flight(range(4)) == 1  # the last still runs
    tokens[5].finish()
    assert executions.in_flight(range(4)) == 0
    assert executions.has_room((0, 1))
    executions.close()


def test_a_wait_for_room_ends_when_cancelled():
    executions = Executions(limit=1)
    executions.enter((0,), never)  # counted in, not started yet: nothing to wait on but the lock
    cancel: list[ServerError] = []
    outcome: list[object] = []

    def wait() -> None:
        try:
            executions.enter((0,), lambda: cancel[0] if cancel else None)
            outcome.append("entered")
        except ServerError as error:
            outcome.append(error.code)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    assert outcome == []  # still waiting
    cancel.append(ServerError(CANCELLED, "interrupted"))
    executions.wake()
    waiter.join(10)
    assert outcome == [CANCELLED]


def test_a_watched_execution_settles_its_status_with_its_own_code():
    executions = Executions()
    token = Token(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4 GiB"))
    executions.enter((0,), never)
    future = executions.watch((0,), token, [])
    token.finish()
    error = future.exception(10)
    assert isinstance(error, ServerError)
    assert error.code == RESOURCE_EXHAUSTED
    assert error.message == "execute: Out of memory allocating 4 GiB"
    assert executions.has_room((0,))
    executions.close()


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("RESOURCE_EXHAUSTED: out of memory", RESOURCE_EXHAUSTED),
        ("INVALID_ARGUMENT: bad shape", 3),
        ("something broke", INTERNAL),
        ("NOT_A_CODE: something", INTERNAL),
    ],
)
def test_status_codes_of_xla_errors_pass_through(text, code):
    assert code_of(RuntimeError(text)) == code
    assert from_exception(RuntimeError(text), "compile").code == code


# ---- the session: cancelling what has not started -------------------------------------


@pytest.fixture
def session():
    server = service.Server(Topology(1, 1))
    session = server.open_session(None)
    device = jax.devices()[0]
    compiled = jax.jit(lambda a: a + 1.0).lower(np.zeros(4, np.float32)).compile()
    executable = compiled._executable.xla_executable  # jaxlib's LoadedExecutable, as the server compiles it
    program = Program(
        executable,
        (0,),
        1,
        [(4,)],
        [np.dtype(np.float32)],
        parameter_shardings=[jax.sharding.SingleDeviceSharding(device)],
        output_shardings=[Sharding((0,), None)],
        name="add_one",
    )
    session.add_program(100, program)
    session.arrays.put(1, ServerArray.from_jax(jax.device_put(np.zeros(4, np.float32), device), Sharding((0,), None)))
    yield session
    server.executions.close()
    server.pool.shutdown()


def execute(session, result: int, epoch: int | None = None):
    request = protos.proxy("IfrtRequest")()
    request.request_metadata.op_id = result
    execute = request.loaded_executable_execute_request
    execute.loaded_executable_handle = 100
    execute.args_handles.append(1)
    execute.result_array_handle.append(result)
    execute.result_status_handle = result + 1000
    answers: list = []
    session._process(request, answers.append, epoch=epoch)
    return answers[0]


def test_an_execution_read_before_an_interrupt_is_dropped_and_its_output_says_cancelled(session):
    read_before = 0  # the client had been interrupted 0 times when the server read it
    session.cancel()
    answer = execute(session, 10, epoch=read_before)
    # The dispatch itself succeeds (the client only logs execute errors); its output holds why.
    assert answer.response_metadata.status.code == 0
    with pytest.raises(ServerError) as lost:
        session.arrays.get(10)
    assert lost.value.code == CANCELLED
    assert session.dropped == 1
    # What the client asks after the interrupt runs.
    assert execute(session, 11).response_metadata.status.code == 0
    np.testing.assert_array_equal(np.asarray(session.arrays.get(11).shards[0]), np.ones(4))
    assert session.take_future(1011).result(10) is None


def test_a_closed_session_drops_what_it_queued_and_takes_no_more_uploads(session):
    read_before_close = 0
    session.close()
    assert execute(session, 12, epoch=read_before_close).response_metadata.status.code == 0
    with pytest.raises(ServerError) as lost:
        session.arrays.get(12)
    assert lost.value.code == CANCELLED
    with pytest.raises(ServerError) as refused:
        session.host_buffers.store(5, b"\0" * 16)
    assert refused.value.code == FAILED_PRECONDITION


# ---- host buffers: filled once, released on every path -------------------------------


def test_a_host_buffer_is_filled_once():
    store = HostBufferStore()
    store.store(3, b"abcd")
    with pytest.raises(ServerError) as again:
        store.store(3, b"efgh")
    assert again.value.code == ALREADY_EXISTS
    assert bytes(store.take(3)) == b"abcd"
    assert not store.has(3)


def make_array_request(buffer: int, result: int):
    request = protos.proxy("IfrtRequest")()
    request.request_metadata.op_id = result
    make = request.make_array_from_host_buffer_request
    make.host_buffer_handle = buffer
    make.array_handle = result
    make.dtype.kind = make.dtype.KIND_F32
    make.shape.dims.append(4)
    sharding = make.sharding.serialized_sharding
    sharding.type_name = "xla::ifrt::SingleDeviceSharding"
    sharding.data = protos.ifrt("SingleDeviceShardingProto")(device_id=0).SerializeToString()
    return request


def test_a_refused_upload_is_released_whether_it_came_before_or_after_its_request(session):
    session.server.fail_slice(0)
    session.host_buffers.store(5, np.zeros(4, np.float32).tobytes())
    answers: list = []
    session._process(make_array_request(5, 20), answers.append)
    assert answers[0].response_metadata.status.code == DATA_LOSS
    assert not session.host_buffers.has(5)  # it stayed in the store, before
    # An upload that arrives after its request was refused is dropped on arrival.
    session._process(make_array_request(6, 21), answers.append)
    assert answers[1].response_metadata.status.code == DATA_LOSS
    session.host_buffers.store(6, np.zeros(4, np.float32).tobytes())
    assert not session.host_buffers.has(6)


# ---- versions --------------------------------------------------------------------------


def version_request(protocol: tuple[int, int], serdes: tuple[int, int]):
    request = protos.proxy("GrpcGetVersionRequest")()
    request.min_version.protocol_version, request.max_version.protocol_version = protocol
    request.min_version.ifrt_serdes_version_number, request.max_version.ifrt_serdes_version_number = serdes
    return request


@pytest.mark.parametrize(
    ("protocol", "serdes", "chosen"),
    [
        ((16, 25), (0, 3), (25, 3)),  # jaxlib 0.10.2's client
        ((16, 30), (0, 9), (25, 3)),  # a newer client that still speaks ours
        ((10, 20), (1, 2), (20, 2)),  # an older one
        ((26, 30), (0, 3), "protocol 26..30"),
        ((16, 25), (4, 9), "SerDes versions 4..9"),
    ],
)
def test_versions_are_negotiated_and_refused_in_one_line(protocol, serdes, chosen):
    request = version_request(protocol, serdes)
    if isinstance(chosen, tuple):
        assert service.negotiate(request) == chosen
        return
    with pytest.raises(ServerError) as refused:
        service.negotiate(request)
    assert refused.value.code == FAILED_PRECONDITION
    assert chosen in refused.value.message and "\n" not in refused.value.message


def test_a_session_opened_with_versions_the_server_does_not_speak_is_refused():
    version = protos.proxy("IfrtProxyVersion")(protocol_version=25, ifrt_serdes_version_number=3)
    service.check_session_version(version)
    version.ifrt_serdes_version_number = 7
    with pytest.raises(ServerError, match="SerDes version 7"):
        service.check_session_version(version)
