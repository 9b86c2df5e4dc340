"""Comparing runs in the dashboard (issue #31 item 7): a run picker chooses the runs the metric
charts overlay, and the runs of the kernel before a restart come back, labelled as such."""

from __future__ import annotations

import lab as labtools
import pytest
from test_browser import ARTIFACTS, open_notebook, run_first_cell
from test_browser_dashboard import DASHBOARD, LOSS_CHART, dark_theme, open_dashboard, run_cell_at

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

SWEEP = """\
import pathways_kernel as pw
for r in range(4):
    for b in pw.steps(range(6), name="sweep"):
        pw.log(loss=(r + 1) / (b + 1))
print("logged", pw.metrics()["run"].nunique(), "runs")"""

AGAIN = """\
import pathways_kernel as pw
for b in pw.steps(range(6), name="sweep"):
    pw.log(loss=0.5)
print("logged", pw.metrics()["run"].nunique(), "runs again")"""

PICKER = f"{DASHBOARD} fieldset.jp-PathwaysDashboard-runs"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-runs")
    labtools.notebook(root / "loss.ipynb", [SWEEP, AGAIN])  # run_cell_at finds the notebook by this name
    lab = labtools.Lab(root, env={"PATHWAYS_LOG_DIR": str(tmp_path_factory.mktemp("session-logs"))})
    yield lab
    lab.stop()


@pytest.fixture
def page(server, tmp_path_factory):
    with labtools.page_of(tmp_path_factory) as page:
        yield page


def checkbox(page, run: str):
    return page.locator(f"{PICKER} input[data-run='{run}']")


def legend(page) -> list[str]:
    """The loss chart's series, as its legend names them (the x series left out)."""
    return page.locator(f"{LOSS_CHART} .u-legend .u-series:not(:first-child) .u-label").all_inner_texts()


def wait_for_legend(page, expected: list[str]) -> None:
    page.wait_for_function(
        "([chart, expected]) => JSON.stringify([...document.querySelectorAll("
        "chart + ' .u-legend .u-series:not(:first-child) .u-label')].map(n => n.textContent)) === JSON.stringify(expected)",
        arg=[LOSS_CHART, expected],
        timeout=60_000,
    )


def test_runs_picked_are_the_runs_drawn_and_an_earlier_kernels_come_back_labelled(page, server):
    page.set_viewport_size({"width": 1280, "height": 800})
    open_notebook(page, server, "loss.ipynb")
    # A kernel start on a loaded 2-core machine: up to a minute and more.
    page.locator("#pathways-monitor[data-state='live']").wait_for(state="attached", timeout=120_000)
    run_first_cell(page, "logged 4 runs")
    open_dashboard(page)
    page.locator(f"{PICKER} input[data-run]").nth(3).wait_for()
    # By default the newest three of the four runs are drawn.
    run = "run 'sweep' (cell 1)"
    wait_for_legend(page, [f"{run} #2 · loss", f"{run} #3 · loss", f"{run} #4 · loss"])
    assert [checkbox(page, f"sweep #{i}").is_checked() for i in (1, 2, 3, 4)] == [False, True, True, True]
    assert page.locator(f"{PICKER} legend").inner_text().startswith("Runs (3 of 4 shown)")

    # Picked by keyboard: Space hides run 3; then run 1 shown with a click.
    checkbox(page, "sweep #3").focus()
    page.keyboard.press("Space")
    checkbox(page, "sweep #1").click()
    wait_for_legend(page, [f"{run} #1 · loss", f"{run} #2 · loss", f"{run} #4 · loss"])
    assert page.locator(LOSS_CHART).get_attribute("data-runs") == "3"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-runs-1280.png"))
    with dark_theme(page):
        page.screenshot(path=str(ARTIFACTS / "dashboard-runs-1280-dark.png"))

    # The kernel restarts; the next run is numbered after the earlier kernel's, which come back.
    page.evaluate(
        "() => { const app = window.jupyterapp;"
        " const w = [...app.shell.widgets('main')].find(w => w.title.label === 'loss.ipynb');"
        " return w.sessionContext.restartKernel(); }"
    )
    page.locator("#pathways-monitor[data-state='live']").wait_for(state="attached", timeout=120_000)
    run_cell_at(page, 1)
    page.locator(".jp-OutputArea-output", has_text="logged 5 runs again").wait_for(timeout=120_000)
    page.evaluate("() => { const app = window.jupyterapp; app.shell.activateById('pathways-dashboard-area'); }")
    # The picks hold across the restart; the new run shows, as the run in progress always does.
    wait_for_legend(
        page,
        [
            f"{run} #1 · earlier kernel · loss",
            f"{run} #4 · earlier kernel · loss",
            f"{run} #5 · loss",
        ],
    )
    earlier = page.locator(f"{PICKER} li[data-earlier='true']")
    assert earlier.count() == 4
    assert earlier.first.inner_text().strip().endswith("earlier kernel")
    page.screenshot(path=str(ARTIFACTS / "dashboard-runs-restart-1280.png"))
    page.set_viewport_size({"width": 1920, "height": 1080})
    wait_for_legend(
        page,
        [f"{run} #1 · earlier kernel · loss", f"{run} #4 · earlier kernel · loss", f"{run} #5 · loss"],
    )
    page.screenshot(path=str(ARTIFACTS / "dashboard-runs-restart-1920.png"))
    with dark_theme(page):
        page.screenshot(path=str(ARTIFACTS / "dashboard-runs-restart-1920-dark.png"))
