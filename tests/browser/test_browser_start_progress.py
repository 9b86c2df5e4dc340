"""A fresh kernel's start, as JupyterLab shows it (issue #31 item 1), through Debian's Chromium.

The kernel connects before its local Pathways server is up and says how far the server is:
the panel and the status bar show "starting the local Pathways server (2 slices x 4 chips)"
with the step and the seconds, and a cell run meanwhile shows a line that counts the seconds
it waits, gone once the server is up. The server is held at its start by a gate file (a
``sitecustomize``, as in tests/kernel/test_start_progress.py), so the window is there on a
quiet machine too. Screenshots: test-artifacts/start-progress-*.png.
"""

from __future__ import annotations

import os

import lab as labtools
import pytest
from test_browser import ARTIFACTS, PANEL, open_monitor, open_notebook

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

GATE_ENV = "PATHWAYS_TEST_SERVER_GATE"
SITECUSTOMIZE = f"""
import os, sys, time
if "pathways_kernel.server" in sys.orig_argv and "serve" in sys.orig_argv and os.environ.get("{GATE_ENV}"):
    _deadline = time.monotonic() + 90
    while not os.path.exists(os.environ["{GATE_ENV}"]) and time.monotonic() < _deadline:
        time.sleep(0.05)
"""
STATUS = ".jp-PathwaysStatus"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-start")
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    gate = site / "open"
    labtools.notebook(root / "start.ipynb", ["import jax\nprint('devices', len(jax.devices()))"])
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    # The product default (the tests' own is embedded:2x4).
    lab = labtools.Lab(root, env={"PATHWAYS_BACKEND": "local:2x4", "PYTHONPATH": path, GATE_ENV: str(gate)})
    lab.gate = gate
    yield lab
    gate.touch()
    lab.stop()


@pytest.fixture
def page(server, tmp_path_factory):
    with labtools.page_of(tmp_path_factory, viewport=(1280, 800)) as page:
        yield page


def shoot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"start-progress-{name}.png"))


def test_the_panel_the_status_bar_and_an_early_cell_say_the_server_is_starting(page, server):
    open_notebook(page, server, "start.ipynb")
    open_monitor(page)
    # From the kernel itself: what it starts, the step and the seconds, in the panel and the status bar.
    page.locator(f"{PANEL}[data-state='starting']").wait_for(state="attached", timeout=60_000)
    message = page.locator(f"{PANEL} .jp-PathwaysPanel-message")
    message.filter(has_text="Starting the local Pathways server (2 slices x 4 chips)… launching (0/4)").wait_for()
    status = page.locator(f"{STATUS}[data-state='starting']")
    status.filter(has_text="Pathways: starting server · launching (0/4)").wait_for()
    first = int(status.inner_text().rsplit("·", 1)[1].split()[0])
    page.locator(STATUS, has_text=f"· {first + 1} s").wait_for(timeout=10_000)  # it counts the seconds
    # A cell run now waits under a line that counts the seconds.
    page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click()
    page.keyboard.press("Shift+Enter")
    waiting = page.locator(".jp-OutputArea-output", has_text="waiting for the local Pathways server to start (")
    waiting.wait_for(timeout=30_000)
    shoot(page, "waiting-1280-light")
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
    waiting.wait_for()
    shoot(page, "waiting-1920-dark")
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached", timeout=30_000)
    page.set_viewport_size({"width": 1280, "height": 800})
    server.gate.touch()
    # Once the server is up: the line goes, the cell runs, the panel and the status bar show the slices.
    page.locator(".jp-OutputArea-output", has_text="devices 8").wait_for(timeout=120_000)
    waiting.wait_for(state="detached", timeout=10_000)
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=60_000)
    page.locator(STATUS, has_text="Pathways 2/2 slices").wait_for(timeout=30_000)
    shoot(page, "ready-1280-light")
