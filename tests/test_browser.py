"""The Pathways panel in a real JupyterLab, driven through Debian's Chromium.

One JupyterLab server per module (see lab.py); each test opens its own page.
"""

from __future__ import annotations

import glob
import time
from pathlib import Path

import lab as labtools
import pytest

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
PANEL = "#pathways-monitor"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    labtools.notebook(
        root / "monitor.ipynb",
        [
            "import jax.numpy as jnp\nx = jnp.ones((8, 256))\nprint('cell ran', x.shape)",
            "import time\ntime.sleep(20)\nprint('slept')",
        ],
    )
    labtools.notebook(root / "plain.ipynb", ["print('plain python')"], kernel="python3")
    lab = labtools.Lab(root)
    yield lab
    lab.stop()


@pytest.fixture(scope="module")
def context(server, tmp_path_factory):
    with labtools.browser(tmp_path_factory.mktemp("chromium")) as ctx:
        yield ctx


@pytest.fixture
def page(context):
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    page.close()


def open_notebook(page, server, name: str) -> None:
    page.goto(server.url(name))
    page.locator(".jp-Notebook .jp-Cell").first.wait_for()
    # The kernel is up once the toolbar's status says idle.
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=90_000)


def run_first_cell(page, expect: str) -> None:
    page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click()
    page.keyboard.press("Shift+Enter")
    page.locator(".jp-OutputArea-output", has_text=expect).first.wait_for(timeout=90_000)


def open_monitor(page, palette: bool = False) -> None:
    """Run "Pathways: Open Monitor": typed into the command palette, or through the app's command registry."""
    if palette:
        # The modal palette closes on blur: the notebook must hold the focus first.
        page.locator(".jp-Notebook .jp-InputArea-editor").first.click()
        page.keyboard.press("Control+Shift+c")
        page.locator(".lm-CommandPalette-input").fill("Pathways: Open Monitor")
        page.locator(".lm-CommandPalette-item[data-command='pathways:open-monitor']").click()
    else:
        page.evaluate("window.jupyterapp.commands.execute('pathways:open-monitor')")
    page.locator(PANEL).wait_for(state="visible")


def test_panel_shows_slices_and_a_failed_slice_live(page, server):
    open_notebook(page, server, "monitor.ipynb")
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=60_000)
    run_first_cell(page, "cell ran (8, 256)")
    open_monitor(page, palette=True)
    # ready, kernelChanged and currentChanged all fired: still exactly one comm for this page.
    assert live_monitor_comms(server) == 1

    canvas = page.locator(f"{PANEL} canvas.jp-PathwaysPanel-canvas[data-slices='2'][data-chips='8']")
    canvas.wait_for(timeout=30_000)
    assert canvas.get_attribute("aria-label") == "2 slices × 4 chips"
    assert page.locator(f"{PANEL} [data-field='slices']").inner_text().endswith("2/2 up")
    assert page.locator(f"{PANEL} .jp-PathwaysPanel-slice").count() == 2
    page.locator(".jp-PathwaysStatus", has_text="Pathways 2/2 slices").wait_for()
    # Hovering the first chip cell of slice 0 names the chip.
    canvas.hover(position={"x": 8, "y": 20})
    tooltip = page.locator(f"{PANEL} .jp-PathwaysPanel-tooltip")
    tooltip.wait_for()
    tip = tooltip.inner_text()
    assert "chip 0 · slice 0" in tip and "coords (0, 0, 0)" in tip and "utilization" in tip and "memory" in tip, tip

    page.get_by_role("button", name="fail slice 1").click()
    clicked = time.monotonic()
    page.locator(f"{PANEL} .jp-PathwaysPanel-slice[data-slice='1'][data-state='down']").wait_for(timeout=2_000)
    page.locator(f"{PANEL} li.jp-PathwaysPanel-event[data-kind='slice_down']").first.wait_for(timeout=2_000)
    seen_after = time.monotonic() - clicked
    assert seen_after <= 2.0, f"slice_down shown {seen_after:.2f} s after the click"
    page.locator(f"{PANEL} canvas[data-down='1']").wait_for(timeout=2_000)
    newest = page.locator(f"{PANEL} li.jp-PathwaysPanel-event").first
    assert newest.get_attribute("data-kind") == "slice_down"
    assert "[0,1] → [0]" in newest.inner_text()
    page.locator(".jp-PathwaysStatus", has_text="Pathways 1/2 slices").wait_for(timeout=5_000)
    page.get_by_role("button", name="restore slice 1").wait_for()

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "monitor.png"))

    page.get_by_role("button", name="restore slice 1").click()
    page.locator(f"{PANEL} .jp-PathwaysPanel-slice[data-slice='1'][data-state='up']").wait_for(timeout=10_000)
    assert page.locator(f"{PANEL} li.jp-PathwaysPanel-event").first.get_attribute("data-kind") == "slice_up"

    # The canvas follows the theme: its background is JupyterLab's, light or dark.
    canvas = page.locator(f"{PANEL} canvas.jp-PathwaysPanel-canvas")
    corner = "c => Array.from(c.getContext('2d').getImageData(c.width - 1, 0, 1, 1).data.slice(0, 3))"
    assert sum(canvas.evaluate(corner)) > 3 * 200
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
    page.wait_for_function(
        f"() => {{ const c = document.querySelector('{PANEL} canvas.jp-PathwaysPanel-canvas');"
        " const [r, g, b] = c.getContext('2d').getImageData(c.width - 1, 0, 1, 1).data; return r + g + b < 3 * 80; }",
        timeout=10_000,
    )
    page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "monitor-dark.png"))
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")


