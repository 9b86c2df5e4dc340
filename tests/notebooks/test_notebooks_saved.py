"""Every notebook in notebooks/ is saved with its outputs (`make notebooks`), so it reads well on GitHub."""

import re

import pytest

from notebooks import MACHINE_SPECIFIC, NEEDS_CLUSTER, NOTEBOOKS, code_cells

NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_saved_executed_in_order_without_errors(name):
    import nbformat

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    ran = [c for c in code_cells(nb) if NEEDS_CLUSTER not in c.metadata.get("tags", [])]
    counts = [c.execution_count for c in ran]
    assert None not in counts, f"{name}: cells not run; run `make notebooks`"
    assert counts == sorted(counts), f"{name}: saved from an out-of-order run; run `make notebooks`"
    assert any(c.outputs for c in ran)
    # Only cells that show an error on purpose (tagged raises-exception, as nbclient reads them) have one.
    unexpected = [c for c in ran if "raises-exception" not in c.metadata.get("tags", [])]
    assert not [o for c in unexpected for o in c.outputs if o.output_type == "error"], f"{name}: saved with an error"
    skipped = [c for c in code_cells(nb) if NEEDS_CLUSTER in c.metadata.get("tags", [])]
    assert all(not c.outputs for c in skipped), f"{name}: a needs-cluster cell has outputs it cannot have had here"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_saved_without_the_saving_machine(name):
    """No socket path, pid, home directory or run timestamps of the machine that saved it (issue #31 item 8)."""
    import nbformat

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    text = (NOTEBOOKS / name).read_text()
    for pattern, _stand_in in MACHINE_SPECIFIC:
        found = pattern.search(text)
        assert found is None, f"{name}: saved with {found.group(0)!r}; run `make notebooks`"
    assert not re.search(r"/tmp/pathways-local-(?!…)", text), name
    assert not [c for c in code_cells(nb) if "execution" in c.metadata], f"{name}: saved with run timestamps"
