"""Per-cell progress under the cell, in a real `pathways` kernel (jupyter_client) and
in a notebook executed by nbclient and rendered by nbconvert, as a user sees them."""

from __future__ import annotations

import datetime
import html
import re
import subprocess
import sys

import nbformat
import pytest
from nbconvert import HTMLExporter

from notebooks import code_cells, execute, outputs_text

pytestmark = pytest.mark.kernel

WIDGET = "application/vnd.jupyter.widget-view+json"

SETUP = """
import time
import jax, jax.numpy as jnp
import pathways_kernel as pw
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = pw.mesh()
params = {"w": jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P())), "loss": jnp.float32(1.0)}
failed = restored = False
"""

# Slice 1 fails at step 12 and is back at step 20: one rollback, two reshards.
ELASTIC = """%%pathways elastic --steps 30 --state params --snapshot-every 5
params = {"w": params["w"] * 0.99, "loss": jnp.mean(params["w"]) / 2}
time.sleep(0.1)
if step == 12 and not failed:
    failed = True
    pw.fail_slice(1)
if step == 20 and not restored:
    restored = True
    pw.repair_slice(1)
"""


class Progress:
    """The progress outputs of one cell, from its IOPub messages."""

    def __init__(self, messages: list[dict]):
        kind = lambda m: m["header"]["msg_type"]  # noqa: E731
        opened = [
            m
            for m in messages
            if kind(m) == "display_data" and "pathways-cell-progress" in m["content"]["data"].get("text/html", "")
        ]
        self.count = len(opened)
        self.comms = [m for m in messages if kind(m).startswith("comm_")]
        self.opened = opened[0] if opened else None
        if not opened:
            return
        self.display_id = self.opened["content"]["transient"]["display_id"]
        mine = [
            (_time(m), m["content"]["data"])
            for m in messages
            if kind(m) == "update_display_data" and m["content"]["transient"]["display_id"] == self.display_id
        ]
        final = [re.search(r": \d+ (steps?|batch(es)?) in ", data["text/plain"]) is not None for _t, data in mine]
        self.updates = [(t, data["text/html"]) for (t, data), done in zip(mine, final, strict=True) if not done]
        self.finals = [data for (_t, data), done in zip(mine, final, strict=True) if done]


def _time(msg: dict) -> float:
    date = msg["header"]["date"]
    if isinstance(date, str):
        date = datetime.datetime.fromisoformat(date)
    return date.timestamp()


def test_an_elastic_cell_shows_live_progress_with_its_recovery_then_a_static_summary(kernel):
    assert kernel.run(SETUP).status == "ok"
    reply = kernel.run(ELASTIC)
    assert reply.status == "ok", reply.error
    progress = Progress(reply.messages)
    assert progress.count == 1
    assert "step 0/30" in progress.opened["content"]["data"]["text/plain"]

    # Live while the cell ran: the step count moves, the loss, ETA and the recovery show up.
    values = [html.unescape(v) for _t, v in progress.updates]
    assert len(values) >= 5, values
    steps = [int(re.search(r"'params': step (\d+)/30", v).group(1)) for v in values]
    assert steps[-1] > steps[0]
    assert any("ETA" in v and "steps/s" in v for v in values)
    assert any("loss 0.4" in v for v in values)
    assert any("1 recovery" in v and "slice 1 down" in v for v in values)
    # At most 4 updates a second, and none once the text stopped changing.
    times = [t for t, _v in progress.updates]
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= 0.2
    assert len(values) == len(set(values))

    # At the end: one static summary in the same output; no widget, nothing in the widget state.
    assert len(progress.finals) == 1 and not progress.comms
    final = progress.finals[0]
    text = final["text/plain"]
    assert "elastic 'params': step 30/30: 30 steps in" in text
    # The loss of the last step (0.99 ** 29 / 2), not of whichever step the view saw last.
    for part in ("1 recovery (", "2 reshards", "goodput ", "loss 0.373", "slice 1 down", "slice 1 back"):
        assert part in text, part
    assert re.search(r"step \d+: reshard onto slices \[0\] from snapshot of step \d+", text), text
    assert html.escape("elastic 'params': step 30/30") in final["text/html"]
    # Markers on the bar where the run lost and got back its slice.
    assert final["text/html"].count('<span title="') == 4


