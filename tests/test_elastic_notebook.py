"""notebooks/elastic.ipynb runs headless on the `pathways` kernel: a slice fails mid-training, every step completes."""

import pytest

from notebooks import code_cells, execute, outputs_text

pytestmark = pytest.mark.kernel


def test_elastic_notebook_survives_a_slice_loss_and_completes_every_step():
    nb = execute("elastic.ipynb")
    status, setup, loop, events, final = (outputs_text(c) for c in code_cells(nb))
    assert "2/2 up" in status
    assert "'data': 2, 'model': 4" in setup
    # Every step ran: the last one is printed, on both slices again after the scale-up.
    assert "step 59" in loop and "60 steps" in loop
    assert "1 recovery, " in loop and "1 scale-up, " in loop
    assert "step 29  loss" in loop and "on 1 slice(s)" in loop.split("step 29")[1].splitlines()[0]
    assert "on 2 slice(s)" in loop.split("step 59")[1].splitlines()[0]
    losses = [float(line.split("loss")[1].split()[0]) for line in loop.splitlines() if line.startswith("step")]
    assert losses[-1] < losses[0]
    for kind in ("slice_down", "retry", "restore", "reshard", "slice_up", "scale_up", "snapshot"):
        assert kind in events, kind
    assert "slices [0,1] -> [0]" in events and "slices [0] -> [0,1]" in events
    assert "params on 8 devices, spec P(None, 'model')" in final
