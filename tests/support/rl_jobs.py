"""Shared pieces of the RL tests on the local Pathways server (tests/server/test_local_server_tunix.py,
test_local_server_tunix_elastic.py, test_local_server_tunix_ppo.py, test_local_server_elastic_rl.py).

- Where Tunix 0.1.7 is installed (beside the venv: ``make test-py`` installs it, ``--target``, ``--no-deps``)
  and ``needs_tunix``, the mark that skips a module without it, saying so.
- ``toy_cluster``: Tunix's own ``RLCluster`` of its test models (``tunix.tests.test_common``), the actor and
  reference on one mesh and the rollout on another.
- ``slice_meshes`` / ``check_syncs``: the trainer's and the rollout's meshes on a 2 x 4 server, and Tunix's own
  ``sync_weights`` wrapped with what each sync test checks (equal weights, bytes through the client, devices).
- ``TunixElastic``: Tunix's ``RLCluster`` + ``GRPOLearner`` as a ``pw.elastic`` job, the glue a user writes
  (docs/rl.md, "Tunix, elastic"), and the two workarounds a lost trainer slice needs for Tunix 0.1.7's defects.
- ``repair_once_down`` / ``repair_once_waited_for``: run inside a test's kernel, to bring back a slice it loses.

Imported by the tests, by their proxy clients and inside their kernels: tests/support is on the ``PYTHONPATH``
those processes inherit (tests/conftest.py); Tunix is not, ``use_tunix()`` puts it on ``sys.path``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

import pytest

TUNIX_DIR = os.path.abspath(os.path.join(os.path.dirname(sys.executable), "..", "tunix-0.1.7"))
needs_tunix = pytest.mark.skipif(
    not os.path.exists(os.path.join(TUNIX_DIR, ".installed")),
    reason=f"Tunix 0.1.7 is not installed in {TUNIX_DIR} (make test-py installs it)",
)
AXES = ("fsdp", "tp")  # the axes Tunix's toy model is sharded over
REPAIR_WAIT_S = 120  # the longest a repairer waits for the loss (or the wait) it repairs after


def use_tunix() -> None:
    """Tunix and its pinned dependencies on this process's path (first: they shadow nothing of the venv's)."""
    if TUNIX_DIR not in sys.path:
        sys.path.insert(0, TUNIX_DIR)


def toy_cluster(trainer_mesh, rollout_mesh, *, max_steps: int, **rollout):
    """Tunix's ``RLCluster`` of two ``ToyTransformer``s (actor and reference on ``trainer_mesh``, the rollout on
    ``rollout_mesh``), SGD at 1e-2, the vanilla rollout of up to 6 new tokens; ``rollout``: more of its config."""
    import optax
    from flax import nnx
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.rollout import base_rollout
    from tunix.tests import test_common as tc

    vocab = tc.MockVocab()
    config = tc.ModelConfig(vocab_size=vocab.GetPieceSize())
    role = rl_cluster_lib.Role
    return rl_cluster_lib.RLCluster(
        actor=tc.ToyTransformer(config=config, rngs=nnx.Rngs(0)),
        reference=tc.ToyTransformer(config=config, rngs=nnx.Rngs(0)),
        tokenizer=vocab,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={role.ACTOR: trainer_mesh, role.REFERENCE: trainer_mesh, role.ROLLOUT: rollout_mesh},
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.sgd(1e-2), eval_every_n_steps=max_steps, max_steps=max_steps
            ),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=6, max_prompt_length=32, kv_cache_size=64, **rollout
            ),
        ),
    )


def slice_meshes():
    """The trainer's mesh on slice 0 (devices 0-3) and the rollout's on slice 1 (4-7) of a 2 x 4 server."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devices = sorted(jax.devices(), key=lambda d: d.id)
    return Mesh(np.array(devices[:4]).reshape(4, 1), AXES), Mesh(np.array(devices[4:]).reshape(1, 4), AXES)


def device_ids(tree) -> list[int]:
    """The ids of the devices ``tree``'s arrays live on."""
    import jax

    return sorted({d.id for leaf in jax.tree.leaves(tree) for d in leaf.sharding.device_set})


def check_syncs(cluster, target: str) -> list[dict]:
    """Wrap ``cluster``'s own ``sync_weights`` with what a user would check after each sync: the
    rollout's weights are the actor's, the host bytes that passed through the client (the server's
    counters), and where each side lives. Returns the list each sync appends to."""
    import jax
    import numpy as np
    from flax import nnx

    from pathways_kernel.backends import server_client

    syncs: list[dict] = []
    sync = cluster.sync_weights

    def checked_sync() -> None:
        before = server_client.status(target)["counts"]
        sync()
        rollout = jax.block_until_ready(nnx.state(cluster.rollout.model(), nnx.Param))
        after = server_client.status(target)["counts"]
        actor = nnx.state(cluster.actor_trainer.model, nnx.Param)
        pairs = zip(jax.tree.leaves(rollout), jax.tree.leaves(actor), strict=True)
        syncs.append({
            "bytes": [after.get(k, 0) - before.get(k, 0) for k in ("host_bytes_from_client", "host_bytes_to_client")],
            "equal": all(bool(np.array_equal(np.asarray(r), np.asarray(a))) for r, a in pairs),
            "rollout_devices": device_ids(rollout),
            "actor_devices": device_ids(actor),
        })  # fmt: skip

    cluster.sync_weights = checked_sync
    return syncs


