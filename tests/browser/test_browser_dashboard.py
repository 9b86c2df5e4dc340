"""The Pathways dashboard (main area) in a real JupyterLab, driven through Debian's Chromium.

An elastic loop trains in the notebook; the dashboard is opened while it runs,
and the notebook itself loses slice 1 partway through.
"""

from __future__ import annotations

import contextlib
import re

import lab as labtools
import pytest
from test_browser import ARTIFACTS, open_notebook, run_first_cell

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

DASHBOARD = "#pathways-dashboard"
UTILIZATION = f"{DASHBOARD} figure[aria-label^='Utilization per slice']"
LOSS = f"{UTILIZATION} .jp-PathwaysDashboard-marker[data-kind='slice_down']:not([hidden])"

TRAIN = """\
import threading, time
import jax, jax.numpy as jnp
import pathways_kernel as pw
from jax.sharding import NamedSharding, PartitionSpec as P

def step_fn(state, step, mesh):
    time.sleep(0.05)
    batch = jax.device_put(jnp.full((8, 128), 1.0), NamedSharding(mesh, P("data")))
    return state + batch.mean()

train = pw.elastic(step_fn, snapshot_every=10, name="train")
threading.Timer(10, pw.fail_slice, args=(1,)).start()  # the notebook loses slice 1 mid-run
state = train(jnp.zeros(()), steps=500)
print("trained", float(state))
"""


LOSS_SETUP = """\
import threading, time
import jax.numpy as jnp
import pathways_kernel as pw
w, failed = jnp.zeros(()), []
print("setup done")"""

# A loss that falls with the step; slice 1 is lost once, at step 45 (the run recovers from its step-40 snapshot).
LOSS_RUN = """\
%%pathways elastic --steps {steps} --state w --snapshot-every 20
time.sleep(0.08)
w = w + 1.0
pw.log(loss=jnp.float32(1.0 / (step + 1) + 0.05 * (step % 4)))
if step == 45 and not failed:
    failed.append(step)
    threading.Thread(target=pw.fail_slice, args=(1,)).start()"""


