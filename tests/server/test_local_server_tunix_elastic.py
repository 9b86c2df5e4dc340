"""Tunix's own RL as an elastic job on the local Pathways server: ``RLCluster`` and ``GRPOLearner`` unchanged,
the actor on slice 0 and the rollout on slice 1 of ``local:2x4``, each Tunix GRPO step one step of
``pw.elastic(slices=[0])``. The glue a user writes is ``TunixElastic`` below (docs/rl.md, "Tunix, elastic"):

- the elastic state is the actor's parameters and optimizer state (what of Tunix's lives on the trainer's
  slice), put back into Tunix's models at the start of each step, so a step the loop runs again starts from
  the state it was given (the step's own, or a snapshot's after a rollback);
- a step run again re-does the weight sync first (Tunix's ``sync_weights``, pathwaysutils' ``reshardRequest``
  on the server): the rollout's weights may be gone with its slice, or newer than a restored trainer's. While
  the rollout's slice is down it waits for the repair, saying so in one line: Tunix 0.1.7's ``Sampler``
  refuses new weights of another sharding, so the rollout cannot move to another mesh.

Losing the rollout's slice mid-step, then repairing it, ends equal to a fault-free run: the same parameters and
the same rewards at every step (Tunix's sampler draws from a fixed seed, so a step is a function of its weights
and prompts). Losing the trainer's slice is not tested: after the rollback, Tunix's sampler fails inside JAX
(docs/rl.md says where). Tunix is installed beside the venv as for test_local_server_tunix.py.
"""

from __future__ import annotations

import os
import sys
import threading

import pytest
from kernels import SERVER, Kernel

HERE = os.path.dirname(os.path.abspath(__file__))
TUNIX_DIR = os.path.abspath(os.path.join(os.path.dirname(sys.executable), "..", "tunix-0.1.7"))
TRAINER, ROLLOUT = 0, 1
AXES = ("fsdp", "tp")  # the axes Tunix's toy model is sharded over
STEPS, EVERY = 4, 2
WAIT_S = 120
PROMPTS = ["input string", "hello world", "My name", "hello there", "a b c", "the end", "x y", "one two"]


class TunixElastic:
    """Tunix's RLCluster + GRPOLearner, one global step per ``pw.elastic`` step (trainer on ``TRAINER``, rollout
    on ``ROLLOUT``). ``faults``: {step: slice lost in the middle of that step's rollout (in the reward)}."""

    def __init__(self, faults=None):
        import jax
        import numpy as np
        import optax
        from flax import nnx
        from tunix.rl import rl_cluster as rl_cluster_lib
        from tunix.rl.grpo import grpo_learner as grpo_lib
        from tunix.rl.rollout import base_rollout
        from tunix.tests import test_common as tc

        import pathways_kernel as pw

        # Tunix picks its weight sync by the environment variable (pathwaysutils' reshardRequest under "proxy",
        # else jax.device_put); a kernel on the local server sets JAX's platform in jax.config only.
        os.environ["JAX_PLATFORMS"] = "proxy"
        self.faults = dict(faults or {})
        self.rewards: dict[int, list[float]] = {}
        self.resyncs = 0
        self.waiting = threading.Event()  # set while the rollout waits for its slice
        self.train = pw.elastic(self.step_fn, snapshot_every=EVERY, slices=[TRAINER], axes=AXES, name="tunix-grpo")
        trainer_mesh = self.train._mesh(pw.session())  # the mesh the loop hands its steps: slice 0, (1, 4)
        vocab = tc.MockVocab()
        config = tc.ModelConfig(vocab_size=vocab.GetPieceSize())
        self.Role = rl_cluster_lib.Role
        self.cluster = rl_cluster_lib.RLCluster(
            actor=tc.ToyTransformer(config=config, rngs=nnx.Rngs(0)),
            reference=tc.ToyTransformer(config=config, rngs=nnx.Rngs(0)),
            tokenizer=vocab,
            cluster_config=rl_cluster_lib.ClusterConfig(
                role_to_mesh={
                    self.Role.ACTOR: trainer_mesh,
                    self.Role.REFERENCE: trainer_mesh,
                    self.Role.ROLLOUT: self.rollout_mesh(),
                },
                rollout_engine="vanilla",
                offload_to_cpu=False,
                training_config=rl_cluster_lib.RLTrainingConfig(
                    actor_optimizer=optax.sgd(1e-2), eval_every_n_steps=1000, max_steps=1000
                ),
                rollout_config=base_rollout.RolloutConfig(
                    max_tokens_to_generate=6, max_prompt_length=32, kv_cache_size=64, temperature=0.9
                ),
            ),
        )
        self.learner = grpo_lib.GRPOLearner(
            rl_cluster=self.cluster,
            reward_fns=self.reward,
            algo_config=grpo_lib.GRPOConfig(num_generations=2, num_iterations=1, beta=0.0),
        )
        self.jax, self.np, self.nnx = jax, np, nnx

    @staticmethod
    def rollout_mesh():
        """The rollout's own mesh: slice ROLLOUT's chips, laid out (2, 2)."""
        import jax
        import numpy as np
        from jax.sharding import Mesh

        import pathways_kernel as pw

        ids = {d.id for d in pw.session().topology.slices[ROLLOUT].devices}
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
        import time

        import pathways_kernel as pw

        deadline = time.monotonic() + WAIT_S
        if ROLLOUT not in {sl.index for sl in pw.session().topology.up_slices}:
            print(f"tunix-grpo: the rollout's slice {ROLLOUT} is down; waiting for its repair (up to {WAIT_S} s)")
            self.waiting.set()
        while ROLLOUT not in {sl.index for sl in pw.session().topology.up_slices}:
            if time.monotonic() > deadline:
                raise pw.PathwaysError(f"tunix-grpo: the rollout's slice {ROLLOUT} did not come back in {WAIT_S} s")
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
            self.resync_rollout()
        prompts = PROMPTS[(2 * step) % len(PROMPTS) :][:2]
        self.learner.train(grain.MapDataset.source(prompts).batch(2).map(lambda x: {"prompts": x, "answer": x}), None)
        return self.state()

    def run(self, state):
        """The job from ``state`` (of ``state()``); a second run from the same state starts with a sync."""
        self.rewards = {}
        final = self.train(state, steps=STEPS)
        return self.jax.device_get(final["actor"]), self.train.last_run


pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(TUNIX_DIR, ".installed")),
    reason=f"Tunix 0.1.7 is not installed in {TUNIX_DIR} (make test-py installs it)",
)


@pytest.fixture(scope="module")
def server_kernel():
    k = Kernel("pathways", backend=SERVER)
    yield k
    k.shutdown()


def test_tunix_grpo_as_an_elastic_job_loses_its_rollout_slice_mid_step_and_ends_equal_to_a_fault_free_run(
    server_kernel,
):
    setup = (
        "import sys, threading, time, jax, numpy as np\n"
        f"sys.path[:0] = [{TUNIX_DIR!r}, {HERE!r}]\n"
        "import test_local_server_tunix_elastic as te\n"
        "job = te.TunixElastic()\n"
        "start = job.state()\n"
        "expected, _ = job.run(start)\n"
        "expected_rewards = job.rewards\n"
        "def repair_once_waited_for(job, i):  # the slice comes back once the rollout waits for it\n"
        "    job.waiting.wait(120)\n"
        "    pw.repair_slice(i)\n"
    )
    reply = server_kernel.run(setup, timeout=300)
    assert reply.status == "ok", reply.error
    try:
        reply = server_kernel.run(
            f"job.faults, job.resyncs = {{2: {ROLLOUT}}}, 0\n"
            f"repairer = threading.Thread(target=repair_once_waited_for, args=(job, {ROLLOUT})); repairer.start()\n"
            "final, report = job.run(start)\n"
            "repairer.join(120)\n"
            "same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(expected)))\n"
            "print(same, job.rewards == expected_rewards, len(report.recoveries), report.steps_executed, job.resyncs)",
            timeout=300,
        )
        assert reply.status == "ok", reply.error
        # The same weights and rewards; one recovery, from the live state (the trainer lost nothing: no step
        # redone); the sync re-done twice: at the start of this run (from the first run's end) and after the loss.
        assert reply.text.strip().splitlines()[-1].split() == ["True", "True", "1", str(STEPS), "2"], reply.text
        said = [line for line in reply.text.splitlines() if line.startswith("tunix-grpo:")]
        assert said == [f"tunix-grpo: the rollout's slice {ROLLOUT} is down; waiting for its repair (up to {WAIT_S} s)"]
    finally:
        server_kernel.run(
            f"pw.repair_slice({ROLLOUT}) if {ROLLOUT} not in [s.index for s in pw.session().topology.up_slices] else None"
        )