# The loss pw.log is given as a device scalar, as a jitted step returns it; the
# loop dispatches steps faster than the devices run them, so the newest loss is
# never computed yet when the view looks: it must show the newest one that is.
LOGGED = """%%pathways elastic --steps 60 --state w --snapshot-every 100
w, loss = slow_step(w, big)
pw.log(loss=loss)
"""


def test_an_elastic_cell_shows_the_loss_given_to_pw_log_live(kernel):
    assert kernel.run(SETUP).status == "ok"
    setup = kernel.run("""
w = jax.device_put(jnp.full((64, 64), 2.0), NamedSharding(mesh, P(None, "model")))
big = jax.device_put(jnp.ones((512, 512)) / 512, NamedSharding(mesh, P("data")))
@jax.jit
def slow_step(w, big):
    heavy = big
    for _ in range(6):
        heavy = jnp.tanh(heavy @ big.T)
    w = w * 0.9 + 0.0 * jnp.mean(heavy)
    return w, jnp.mean(w)
jax.block_until_ready(slow_step(w, big))
""")
    assert setup.status == "ok", setup.error
    reply = kernel.run(LOGGED)
    assert reply.status == "ok", reply.error
    progress = Progress(reply.messages)
    live = [html.unescape(v) for _t, v in progress.updates]
    # Computed losses shown while the cell ran: 2 * 0.9 ** (step + 1), falling.
    shown = [float(m.group(1)) for v in live if (m := re.search(r" · loss ([0-9.]+)", v))]
    assert len(shown) >= 3, live
    assert shown[-1] < shown[0] < 2.0
    assert "loss 0.003594" in progress.finals[0]["text/plain"]  # 2 * 0.9 ** 60


def test_pw_steps_with_pw_log_and_the_off_switches(kernel):
    assert kernel.run(SETUP).status == "ok"
    reply = kernel.run("""
for i in pw.steps(range(20), name="train"):
    time.sleep(0.05)
    pw.log(loss=jnp.float32(1.0 / (i + 1)), acc=i)
""")
    assert reply.status == "ok", reply.error
    progress = Progress(reply.messages)
    assert progress.count == 1
    text = progress.finals[0]["text/plain"]
    assert "steps 'train': step 20/20: 20 steps in" in text
    assert "loss 0.05 · acc 19" in text
    assert "recover" not in text  # a plain loop has nothing to recover

    quiet = kernel.run("""
for i in pw.steps(range(5), progress=False):
    time.sleep(0.01)
@pw.elastic
def train(state, step, mesh):
    return state * 0.5
x = train(jnp.ones(8), steps=4, progress=False)
""")
    assert quiet.status == "ok", quiet.error
    assert Progress(quiet.messages).count == 0
    cell = kernel.run("%%pathways elastic --steps 4 --state params --no-progress\nparams = dict(params)")
    assert cell.status == "ok", cell.error
    assert Progress(cell.messages).count == 0
    assert "4 steps" in cell.text  # the run's report is still shown

    shown = kernel.run("x = train(jnp.ones(8), steps=4)")
    assert Progress(shown.messages).count == 1


def test_a_bare_loader_loop_has_progress_without_a_total_and_ends_with_the_cell(kernel):
    assert kernel.run(SETUP).status == "ok"
    reply = kernel.run("""
import numpy as np
def make_batches(step, shard, num_shards):
    return np.full((4, 8), step, np.float32)
loader = pw.loader(make_batches, name="ones")
for n, batch in enumerate(loader):
    time.sleep(0.02)
    if n == 7:
        break
""")
    assert reply.status == "ok", reply.error
    progress = Progress(reply.messages)
    assert progress.count == 1
    text = progress.finals[0]["text/plain"]
    assert text.startswith("loader 'ones': step 8: 8 steps in"), text

    # Wrapped in pw.steps, the loop is that run: its progress=False silences it.
    quiet = kernel.run("""
for n, batch in enumerate(pw.steps(loader, progress=False)):
    if n == 3:
        break
""")
    assert quiet.status == "ok", quiet.error
    assert Progress(quiet.messages).count == 0