MEMORY = """\
import jax, jax.numpy as jnp
import pathways_kernel as pw
big = jax.device_put(jnp.ones((8 * 2**20,), jnp.float32))  # 32 MiB
big.block_until_ready()
print("allocated", big.nbytes >> 20, "MiB")"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-dashboard")
    labtools.notebook(root / "train.ipynb", [TRAIN])
    labtools.notebook(root / "memory.ipynb", [MEMORY])
    labtools.notebook(root / "loss.ipynb", [LOSS_SETUP, LOSS_RUN.format(steps=160), LOSS_RUN.format(steps=100)])
    lab = labtools.Lab(root)
    yield lab
    lab.stop()


@pytest.fixture
def page(server, tmp_path_factory):
    with labtools.page_of(tmp_path_factory) as page:
        yield page


def open_dashboard(page) -> None:
    """Run "Pathways: Open Dashboard" from the command palette, as a user would."""
    page.locator(".jp-Notebook .jp-InputArea-editor").first.click()
    page.keyboard.press("Control+Shift+c")
    page.locator(".lm-CommandPalette-input").fill("Pathways: Open Dashboard")
    page.locator(".lm-CommandPalette-item[data-command='pathways:open-dashboard']").click()
    page.locator(DASHBOARD).wait_for(state="visible")


def marker_x(page) -> float:
    box = page.locator(LOSS).first.bounding_box()
    return box["x"] + box["width"] / 2


def test_the_dashboard_opened_mid_training_marks_the_slice_loss_on_the_time_axis(page, server):
    open_notebook(page, server, "train.ipynb")
    page.locator("#pathways-monitor[data-state='live']").wait_for(state="attached", timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click()
    page.keyboard.press("Shift+Enter")
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='busy']").first.wait_for(timeout=10_000)
    open_dashboard(page)
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=30_000)
    assert (
        "Following train.ipynb · embedded:2x4" in page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-header").inner_text()
    )
    # Step time and throughput of the running loop arrive while its cell runs.
    throughput = page.locator(f"{DASHBOARD} figure[aria-label^='Throughput'] .u-legend")
    throughput.filter(has_text="elastic 'train'").wait_for(timeout=30_000)
    memory = page.locator(f"{DASHBOARD} figure[aria-label^='Memory used vs capacity'] .u-legend").inner_text()
    assert "capacity per slice (emulated 16 GiB/chip)" in memory, memory

    page.locator(LOSS).first.wait_for(timeout=40_000)
    page.wait_for_timeout(3_000)  # the loss moves in from the right edge of the live window
    assert page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status") == "busy"
    for kind in ("Utilization per slice", "Memory used vs capacity", "Step time", "Throughput"):
        label = page.locator(f"{DASHBOARD} figure[aria-label^='{kind}'] [role='img']").get_attribute("aria-label")
        assert label.startswith(kind) and ("percent" in label or "bytes" in label or "second" in label), label

    # Hovering the marker reads the event out.
    plot = page.locator(f"{UTILIZATION} .u-over").bounding_box()
    readout = page.locator(f"{UTILIZATION} .jp-PathwaysDashboard-readout")
    # One wait for the whole line: the live window slides on (~16 px/s across the main area), so
    # the marker may be a few pixels away from the cursor by the time it lands: aim again.
    for attempt in range(5):
        page.mouse.move(marker_x(page), plot["y"] + plot["height"] / 2)
        try:
            readout.filter(has_text="slice_down").filter(has_text="slices [0,1] → [0]").wait_for(timeout=1_000)
            break
        except Exception:
            if attempt == 4:
                raise
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"))

    # Drag across the plot to zoom: the range stops sliding with time, in every chart alike.
    page.mouse.move(plot["x"] + 10, plot["y"] + 20)
    page.mouse.down()
    page.mouse.move(plot["x"] + plot["width"] - 2, plot["y"] + 20, steps=8)
    page.mouse.up()
    page.locator(f"{DASHBOARD}[data-zoomed='true']").wait_for(state="attached", timeout=5_000)
    page.wait_for_timeout(300)  # the next frame draws the zoomed range
    zoomed = marker_x(page)
    page.wait_for_timeout(1_500)
    assert abs(marker_x(page) - zoomed) < 1, "a zoomed range stays put while data arrives"
    memory_marker = page.locator(
        f"{DASHBOARD} figure[aria-label^='Memory used vs capacity'] .jp-PathwaysDashboard-marker[data-kind='slice_down']:not([hidden])"
    ).first.bounding_box()
    assert abs(memory_marker["x"] + memory_marker["width"] / 2 - zoomed) < 3, "the zoom applies to every chart"
    # Double-click: back to the live window, which slides on with time.
    page.mouse.dblclick(plot["x"] + plot["width"] / 2, plot["y"] + 20)
    page.locator(f"{DASHBOARD}[data-zoomed='false']").wait_for(state="attached", timeout=5_000)
    page.wait_for_timeout(300)
    live = marker_x(page)
    page.wait_for_timeout(1_500)
    assert marker_x(page) < live - 1, "the live window moves on"

    # The kind filter is made of real checkboxes, in a menu.
    page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-filter summary").click()
    box = page.get_by_role("checkbox", name="slice_down")
    box.uncheck()
    page.locator(LOSS).wait_for(state="detached", timeout=5_000)
    box.check()
    page.locator(LOSS).first.wait_for(timeout=5_000)
    page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-filter summary").click()

    # Axis text follows the theme: dark on light, light on dark (the canvas is redrawn on a theme change).
    assert 0 <= axis_brightness(page, UTILIZATION) < 100
    with dark_theme(page):
        wait_for_light_axis(page, UTILIZATION)
        page.screenshot(path=str(ARTIFACTS / "dashboard-dark.png"))


# Mean brightness of the drawn pixels of a chart's value axis (its text, in a translucent theme colour).
AXIS_BRIGHTNESS = """(figure) => {
  const c = document.querySelector(figure + " canvas");
  if (!c) return -1;
  const d = c.getContext('2d').getImageData(0, 0, Math.round(50 * devicePixelRatio), c.height).data;
  let sum = 0, n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 50) { sum += (d[i] + d[i + 1] + d[i + 2]) / 3; n++; }
  return n ? sum / n : -1;
}"""


def axis_brightness(page, figure: str) -> float:
    return page.evaluate(AXIS_BRIGHTNESS, figure)


def wait_for_light_axis(page, figure: str) -> None:
    """On a dark theme: the chart's axis text is drawn light (its canvas was redrawn in the theme's colours)."""
    page.wait_for_function(f"(f) => ({AXIS_BRIGHTNESS})(f) > 150", arg=figure, timeout=15_000)


@contextlib.contextmanager
def dark_theme(page):
    """JupyterLab Dark within the same lab session (the command a user runs from Settings › Theme), then Light again."""
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
    page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=30_000)
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        yield
    finally:
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
        page.locator("body[data-jp-theme-light='true']").wait_for(state="attached", timeout=30_000)
        page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=30_000)


def test_the_dashboard_comes_back_with_the_layout(page, server):
    open_notebook(page, server, "train.ipynb")
    open_dashboard(page)
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=60_000)
    page.wait_for_timeout(1_500)  # the layout is saved shortly after it changes
    page.goto(server.url("train.ipynb").replace("&reset", ""))
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=90_000)
    # It comes back as the tab beside the notebook's; it draws once shown.
    page.evaluate("window.jupyterapp.shell.activateById('pathways-dashboard-area')")
    page.locator(f"{DASHBOARD} canvas").nth(3).wait_for(state="attached", timeout=10_000)
    assert page.locator(f"{DASHBOARD} canvas").count() >= 4


def test_per_chip_utilization_of_one_slice_on_demand(page, server):
    open_notebook(page, server, "train.ipynb")
    open_dashboard(page)
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=60_000)
    chips = page.locator(f"{DASHBOARD} figure[aria-label^='Utilization per chip']")
    assert chips.is_hidden(), "no slice chosen: no per-chip chart"
    page.wait_for_timeout(10_000)  # the kernel keeps per-chip history at 1 Hz meanwhile
    page.get_by_label("Per-chip utilization of").select_option("0")
    chips.wait_for(state="visible", timeout=10_000)
    legend = chips.locator(".u-legend")
    for chip in range(4):
        legend.filter(has_text=f"chip {chip}").wait_for(timeout=10_000)
    assert "chip 4" not in legend.inner_text(), "only slice 0's chips"
    # The kernel's past seconds of those chips (chip_history, 1 Hz) are there at once, not only frames from now on.
    points = page.evaluate(
        "() => [...window.jupyterapp.shell.widgets('main')].find(w => w.id === 'pathways-dashboard-area')"
        ".content.data.chips().data[0].length"
    )
    assert points >= 8, f"{points} points right after choosing the slice"


def test_the_dashboard_follows_a_console_too(page, server):
    open_notebook(page, server, "train.ipynb")
    open_dashboard(page)
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=60_000)
    header = page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-header")
    header.filter(has_text="Following train.ipynb").wait_for()
    page.evaluate("window.jupyterapp.commands.execute('console:create', {kernelPreference: {name: 'pathways'}})")
    # The console's tab is in front of the dashboard's now: its header is attached, not shown.
    header.filter(has_text="Following Console").wait_for(state="attached", timeout=60_000)
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=90_000)
    assert "embedded:2x4" in header.inner_text()


# In the dashboard, or in its own tab once opened there.
LOSS_CHART = "figure.jp-PathwaysDashboard-metric[data-metric='loss']"
GOODPUT_CHART = "figure[data-chart='goodput']"
INTERVAL_STEP_TIME = "figure[data-chart='goodput-step-time']"


def run_cell_at(page, index: int) -> None:
    """Run cell ``index`` of the notebook (made the active tab first) from its editor, as a user would."""
    page.evaluate(
        "() => { const app = window.jupyterapp;"
        " const w = [...app.shell.widgets('main')].find(w => w.title.label === 'loss.ipynb'); app.shell.activateById(w.id); }"
    )
    page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").nth(index).click()
    page.keyboard.press("Shift+Enter")


def loss_points(page) -> int:
    return int(page.locator(LOSS_CHART).get_attribute("data-points") or 0)


# The values the loss chart draws for its first run (uPlot's data, smoothed as shown).
DRAWN_LOSS = (
    "Array.from([...window.jupyterapp.shell.widgets('main')].find(w => w.id === 'pathways-dashboard-area')"
    ".content._metricCharts.get('loss').data[1])"
)


def drawn_loss(page) -> list:
    return page.evaluate(f"() => {DRAWN_LOSS}")


def test_the_loss_curve_grows_while_an_elastic_cell_runs_and_marks_the_recovery(page, server):
    open_notebook(page, server, "loss.ipynb")
    page.locator("#pathways-monitor[data-state='live']").wait_for(state="attached", timeout=60_000)
    run_first_cell(page, "setup done")
    run_cell_at(page, 1)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='busy']").first.wait_for(timeout=10_000)
    open_dashboard(page)
    page.set_viewport_size({"width": 1024, "height": 700})

    # The curve appears while the cell runs, and grows.
    page.locator(LOSS_CHART).wait_for(timeout=60_000)
    page.wait_for_function(
        f'() => Number(document.querySelector("{LOSS_CHART}")?.dataset.points) >= 10', timeout=60_000
    )
    first = loss_points(page)
    page.wait_for_function(
        f'() => Number(document.querySelector("{LOSS_CHART}").dataset.points) > {first}', timeout=30_000
    )
    assert page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status") == "busy"

    # The slice loss and the reshard that recovered the run, on the curve's step axis.
    for kind in ("slice_down", "reshard"):
        page.locator(f"{LOSS_CHART} .jp-PathwaysDashboard-marker[data-kind='{kind}']:not([hidden])").first.wait_for(
            timeout=90_000
        )
    down = page.locator(f"{LOSS_CHART} .jp-PathwaysDashboard-marker[data-kind='slice_down']").first
    assert 40 <= int(down.get_attribute("data-step")) <= 50, down.get_attribute("data-step")
    page.locator(LOSS_CHART).scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-loss-1024.png"))

    # When the run ends, its goodput over time: each interval stacked by category, and its step time.
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
        state="attached", timeout=180_000
    )
    goodput = page.locator(f"{GOODPUT_CHART}[data-intervals='50']")
    goodput.wait_for(timeout=30_000)
    legend = goodput.locator(".u-legend").inner_text()
    assert "productive" in legend and "recovery" in legend, legend
    title = page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-goodput h3")
    assert title.inner_text().startswith("Goodput over time: run "), title.inner_text()
    first_run = title.inner_text()
    read_interval(page, GOODPUT_CHART, "productive")
    read_interval(page, INTERVAL_STEP_TIME, "mean ")
    goodput.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "dashboard-goodput-1024.png"))

    # Smoothing changes the drawn curve: raw at 0, TensorBoard's EMA at 0.9.
    smoothing = page.get_by_role("slider", name="Smoothing")
    smoothing.focus()
    page.keyboard.press("Home")  # 0: the raw values
    page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-smoothing output", has_text="0.00").wait_for()
    raw = drawn_loss(page)
    page.evaluate(f"() => {{ window.rawLoss = JSON.stringify({DRAWN_LOSS}); }}")
    page.keyboard.press("End")  # 0.99
    page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-smoothing output", has_text="0.99").wait_for()
    page.wait_for_function(f"() => JSON.stringify({DRAWN_LOSS}) !== window.rawLoss", timeout=10_000)
    smooth = drawn_loss(page)
    assert len(raw) == len(smooth) and raw[0] == pytest.approx(smooth[0])

    def wiggle(values: list) -> float:
        return sum(abs(b - a) for a, b in zip(values[5:], values[6:], strict=False) if a is not None and b is not None)

    assert wiggle(smooth) < 0.5 * wiggle(raw), "smoothing takes out the step-to-step noise"

    # Against wall time: seconds since the run started, read out as such; then back to steps.
    page.get_by_label("X axis").select_option("wall")
    page.locator(f"{LOSS_CHART}[data-axis='wall']").wait_for(state="attached", timeout=5_000)
    wall = page.evaluate(f"() => Array.from({DRAWN_X})")
    assert len(wall) == loss_points(page) and 0 <= wall[0] < wall[-1] < 120, wall[-3:]
    assert any(x != int(x) for x in wall), "seconds, not steps"
    page.locator(f"{LOSS_CHART} [role='img']").focus()
    page.keyboard.press("End")
    readout = page.locator(f"{LOSS_CHART} .jp-PathwaysDashboard-readout")
    page.wait_for_function(
        "(el) => /^\\d+\\.\\d+ s · /.test(el.textContent)", arg=readout.element_handle(), timeout=5_000
    )
    page.get_by_label("X axis").select_option("step")
    page.locator(f"{LOSS_CHART}[data-axis='step']").wait_for(state="attached", timeout=5_000)

    with dark_theme(page):
        wait_for_light_axis(page, LOSS_CHART)
        # The chart in its own tab, from its button.
        page.locator(LOSS_CHART).get_by_role("button", name="Open loss in its own tab").click()
        tab = page.locator("#pathways-chart-metric_loss")
        tab.locator(LOSS_CHART).wait_for(timeout=10_000)
        page.locator(".lm-DockPanel .lm-TabBar-tab", has_text="loss · Pathways").wait_for(timeout=5_000)
        assert page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-tabNote[data-chart='metric:loss']").is_visible()
        # A second run of the loop overlays the first, one line each, and the tab grows while it runs.
        run_cell_at(page, 2)
        tab.locator(f"{LOSS_CHART}[data-runs='2']").wait_for(state="attached", timeout=120_000)
        # Its steps are among the first run's: count the second run's own points.
        second = f"{DRAWN_X.replace('data[0]', 'data[2]')}.filter(v => v !== null).length"
        page.wait_for_function(f"() => {second} >= 1", timeout=60_000)
        grown = page.evaluate(f"() => {second}")
        page.wait_for_function(f"() => {second} > {grown}", timeout=30_000)
        assert page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status") == "busy"
        for kind in ("slice_down", "reshard"):
            assert tab.locator(f".jp-PathwaysDashboard-marker[data-kind='{kind}']:not([hidden])").count() >= 1, kind
        legend = page.locator(f"{LOSS_CHART} .u-legend").inner_text()
        assert len(re.findall(r"run 'w' \(cell \d+\) · loss", legend)) == 2, legend
        wait_for_light_axis(page, LOSS_CHART)
        page.screenshot(path=str(ARTIFACTS / "dashboard-loss-1024-dark.png"))

        # From the keyboard: Tab reaches the chart, the arrow keys move the readout step by step.
        plot = page.locator(f"{LOSS_CHART} [role='img']")
        plot.focus()
        assert page.evaluate("() => document.activeElement.closest('figure')?.dataset.metric") == "loss"
        readout = page.locator(f"{LOSS_CHART} .jp-PathwaysDashboard-readout")
        page.keyboard.press("End")
        readout.filter(has_text="step 159").wait_for(timeout=5_000)
        page.keyboard.press("ArrowLeft")
        readout.filter(has_text="step 158").wait_for(timeout=5_000)
        page.keyboard.press("Home")
        readout.filter(has_text="step 0 ").wait_for(timeout=5_000)

        # The second run's goodput replaces the first's, drawn in the dark theme's colours.
        page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
            state="attached", timeout=180_000
        )
        page.wait_for_function(
            "([el, t]) => el.textContent !== t", arg=[title.element_handle(), first_run], timeout=30_000
        )
        # The dashboard is a tab beside the notebook's: the user goes back to it.
        page.evaluate("window.jupyterapp.shell.activateById('pathways-dashboard-area')")
        wait_for_light_axis(page, GOODPUT_CHART)
        read_interval(page, GOODPUT_CHART, "productive")
        page.locator(GOODPUT_CHART).scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "dashboard-goodput-1024-dark.png"))

        # The kernel goes: the chart's tab closes and the chart is back in the dashboard.
        page.evaluate(
            "() => [...window.jupyterapp.shell.widgets('main')].find(w => w.title.label === 'loss.ipynb')"
            ".sessionContext.shutdown()"
        )
        tab.wait_for(state="detached", timeout=30_000)
        page.locator(f"{DASHBOARD} {LOSS_CHART}").wait_for(state="attached", timeout=5_000)
    page.set_viewport_size({"width": 1400, "height": 900})


def read_interval(page, figure: str, expect: str) -> None:
    """Focus an interval chart: End reads the last interval out, ArrowLeft the one before."""
    page.locator(f"{figure} [role='img']").focus()
    readout = page.locator(f"{figure} .jp-PathwaysDashboard-readout")
    page.keyboard.press("End")
    readout.filter(has_text=expect).wait_for(timeout=5_000)
    last = readout.inner_text()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("([el, t]) => el.textContent !== t", arg=[readout.element_handle(), last], timeout=5_000)


# The x values the loss chart draws (steps, or seconds since each run started).
DRAWN_X = (
    "[...window.jupyterapp.shell.widgets('main')].find(w => w.id === 'pathways-dashboard-area')"
    ".content._metricCharts.get('loss').data[0]"
)


DASHBOARD_WIDGET = "[...window.jupyterapp.shell.widgets('main')].find(w => w.id === 'pathways-dashboard-area').content"


def test_memory_scales_to_the_data_and_the_legend_fits_one_row_at_1024(page, server):
    page.set_viewport_size({"width": 1024, "height": 700})
    open_notebook(page, server, "memory.ipynb")
    page.locator("#pathways-monitor[data-state='live']").wait_for(state="attached", timeout=60_000)
    run_first_cell(page, "allocated 32 MiB")
    open_dashboard(page)
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=30_000)

    memory_line_well_above_zero(page)
    memory = page.locator(MEMORY_CHART)
    memory.scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-memory-1024.png"))
    # % of capacity: a percentage axis.
    memory.get_by_role("checkbox", name="% of capacity").check()
    page.wait_for_function(f"() => {{ const r = {DASHBOARD_WIDGET}._memory.yRange; return r && r[1] === 100; }}")
    memory.get_by_role("checkbox", name="% of capacity").uncheck()

    # The event kinds are one row: a menu, routine kinds (snapshot, compile) off until asked for.
    summary = legend_in_one_row(page)
    summary.click()
    assert not page.get_by_role("checkbox", name="snapshot").is_checked()
    assert not page.get_by_role("checkbox", name="compile").is_checked()
    assert page.get_by_role("checkbox", name="slice_down").is_checked()
    page.keyboard.press("Escape")
    page.get_by_role("checkbox", name="snapshot").wait_for(state="hidden", timeout=5_000)

    arrow_keys_move_the_legend(page)

    # Any chart in its own tab from the command palette too; closing the tab puts it back.
    page.locator(f"{UTILIZATION} [role='img']").focus()
    page.keyboard.press("Control+Shift+c")
    page.locator(".lm-CommandPalette-input").fill("Open Chart")
    page.locator(".lm-CommandPalette-item", has_text="Pathways: Open Chart “Memory used vs capacity” in a Tab").click()
    tab = page.locator(".lm-DockPanel .lm-TabBar-tab", has_text="Memory used vs capacity · Pathways")
    tab.wait_for(timeout=10_000)
    page.locator(f"#pathways-chart-memory {MEMORY_CHART.removeprefix(DASHBOARD + ' ')} canvas").wait_for()
    tab.locator(".lm-TabBar-tabCloseIcon").click()
    page.locator(MEMORY_CHART).wait_for(timeout=5_000)

    with dark_theme(page):
        wait_for_light_axis(page, MEMORY_CHART)
        memory_line_well_above_zero(page)
        legend_in_one_row(page)
        arrow_keys_move_the_legend(page)
        memory.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "dashboard-memory-1024-dark.png"))
    page.set_viewport_size({"width": 1400, "height": 900})


MEMORY_CHART = f"{DASHBOARD} figure[aria-label^='Memory used vs capacity']"


def memory_line_well_above_zero(page) -> None:
    """The 32 MiB line is well above zero: the axis runs to the data, not to the 64 GiB emulated capacity."""
    page.wait_for_function(
        f"() => {{ const d = {DASHBOARD_WIDGET}; const r = d._memory.yRange; const m = d.data.memory().data;"
        " const used = Math.max(...m.slice(1, -1).map(c => c[c.length - 1] ?? 0));"
        " return r && used >= 32 * 2**20 && used / r[1] > 0.5; }",
        timeout=30_000,
    )


def legend_in_one_row(page):
    """The event-marker menu's summary is one line of text inside the dashboard; returns it."""
    summary = page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-filter summary")
    box = summary.bounding_box()
    font = page.evaluate(
        "() => parseFloat(getComputedStyle(document.querySelector('.jp-PathwaysDashboard-filter summary')).fontSize)"
    )
    assert box["height"] < 2.5 * font, (box, font)  # one line of text (two would be over 2.5 font sizes)
    dashboard = page.locator(DASHBOARD).bounding_box()
    assert box["x"] + box["width"] <= dashboard["x"] + dashboard["width"], (box, dashboard)
    return summary


def arrow_keys_move_the_legend(page) -> None:
    """The time charts read from the keyboard too: the legend follows the arrow keys."""
    utilization = page.locator(UTILIZATION)
    utilization.locator("[role='img']").focus()
    page.keyboard.press("End")
    legend = utilization.locator(".u-legend")
    page.wait_for_function(
        "(el) => /\\d\\d:\\d\\d:\\d\\d/.test(el.innerText)", arg=legend.element_handle(), timeout=5_000
    )
    before = legend.inner_text()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("([el, t]) => el.innerText !== t", arg=[legend.element_handle(), before], timeout=5_000)
