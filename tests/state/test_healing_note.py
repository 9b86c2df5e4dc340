"""After an elastic cell that recovered from a slice loss, what the loss took from earlier cells is a
note set apart from the run's result: it names the variables and how to keep them, once (issue #31 item 5)."""

from __future__ import annotations

import re

SETUP = """
import threading, time
import jax, numpy as np, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
features = jax.device_put(np.ones((8, 4)), NamedSharding(pw.mesh(), P("data")))  # an earlier cell's, no snapshot
w, failed = jnp.zeros(()), []
"""

RUN = """%%pathways elastic --steps 30 --state w --snapshot-every 5
time.sleep(0.03)
w = w + 1.0
if step == 12 and not failed:
    failed.append(step)
    threading.Thread(target=pw.fail_slice, args=(1,)).start()"""


def test_an_elastic_cell_that_recovered_says_what_else_was_lost_apart_and_once(kernel):
    assert kernel.run(SETUP).status == "ok"
    try:
        reply = kernel.run(RUN)
        assert reply.status == "ok", reply.error
        outputs = [d.get("text/plain", "") for d in reply.data]
        notes = [i for i, text in enumerate(outputs) if "earlier variables" in text]
        assert len(notes) == 1, outputs
        note = outputs[notes[0]]
        assert note.startswith("slice 1 lost: earlier variables with data on it are gone (not this cell's result)")
        assert re.search(r"DATA_LOSS\): ([\w, ]+);", note).group(1) == "features", note  # not the run's own w
        assert "%pathways autosnapshot on" in note
        # The run's own result comes first, the note after it, in a box of its own.
        assert any("30 steps in" in text for text in outputs[: notes[0]]) or "30 steps in" in reply.text, outputs
        assert "border-left" in reply.data[notes[0]]["text/html"]
        again = kernel.run("print(float(w))")
        assert again.text.strip() == "30.0" and "features" not in again.text, again.text
    finally:
        kernel.run("%pathways repair 1")