def test_the_panel_acts_while_a_cell_runs(page, server):
    """Requests go over the comm's kernel subshell, so a busy main shell does not hold them."""
    open_notebook(page, server, "monitor.ipynb")
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=60_000)
    open_monitor(page)
    page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").nth(1).click()
    page.keyboard.press("Shift+Enter")
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='busy']").first.wait_for(timeout=10_000)
    page.get_by_role("button", name="fail slice 1").click()
    page.locator(f"{PANEL} .jp-PathwaysPanel-slice[data-slice='1'][data-state='down']").wait_for(timeout=2_000)
    page.get_by_role("button", name="restore slice 1").click()
    page.locator(f"{PANEL} .jp-PathwaysPanel-slice[data-slice='1'][data-state='up']").wait_for(timeout=2_000)
    # Both answered while the 20 s cell was still running.
    assert page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status") == "busy"
    assert page.locator(".jp-OutputArea-output", has_text="slept").count() == 0


def test_a_plain_python_notebook_gets_a_friendly_message(page, server):
    open_notebook(page, server, "plain.ipynb")
    open_monitor(page)
    page.locator(f"{PANEL}[data-state='not-pathways']").wait_for(timeout=30_000)
    message = page.locator(f"{PANEL} .jp-PathwaysPanel-message")
    assert "not a Pathways kernel" in message.inner_text()
    assert page.locator(f"{PANEL} .jp-PathwaysPanel-body").is_hidden()


def test_the_panel_reconnects_after_a_kernel_restart(page, server):
    open_notebook(page, server, "monitor.ipynb")
    open_monitor(page)
    page.locator(f"{PANEL} canvas[data-slices='2'][data-down='']").wait_for(timeout=60_000)
    page.evaluate("window.jupyterapp.shell.currentWidget.sessionContext.restartKernel()")
    page.locator(f"{PANEL}[data-state='connecting']").wait_for(state="attached", timeout=30_000)
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=90_000)
    page.locator(f"{PANEL} li.jp-PathwaysPanel-event[data-kind='connect']").first.wait_for(timeout=30_000)
    # The restarted kernel has only this page's new comm.
    assert live_monitor_comms(server) == 1


def live_monitor_comms(server) -> int:
    """Comms on `pathways.monitor` open in the notebook's kernel, asked of the kernel itself."""
    from jupyter_client import BlockingKernelClient

    (kernel,) = [k for k in server.get("sessions") if k["path"].endswith("monitor.ipynb")]
    (connection_file,) = glob.glob(f"{server.env['JUPYTER_RUNTIME_DIR']}/kernel-{kernel['kernel']['id']}.json")
    client = BlockingKernelClient(connection_file=connection_file)
    client.load_connection_file()
    client.start_channels()
    try:
        reply = client.comm_info(target_name="pathways.monitor", reply=True, timeout=30)
        return len(reply["content"]["comms"])
    finally:
        client.stop_channels()


