"""notebooks/profiling.ipynb runs headless on the `pathways` kernel and shows what it promises."""

import re

import pytest

from notebooks import code_cells, execute, outputs_text

pytestmark = pytest.mark.kernel


def test_profiling_notebook_profiles_a_cell_and_lists_it(tmp_path, monkeypatch):
    """On the product default (the local Pathways server), whose trace names ops by their JAX source as embedded does."""
    monkeypatch.setenv("PATHWAYS_PROFILE_DIR", str(tmp_path))  # the kernel inherits it
    code = code_cells(execute("profiling.ipynb"))
    setup, magic, api, listing, events = (outputs_text(c) for c in code)
    assert setup == ""
    # The trailing ';' kept the array from printing: the summary is all the cell shows.
    assert magic.startswith("profile ten-steps: wall"), magic
    assert re.search(r"compile [1-9][\d.]* ms \(\d+x\)", magic), magic  # the first call compiled inside
    assert (
        "slice 0" in magic
        and "slice 1" in magic
        and "jit(train_step)/dot_general  (all-gather, jit_train_step" in magic
    ), magic
    assert re.search(r"wall \d+ ms; busiest op \S+", api), api
    assert "profile python-api: wall" in api
    assert re.search(r"^ten-steps\s.*\n^python-api\s", listing, re.M), listing
    assert str(tmp_path) in listing
    assert events.count("profile") >= 2 and "ten-steps ->" in events, events
    html = [o for o in code[1].outputs if "data" in o][0]["data"]["text/html"]
    assert "Open in XProf" in html
