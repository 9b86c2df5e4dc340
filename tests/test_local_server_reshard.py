"""Resharding on the local Pathways server after a loss, driven by JAX's own proxy client.

What an elastic run does once a slice is lost or comes back: move live state onto
the new mesh. The server counts the bytes that pass through its host-buffer store
each way (``control.status``): a reshard that the server does itself moves none.
JAX's ``device_put`` to a sharding of another shape reads the array into the client
and uploads it again (JAX decides that in the client, before asking the server), so
the kernel reshards with ``state.transfers.reshard``, IFRT's reshard, which the
server serves; a same-shape ``device_put`` onto other devices is the server's
``copy_arrays``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pathways_kernel.server import launch

HERE = __file__
ROWS, COLS = 512, 4096  # 8 MiB of float32


@pytest.fixture
def server():
    started = launch.start(2, 4)
    yield started
    started.stop()


def client_reshard(target: str) -> dict:
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from pathwaysutils.elastic import elastic

    from pathways_kernel.server import control
    from pathways_kernel.state import transfers

    devices = jax.devices()
    value = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    slice0 = Mesh(np.array(devices[:4]).reshape(1, 4), ("data", "model"))
    slice1 = Mesh(np.array(devices[4:]).reshape(1, 4), ("data", "model"))
    both = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    rows, cols = P(("data", "model")), P(None, "model")
    live = jax.device_put(value, NamedSharding(slice0, rows))
    lost = jax.device_put(value, NamedSharding(both, rows))
    jax.block_until_ready([live, lost])

    def through_client(move) -> dict:
        """Runs ``move``, waits for it; the host-buffer bytes each way meanwhile, and whether
        the result (read afterwards) equals numpy."""
        before = control.status(target)["counts"]
        try:
            moved = move()
            jax.block_until_ready(moved)
        except jax.errors.JaxRuntimeError as error:
            return {"error": str(error).splitlines()[0], "slice_down": elastic.is_error_due_to_slice_down(error)}
        after = control.status(target)["counts"]
        return {
            "bytes": [after.get(k, 0) - before.get(k, 0) for k in ("host_bytes_from_client", "host_bytes_to_client")],
            "reshards": after.get("requests.reshard_arrays_request", 0)
            - before.get("requests.reshard_arrays_request", 0),
            "equal": all(np.array_equal(np.asarray(m), value) for m in moved),
            "devices": sorted({d.id for m in moved for d in m.sharding.device_set}),
        }

    control.fail(target, 1)
    result = {
        # onto the survivors, laid out otherwise (a mesh of another shape)
        "after_loss": through_client(
            lambda: transfers.reshard([live, live], [NamedSharding(slice0, cols), NamedSharding(slice0, P())])
        ),
        "lost": through_client(lambda: transfers.reshard([lost], [NamedSharding(slice0, rows)])),
    }
    control.repair(target, 1)
    # The slice is back: scale up onto both slices, and a same-shape move onto slice 1.
    result["scale_up"] = through_client(lambda: transfers.reshard([live], [NamedSharding(both, rows)]))
    result["same_shape"] = through_client(lambda: [jax.device_put(live, NamedSharding(slice1, rows))])
    return result


def test_resharding_after_a_loss_moves_the_bytes_on_the_server_not_through_the_client(server):
    out = subprocess.run(
        [sys.executable, HERE, server.target],
        capture_output=True,
        text=True,
        timeout=240,
        env=launch.client_env(server.target),
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    got = json.loads(lines[-1])

    for case in ("after_loss", "scale_up", "same_shape"):
        assert got[case]["equal"] is True, (case, got[case])
        assert got[case]["bytes"] == [0, 0], (case, got[case])
    assert got["after_loss"]["reshards"] >= 1 and got["after_loss"]["devices"] == [0, 1, 2, 3]
    assert got["scale_up"]["reshards"] >= 1 and got["scale_up"]["devices"] == list(range(8))
    assert got["same_shape"]["devices"] == [4, 5, 6, 7]
    assert "DATA_LOSS" in got["lost"]["error"] and got["lost"]["slice_down"] is True, got["lost"]


if __name__ == "__main__":
    import pathwaysutils

    pathwaysutils.initialize()
    print(json.dumps(client_reshard(sys.argv[1])), flush=True)
