"""Slices of different TPU generations and shapes on one local Pathways server
(``pathways-local serve --slices v5p:2x2x1*2,v6e:2x2``), seen through JAX's own proxy
client: each device says the kind of chip it is and where it sits in its slice; a
program runs on one kind's slices, one spanning two kinds is refused in one line, and
weights move between the kinds on the server (a weight sync from a v5p trainer to a v6e
rollout, with pathwaysutils' side channel).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import proxy_clients
import pytest

from pathways_kernel.backends import server_client

HERE = __file__
SPEC = "v5p:2x2x1*2,v6e:2x2"


@pytest.fixture(scope="module")
def server():
    started = server_client.start(SPEC)
    yield started
    started.stop()


def client_kinds(target: str) -> dict:
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from pathwaysutils.experimental import reshard as experimental_reshard

    devices = jax.devices()
    result: dict = {
        "devices": [[d.id, d.device_kind, d.slice_index, list(d.coords)] for d in devices],
        "status": {k: v for k, v in server_client.status(target).items() if k in ("slices", "kinds", "spec")},
    }
    v5p = Mesh(np.array(devices[:8]).reshape(2, 4), ("data", "model"))  # both v5p slices
    v6e = Mesh(np.array(devices[8:]).reshape(1, 4), ("data", "model"))
    value = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    x = jax.device_put(value, NamedSharding(v5p, P("data", "model")))
    result["v5p_step"] = float(jax.jit(lambda a: (a * 2).sum())(x)) == float((value * 2).sum())
    spanning = Mesh(np.array(devices[4:12]).reshape(2, 4), ("data", "model"))  # a v5p slice and the v6e one
    try:
        y = jax.device_put(value, NamedSharding(spanning, P("data", "model")))
        float(jax.jit(lambda a: (a + 1).sum())(y))
        result["spanning"] = "ran"
    except jax.errors.JaxRuntimeError as error:
        result["spanning"] = str(error).splitlines()[0]
    before = server_client.status(target)["counts"]
    synced = experimental_reshard.sidechannel_reshard_with_intermediate_sharding(
        x, x.sharding, NamedSharding(v6e, P(None, "model"))
    )
    jax.block_until_ready(synced)
    after = server_client.status(target)["counts"]
    result["sync_bytes"] = [
        after.get(k, 0) - before.get(k, 0) for k in ("host_bytes_from_client", "host_bytes_to_client")
    ]
    result["sync_devices"] = sorted(d.id for d in synced.sharding.device_set)
    result["sync_equal"] = bool(np.array_equal(np.asarray(synced), value))
    return result


def test_slices_of_two_generations_report_their_chips_and_run_programs_per_kind(server):
    got = proxy_clients.run_client(HERE, server.target, server.target)

    kinds = [d[1] for d in got["devices"]]
    assert kinds == ["TPU v5p"] * 8 + ["TPU v6 lite"] * 4, got["devices"]
    assert [d[2] for d in got["devices"]] == [0] * 4 + [1] * 4 + [2] * 4
    # a v5p slice of 2x2x1 and a v6e slice of 2x2: each chip's (x, y, z) in its grid
    assert [d[3] for d in got["devices"][4:8]] == [[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]]
    assert [d[3] for d in got["devices"][8:]] == [[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]]
    assert got["status"] == {"slices": 3, "kinds": ["TPU v5p"] * 2 + ["TPU v6 lite"], "spec": SPEC}
    assert got["v5p_step"] is True
    assert "cannot span two kinds of chip (TPU v5p on slice 1, TPU v6 lite on slice 2)" in got["spanning"], got
    assert got["sync_equal"] is True and got["sync_devices"] == [8, 9, 10, 11], got
    assert got["sync_bytes"] == [0, 0], got


def test_a_bad_slices_spec_is_one_line():
    out = subprocess.run(
        [sys.executable, "-m", "pathways_kernel.server", "serve", "--slices", "v5p:2x2,v6e:2x2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "pathways-local serve: argument --slices: bad slices 'v5p:2x2,v6e:2x2': a v5p slice is a 3D grid AxBxC, "
        "got 2x2 (see pathways-local serve --help)"
    ], out.stderr


KERNEL_STEPS = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from pathways_kernel.training.mfu import peak_flops_per_chip
trainer, rollout = pw.mesh(kind="v5p"), pw.mesh(kind="TPU v6 lite")
w = jax.device_put(np.arange(32.0).reshape(8, 4), NamedSharding(trainer, P("data", "model")))
synced = jax.device_put(jax.jit(lambda a: a * 2)(w), NamedSharding(rollout, P(None, "model")))
print("trainer", dict(trainer.shape), sorted(d.id for d in trainer.devices.flat))
print("rollout", dict(rollout.shape), sorted(d.id for d in rollout.devices.flat))
print("synced", np.array_equal(np.asarray(synced), np.arange(32.0).reshape(8, 4) * 2))
print("peak", peak_flops_per_chip(pw.session()))
"""


