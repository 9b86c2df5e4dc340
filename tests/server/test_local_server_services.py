"""What Pathways does server-side, on a kernel backed by the local Pathways server:
``%%pathways sidecar`` and ``pw.loader`` run in the server's process,
``%%pathways profile`` captures the server's device side, and checkpoints and
snapshots reach Cloud Storage (fake-gcs-server) and come back. One kernel, one server
for the module. (Sidecars on the embedded backend: ``tests/colocated/test_sidecar.py``.)
"""

from __future__ import annotations

import os
import re
import time

import pytest
from kernels import SERVER, Kernel


@pytest.fixture(scope="module")
def server_kernel(gcs_server):
    k = Kernel("pathways", backend=SERVER, env=gcs_server.env)
    reply = k.run(
        "import os, time, threading\n"
        "import jax, jax.numpy as jnp, numpy as np\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "server_pid = pw.session().backend.server.pid\n"
        "print(jax.config.jax_platforms, server_pid != os.getpid())",
        timeout=240,
    )
    assert reply.status == "ok" and reply.text.strip() == "proxy True", reply.text + reply.error
    yield k
    k.shutdown()


@pytest.mark.kernel
def test_a_profiled_cell_holds_the_server_s_device_side(server_kernel):
    reply = server_kernel.run(
        "%%pathways profile --name sharded\n"
        "x = jax.device_put(jnp.ones((256, 256)), NamedSharding(pw.mesh(), P('data')))\n"
        "f = jax.jit(lambda a: jnp.tanh(a @ a.T))\n"
        "for _ in range(3):\n"
        "    f(x).block_until_ready()\n"
    )
    assert reply.status == "ok", reply.error
    # The devices' work runs in the server: its trace is what shows both slices busy.
    assert re.search(r"slice 0  busy [\d.]+ ms per device .* devices 0,1,2,3", reply.text), reply.text
    assert re.search(r"slice 1  busy [\d.]+ ms per device .* devices 4,5,6,7", reply.text), reply.text
    assert "(ynn_fusion, jit__lambda; 8 devices)" in reply.text or "jit__lambda; 8 devices" in reply.text, reply.text
    # Ops named by their JAX source, as on the embedded backend: the server compiles the
    # client's program with its locations, so its HLO keeps each op's op_name.
    assert re.search(r" \d+  jit\(<lambda>\)/dot_general  \(", reply.text), reply.text
    run_dir = re.search(r"trace sharded\s+\S+ \S+\s+(\S+)", reply.text).group(1)
    files = sorted(os.listdir(run_dir))
    # The server's file beside the kernel's own, as a Pathways worker's beside the client's.
    assert "pathways-local-server.xplane.pb" in files and len([f for f in files if f.endswith(".xplane.pb")]) == 2


@pytest.mark.kernel
def test_checkpoints_and_snapshots_go_to_cloud_storage_and_come_back(server_kernel, gcs_server):
    bucket = gcs_server.make_bucket("server-kernel")
    reply = server_kernel.run(
        "state = {'w': jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(pw.mesh(), P('data', 'model'))),\n"
        "         'step': jax.device_put(np.int32(7), pw.topology().slices[1].devices[0])}\n"
        f"%pathways checkpoint save {bucket}/ckpt --step 1 --vars state --wait\n"
        f"t = pw.persist(state, '{bucket}/snap'); t.wait()\n"
        "del state\n"
        f"%pathways checkpoint restore {bucket}/ckpt\n"
        "print(np.array_equal(np.asarray(state['w']), np.arange(64.0).reshape(8, 8)), int(state['step']))\n"
        f"back = pw.restore('{bucket}/snap')\n"
        "print(np.array_equal(np.asarray(back['w']), np.arange(64.0).reshape(8, 8)), int(back['step']))"
    )
    assert reply.status == "ok", reply.error
    assert [line for line in reply.text.splitlines() if line.strip()][-2:] == ["True 7", "True 7"], reply.text


# -- sidecars: in the server's process ------------------------------------------------


@pytest.mark.serial  # timing: two 3 s sidecars must overlap in wall time
@pytest.mark.kernel
def test_on_the_server_sidecars_and_the_loader_run_in_the_server_process_at_the_same_time(server_kernel):
    reply = server_kernel.run(
        "%%pathways sidecar --slices all --timeout 30\n"
        "@pw.sidecar\n"
        "def where(slice_index):\n"
        "    time.sleep(3)\n"
        "    return np.array([os.getpid(), slice_index])\n"
    )
    assert reply.status == "ok", reply.error
    reply = server_kernel.run(
        "started = time.monotonic()\n"
        "r = where()\n"
        "took = time.monotonic() - started\n"
        "print({i: v.tolist() == [server_pid, i] for i, v in r.items()}, took < 5.0, round(took, 1))\n"
        "print(r[1].devices() == set(pw.topology().slices[1].devices))"
    )
    assert reply.status == "ok", reply.error
    assert reply.text.split()[:4] == ["{0:", "True,", "1:", "True}"], reply.text
    assert reply.text.split()[4] == "True", f"two 3 s sidecars on two slices took {reply.text.split()[5]} s"
    assert reply.text.split()[6] == "True", reply.text
    # As on Pathways, a sidecar's first call on a slice fixes its result's shapes there.
    reply = server_kernel.run(
        "sized = pw.sidecar(lambda n: np.arange(n), slices='0')\nprint(sized(3)[0].tolist())\nsized(5)"
    )
    assert reply.text.strip() == "[0, 1, 2]", reply.text
    assert reply.error.strip().startswith(
        "SidecarError: sidecar '<lambda>' failed on slice 0: JaxRuntimeError: INVALID_ARGUMENT: <lambda> returned "
        "int32[5] as output 0, not the int32[3] of its first call"
    ), reply.error
    assert len(reply.error.strip().splitlines()) == 1, reply.error
    # The loader's producers run there too, one block per slice, joined on the mesh.
    reply = server_kernel.run(
        "def pids(step, shard, num_shards):\n"
        "    return {'pid': np.full((4,), os.getpid()), 'step': np.full((4,), step * 10 + shard)}\n"
        "with pw.loader(pids, mesh=pw.mesh(), spec=P('data'), prefetch=1) as batches:\n"
        "    b = batches.batch(3)\n"
        "print(set(np.asarray(b['pid']).tolist()) == {server_pid}, np.asarray(b['step']).tolist(), b['pid'].sharding.spec)"
    )
    assert reply.status == "ok", reply.error
    assert reply.text.strip() == "True [30, 30, 30, 30, 31, 31, 31, 31] P('data',)", reply.text


