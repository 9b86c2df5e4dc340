"""Resharding on the local Pathways server after a loss, driven by JAX's own proxy client.

What an elastic run does once a slice is lost or comes back: move live state onto
the new mesh. The server counts the bytes that pass through its host-buffer store
each way (``server_client.status``): a reshard that the server does itself moves none.
JAX's ``device_put`` to a sharding of another shape reads the array into the client
and uploads it again (JAX decides that in the client, before asking the server; the
test checks that boundary too), so the kernel reshards with ``state.transfers.reshard``,
IFRT's reshard, which the server serves; a same-shape ``device_put`` onto other devices
is the server's ``copy_arrays``, pathwaysutils' split and concatenate its ``remap_arrays``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import proxy_clients
import pytest

from pathways_kernel.backends import server_client

HERE = __file__
ROWS, COLS = 512, 4096  # 8 MiB of float32


@pytest.fixture
def server():
    started = server_client.start(2, 4)
    yield started
    started.stop()


def client_reshard(target: str) -> dict:
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from pathwaysutils.elastic import elastic
    from pathwaysutils.experimental import concatenate_by_mesh_axis, split_by_mesh_axis

    from pathways_kernel.state import transfers

    devices = jax.devices()
    value = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    slice0 = Mesh(np.array(devices[:4]).reshape(1, 4), ("data", "model"))
    slice1 = Mesh(np.array(devices[4:]).reshape(1, 4), ("data", "model"))
    both = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    rows, cols = P(("data", "model")), P(None, "model")
    live = jax.device_put(value, NamedSharding(slice0, rows))
    lost = jax.device_put(value, NamedSharding(both, P("data", "model")))
    jax.block_until_ready([live, lost])
    kept: dict = {}

    def through_client(name, move, expected=(value,)) -> dict:
        """Runs ``move``, waits for it; the host-buffer bytes each way meanwhile, and whether
        the results (read afterwards) equal ``expected``."""
        before = server_client.status(target)["counts"]
        try:
            moved = kept[name] = list(jax.block_until_ready(move()))
        except jax.errors.JaxRuntimeError as error:
            return {"error": str(error).splitlines()[0], "slice_down": elastic.is_error_due_to_slice_down(error)}
        after = server_client.status(target)["counts"]
        return {
            "bytes": [after.get(k, 0) - before.get(k, 0) for k in ("host_bytes_from_client", "host_bytes_to_client")],
            "requests": sorted(
                k.split(".")[1] for k in after if k.startswith("requests.") and after[k] != before.get(k)
            ),
            "equal": [bool(np.array_equal(np.asarray(m), e)) for m, e in zip(moved, expected, strict=True)],
            "devices": sorted({d.id for m in moved for d in m.sharding.device_set}),
        }

    halves = (value[: ROWS // 2], value[ROWS // 2 :])
    result = {
        # pathwaysutils' split and concatenate by mesh axis: shards regrouped where they are.
        "split": through_client("split", lambda: split_by_mesh_axis.split_by_mesh_axis(lost, "data"), halves),
        "concatenated": through_client(
            "whole", lambda: [concatenate_by_mesh_axis.concatenate_by_mesh_axis(kept["split"], "data")]
        ),
    }
    survivor = split_by_mesh_axis.split_by_mesh_axis(lost, "data")[0]  # concatenating donated the halves
    server_client.fail(target, 1)
    # onto the survivors, laid out otherwise (a mesh of another shape)
    result["after_loss"] = through_client(
        "after_loss",
        lambda: transfers.reshard([live, live], [NamedSharding(slice0, cols), NamedSharding(slice0, P())]),
        (value, value),
    )
    # The boundary: JAX's own device_put to another shape goes through the client, both ways.
    result["device_put"] = through_client("put", lambda: [jax.device_put(live, NamedSharding(slice0, cols))])
    result["lost"] = through_client("lost", lambda: transfers.reshard([lost], [NamedSharding(slice0, rows)]))
    # The half split off onto slice 0 outlived the loss.
    result["half_on_slice0"] = bool(np.array_equal(np.asarray(survivor), halves[0]))
    server_client.repair(target, 1)
    # The slice is back: scale up onto both slices, and a same-shape move onto slice 1.
    result["scale_up"] = through_client("up", lambda: transfers.reshard([live], [NamedSharding(both, rows)]))
    result["same_shape"] = through_client("same", lambda: [jax.device_put(live, NamedSharding(slice1, rows))])
    return result


def test_resharding_after_a_loss_moves_the_bytes_on_the_server_not_through_the_client(server):
    got = proxy_clients.run_client(HERE, server.target, server.target)

    for case in ("split", "concatenated", "after_loss", "scale_up", "same_shape"):
        assert all(got[case]["equal"]), (case, got[case])
        assert got[case]["bytes"] == [0, 0], (case, got[case])
    assert "remap_arrays_request" in got["split"]["requests"], got["split"]
    assert "remap_arrays_request" in got["concatenated"]["requests"], got["concatenated"]
    assert "reshard_arrays_request" in got["after_loss"]["requests"] and got["after_loss"]["devices"] == [0, 1, 2, 3]
    assert "reshard_arrays_request" in got["scale_up"]["requests"] and got["scale_up"]["devices"] == list(range(8))
    assert "copy_arrays_request" in got["same_shape"]["requests"] and got["same_shape"]["devices"] == [4, 5, 6, 7]
    assert all(n >= ROWS * COLS * 4 for n in got["device_put"]["bytes"]), got["device_put"]
    assert "DATA_LOSS" in got["lost"]["error"] and got["lost"]["slice_down"] is True, got["lost"]
    assert got["half_on_slice0"] is True


if __name__ == "__main__":
    import pathwaysutils

    pathwaysutils.initialize()
    print(json.dumps(client_reshard(sys.argv[1])), flush=True)