# -- Workarounds for two defects of Tunix 0.1.7 that a lost trainer slice runs into (docs/rl.md, "Tunix,
# elastic"). Patches of Tunix's objects in the test's glue, not of the product: the product cannot fix them.


def keep_sample_count_an_int(sampler) -> None:
    """Tunix defect 1: ``Sampler.init_sample_state`` stores ``num_input_tokens``, a ``pytree_node=False`` field of
    ``_SamplingState``, as ``jnp.array(n)``: an array on device 0 (the trainer's slice) in the pytree metadata of
    the jitted prefill's and decode's arguments, which JAX keeps in its cache keys and compares on every call.
    Once that array is lost with its slice, every later sample fails (``DATA_LOSS``, reported as "Exception raised
    while checking equality of metadata fields of pytree"). This keeps the count the Python int it is made from
    (upstream, one line). Must be in place before the sampler's first call: the first call's key stays cached."""
    init = sampler.init_sample_state

    def init_sample_state(all_input_ids, *args, **kwargs):
        return dataclasses.replace(init(all_input_ids, *args, **kwargs), num_input_tokens=all_input_ids.shape[1])

    sampler.init_sample_state = init_sample_state


def forget_lost_metrics(trainer) -> None:
    """Tunix defect 2: ``PeftTrainer`` reads each step's loss one step late (its buffered metrics) and keeps the
    step's loss in its throttler's in-flight queue. On a step run again after a loss those may be arrays of the
    lost slice (``DATA_LOSS`` when read), or a buffer of the failed attempt (``assert metrics_buffer.step ==
    step``). This drops them, and with them the logged metrics of the lost step, before the step runs again."""
    trainer._buffered_train_metrics = trainer._prev_buffered_train_metrics = None
    inflight = trainer._throttler._inflight_queue
    while inflight is not None and not inflight.empty():
        inflight.get_nowait()