def test_a_kernel_on_slices_of_two_kinds_groups_them_and_builds_a_mesh_per_kind():
    from kernels import Kernel

    k = Kernel("pathways", backend=f"local:{SPEC}")
    try:
        shown = k.run("print(pw.topology())", timeout=240)
        assert shown.status == "ok", shown.error
        assert "TPU v5p: slices 0,1 (2/2 up, 8 chips)" in shown.text, shown.text
        assert "TPU v6 lite: slices 2 (1/1 up, 4 chips)" in shown.text, shown.text
        assert "slice 2: up   4 chips TPU v6 lite grid 2x2x1" in shown.text, shown.text
        ran = k.run(KERNEL_STEPS, timeout=240)
        assert ran.status == "ok", ran.error
        assert "trainer {'data': 2, 'model': 4} [0, 1, 2, 3, 4, 5, 6, 7]" in ran.text, ran.text
        assert "rollout {'data': 1, 'model': 4} [8, 9, 10, 11]" in ran.text, ran.text
        assert "synced True" in ran.text, ran.text
        # MFU's peak: each kind's, 8 v5p chips at 459 TFLOP/s and 4 v6e at 918
        assert f"peak ({(8 * 459e12 + 4 * 918e12) / 12!r}" in ran.text, ran.text
        magic = k.run("%pathways mesh --kind v6e --name rollout_mesh\nprint(rollout_mesh.devices.flat[0].device_kind)")
        assert magic.status == "ok", magic.error
        assert "Mesh(data=1, model=4) over 4 devices -> bound to 'rollout_mesh'" in magic.text, magic.text
        assert "TPU v6 lite" in magic.text, magic.text
        mixed = k.run("pw.mesh()")
        assert mixed.status == "error"
        assert "the live slices are of 2 kinds (TPU v5p on slice 0,1, TPU v6 lite on slice 2)" in mixed.error
        assert len(mixed.error.strip().splitlines()) == 1, mixed.error
        # Elastic runs per kind: on the v5p slices only, a v5p slice lost mid-run; the v6e slice is never used.
        spans = k.run("%%pathways elastic --steps 2 --state w\nw = w + 1")
        assert spans.status == "error" and "the live slices are of 2 kinds" in spans.error, spans.error
        assert len(spans.error.strip().splitlines()) == 1, spans.error
        run = k.run(
            "%%pathways elastic --kind v5p --steps 6 --state w --snapshot-every 2\n"
            "w = w + 1\n"
            "if step == 3: pw.fail_slice(1)\n"
            "assert {d.device_kind for d in mesh.devices.flat} == {'TPU v5p'}",
            timeout=240,
        )
        try:
            assert run.status == "ok", run.error
            assert "6 steps" in run.text and "1 recovery, " in run.text, run.text
            # Back from the snapshot of step 2 onto slice 0 (devices 0-3): every step counted once.
            kept = k.run("print(float(w[0, 0]), sorted(d.id for d in w.sharding.device_set))")
            assert kept.text.strip() == "6.0 [0, 1, 2, 3]", kept.text + kept.error
        finally:
            k.run("pw.repair_slice(1)")
    finally:
        k.shutdown()


if __name__ == "__main__":
    import pathwaysutils

    pathwaysutils.initialize()
    print(json.dumps(client_kinds(sys.argv[1])), flush=True)
