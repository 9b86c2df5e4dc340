"""A newcomer's first hour (issue #31) in a real JupyterLab at 1280x800, through Debian's Chromium.

Each test is a step a new user takes: open the dashboard, read its axes and
legends, read the events. Screenshots of each state land in test-artifacts/
(first-hour-*), light and dark, at 1280x800 and 1920x1080.
"""

from __future__ import annotations

import re

import lab as labtools
import pytest
from test_browser import ARTIFACTS, PANEL, open_monitor, open_notebook
from test_browser_dashboard import dark_theme, wait_for_light_axis

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

DASHBOARD = "#pathways-dashboard"
MEMORY = f"{DASHBOARD} figure[data-chart='memory']"
LOSS_CHART = f"{DASHBOARD} figure.jp-PathwaysDashboard-metric[data-metric='loss']"

SETUP = """\
import time, jax.numpy as jnp, pathways_kernel as pw
params = jnp.zeros(())
print('setup done')"""

# The quickstart's shape: an elastic cell whose state is `params`, logging its loss, snapshotting every 10 steps.
TRAIN = """\
%%pathways elastic --steps 60 --state params --snapshot-every 10
time.sleep(0.05)
params = params + 1.0
pw.log(loss=jnp.float32(1.0 / (step + 1)))"""


LONG_TRAIN = TRAIN.replace("--steps 60", "--steps 600")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-first-hour")
    labtools.notebook(root / "params.ipynb", [SETUP, TRAIN])
    # A kernel of its own: only this run's events.
    labtools.notebook(root / "events.ipynb", [SETUP, TRAIN, "%pathways events"])
    labtools.notebook(root / "starting.ipynb", ["print('up')"])
    # Run All: a long elastic cell, then enough cells after it that the last is a few screens down.
    labtools.notebook(root / "runall.ipynb", [SETUP, LONG_TRAIN] + [f"print('after {i}')" for i in range(40)])
    lab = labtools.Lab(root)
    yield lab
    lab.stop()


@pytest.fixture
def page(server, tmp_path_factory):
    with labtools.page_of(tmp_path_factory, viewport=(1280, 800)) as page:
        yield page


def shoot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"first-hour-{name}.png"))


def dashboard_chart(page, key: str) -> str:
    """A JS expression for one of the dashboard's chart objects (`_memory`, `_utilization`)."""
    return (
        f"[...window.jupyterapp.shell.widgets('main')].find(w => w.id === 'pathways-dashboard-area').content.{key}.plot"
    )


def axis_ticks(page, key: str, axis: int) -> list[str]:
    """The tick labels uPlot drew on a chart's axis (0: time, 1: value)."""
    return page.evaluate(f"() => [...({dashboard_chart(page, key)}.axes[{axis}]._values ?? [])].map(String)")


def run_cell(page, index: int, notebook: str = "params.ipynb") -> None:
    page.evaluate(
        "(name) => { const app = window.jupyterapp;"
        " const w = [...app.shell.widgets('main')].find(w => w.title.label === name); app.shell.activateById(w.id); }",
        notebook,
    )
    page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").nth(index).click()
    page.keyboard.press("Shift+Enter")


def test_the_dashboard_opens_wide_with_axes_that_read_before_and_after_data(page, server):
    open_notebook(page, server, "params.ipynb")
    open_monitor(page)  # both sidebars open, as a newcomer has them
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=90_000)
    page.evaluate("window.jupyterapp.commands.execute('pathways:open-dashboard')")
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=60_000)
    width = page.locator(DASHBOARD).bounding_box()["width"]
    assert width >= 900, f"the dashboard got {width:.0f} px of a 1280 px window"
    page.wait_for_function(f"() => ({dashboard_chart(page, '_memory')}.axes[1]._values ?? []).length >= 2")

    # Before data: the memory axis counts bytes that mean something, the time axis reads clock time.
    memory = axis_ticks(page, "_memory", 1)
    assert len(set(memory)) == len(memory) and "1 B" not in memory, memory
    assert memory[-1] in ("1 GiB", "1024 MiB"), memory
    times = axis_ticks(page, "_utilization", 0)
    assert times and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in times), times
    shoot(page, "dashboard-before-1280")

    # After a run: its loss line is named by run, cell and metric.
    run_cell(page, 0)
    page.locator(".jp-OutputArea-output", has_text="setup done").first.wait_for(timeout=120_000)
    run_cell(page, 1)
    page.locator(".jp-OutputArea-output", has_text="60 steps in").first.wait_for(timeout=180_000)
    prompt = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-InputPrompt")
    page.wait_for_function("(p) => /\\[\\d+\\]/.test(p.textContent)", arg=prompt.element_handle(), timeout=30_000)
    cell = re.search(r"\[(\d+)\]", prompt.inner_text()).group(1)
    page.evaluate("window.jupyterapp.commands.execute('pathways:open-dashboard')")
    legend = page.locator(f"{LOSS_CHART} .u-legend")
    legend.filter(has_text=f"run 'params' (cell {cell}) · loss").wait_for(timeout=30_000)
    assert "#1" not in legend.inner_text(), legend.inner_text()
    times = axis_ticks(page, "_memory", 0)
    assert times and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in times), times
    shoot(page, "dashboard-after-1280")
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.wait_for_timeout(1_000)
    shoot(page, "dashboard-after-1920")
    with dark_theme(page):
        wait_for_light_axis(page, f"{DASHBOARD} figure[data-chart='utilization']")
        shoot(page, "dashboard-after-1920-dark")
        page.set_viewport_size({"width": 1280, "height": 800})
        page.wait_for_timeout(1_000)
        shoot(page, "dashboard-after-1280-dark")