class TunixElastic:
    """Tunix's RLCluster + GRPOLearner, one global step per ``pw.elastic`` step: the trainer (actor and reference)
    on slice ``TRAINER``, the rollout on slice ``ROLLOUT`` of ``local:2x4``.

    - The elastic state is the actor's parameters and optimizer state (what of Tunix's lives on the trainer's
      slice), put back into Tunix's models at the start of each step, so a step the loop runs again starts from
      the state it was given (the step's own, or a snapshot's after a rollback).
    - A step run again re-does the weight sync first (Tunix's ``sync_weights``, pathwaysutils' ``reshardRequest``
      on the server): the rollout's weights may be gone with its slice, or newer than a restored trainer's. While
      the rollout's slice is down it waits for the repair, saying so in one line: Tunix 0.1.7's ``Sampler``
      refuses new weights of another sharding, so the rollout cannot move to another mesh.
    - ``workarounds``: apply the two patches above (the sample count from the start, the metrics on a step run
      again), which a lost trainer slice needs; a lost rollout slice needs neither.

    ``faults``: {step: slice lost in the middle of that step, in the reward (after the rollout, before the update
    and the sync)}. Tunix's sampler draws from a fixed seed, so a step is a function of its weights and prompts.
    """

    TRAINER, ROLLOUT = 0, 1
    STEPS, EVERY = 4, 2
    WAIT_S = 120
    PROMPTS = ["input string", "hello world", "My name", "hello there", "a b c", "the end", "x y", "one two"]

    def __init__(self, faults=None, workarounds: bool = False):
        use_tunix()
        import jax
        import numpy as np
        from flax import nnx
        from tunix.rl import rl_cluster as rl_cluster_lib
        from tunix.rl.grpo import grpo_learner as grpo_lib

        import pathways_kernel as pw

        # Tunix picks its weight sync by the environment variable (pathwaysutils' reshardRequest under "proxy",
        # else jax.device_put); a kernel on the local server sets JAX's platform in jax.config only.
        os.environ["JAX_PLATFORMS"] = "proxy"
        self.faults = dict(faults or {})
        self.workarounds = workarounds
        self.rewards: dict[int, list[list[float]]] = {}
        self.resyncs = 0
        self.waiting = threading.Event()  # set while the rollout waits for its slice
        self.train = pw.elastic(
            self.step_fn, snapshot_every=self.EVERY, slices=[self.TRAINER], axes=AXES, name="tunix-grpo"
        )
        trainer_mesh = self.train._mesh(pw.session())  # the mesh the loop hands its steps: slice 0, (1, 4)
        self.Role = rl_cluster_lib.Role
        self.cluster = toy_cluster(trainer_mesh, self.rollout_mesh(), max_steps=1000, temperature=0.9)
        if workarounds:
            keep_sample_count_an_int(self.cluster.rollout._sampler)
        self.learner = grpo_lib.GRPOLearner(
            rl_cluster=self.cluster,
            reward_fns=self.reward,
            algo_config=grpo_lib.GRPOConfig(num_generations=2, num_iterations=1, beta=0.0),
        )
        self.jax, self.np, self.nnx = jax, np, nnx

    @classmethod
    def rollout_mesh(cls):
        """The rollout's own mesh: slice ROLLOUT's chips, laid out (2, 2)."""
        import jax
        import numpy as np
        from jax.sharding import Mesh

        import pathways_kernel as pw

        ids = {d.id for d in pw.session().topology.slices[cls.ROLLOUT].devices}
        devices = sorted((d for d in jax.devices() if d.id in ids), key=lambda d: d.id)
        return Mesh(np.array(devices).reshape(2, 2), AXES)

    def reward(self, prompts, completions, **_):
        import pathways_kernel as pw

        lost = self.faults.pop(self.step, None)
        if lost is not None:
            pw.fail_slice(lost)  # mid-step: the rollout is done, the update and the sync are not
        r = [float(len(c) % 5) for c in completions]
        self.rewards.setdefault(self.step, []).append(r)
        return self.np.asarray(r, dtype=self.np.float32)

    # -- the elastic state: everything of Tunix's on the trainer's slice, as plain dicts of arrays -----------
    def state(self):
        nnx, c = self.nnx, self.cluster
        return {
            "actor": nnx.to_pure_dict(nnx.state(c.actor_trainer.model, nnx.Param)),
            "opt": nnx.to_pure_dict(nnx.state(c.actor_trainer.optimizer)),
        }

    def put(self, state):
        """Into Tunix's models, as copies: Tunix's train step donates its inputs, and the loop keeps ``state``
        (to snapshot it, or to run the step again from it)."""
        nnx, c = self.nnx, self.cluster
        state = self.jax.tree.map(self.jax.numpy.copy, state)
        for target, pure in ((c.actor_trainer.model, state["actor"]), (c.actor_trainer.optimizer, state["opt"])):
            current = nnx.state(target, nnx.Param) if target is c.actor_trainer.model else nnx.state(target)
            nnx.replace_by_pure_dict(current, pure)
            nnx.update(target, current)

    def resync_rollout(self):
        """After a loss, the rollout's weights are the trainer's again (the step's, or its snapshot's, after a
        rollback), on the rollout's own slice: waiting for it while it is down, then Tunix's own sync."""
        import pathways_kernel as pw

        deadline = time.monotonic() + self.WAIT_S
        if not _up(self.ROLLOUT):
            print(
                f"tunix-grpo: the rollout's slice {self.ROLLOUT} is down; waiting for its repair (up to {self.WAIT_S} s)"
            )
            self.waiting.set()
        while not _up(self.ROLLOUT):
            if time.monotonic() > deadline:
                raise pw.PathwaysError(
                    f"tunix-grpo: the rollout's slice {self.ROLLOUT} did not come back in {self.WAIT_S} s"
                )
            time.sleep(0.05)
        self.cluster.sync_weights()
        self.resyncs += 1

    def step_fn(self, state, step, mesh):
        from grain import python as grain

        again = step <= getattr(self, "step", -1)  # run again after a loss: the rollout may be gone, even if back
        self.step = step
        self.rewards.pop(step, None)
        self.put(state)
        # After a recovery the loop hands a new mesh (here: slice 0 again, once repaired), the state restored on it.
        self.cluster.r2m[self.Role.ACTOR] = self.cluster.r2m[self.Role.REFERENCE] = mesh
        if again:
            if self.workarounds:
                forget_lost_metrics(self.cluster.actor_trainer)
            self.resync_rollout()
        prompts = self.PROMPTS[(2 * step) % len(self.PROMPTS) :][:2]
        self.learner.train(grain.MapDataset.source(prompts).batch(2).map(lambda x: {"prompts": x, "answer": x}), None)
        return self.state()

    def run(self, state):
        """The job from ``state`` (of ``state()``); a second run from the same state starts with a sync."""
        self.rewards = {}
        final = self.train(state, steps=self.STEPS)
        return self.jax.device_get(final["actor"]), self.train.last_run


# -- run inside a test's kernel ------------------------------------------------------------------------------


def _up(index: int) -> bool:
    import pathways_kernel as pw

    return index in {sl.index for sl in pw.session().topology.up_slices}


def repair_once_down(index: int) -> None:
    """Repairs slice ``index`` once it is down (never waiting for the loop); at most REPAIR_WAIT_S for the loss."""
    import pathways_kernel as pw

    deadline = time.monotonic() + REPAIR_WAIT_S
    while _up(index) and time.monotonic() < deadline:
        time.sleep(0.05)
    pw.repair_slice(index)


def repair_once_waited_for(job: TunixElastic, index: int) -> None:
    """Repairs slice ``index`` once ``job``'s rollout waits for it; at most REPAIR_WAIT_S for the wait."""
    import pathways_kernel as pw

    job.waiting.wait(REPAIR_WAIT_S)
    pw.repair_slice(index)


def repair_if_down(index: int) -> None:
    """Leaves slice ``index`` up for the module's next test (a test's ``finally``)."""
    import pathways_kernel as pw

    if not _up(index):
        pw.repair_slice(index)
