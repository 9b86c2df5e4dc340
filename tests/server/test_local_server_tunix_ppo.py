"""Tunix's PPO, unchanged, against the local Pathways server: ``RLCluster`` with the actor and the critic on
slice 0 and the rollout on slice 1 of ``local:2x4``, trained by ``PPOLearner``. With ``JAX_PLATFORMS=proxy``
Tunix syncs the actor's weights to the rollout with pathwaysutils' ``reshardRequest`` side channel after every
step; after each sync the rollout model's weights equal the actor's, and no weight byte passed through the
client. The GRPO twin is test_local_server_tunix.py (Tunix is installed beside the venv by ``make test-py``;
this module skips, saying so, where it is not).

``beta=0.0`` (no KL penalty, so no reference model): Tunix 0.1.7's PPO subtracts the reference's log-probs
(computed on the reference's mesh) from the policy's old log-probs (computed by the rollout, on the rollout's
mesh) in one jitted op, so with the rollout on its own slice it fails with JAX's "Received incompatible devices
for jitted computation" -- on stock CPU JAX with 8 devices as on the server: a Tunix limitation, not the server's.
"""

from __future__ import annotations

import json
import os
import sys

import proxy_clients
import pytest
from rl_jobs import TUNIX_DIR, check_syncs, device_ids, needs_tunix, slice_meshes

from pathways_kernel.backends import server_client

HERE = __file__
pytestmark = needs_tunix


@pytest.fixture(scope="module")
def server():
    started = server_client.start(2, 4)  # slice 0: devices 0-3 (trainer roles), slice 1: 4-7 (rollout)
    yield started
    started.stop()


def ppo_cluster(trainer_mesh, rollout_mesh, *, max_steps: int):
    """Tunix's ``RLCluster`` for PPO of its own test models (``tunix.tests.test_common``), one layer each: a
    ``ToyTransformer`` actor and a ``ToyTransformerWithScoreHead`` critic on ``trainer_mesh``, the rollout on
    ``rollout_mesh``. SGD at 1e-2 for both; the vanilla rollout of up to 6 new tokens."""
    import optax
    from flax import nnx
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.rollout import base_rollout
    from tunix.tests import test_common as tc

    vocab = tc.MockVocab()
    config = tc.ModelConfig(num_layers=1, vocab_size=vocab.GetPieceSize())  # the smallest that exercises PPO
    role = rl_cluster_lib.Role
    critic = tc.ToyTransformerWithScoreHead(tc.ToyTransformer(config=config, rngs=nnx.Rngs(1)), nnx.Rngs(1))
    return rl_cluster_lib.RLCluster(
        actor=tc.ToyTransformer(config=config, rngs=nnx.Rngs(0)),
        critic=critic,
        tokenizer=vocab,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={
                role.ACTOR: trainer_mesh,
                role.CRITIC: trainer_mesh,
                role.ROLLOUT: rollout_mesh,
            },
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.sgd(1e-2),
                critic_optimizer=optax.sgd(1e-2),
                eval_every_n_steps=max_steps,
                max_steps=max_steps,
            ),
            rollout_config=base_rollout.RolloutConfig(max_tokens_to_generate=6, max_prompt_length=32, kv_cache_size=64),
        ),
    )


def client_ppo(target: str) -> dict:
    import jax
    import numpy as np
    from flax import nnx
    from grain import python as grain
    from tunix.rl.ppo import ppo_learner as ppo_lib

    trainer_mesh, rollout_mesh = slice_meshes()
    cluster = ppo_cluster(trainer_mesh, rollout_mesh, max_steps=10)
    syncs = check_syncs(cluster, target)

    def params(model):
        return jax.tree.map(np.asarray, nnx.state(model, nnx.Param))

    def changed(before, model) -> bool:
        pairs = zip(jax.tree.leaves(before), jax.tree.leaves(params(model)), strict=True)
        return any(not np.array_equal(a, b) for a, b in pairs)

    actor0, critic0 = params(cluster.actor_trainer.model), params(cluster.critic_trainer.model)
    learner = ppo_lib.PPOLearner(
        rl_cluster=cluster,
        ppo_config=ppo_lib.PPOConfig(num_iterations=1, beta=0.0),  # see the module's docstring
        reward_fns=lambda completions, **_: np.arange(len(completions), dtype=np.float32),
    )
    prompts = ["input string", "hello world", "My name", "hello there"]
    data = grain.MapDataset.source(prompts).batch(2).map(lambda x: {"prompts": x, "answer": x})
    learner.train(data, None)
    return {
        "should_sync": learner.should_sync_weights,
        "syncs": syncs,
        "steps": [cluster.actor_trainer.train_steps, cluster.critic_trainer.train_steps],
        "trained": [changed(actor0, cluster.actor_trainer.model), changed(critic0, cluster.critic_trainer.model)],
        "devices": {
            "actor": device_ids(nnx.state(cluster.actor_trainer.model, nnx.Param)),
            "critic": device_ids(nnx.state(cluster.critic_trainer.model, nnx.Param)),
            "rollout": device_ids(nnx.state(cluster.rollout.model(), nnx.Param)),
        },
    }


def test_tunix_ppo_with_actor_and_critic_on_slice_0_and_rollout_on_slice_1_syncs_on_the_server(server):
    env = server_client.client_env(server.target)
    env["PYTHONPATH"] = os.pathsep.join([TUNIX_DIR, env.get("PYTHONPATH", "")])
    got = proxy_clients.run_client(HERE, server.target, server.target, env=env, timeout=600)

    assert got["should_sync"] is True and got["trained"] == [True, True], got
    assert got["steps"] == [2, 2], got  # 4 prompts in batches of 2: two PPO steps, each actor and critic
    assert len(got["syncs"]) == 2, got
    for sync in got["syncs"]:
        assert sync["equal"] is True, got["syncs"]
        assert sync["bytes"] == [0, 0], got["syncs"]
        assert sync["actor_devices"] == [0, 1, 2, 3] and sync["rollout_devices"] == [4, 5, 6, 7], sync
    trainer, rollout = [0, 1, 2, 3], [4, 5, 6, 7]
    assert got["devices"] == {"actor": trainer, "critic": trainer, "rollout": rollout}, got


if __name__ == "__main__":
    import pathwaysutils

    pathwaysutils.initialize()
    print(json.dumps(client_ppo(sys.argv[1])), flush=True)