def test_reloading_the_page_20_times_keeps_live_comms_bounded(page, server):
    open_notebook(page, server, "monitor.ipynb")
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=30_000)
    for _ in range(20):
        page.reload()
        page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=60_000)
    live = live_monitor_comms(server)
    # The kernel keeps at most MAX_COMMS (8) and closes stale ones; without that, 21.
    assert 1 <= live <= 8, f"{live} live monitor comms after 20 reloads"


KERNEL_STATUS = "#jp-main-statusbar .jp-StatusBar-TextItem[title^='Change kernel for']"


def test_the_status_bar_stays_busy_while_the_panel_acts_during_a_cell(page, server):
    """Monitor traffic (ping, fail/restore, snapshot) on its subshell never shows the kernel Idle mid-cell."""
    open_notebook(page, server, "monitor.ipynb")
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=60_000)
    open_monitor(page)
    page.locator(KERNEL_STATUS, has_text="Idle").wait_for(timeout=30_000)
    page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").nth(1).click()
    page.keyboard.press("Shift+Enter")
    page.locator(KERNEL_STATUS, has_text="Busy").wait_for(timeout=10_000)
    # Sampled in the page every 250 ms until the cell's output appears (the cell is over then).
    page.evaluate(
        """selector => {
            window.__pwStatus = [];
            window.__pwSampler = setInterval(() => {
                const slept = [...document.querySelectorAll('.jp-OutputArea-output')].some(o => o.textContent.includes('slept'));
                if (!slept) window.__pwStatus.push(document.querySelector(selector)?.textContent ?? '');
            }, 250);
        }""",
        KERNEL_STATUS,
    )
    started = time.monotonic()
    page.get_by_role("button", name="fail slice 1").click()
    page.locator(f"{PANEL} .jp-PathwaysPanel-slice[data-slice='1'][data-state='down']").wait_for(timeout=5_000)
    page.get_by_role("button", name="restore slice 1").click()
    page.locator(f"{PANEL} .jp-PathwaysPanel-slice[data-slice='1'][data-state='up']").wait_for(timeout=5_000)
    page.get_by_role("button", name="Snapshot now").click()
    result = page.locator(f"{PANEL} .jp-PathwaysPanel-actionResult")
    page.wait_for_function(
        "el => el.textContent.startsWith('Snapshot') && !el.textContent.startsWith('Snapshotting')",
        arg=result.element_handle(),
        timeout=10_000,
    )
    assert time.monotonic() - started < 15, "the panel's requests waited for the cell"
    # The cell runs 20 s: at least one 15 s ping falls inside it.
    page.locator(".jp-OutputArea-output", has_text="slept").wait_for(timeout=40_000)
    samples = page.evaluate("() => { clearInterval(window.__pwSampler); return window.__pwStatus; }")
    assert len(samples) >= 40, f"only {len(samples)} samples during a 20 s cell"
    not_busy = [(i * 0.25, s) for i, s in enumerate(samples) if not s.endswith("| Busy")]
    assert not not_busy, f"status bar not Busy during the cell at (s, text): {not_busy[:5]}"
    assert samples[0].startswith("Pathways (JAX)")
    page.locator(KERNEL_STATUS, has_text="Idle").wait_for(timeout=10_000)


@pytest.fixture(scope="module")
def no_backend_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-no-backend")
    labtools.notebook(root / "nobackend.ipynb", ["%pathways connect local:2x4"])
    lab = labtools.Lab(root, env={"PATHWAYS_BACKEND": "proxy:grpc://127.0.0.1:1"})
    yield lab
    lab.stop()


def test_the_panel_explains_a_kernel_without_a_backend(page, no_backend_server):
    open_notebook(page, no_backend_server, "nobackend.ipynb")
    open_monitor(page)
    page.locator(f"{PANEL}[data-state='no-backend']").wait_for(state="attached", timeout=60_000)
    message = page.locator(f"{PANEL} .jp-PathwaysPanel-message").inner_text()
    assert message.startswith("No backend: ConnectError: cannot connect to grpc://127.0.0.1:1"), message
    assert "Run %pathways connect local:2x4 in a cell, or fix the target" in message, message
    assert page.locator(f"{PANEL} .jp-PathwaysPanel-body").is_hidden()
    # Doing what it says brings the panel live on the same comm.
    run_first_cell(page, "local:2x4")
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=30_000)
    page.locator(f"{PANEL} canvas[data-slices='2'][data-chips='8']").wait_for(timeout=30_000)
    assert page.locator(f"{PANEL} .jp-PathwaysPanel-message").is_hidden()
