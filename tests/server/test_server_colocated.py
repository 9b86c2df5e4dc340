"""Colocated Python in the local Pathways server, on its own, in this process: what status a
function that raises answers with. Its status code passes through, as the reference server
passes an execution's status through: a Python error of the user's code is INTERNAL (as
jaxlib's host callbacks make it: ``INTERNAL: CpuCallback error``), an XLA or tensorstore error
keeps the code its text starts with."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import tensorstore as ts

from pathways_kernel.server.arrays import ServerArray, Sharding
from pathways_kernel.server.colocated import ColocatedProgram
from pathways_kernel.server.errors import (
    DATA_LOSS,
    INTERNAL,
    NOT_FOUND,
    RESOURCE_EXHAUSTED,
    ServerError,
)


def program(function) -> ColocatedProgram:
    device = jax.devices()[0]
    spec = jax.ShapeDtypeStruct((4,), np.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    return ColocatedProgram(
        "f",
        function,
        jax.tree_util.tree_structure(((0,), {})),
        (spec,),
        jax.tree_util.tree_structure(0),
        (spec,),
        (0,),
        output_shardings=[Sharding((0,), None)],
    )


def run(function) -> ServerError:
    value = jax.device_put(np.zeros(4, np.float32), jax.devices()[0])
    with pytest.raises(ServerError) as raised:
        program(function).run([ServerArray.from_jax(value, Sharding((0,), None))])
    return raised.value


def raises(error: Exception):
    def function(x):
        raise error

    return function


def open_missing(tmp_path):
    def function(x):
        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / "nowhere")}}
        ts.open(spec, open=True, read=True).result()

    return function


def test_a_python_error_of_the_function_is_internal_in_one_line():
    error = run(raises(KeyError("no shard file for this host")))
    assert (error.code, error.message) == (INTERNAL, "KeyError: 'no shard file for this host'")
    error = run(raises(ValueError("two\n  lines")))
    assert (error.code, error.message) == (INTERNAL, "ValueError: two lines")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4 GiB"), RESOURCE_EXHAUSTED),
        (jax.errors.JaxRuntimeError("DATA_LOSS: slice 1 is down"), DATA_LOSS),  # what an elastic loop recovers from
        (jax.errors.JaxRuntimeError("something broke"), INTERNAL),
        (ValueError("the shard said NOT_FOUND: somewhere inside"), INTERNAL),  # a code only where the text starts
        (ServerError(DATA_LOSS, "slice 0 is down"), DATA_LOSS),  # the server's own, from an input on a lost slice
    ],
)
def test_a_status_code_in_the_error_passes_through(error, code):
    assert run(raises(error)).code == code


def test_a_tensorstore_failure_keeps_its_code(tmp_path):
    missing = run(open_missing(tmp_path))
    assert missing.code == NOT_FOUND, missing.message
    assert missing.message.startswith('ValueError: Error opening "zarr" driver'), missing.message
    bad = run(lambda x: ts.open({"driver": "zarr", "kvstore": {"driver": "no_such_driver"}}).result())
    assert bad.code == INTERNAL, bad.message  # its text names no code
