"""notebooks/quickstart.ipynb runs headless on the `pathways` kernel and shows what it promises."""

import pytest

from notebooks import code_cells, execute, outputs_text

pytestmark = pytest.mark.kernel


def test_quickstart_runs_and_trains_over_both_slices():
    code = code_cells(execute("quickstart.ipynb"))
    status, topology, mesh, train, events = (outputs_text(c) for c in code)
    assert "local:2x4" in status and "2/2 up" in status
    assert "slice 0: up" in topology and "slice 1: up" in topology
    assert "Mesh(data=2, model=4) over 8 devices -> bound to 'mesh'" in mesh
    assert "step 4: loss" in train
    assert "loss went down: True" in train
    assert "w1 is sharded P(None, 'model') over 8 devices on 2 slices" in train
    assert "connect" in events
    # "What happened" shows the run, and the client's connect lines as one row (issue #31 item 6).
    assert "steps 'quickstart': goodput" in events, events
    assert events.count("connection_update") <= 1, events
    html = [o for o in code[1].outputs if "data" in o][0]["data"]["text/html"]
    assert "pathways-topology" in html
