"""What Pathways does server-side, on a kernel backed by the local Pathways server:
``%%pathways profile`` captures the server's device side, and checkpoints and
snapshots reach Cloud Storage (fake-gcs-server) and come back. One kernel, one server
for the module. (Sidecars on the server: ``tests/test_sidecar.py``.)
"""

from __future__ import annotations

import os
import re

import pytest
from kernels import SERVER, Kernel


@pytest.fixture(scope="module")
def server_kernel(gcs_server):
    k = Kernel("pathways", backend=SERVER, env=gcs_server.env)
    reply = k.run(
        "import jax, jax.numpy as jnp, numpy as np\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "print(jax.config.jax_platforms, pw.session().backend.server.pid)",
        timeout=240,
    )
    assert reply.status == "ok" and reply.text.startswith("proxy "), reply.text + reply.error
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
