"""The dashboard's phase lane (``pw.phase``, issue #29 item 4) in a real JupyterLab, through Debian's Chromium:
an RL-shaped loop marks its rollout, reward, update and sync on two slices; the lane shows them per role
on the dashboard's time axis, readable by keyboard, with each role's wait on the other, at 1280x800 and
1920x1080, light and dark."""

from __future__ import annotations

import re

import lab as labtools
import pytest
from test_browser import ARTIFACTS, open_notebook, run_first_cell
from test_browser_dashboard import DASHBOARD, dark_theme

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

LANE = f"{DASHBOARD} figure[data-chart='phases']"

LOOP = """\
import time
import numpy as np
import jax.numpy as jnp
from jax.sharding import Mesh
import pathways_kernel as pw

slices = pw.session().topology
trainer_mesh = Mesh(np.array(slices.slice(0).devices), ("x",))
rollout_mesh = Mesh(np.array(slices.slice(1).devices), ("x",))
for step in pw.steps(range(24), name="grpo"):
    with pw.phase("rollout", mesh=rollout_mesh):
        time.sleep(0.3)
    with pw.phase("reward", mesh=rollout_mesh):
        time.sleep(0.05)
    with pw.phase("update", mesh=trainer_mesh):
        time.sleep(0.15)
    with pw.phase("sync", mesh=trainer_mesh):
        time.sleep(0.05)
print("trained", step + 1)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-phases")
    labtools.notebook(root / "rl.ipynb", [LOOP])
    lab = labtools.Lab(root)
    yield lab
    lab.stop()


@pytest.fixture
def page(server, tmp_path_factory):
    with labtools.page_of(tmp_path_factory) as page:
        yield page


def test_the_phase_lane_shows_each_roles_phases_and_waits_on_the_time_axis(page, server):
    page.set_viewport_size({"width": 1280, "height": 800})
    open_notebook(page, server, "rl.ipynb")
    page.evaluate("window.jupyterapp.commands.execute('pathways:open-dashboard')")
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=60_000)
    run_first_cell(page, "trained 24", seconds=240)
    lane = page.locator(LANE)
    page.evaluate("window.jupyterapp.shell.activateById('pathways-dashboard-area')")  # Run took the focus
    lane.wait_for(state="visible", timeout=30_000)
    assert lane.locator(".jp-PathwaysDashboard-chartTitle").inner_text() == "Phases by role"
    # A legend entry per phase, in the order the loop ran them.
    legend = lane.locator(".u-legend .u-series th").all_inner_texts()
    assert [t.strip() for t in legend[1:]] == ["rollout", "reward", "update", "sync"], legend
    # Each role's time in view: the rollout's phases take 0.35 s of each 0.55 s step (more under load).
    split = lane.locator(".jp-PathwaysDashboard-phaseSplit")
    split.filter(has_text="waited for rollout").wait_for(timeout=10_000)
    text = split.inner_text()
    trainer = re.search(r"trainer \(slice 0\): busy (\d+)%, waited for rollout (\d+)%", text)
    rollout = re.search(r"rollout \(slice 1\): busy (\d+)%, waited for trainer (\d+)%", text)
    assert trainer and rollout, text
    assert int(trainer[2]) > int(trainer[1]) and int(rollout[1]) > int(rollout[2]), text

    # Keyboard: focus the lane, End goes to the last phase boundary, the arrows step back through them.
    plot = lane.locator("[role='img']")
    assert "arrow keys move the readout from one phase boundary to the next" in plot.get_attribute("aria-label")
    plot.focus()
    page.keyboard.press("End")
    readout = lane.locator(".jp-PathwaysDashboard-readout")
    for _ in range(8):
        page.keyboard.press("ArrowLeft")
        if re.search(r"(trainer|rollout): (rollout|reward|update|sync) \(step \d+, \d+ ms\)", readout.inner_text()):
            break
    assert re.search(r"(trainer|rollout): (rollout|reward|update|sync) \(step \d+, \d+ ms\)", readout.inner_text()), (
        readout.inner_text()
    )
    assert "trainer:" in readout.inner_text() and "rollout:" in readout.inner_text()

    ARTIFACTS.mkdir(exist_ok=True)
    for width, height in ((1280, 800), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(500)  # the dashboard lays out again at the new size
        lane.scroll_into_view_if_needed()
        box, shown = lane.bounding_box(), page.locator(DASHBOARD).bounding_box()
        assert box["x"] >= shown["x"] - 1 and box["x"] + box["width"] <= shown["x"] + shown["width"] + 1, (box, shown)
        page.screenshot(path=str(ARTIFACTS / f"dashboard-phases-{width}.png"))
        with dark_theme(page):
            lane.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / f"dashboard-phases-{width}-dark.png"))
