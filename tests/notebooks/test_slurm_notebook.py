"""notebooks/slurm.ipynb: valid, and its cluster-free steps run against the real Slurm of tests/support/slurm.py.

Cells tagged ``needs-cluster`` need a real Pathways job (no Pathways image
runs here); they are dropped before execution. The rehearsal cells run for
real: ``local:2x4`` bound to a two-node ``--no-kill`` job, a node set DOWN and
resumed (its slice stays down), and the session bound to a new job.
"""

import nbformat
import pytest
from slurm import slurm_cluster  # noqa: F401  (the `slurm` fixture)

from notebooks import NOTEBOOKS, code_cells, execute, outputs_text

pytestmark = pytest.mark.kernel


def test_slurm_notebook_runs_its_rehearsal_on_a_real_slurm(slurm, monkeypatch):
    full = nbformat.read(NOTEBOOKS / "slurm.ipynb", as_version=4)
    needs_cluster = [c for c in full.cells if "needs-cluster" in c.metadata.get("tags", [])]
    assert any("--submit pathways-job" in c.source for c in needs_cluster)
    job = slurm.submit("#!/bin/bash\nsleep 300\n", "--nodes=2", "--no-kill", "--time=10", "--job-name=pw-rehearsal")
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    try:
        nb = execute("slurm.ipynb", keep=lambda c: "needs-cluster" not in c.metadata.get("tags", []), timeout=120)
    finally:
        slurm.run("scancel", job, check=False)
        slurm.run("scancel", "--name", "pw-rehearsal-2", check=False)
    template, help_text, bound, bound_event, total, down, lost, resumed, back = (
        outputs_text(c) for c in code_cells(nb)
    )
    assert "pathways-proxy=grpc://" in template and "#SBATCH --no-kill" in template
    assert "--submit" in help_text and "--slurm" in help_text and "--nodes-per-slice" in help_text
    assert "local:2x4" in bound and "2/2 up" in bound
    assert f"slurm job {job} (pw-rehearsal): RUNNING" in bound_event and "slice 1 = tpu-1" in bound_event
    assert "120.0" in total
    assert "slurm node tpu-1 DOWN: rehearsal" in down and "slices [0,1] -> [0]" in down
    assert "DATA_LOSS" in lost
    assert "1/2 up" in resumed
    assert "2/2 up" in back
