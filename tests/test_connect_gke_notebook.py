"""notebooks/connect-gke.ipynb: valid, and the cells that need no cluster run and show what they promise.

Cells tagged ``needs-cluster`` talk to a real Pathways proxy, which cannot run
here; they are dropped before execution (and checked to be only those).
"""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.kernel

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "connect-gke.ipynb"


def text_of(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def test_gke_notebook_runs_its_cluster_free_steps():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    needs_cluster = [c for c in nb.cells if "needs-cluster" in c.metadata.get("tags", [])]
    assert any("grpc://localhost:29000" in c.source for c in needs_cluster)
    assert any("connect sps" in c.source for c in needs_cluster)
    nb.cells = [c for c in nb.cells if c not in needs_cluster]
    NotebookClient(nb, timeout=120, kernel_name="pathways").execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    help_text, wrong, local = (text_of(c) for c in code)
    assert "--insecure" in help_text and "--timeout" in help_text and "--cluster" in help_text
    assert "connect failed" in wrong and "refused" in wrong
    assert "local:2x4" in local and "2/2 up" in local
