"""The local Pathways server's session, on its own, in this process (as XLA's
``ifrt_backend_test`` checks ``IfrtBackend``): executions in flight, cancelling what has not
started, and status codes passed through."""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest

from pathways_kernel.server import protos, service
from pathways_kernel.server.arrays import ServerArray, Sharding
from pathways_kernel.server.devices import Topology
from pathways_kernel.server.errors import CANCELLED, INTERNAL, RESOURCE_EXHAUSTED, ServerError, code_of, from_exception
from pathways_kernel.server.executions import Executions
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
