"""The Pathways dashboard (main area) in a real JupyterLab, driven through Debian's Chromium.

An elastic loop trains in the notebook; the dashboard is opened while it runs,
and the notebook itself loses slice 1 partway through.
"""

from __future__ import annotations

import lab as labtools
import pytest
from test_browser import ARTIFACTS, open_notebook

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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-dashboard")
    labtools.notebook(root / "train.ipynb", [TRAIN])
    lab = labtools.Lab(root)
    yield lab
    lab.stop()


@pytest.fixture
def page(server, tmp_path_factory):
    with labtools.browser(tmp_path_factory.mktemp("chromium")) as context:
        page = context.new_page()
        page.set_default_timeout(60_000)
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
    assert "Following train.ipynb · local:2x4" in page.locator(f"{DASHBOARD} .jp-PathwaysDashboard-header").inner_text()
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
    x = marker_x(page)
    plot = page.locator(f"{UTILIZATION} .u-over").bounding_box()
    page.mouse.move(x, plot["y"] + plot["height"] / 2)
    readout = page.locator(f"{UTILIZATION} .jp-PathwaysDashboard-readout")
    readout.filter(has_text="slice_down").wait_for(timeout=5_000)
    assert "slices [0,1] → [0]" in readout.inner_text()
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

    # The kind filter is made of real checkboxes.
    box = page.get_by_role("checkbox", name="slice_down")
    box.uncheck()
    page.locator(LOSS).wait_for(state="detached", timeout=5_000)
    box.check()
    page.locator(LOSS).first.wait_for(timeout=5_000)

    # Axis text follows the theme: dark on light, light on dark (the canvas is redrawn on a theme change).
    assert 0 <= axis_brightness(page) < 100
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
    page.wait_for_function(f"() => ({AXIS_BRIGHTNESS})() > 150", timeout=10_000)
    page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "dashboard-dark.png"))
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")


# Mean brightness of the drawn pixels of the utilization chart's value axis (its text, in a translucent theme colour).
AXIS_BRIGHTNESS = f"""() => {{
  const c = document.querySelector("{UTILIZATION} canvas");
  const d = c.getContext('2d').getImageData(0, 0, Math.round(50 * devicePixelRatio), c.height).data;
  let sum = 0, n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 50) {{ sum += (d[i] + d[i + 1] + d[i + 2]) / 3; n++; }}
  return n ? sum / n : -1;
}}"""


def axis_brightness(page) -> float:
    return page.evaluate(AXIS_BRIGHTNESS)


def test_the_dashboard_comes_back_with_the_layout(page, server):
    open_notebook(page, server, "train.ipynb")
    open_dashboard(page)
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=60_000)
    page.wait_for_timeout(1_500)  # the layout is saved shortly after it changes
    page.goto(server.url("train.ipynb").replace("&reset", ""))
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=90_000)
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
    header.filter(has_text="Following Console").wait_for(timeout=60_000)
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=90_000)
    assert "local:2x4" in header.inner_text()
