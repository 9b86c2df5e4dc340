"""The ``reshardRequest`` side channel on the local Pathways server, driven by pathwaysutils
as Tunix drives it: each weight sync moves the trainer's parameters (slice 0) onto the
rollout mesh (slice 1) with ``sidechannel_reshard_with_intermediate_sharding``, the
server moving the bytes itself (none pass through the client, counted as in
``test_local_server_reshard.py``), and honours ``donate``.
"""

from __future__ import annotations

import functools
import json
import sys

import numpy as np
import proxy_clients
import pytest

from pathways_kernel.backends import server_client

HERE = __file__
ROWS, COLS = 256, 2048  # 2 MiB of float32 per parameter


@pytest.fixture(scope="module")
def server():
    started = server_client.start(2, 4)
    yield started
    started.stop()


def client_sync(target: str) -> dict:
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from pathwaysutils.elastic import elastic
    from pathwaysutils.experimental import reshard as experimental_reshard

    devices = jax.devices()
    trainer = Mesh(np.array(devices[:4]).reshape(4, 1), ("fsdp", "tp"))
    rollout = Mesh(np.array(devices[4:]).reshape(1, 4), ("fsdp", "tp"))
    rollout_tp2 = Mesh(np.array(devices[4:]).reshape(2, 2), ("fsdp", "tp"))
    base = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    expected = {"w": base, "b": base[0] * 2, "scale": np.float32(3.0) * base[:8]}
    train_shardings = {
        "w": NamedSharding(trainer, P("fsdp", None)),
        "b": NamedSharding(trainer, P()),
        "scale": NamedSharding(trainer, P("fsdp", "tp")),
    }
    params = {k: jax.device_put(v, train_shardings[k]) for k, v in expected.items()}
    jax.block_until_ready(params)

    def sync(move, wanted) -> dict:
        """Runs one weight sync, waits for it; the client's host-buffer bytes each way meanwhile."""
        before = server_client.status(target)["counts"]
        moved = jax.block_until_ready(move())
        after = server_client.status(target)["counts"]
        leaves, wanted_leaves = jax.tree.leaves(moved), jax.tree.leaves(wanted)
        return {
            "bytes": [after.get(k, 0) - before.get(k, 0) for k in ("host_bytes_from_client", "host_bytes_to_client")],
            "requests": sorted(
                k.split(".")[1] for k in after if k.startswith("requests.") and after[k] != before.get(k)
            ),
            "devices": sorted({d.id for leaf in leaves for d in leaf.sharding.device_set}),
            "equal": [bool(np.array_equal(np.asarray(m), w)) for m, w in zip(leaves, wanted_leaves, strict=True)],
            "moved": moved,
        }

    result = {}
    # Tunix's reshard_pytree: the source shardings as a pytree, the rollout's as another.
    rollout_shardings = {
        "w": NamedSharding(rollout, P(None, "tp")),
        "b": NamedSharding(rollout, P("tp")),
        "scale": NamedSharding(rollout, P()),
    }
    in_shardings = jax.tree.map(lambda x: x.sharding, params)
    for step in range(3):  # every step the trainer's weights change, and are synced again
        params = jax.block_until_ready({k: v + 1 for k, v in params.items()})  # its scalar uploads counted before
        expected = {k: v + 1 for k, v in expected.items()}
        got = sync(
            functools.partial(
                experimental_reshard.sidechannel_reshard_with_intermediate_sharding,
                params, in_shardings, rollout_shardings, donate=False, cache_resharding_plans=True,
            ),
            expected,
        )  # fmt: skip
        got.pop("moved")
        result[f"pytree{step}"] = got
    # One array whose layouts share no factor: pathwaysutils goes through an intermediate
    # sharding (a program on the trainer's devices, then split_by_mesh_axis), then the side channel.
    w = params["w"]
    got = sync(
        lambda: experimental_reshard.sidechannel_reshard_with_intermediate_sharding(
            w, w.sharding, NamedSharding(rollout_tp2, P(None, "tp")), donate=True
        ),
        expected["w"],
    )
    result["intermediate"] = {k: v for k, v in got.items() if k != "moved"}
    # Donation: the trainer's copy is gone afterwards, as on Pathways.
    b = params["b"]
    got = sync(
        lambda: experimental_reshard.reshard(b, NamedSharding(rollout, P()), donate=True),
        expected["b"],
    )
    result["donated"] = {k: v for k, v in got.items() if k != "moved"}
    result["donated"]["source_deleted"] = b.is_deleted()
    try:
        np.asarray(b + 1)
        result["donated"]["source_usable"] = True
    except (RuntimeError, ValueError):
        result["donated"]["source_usable"] = False
    # The rollout's slice is lost: the sync itself fails with the slice-down error an elastic RL
    # loop waits for, and once the slice is back the next sync lands there again.
    server_client.fail(target, 1)
    try:
        experimental_reshard.reshard(params["w"], NamedSharding(rollout, P()))
        result["onto_lost"] = "synced"
    except jax.errors.JaxRuntimeError as error:
        result["onto_lost"] = str(error).splitlines()[0]
        result["onto_lost_is_slice_down"] = elastic.is_error_due_to_slice_down(error)
    server_client.repair(target, 1)
    after = experimental_reshard.reshard(params["w"], NamedSharding(rollout, P()))
    result["after_repair"] = bool(np.array_equal(np.asarray(after), expected["w"]))
    return result


def test_weight_sync_through_the_side_channel_moves_no_bytes_through_the_client(server):
    got = proxy_clients.run_client(HERE, server.target, server.target)

    onto_lost, is_slice_down = got.pop("onto_lost"), got.pop("onto_lost_is_slice_down", None)
    after_repair = got.pop("after_repair")
    for case, sync in got.items():
        assert all(sync["equal"]), (case, sync)
        assert sync["bytes"] == [0, 0], (case, sync)
        assert sync["devices"] == [4, 5, 6, 7], (case, sync)
    assert "loaded_executable_execute_request" in got["pytree0"]["requests"], got["pytree0"]
    # The plan is cached: later syncs compile nothing.
    assert "compile_request" not in got["pytree2"]["requests"], got["pytree2"]
    assert "remap_arrays_request" in got["intermediate"]["requests"], got["intermediate"]
    assert got["donated"]["source_deleted"] is True and got["donated"]["source_usable"] is False, got["donated"]
    assert "DATA_LOSS: slice 1 is down" in onto_lost and is_slice_down is True, onto_lost
    assert after_repair is True


if __name__ == "__main__":
    import pathwaysutils

    pathwaysutils.initialize()
    print(json.dumps(client_sync(sys.argv[1])), flush=True)
