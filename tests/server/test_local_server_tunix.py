"""Tunix's RL, unchanged, against the local Pathways server: ``RLCluster`` with the actor and
reference on slice 0 (a v5p) and the rollout on slice 1 (a v6e), trained by ``GRPOLearner`` as
Tunix's own disaggregated GRPO test does. With ``JAX_PLATFORMS=proxy`` Tunix syncs the weights with
pathwaysutils' ``reshardRequest`` side channel after every step; after each sync the
rollout model's weights equal the trainer's, and no weight byte passed through the client.

Tunix and its dependencies are not the package's: ``make test-py`` installs them beside the
venv (``--target``, ``--no-deps``, ~6 s and 73 MB from the package index; the Makefile's
``TUNIX`` target), and this module skips, saying so, where they are not installed.
"""

from __future__ import annotations

import json
import os
import sys

import proxy_clients
import pytest
from rl_jobs import TUNIX_DIR, check_syncs, needs_tunix, slice_meshes, toy_cluster

from pathways_kernel.backends import server_client

HERE = __file__
SPEC = "v5p:2x2x1,v6e:2x2"
pytestmark = needs_tunix


@pytest.fixture(scope="module")
def server():
    # The trainer's slice is a v5p, the rollout's a Trillium v6e (device ids 0-3 and 4-7, as on 2x4).
    started = server_client.start(SPEC)
    yield started
    started.stop()


def client_grpo(target: str) -> dict:
    import jax
    import numpy as np
    from flax import nnx
    from grain import python as grain
    from tunix.rl.grpo import grpo_learner as grpo_lib

    trainer_mesh, rollout_mesh = slice_meshes()
    cluster = toy_cluster(trainer_mesh, rollout_mesh, max_steps=10)
    syncs = check_syncs(cluster, target)
    initial = jax.tree.map(np.asarray, nnx.state(cluster.actor_trainer.model, nnx.Param))
    learner = grpo_lib.GRPOLearner(
        rl_cluster=cluster,
        reward_fns=lambda completions, **_: np.arange(len(completions), dtype=np.float32),
        algo_config=grpo_lib.GRPOConfig(num_generations=2, num_iterations=1),
    )
    prompts = ["input string", "hello world", "My name", "hello there"]
    data = grain.MapDataset.source(prompts).batch(2).map(lambda x: {"prompts": x, "answer": x})
    learner.train(data, None)
    trained = nnx.state(cluster.actor_trainer.model, nnx.Param)
    changed = any(
        not np.array_equal(a, np.asarray(b))
        for a, b in zip(jax.tree.leaves(initial), jax.tree.leaves(trained), strict=True)
    )
    kinds = {
        "trainer": sorted({d.device_kind for d in trainer_mesh.devices.flat}),
        "rollout": sorted({d.device_kind for d in rollout_mesh.devices.flat}),
    }
    return {"should_sync": learner.should_sync_weights, "syncs": syncs, "trained": changed, "kinds": kinds}


def test_tunix_grpo_with_trainer_on_a_v5p_slice_and_rollout_on_a_v6e_slice_syncs_on_the_server(server):
    env = server_client.client_env(server.target)
    env["PYTHONPATH"] = os.pathsep.join([TUNIX_DIR, env.get("PYTHONPATH", "")])
    got = proxy_clients.run_client(HERE, server.target, server.target, env=env, timeout=600)

    assert got["should_sync"] is True and got["trained"] is True, got
    assert len(got["syncs"]) >= 2, got
    for sync in got["syncs"]:
        assert sync["equal"] is True, got["syncs"]
        assert sync["bytes"] == [0, 0], got["syncs"]
        assert sync["actor_devices"] == [0, 1, 2, 3] and sync["rollout_devices"] == [4, 5, 6, 7], sync
    assert got["kinds"] == {"trainer": ["TPU v5p"], "rollout": ["TPU v6 lite"]}, got


if __name__ == "__main__":
    import pathwaysutils

    pathwaysutils.initialize()
    print(json.dumps(client_grpo(sys.argv[1])), flush=True)