def test_a_snapshot_every_10_steps_is_one_row_in_the_panel_and_in_pathways_events(page, server):
    open_notebook(page, server, "events.ipynb")
    open_monitor(page)
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=90_000)
    run_cell(page, 0, "events.ipynb")
    page.locator(".jp-OutputArea-output", has_text="setup done").first.wait_for(timeout=120_000)
    run_cell(page, 1, "events.ipynb")
    page.locator(".jp-OutputArea-output", has_text="60 steps in").first.wait_for(timeout=180_000)

    # The panel's topology chips carry their ids, as the notebook's grid numbers them.
    page.locator(f"{PANEL} canvas[data-chip-labels='true']").wait_for(state="attached", timeout=10_000)
    page.locator(PANEL).screenshot(path=str(ARTIFACTS / "first-hour-panel-chips.png"))

    # The panel: the run's 7 snapshots are one row with their count (the last one may land just
    # after the run's goodput event, which ends a run: then a row of its own).
    snapshots_selector = f"{PANEL} li.jp-PathwaysPanel-event[data-kind='snapshot']"
    snapshots = page.locator(snapshots_selector)
    counted = "(s) => [...document.querySelectorAll(s)].reduce((n, li) => n + Number(li.dataset.count), 0) === 7"
    try:
        page.wait_for_function(f"({counted})", arg=snapshots_selector, timeout=15_000)
    except Exception:
        shoot(page, "events-panel-failure")
        raise
    assert snapshots.count() <= 2, [snapshots.nth(i).inner_text() for i in range(snapshots.count())]
    assert "step 0–" in snapshots.last.inner_text(), snapshots.last.inner_text()
    assert page.locator(f"{PANEL} li.jp-PathwaysPanel-event[data-kind='connection_update']").count() <= 1

    # %pathways events: one row for them too, in a table that reads left to right on one line a row.
    run_cell(page, 2, "events.ipynb")
    table = page.locator("table.pathways-events").first
    table.wait_for(timeout=60_000)
    table.locator("td", has_text=re.compile("snapshot ×[67]")).first.wait_for(timeout=10_000)
    table.scroll_into_view_if_needed()
    shoot(page, "events-1280")
    cells = table.locator("td")
    aligned = {cells.nth(i).evaluate("(td) => getComputedStyle(td).textAlign") for i in range(cells.count())}
    assert aligned == {"left"}, aligned
    output = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea-output").first.bounding_box()
    box = table.bounding_box()
    assert box["x"] + box["width"] <= output["x"] + output["width"] + 1, "the table is cut off on the right"
    rows = table.locator("tbody tr")
    tallest = max(rows.nth(i).bounding_box()["height"] for i in range(rows.count()))
    assert tallest < 70, f"a row {tallest:.0f} px tall (three lines at most)"
    with dark_theme(page):
        page.wait_for_timeout(500)
        shoot(page, "events-1280-dark")


PROGRESS = ".pathways-cell-progress"


def test_run_all_keeps_the_live_elastic_cells_progress_in_view(page, server):
    open_notebook(page, server, "runall.ipynb")
    # Not awaited: the command's promise settles only once every cell has run.
    page.evaluate("() => { void window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.locator(PROGRESS).first.wait_for(state="attached", timeout=120_000)
    page.wait_for_timeout(2_000)  # the run goes on; Run All has moved the active cell to the last one
    shoot(page, "runall-progress-1280")
    assert page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status") == "busy"
    view = page.locator(".jp-Notebook .jp-WindowedPanel-outer").first.bounding_box()
    bar = page.locator(PROGRESS).first.bounding_box()
    shoot(page, "runall-progress-1280")
    assert bar is not None and view["y"] <= bar["y"] and bar["y"] + bar["height"] <= view["y"] + view["height"], (
        f"the live progress is off-screen: bar {bar}, notebook view {view}"
    )


# Every status line the panel showed, recorded in the page as it changes (a kernel start is seconds long).
RECORD_STATUS = """() => {
    window.__pwSaid = [];
    const seen = () => {
        const m = document.querySelector('#pathways-monitor .jp-PathwaysPanel-message');
        const text = m && !m.hidden ? m.textContent : '';
        if (text && window.__pwSaid[window.__pwSaid.length - 1] !== text) window.__pwSaid.push(text);
    };
    new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
    seen();
}"""


def test_the_panel_says_the_kernel_is_starting_its_server_while_it_starts(page, server):
    page.goto(server.url("starting.ipynb"))
    page.locator(PANEL).wait_for(state="attached", timeout=60_000)
    page.evaluate(RECORD_STATUS)
    open_monitor(page)
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=120_000)
    said = page.evaluate("() => window.__pwSaid")
    assert any(s.startswith("Starting the Pathways kernel and its local Pathways server") for s in said), said
    assert not any("no kernel yet" in s for s in said), said
