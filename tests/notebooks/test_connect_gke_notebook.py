"""notebooks/connect-gke.ipynb: valid, and the cells that need no cluster run and show what they promise.

Cells tagged ``needs-cluster`` talk to a real Pathways proxy, which cannot run
here; they are dropped before execution (and checked to be only those).
"""

import nbformat
import pytest

from notebooks import NOTEBOOKS, code_cells, execute, outputs_text

pytestmark = pytest.mark.kernel


def test_gke_notebook_runs_its_cluster_free_steps():
    full = nbformat.read(NOTEBOOKS / "connect-gke.ipynb", as_version=4)
    needs_cluster = [c for c in full.cells if "needs-cluster" in c.metadata.get("tags", [])]
    assert any("grpc://localhost:29000" in c.source for c in needs_cluster)
    assert any("connect sps" in c.source for c in needs_cluster)
    nb = execute("connect-gke.ipynb", keep=lambda c: "needs-cluster" not in c.metadata.get("tags", []), timeout=120)
    help_text, wrong, local = (outputs_text(c) for c in code_cells(nb))
    assert "--insecure" in help_text and "--timeout" in help_text and "--cluster" in help_text
    assert "connect failed" in wrong and "refused" in wrong
    assert "local:2x4" in local and "2/2 up" in local
