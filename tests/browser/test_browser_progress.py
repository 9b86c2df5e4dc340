"""Per-cell progress in a real JupyterLab through Debian's Chromium: live under the
cell while an elastic run loses and gets back a slice, then the static summary,
kept by the saved notebook and rendered by nbconvert without a kernel."""

from __future__ import annotations

import re
import time
import urllib.request

import lab as labtools
import nbformat
import pytest
from nbconvert import HTMLExporter
from test_browser import ARTIFACTS, KERNEL_STATUS, open_notebook, run_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

SETUP = """\
import time
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = pw.mesh()
params = {"w": jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P())), "loss": jnp.float32(1.0)}
failed = restored = False
print("setup done")"""

# Slice 1 is lost at step 20 and back at step 40: one rollback and two reshards, marked on the bar.
TRAIN = """\
%%pathways elastic --steps 80 --state params --snapshot-every 5
params = {"w": params["w"] * 0.99, "loss": jnp.mean(params["w"]) / 2}
time.sleep(0.1)
if step == 20 and not failed:
    failed = True
    pw.fail_slice(1)
if step == 40 and not restored:
    restored = True
    pw.repair_slice(1)"""

CELL = ".jp-Notebook .jp-CodeCell"
# One output under the cell, live then the summary: plain text/html updated in place.
PROGRESS = f"{CELL} .jp-OutputArea-output[data-mime-type='text/html'] .pathways-cell-progress"
DONE = ": 80 steps in"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-progress")
    labtools.notebook(root / "progress.ipynb", [SETUP, TRAIN])
    lab = labtools.Lab(root)
    yield lab
    lab.stop()


@pytest.fixture
def page(server, tmp_path_factory):
    with labtools.page_of(tmp_path_factory) as page:
        yield page


def step_of(text: str) -> int:
    return int(re.search(r"step (\d+)/80", text).group(1))


def test_progress_under_the_cell_live_then_saved_and_rendered_by_nbconvert(page, server, tmp_path):
    open_notebook(page, server, "progress.ipynb")
    # Not awaited: the command's promise settles only when every cell has run.
    run_all = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
    live = page.locator(PROGRESS).first
    run_until(page, lambda: page.evaluate(run_all), live, artifact="cell-progress-failure.png")
    # The view's updates must not change what JupyterLab says of the kernel: sampled
    # every 250 ms until the static summary replaces the view (the run is over then).
    page.evaluate(
        """([status, progress, done]) => {
            window.__pwStatus = [];
            window.__pwSampler = setInterval(() => {
                const view = document.querySelector(progress);
                if (!(view && view.innerText.includes(done))) {
                    window.__pwStatus.push(document.querySelector(status)?.textContent ?? '');
                }
            }, 250);
        }""",
        [KERNEL_STATUS, PROGRESS, DONE],
    )

    # Live: the count moves while the cell is busy, and the slice loss shows as it happens.
    first = step_of(live.inner_text())
    page.wait_for_function(
        "([sel, n]) => { const e = document.querySelector(sel); const m = e && e.innerText.match(/step (\\d+)\\/80/);"
        " return m && Number(m[1]) > n; }",
        arg=[PROGRESS, first],
        timeout=30_000,
    )
    page.locator(PROGRESS, has_text="1 recovery").wait_for(timeout=60_000)
    text = live.inner_text()
    assert "steps/s" in text and "ETA" in text and "loss 0." in text and "slice 1 down" in text, text
    assert page.locator(".jp-Notebook-ExecutionIndicator[data-status='busy']").count() >= 1
    markers = page.locator(f"{PROGRESS} span[title]")
    assert markers.count() >= 2  # the loss and the rollback's reshard, on the bar
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(CELL).nth(1).screenshot(path=str(ARTIFACTS / "cell-progress-live.png"))

    # After: the same output is the static summary, with every marker.
    static = page.locator(PROGRESS, has_text=DONE)
    static.wait_for(timeout=120_000)
    summary = static.inner_text()
    assert "elastic 'params': step 80/80: 80 steps in" in summary, summary
    for part in ("1 recovery (", "2 reshards", "goodput ", "slice 1 down", "slice 1 back"):
        assert part in summary, part
    assert "ETA" not in summary and page.locator(PROGRESS).count() == 1
    samples = page.evaluate("() => { clearInterval(window.__pwSampler); return window.__pwStatus; }")
    assert len(samples) >= 12, samples
    assert all(sample.endswith("| Busy") for sample in samples), sorted(set(samples))
    assert page.locator(f"{PROGRESS} span[title]").count() == 4
    page.locator(CELL).nth(1).screenshot(path=str(ARTIFACTS / "cell-progress-done.png"))
    # Theme variables only: in the dark theme the summary follows it.
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
    colors = static.evaluate(
        "e => [getComputedStyle(e).color, getComputedStyle(e.querySelector('div')).backgroundColor]"
    )
    assert colors[0] != "rgb(0, 0, 0)" and colors[1] != "rgb(221, 221, 221)", colors  # not the light fallbacks
    page.locator(CELL).nth(1).screenshot(path=str(ARTIFACTS / "cell-progress-dark.png"))

    # Saved from JupyterLab, the file renders the summary through nbconvert, no kernel involved.
    page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
    path = server.root / "progress.ipynb"
    deadline = time.time() + 30
    while "step 80/80" not in path.read_text() and time.time() < deadline:
        time.sleep(0.25)
    # Reopened with no kernel behind it, JupyterLab shows the saved summary.
    for kernel in server.get("kernels"):
        urllib.request.urlopen(urllib.request.Request(server.api(f"kernels/{kernel['id']}"), method="DELETE")).close()
    page.goto(server.url("progress.ipynb"))
    page.locator(PROGRESS, has_text="step 80/80: 80 steps in").wait_for(timeout=60_000)
    assert page.locator(f"{PROGRESS} span[title]").count() == 4

    nb = nbformat.read(path, as_version=4)
    body, _resources = HTMLExporter().from_notebook_node(nb)
    rendered = tmp_path / "progress.html"
    rendered.write_text(body)
    page.goto(rendered.as_uri())
    saved = page.locator(".pathways-cell-progress").first
    saved.wait_for(timeout=10_000)
    assert "step 80/80: 80 steps in" in saved.inner_text()
    assert page.locator(".pathways-cell-progress span[title]").count() == 4
    saved.screenshot(path=str(ARTIFACTS / "cell-progress-nbconvert.png"))