@pytest.mark.kernel
def test_on_the_server_a_loader_batch_costs_ten_requests_each_slice_making_its_block_on_its_own_devices(
    server_kernel,
):
    """Each batch cost 17 requests: slice 1's block was made on slice 0's devices and copied over,
    and the blocks were joined by 4 disassembles and 2 assembles; now one join (remap) and no copy."""
    reply = server_kernel.run(
        "from pathways_kernel.backends import server_client\n"
        "target = pw.session().backend.server.target\n"
        "def rows(step, shard, num_shards):\n"
        "    x = np.full((8, 16), step * 10 + shard, np.float32)\n"
        "    return {'x': x, 'y': x[:, :1]}\n"
        "def requests():\n"
        "    time.sleep(0.3)\n"
        "    return {k: v for k, v in server_client.status(target)['counts'].items() if k.startswith('requests.')}\n"
        "with pw.loader(rows, mesh=pw.mesh(), spec=P('data'), prefetch=0) as batches:\n"
        "    jax.block_until_ready(batches.batch(0))\n"
        "    before = requests()\n"
        "    for step in range(1, 21):\n"
        "        b = batches.batch(step)\n"
        "        jax.block_until_ready(b)\n"
        "    after = requests()\n"
        "spent = {k[len('requests.'):]: (after[k] - before.get(k, 0)) / 20 for k in after if after[k] != before.get(k, 0)}\n"
        "print(round(sum(spent.values()), 1), spent.get('copy_arrays_request', 0), spent)\n"
        "print(np.asarray(b['x'])[:, 0].tolist(), b['x'].sharding == NamedSharding(pw.mesh(), P('data')))"
    )
    assert reply.status == "ok", reply.error
    per_batch, copies, *_ = reply.text.split()
    # 2 uploads, 2 executions, 2 readiness checks (the loader's, one per slice) + 1 (the cell's), 1 join,
    # ~2 destructs (was 17.3: 1 copy, 4 disassembles, 2 assembles more).
    assert float(per_batch) <= 11, reply.text
    assert float(copies) == 0, reply.text
    assert (
        reply.text.splitlines()[1]
        == "[200.0, 200.0, 200.0, 200.0, 200.0, 200.0, 200.0, 200.0, 201.0, 201.0, 201.0, 201.0, 201.0, 201.0, 201.0, 201.0] True"
    ), reply.text


@pytest.mark.kernel
def test_on_the_server_a_hung_sidecar_times_out_and_holds_up_nothing_else(server_kernel):
    server_kernel.run(
        "%%pathways sidecar --slices 0 --timeout 2\n"
        "@pw.sidecar\n"
        "def frozen():\n"
        "    time.sleep(15)\n"
        "    return np.zeros(1)\n"
    )
    started = time.monotonic()
    # The kernel's own start time too, for the check below (an earlier test's `started` was read there).
    reply = server_kernel.run("started = time.monotonic()\nfrozen()", timeout=60)
    assert reply.status == "error" and time.monotonic() - started < 12, reply.error
    assert reply.error.strip().startswith("SidecarTimeout: sidecar 'frozen' on slice 0 did not finish within 2 s")
    # While it still runs in the server, the session's other work is served.
    reply = server_kernel.run("print(int(jax.jit(lambda a: a.sum())(jnp.arange(5))), time.monotonic() - started < 12)")
    assert reply.text.split() == ["10", "True"], reply.text + reply.error


@pytest.mark.kernel
def test_on_the_server_a_slice_lost_while_sidecars_run_keeps_the_live_slices_results(server_kernel):
    reply = server_kernel.run(
        "%%pathways sidecar --slices all\n"
        "@pw.sidecar\n"
        "def rows(slice_index):\n"
        "    time.sleep(2.0 if slice_index == 1 else 0.2)\n"
        "    return np.full(4, slice_index)\n"
    )
    assert reply.status == "ok", reply.error
    reply = server_kernel.run(
        "threading.Timer(0.8, pw.fail_slice, (1,)).start()\nr = rows()\nprint(sorted(r), r[0].tolist())"
    )
    try:
        assert reply.status == "ok", reply.error
        assert "[0] [0, 0, 0, 0]" in reply.text, reply.text
        said = [line for line in reply.error.splitlines() if line.strip()]
        assert len(said) == 1, reply.error
        assert "sidecar 'rows': slice 1 was lost while it ran (DATA_LOSS); results of slices [0] only" in said[0]
    finally:
        server_kernel.run("pw.repair_slice(1)")
