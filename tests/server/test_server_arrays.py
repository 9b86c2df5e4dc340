"""The local Pathways server's array store, on its own, in this process: an array deleted by
the session's thread while another thread (the control channel's status, the runtime metric
service's HBM usage, a reshard) reads it."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import jax
import numpy as np
import pytest

from pathways_kernel.server import protos, service
from pathways_kernel.server.array_requests import delete_array_request
from pathways_kernel.server.arrays import ServerArray, Sharding
from pathways_kernel.server.devices import Topology

ROUNDS = 300  # the unlocked store failed within 10
SERVER = str(Path(service.__file__).parent)


@pytest.fixture
def session():
    server = service.Server(Topology(1, 1))
    session = server.open_session(None)
    yield session
    server.executions.close()
    server.pool.shutdown()


def size_of(handle: int) -> int:
    """Bytes of the array under ``handle``: neighbours differ, so a count says which it saw."""
    return 4 * (handle % 64 + 1)


def yielding(frame: FrameType, event: str, arg: Any) -> Any:
    """A trace function that lets the other thread run before each line of the server's code,
    so that a reader and a writer interleave line by line (a switch interval alone almost
    never falls inside the few lines where they meet)."""
    if not frame.f_code.co_filename.startswith(SERVER):
        return None
    if event == "line":
        time.sleep(0)
    return yielding


def test_a_reader_racing_deletes_never_fails_nor_counts_a_deleted_array(session):
    device = jax.devices()[0]
    values = [jax.device_put(np.zeros(n + 1, np.float32), device) for n in range(64)]
    last_deleted = [0]  # the handle the deleting thread last finished deleting
    failures: list[BaseException] = []
    miscounts: list[tuple[int, int]] = []
    done = threading.Event()

    def read() -> None:
        sys.settrace(yielding)
        while not done.is_set():
            before = last_deleted[0]
            try:
                counted = session.server.status()["bytes_per_device"][0]
            except BaseException as error:  # what the control thread would have died of
                failures.append(error)
                return
            if before and counted == size_of(before):  # the array it knew to be deleted
                miscounts.append((before, counted))

    reader = threading.Thread(target=read)
    reader.start()
    sys.settrace(yielding)
    try:
        for handle in range(1, ROUNDS + 1):
            if failures or miscounts:
                break
            session.arrays.put(handle, ServerArray.from_jax(values[handle % 64], Sharding((0,), None)))
            request = protos.proxy("IfrtRequest")()
            request.delete_array_request.array_handle.append(handle)
            delete_array_request(session, request.delete_array_request, protos.proxy("IfrtResponse")())
            assert session.arrays.is_deleted(handle)
            last_deleted[0] = handle
            session.arrays.destruct([handle])
    finally:
        sys.settrace(None)
        done.set()
        reader.join(30)
    assert not failures, repr(failures[0])
    assert not miscounts, miscounts[:3]
    assert session.server.status()["bytes_per_device"][0] == 0