def test_an_elastic_map_cell_counts_batches_not_steps(kernel):
    assert kernel.run(SETUP).status == "ok"
    reply = kernel.run("""
import numpy as np
def double(p, batch, mesh):
    time.sleep(0.05)
    return batch * p
out = pw.elastic_map(double, np.arange(32, dtype=np.float32).reshape(16, 2), np.float32(2.0), batch_size=2)
""")
    assert reply.status == "ok", reply.error
    progress = Progress(reply.messages)
    assert progress.count == 1
    line = progress.finals[0]["text/plain"].splitlines()[0]
    # Its 16 requests in 8 batches, counted as batches wherever the line counts.
    assert re.match(r"elastic_map 'double': batch 8/8: 8 batches in [0-9.]+ m?s · [0-9.]+ batches/s · ", line), line
    assert "step" not in line, line
    live = [html.unescape(page) for _t, page in progress.updates]
    assert all("step" not in page for page in live), live


def test_runs_nested_or_past_the_cap_open_no_more_outputs(kernel):
    assert kernel.run(SETUP).status == "ok"
    reply = kernel.run("""
for epoch in pw.steps(range(2), name="epochs"):
    for i in pw.steps(range(3), name="inner"):
        pass
for k in range(15):
    for i in pw.steps(range(2), name=f"run{k}"):
        pass
""")
    assert reply.status == "ok", reply.error
    progress = Progress(reply.messages)
    assert progress.count == 10  # the outer loop, then 9 of the 15 runs
    assert "inner" not in "".join(
        m["content"]["data"].get("text/plain", "") for m in reply.messages if m["header"]["msg_type"] == "display_data"
    )


def test_pw_log_outside_a_run_is_one_line(kernel):
    reply = kernel.run("pw.log(loss=1.0)")
    assert "PathwaysError: pw.log records metrics of a run in progress" in reply.error
    assert "Traceback" not in reply.error


def test_no_progress_outside_ipython(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import pathways_kernel as pw\n"
        "import pathways_kernel.magics.elastic  # the magics' module installs the view: still nothing without a kernel\n"
        "for i in pw.steps(range(3)):\n"
        "    pw.log(loss=float(i))\n"
        "print('done')\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"


def test_the_elastic_notebook_saves_its_summary_for_nbconvert_and_a_reopened_file(tmp_path):
    nb = execute("elastic.ipynb", timeout=600)
    path = tmp_path / "elastic.ipynb"
    nbformat.write(nb, path)

    reopened = nbformat.read(path, as_version=4)
    loop = code_cells(reopened)[2]
    assert not any(WIDGET in out.get("data", {}) for out in loop.outputs)
    assert "widgets" not in reopened.metadata  # no widget state for a reader's frontend to miss
    summaries = [out for out in loop.outputs if "pathways-cell-progress" in out.get("data", {}).get("text/html", "")]
    assert len(summaries) == 1
    text = summaries[0]["data"]["text/plain"]
    assert "elastic 'params': step 240/240: 240 steps in" in text
    for part in ("1 recovery (", "2 reshards", "goodput ", "step 85: slice 1 down", "slice 1 back"):
        assert part in text, part
    # The loss pw.log was given at the last step, as the cell printed it.
    printed = float(outputs_text(loop).split("step 239  loss")[1].split()[0])
    shown = float(re.search(r" · loss ([0-9.e+-]+) · ", text).group(1))
    assert shown == pytest.approx(printed, rel=1e-3)

    body, _resources = HTMLExporter().from_notebook_node(reopened)
    assert 'class="pathways-cell-progress"' in body
    assert re.search(r"elastic (&#x27;|')params(&#x27;|'): step 240/240: 240 steps in", body)
    assert "1 recovery (" in body and "2 reshards" in body and "goodput " in body
