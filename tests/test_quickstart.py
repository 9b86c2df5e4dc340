"""notebooks/quickstart.ipynb runs headless on the `pathways` kernel and shows what it promises."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.kernel

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "quickstart.ipynb"


def outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def test_quickstart_runs_and_trains_over_both_slices():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata.kernelspec.name == "pathways"
    NotebookClient(nb, timeout=180, kernel_name="pathways").execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    status, topology, mesh, train, events = (outputs_text(c) for c in code)
    assert "local:2x4" in status and "2/2 up" in status
    assert "slice 0: up" in topology and "slice 1: up" in topology
    assert "Mesh(data=2, model=4) over 8 devices -> bound to 'mesh'" in mesh
    assert "step 4: loss" in train
    assert "loss went down: True" in train
    assert "w1 is sharded P(None, 'model') over 8 devices on 2 slices" in train
    assert "connect" in events
    html = [o for o in code[1].outputs if "data" in o][0]["data"]["text/html"]
    assert "pathways-topology" in html
