"""notebooks/rl.ipynb runs headless on the `pathways` kernel: a GRPO-style loop with the trainer on a v5p
slice and the rollout on a v6e slice of the local server, the weights synced server-side every step."""

import re

import pytest

from notebooks import code_cells, execute, outputs_text

pytestmark = pytest.mark.kernel


def test_rl_notebook_learns_and_syncs_the_rollout_to_the_trainer_across_kinds():
    nb = execute("rl.ipynb", timeout=600)
    topology, meshes, both, _model, _update, loop, roles, final = (outputs_text(c) for c in code_cells(nb))
    assert "TPU v5p: slices 0 (1/1 up, 4 chips)" in topology and "TPU v6 lite: slices 1" in topology
    assert "trainer: {'data': 1, 'model': 4} {'TPU v5p'}" in meshes and "{'TPU v6 lite'}" in meshes
    assert "the live slices are of 2 kinds" in both
    assert len(re.findall(r"step \d+: reward", loop)) == 8
    # The loop marks its phases (pw.phase): the run's time by role, each mesh's wait on the other.
    trainer = re.search(
        r"trainer \(slice 0 · TPU v5p\): busy ([\d.]+)% \(update [\d.]+%, sync [\d.]+%\) · waited for rollout ([\d.]+)%",
        roles,
    )
    rollout = re.search(
        r"rollout \(slice 1 · TPU v6 lite\): busy ([\d.]+)% \(rollout [\d.]+%, reward [\d.]+%\) · waited for trainer ([\d.]+)%",
        roles,
    )
    assert trainer and rollout, roles
    assert float(trainer[1]) == pytest.approx(float(rollout[2]), abs=0.2), roles
    assert "rollout weights equal the trainer's: True" in final
    assert "rollout weights on: ['TPU v6 lite']" in final
    first, last = (float(x) for x in re.search(r"reward: ([\d.]+) at the first step, ([\d.]+)", final).groups())
    assert last > first, final
