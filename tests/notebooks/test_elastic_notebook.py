"""notebooks/elastic.ipynb runs headless on the `pathways` kernel: a slice fails mid-training, every step completes."""

import re

import pytest

from notebooks import code_cells, execute, outputs_text

pytestmark = pytest.mark.kernel


def test_elastic_notebook_survives_a_slice_loss_and_completes_every_step():
    nb = execute("elastic.ipynb", timeout=600)
    status, setup, loop, goodput, metrics, events, final = (outputs_text(c) for c in code_cells(nb))
    assert "2/2 up" in status
    assert "'data': 2, 'model': 4" in setup
    # Every step ran: the last one is printed, on both slices again after the scale-up.
    assert "step 239" in loop and "240 steps" in loop
    assert "1 recovery, " in loop and "1 scale-up, " in loop
    assert "step 119  loss" in loop and "on 1 slice(s)" in loop.split("step 119")[1].splitlines()[0]
    assert "on 2 slice(s)" in loop.split("step 239")[1].splitlines()[0]
    losses = [float(line.split("loss")[1].split()[0]) for line in loop.splitlines() if line.startswith("step")]
    assert losses[-1] < losses[0]
    # One duration for the run: the progress summary and the run's report agree.
    durations = re.findall(r"240 steps in ([0-9.]+) s", loop)
    assert len(durations) == 2 and durations[0] == durations[1], loop
    assert "goodput" in goodput and "compiling" in goodput and "recovering from a loss" in goodput
    # Every step's loss was kept, read off the devices (but one computed on the lost slice).
    logged = re.search(r"(\d+) losses logged over steps 0\.\.239", metrics)
    assert logged and int(logged.group(1)) >= 235, metrics
    assert re.search(r"^\s+239\s+[0-9.]+\s+[0-9.]+$", metrics, re.M), metrics
    for kind in ("slice_down", "retry", "restore", "reshard", "slice_up", "scale_up", "snapshot"):
        assert kind in events, kind
    assert "slices [0,1] -> [0]" in events and "slices [0] -> [0,1]" in events
    assert "params on 8 devices, spec P(None, 'model')" in final
