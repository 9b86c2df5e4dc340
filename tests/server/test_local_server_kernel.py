"""Real kernels on the local backend, the product default (``local:2x4``).

The kernel starts ``pathways-local`` as a child and reaches it through JAX's own
proxy client (``JAX_PLATFORMS=proxy``, pathwaysutils), as a GKE user reaches
Pathways; slices are lost in the server process. What a user sees is checked:
devices, a sharded step, DATA_LOSS, healing, an elastic run (a killed server: test_server_death.py).
"""

from __future__ import annotations

import os
import re
import signal

import pytest
from kernels import Kernel
from waiting import wait_until

SETUP = """
import jax, numpy as np, pathwaysutils
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = pw.mesh()
w = jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data", "model")))
logits = jax.device_put(np.ones((8, 2)), NamedSharding(mesh, P("data")))
on0 = jax.device_put(np.full(4, 3.0), pw.topology().slices[0].devices[0])
"""


@pytest.fixture(scope="module")
def server_kernel():
    """A kernel on the product default: no backend named anywhere."""
    k = Kernel("pathways", backend=None)
    reply = k.run(SETUP, timeout=240)
    assert reply.status == "ok", reply.error
    yield k
    pid = server_pid(k)
    k.shutdown()
    # Stopped by pid with the kernel.
    assert wait_until(lambda: not alive(pid), 30)


def server_pid(kernel: Kernel) -> int:
    status = kernel.run("%pathways status").text
    match = re.search(r"target\s+grpc://unix:\S+ \(local Pathways server, pid (\d+)\)", status)
    assert match, status
    return int(match.group(1))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by the kernel) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_kernel_runs_jax_s_proxy_client_against_its_own_server(server_kernel):
    reply = server_kernel.run(
        "print([d.slice_index for d in jax.devices()], pathwaysutils.is_pathways_backend_used(),"
        " jax.config.jax_platforms, dict(mesh.shape))"
    )
    assert reply.text.strip() == "[0, 0, 0, 0, 1, 1, 1, 1] True proxy {'data': 2, 'model': 4}", reply.text + reply.error
    assert "backend   local:2x4" in server_kernel.run("%pathways status").text
    step = server_kernel.run(
        "import jax.numpy as jnp\n"
        "f = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(axis=0), out_shardings=NamedSharding(mesh, P('data')))\n"
        "x = np.arange(64.0).reshape(8, 8) / 64\n"
        "print(np.allclose(np.asarray(f(jax.device_put(x, w.sharding))), np.tanh(x @ x.T).sum(axis=0)))"
    )
    assert step.text.strip() == "True", step.error
    # Memory figures are the server's own count of bytes on each device, read through its runtime metric service.
    memory = server_kernel.run(
        "from pathways_kernel.monitoring import telemetry\n"
        "from pathways_kernel.backends import server_client\n"
        "layout = telemetry.Layout.of(pw.topology())\n"
        "source = telemetry.hub().source\n"
        "sample = source.sample(layout).memory.tolist()\n"
        "print(source.name, sample == server_client.status(pw.session().backend.server.target)['bytes_per_device'],"
        " sample[0] > sample[1] > 0)"
    )
    assert memory.text.strip() == "runtime metrics (pathways-local), 1 s True True", memory.text + memory.error


def test_a_host_callback_is_one_line_naming_the_limit_and_the_embedded_backend(server_kernel):
    for code in (
        "jax.jit(lambda x: (jax.debug.print('x={x}', x=x), x + 1)[1])(np.arange(3.0))",
        "jax.pure_callback(lambda x: np.asarray(x) * 2, jax.ShapeDtypeStruct((3,), np.float32), np.arange(3, dtype=np.float32))",
    ):
        reply = server_kernel.run(code)
        lines = [line for line in reply.error.splitlines() if line.strip()]
        assert reply.status == "error" and len(lines) == 1, reply.error
        assert "host callbacks (jax.debug.print, jax.pure_callback, io_callback) do not run on local:2x4" in lines[0]
        assert "%pathways connect embedded:2x4" in lines[0]
    # Other JAX errors keep their usual traceback.
    other = server_kernel.run("jax.device_put(np.ones(3), jax.devices()[0]).reshape(4)")
    assert other.status == "error" and "Traceback" in other.error and len(other.error.splitlines()) > 1


