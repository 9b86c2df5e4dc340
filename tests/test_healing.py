"""Notebook healing through a real kernel: variables on a lost slice come back
from their snapshots between cells; the user is told in one block."""

import time

import pytest

SETUP = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = pw.mesh()
w = jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data", "model")))
params = {"b": jax.device_put(np.ones(8), NamedSharding(mesh, P("data"))), "lr": 0.1}
logits = jax.device_put(np.ones((8, 2)), NamedSharding(mesh, P("data")))
on0 = jax.device_put(np.full(4, 3.0), pw.topology().slices[0].devices[0])
"""


@pytest.fixture(scope="module")
def notebook(kernel):
    reply = kernel.run(SETUP)
    assert reply.status == "ok", reply.error
    return kernel


def test_lost_variables_are_restored_from_snapshots_and_named_in_one_block(notebook):
    assert notebook.run("%pathways snapshot w params").status == "ok"
    time.sleep(0.2)  # the snapshots' age shows in the report
    reply = notebook.run("%pathways fail 1")
    assert reply.status == "ok", reply.error
    blocks = [d["text/plain"] for d in reply.data if "slice 1 lost" in d.get("text/plain", "")]
    assert len(blocks) == 1, reply.text
    block = blocks[0]
    assert "restored from snapshots onto slices [0]:" in block
    assert "w (0." in block and "s ago" in block and "params (" in block
    assert "no snapshot, now unusable (DATA_LOSS): logits" in block
    assert "on0" not in block  # it lived on slice 0 only
    assert len(block.splitlines()) <= 4

    check = notebook.run(
        "print(float(w.sum()), w.sharding.spec, len(w.sharding.device_set), float(params['b'].sum()), params['lr'],"
        " float(on0.sum()), pw.is_lost(logits))"
    )
    assert check.status == "ok", check.error
    assert check.text.strip() == "2016.0 P('data', 'model') 4 8.0 0.1 12.0 True"
    restores = notebook.run("print(sorted(e.detail.split()[0] for e in pw.events(kind='restore')[-2:]))")
    assert restores.text.strip() == "[\"'params'\", \"'w'\"]"


def test_still_unusable_variable_is_not_announced_again(notebook):
    notebook.run("%pathways restore 1")
    try:
        notebook.run("fresh = jax.device_put(np.ones(8), NamedSharding(pw.mesh(), P('data')))")
        reply = notebook.run("%pathways fail 1")
        assert "no snapshot, now unusable (DATA_LOSS): fresh;" in reply.text
        assert "logits" not in reply.text
    finally:
        notebook.run("%pathways restore 1")


def test_a_slice_lost_between_cells_heals_before_the_next_cell(notebook):
    assert "autosnapshot on" in notebook.run("%pathways autosnapshot on").text
    assert notebook.run("v = jax.device_put(np.arange(8.0), NamedSharding(pw.mesh(), P('data')))").status == "ok"
    # A loss from another thread (as chaos does) while no cell runs.
    notebook.run("import threading, time as _t\nthreading.Thread(target=lambda: (_t.sleep(0.3), pw.fail_slice(1))).start()")
    time.sleep(1.5)
    reply = notebook.run("print(float(v.sum()))")
    assert reply.status == "ok", reply.error
    assert "slice 1 lost" in reply.text and "v (" in reply.text
    assert reply.text.strip().endswith("28.0")
    notebook.run("%pathways autosnapshot off")