def test_a_slice_lost_in_the_server_is_data_loss_and_named_snapshots_heal(server_kernel):
    assert server_kernel.run("%pathways snapshot w").status == "ok"
    assert server_kernel.run("pw.snapshot_store().latest('w')").status == "ok"  # waits for the copy
    reply = server_kernel.run("%pathways fail 1")
    assert reply.status == "ok", reply.error
    assert "slice 1 down: lost" in reply.text
    assert "restored from snapshots onto slices [0]: w (" in reply.text, reply.text
    assert "no snapshot, now unusable (DATA_LOSS): logits" in reply.text, reply.text
    try:
        check = server_kernel.run(
            "print(pw.is_lost(logits), pw.is_lost(w), pw.is_lost(on0), float(on0.sum()), float(w.sum()))"
        )
        assert check.text.strip() == "True False False 12.0 2016.0", check.text + check.error
        lost = server_kernel.run("np.asarray(logits)")
        assert lost.status == "error" and "DATA_LOSS: slice 1 was lost" in lost.error
        # The server itself holds nothing for the lost slice, as pw.health's check sees.
        health = server_kernel.run("%pathways health").text
        assert "slice 1: down" in health and "1/2 slices healthy" in health, health
    finally:
        repaired = server_kernel.run("%pathways repair 1").text
    assert "slice 1 up again (empty: lost arrays stay lost)" in repaired
    after = server_kernel.run("print(pw.is_lost(logits), float(w.sum()), w.sharding.spec)")
    assert after.text.strip() == "True 2016.0 P('data', 'model')", after.text + after.error
    assert "2/2 slices healthy" in server_kernel.run("%pathways health").text


def test_an_elastic_run_survives_a_slice_lost_in_the_server(server_kernel):
    setup = server_kernel.run(
        "params = jax.device_put(np.zeros(8), NamedSharding(pw.mesh(), P('data')))\nlost_once = False"
    )
    assert setup.status == "ok", setup.error
    try:
        reply = server_kernel.run(
            "%%pathways elastic --steps 30 --state params --snapshot-every 5\n"
            "params = params + 1\n"
            "if step == 12 and not lost_once:\n"
            "    lost_once = True\n"
            "    pw.fail_slice(1)\n",
            timeout=240,
        )
        assert reply.status == "ok", reply.error
        assert "30 steps" in reply.text and "1 recovery" in reply.text, reply.text
        check = server_kernel.run("print(float(params[0]), float(params[7]), len(params.sharding.device_set))")
        assert check.text.strip() == "30.0 30.0 4", check.text + check.error
    finally:
        server_kernel.run("%pathways repair 1")


def test_server_specs_and_a_server_for_a_remote_spec_is_one_line():
    from pathways_kernel import backends
    from pathways_kernel.core.errors import SpecError

    assert backends.from_spec("local:2x4", server=True).spec == "local:2x4"
    assert backends.from_spec("local-server:1x2").spec == "local:1x2"
    assert backends.from_spec("local", server=True).spec == "local:2x4"
    with pytest.raises(SpecError, match=r"use local:SxC, e.g. local:2x4, not 'grpc://localhost:29000'"):
        backends.from_spec("grpc://localhost:29000", server=True)
    with pytest.raises(SpecError, match="bad local spec"):
        backends.from_spec("local-server:2y4")


def test_the_server_goes_when_its_kernel_is_killed():
    # Last wave's spec in a kernelspec environment still starts the server.
    kernel = Kernel("pathways", env={"PATHWAYS_BACKEND": "local-server:1x2"})
    try:
        pid = server_pid(kernel)
        assert alive(pid)
        os.kill(kernel.km.provisioner.process.pid, signal.SIGKILL)
        assert wait_until(lambda: not alive(pid), 30), "the server outlived its kernel"
    finally:
        kernel.shutdown()
