"""Profile a cell in a real JupyterLab and read it in XProf, in a JupyterLab tab.

The Jupyter server runs jupyter-server-proxy, which starts XProf
(``pathways_kernel.profiling.xprof_server``) on the first request to
``/xprof/`` behind the server's token; the kernel writes under the same
profile root XProf serves.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import lab as labtools
import pytest
from test_browser import ARTIFACTS, open_notebook, run_first_cell, run_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

TAB = "#pathways-xprof"
# XProf drew the trace after ~40 s on a loaded 2-core machine; the tab gives up at 120 s (XPROF_BOUND_S).
XPROF_SHOWN_MS = 150_000
# Every status line the XProf tab shows, with its state, in order (polled every 50 ms from before the click).
RECORD_STATUS = """() => {
  window.__xprofStatus = [];
  window.setInterval(() => {
    const view = document.querySelector('#pathways-xprof .jp-PathwaysXprof');
    if (view === null) return;
    const entry = [view.querySelector('.jp-PathwaysXprof-status').textContent, view.dataset.state];
    const last = window.__xprofStatus[window.__xprofStatus.length - 1];
    if (!last || last[0] !== entry[0] || last[1] !== entry[1]) window.__xprofStatus.push(entry);
  }, 50);
}"""

SETUP = """import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
m = pw.mesh()
x = jax.device_put(jnp.ones((512, 512)), NamedSharding(m, P("data", "model")))

@jax.jit
def train_step(x):
    return jnp.tanh(x @ x.T) * 0.5
print("setup done")"""

PROFILE = """%%pathways profile --name loop
for _ in range(20):
    x = train_step(x)
x.block_until_ready();"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    labtools.notebook(root / "profile.ipynb", [SETUP, PROFILE])
    labtools.notebook(root / "other.ipynb", ['print("other ready")'])
    lab = labtools.Lab(root, env={"PATHWAYS_PROFILE_DIR": str(root / "profiles")})
    yield lab
    lab.stop()
    # jupyter-server-proxy stops XProf with the server.
    assert not xprof_pids(lab), "XProf outlived the Jupyter server"


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    with labtools.page_of(tmp_path_factory) as page:
        yield page


def xprof_pids(server) -> set[str]:
    """Our XProf server processes started under this Lab's profile root."""
    found = subprocess.run(["pgrep", "-f", "pathways_kernel.profiling.xprof_server"], capture_output=True, text=True)
    return {
        pid
        for pid in found.stdout.split()
        if str(server.root) in Path(f"/proc/{pid}/environ").read_text(errors="replace")
    }


def xprof_listeners(server, flags: str) -> list[str]:
    """Listening sockets of those processes (``ss`` ``-Hltnp``: TCP, ``-Hlxp``: Unix)."""
    out = subprocess.run(["ss", flags], capture_output=True, text=True).stdout
    pids = xprof_pids(server)
    column = 4 if "x" in flags else 3
    return [line.split()[column] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


def test_open_in_xprof_shows_the_captured_run_and_its_trace(page, server):
    open_notebook(page, server, "profile.ipynb")
    # Not awaited: the command's promise settles only when every cell has run.
    run_all = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
    button = page.locator(".jp-OutputArea-output a.pathways-open-xprof", has_text="Open in XProf")
    run_until(page, lambda: page.evaluate(run_all), button, seconds=120, artifact="xprof-failure.png")
    summary = page.locator(".jp-OutputArea-output .pathways-profile").inner_text()
    assert "profile loop" in summary and "jit_train_step" in summary, summary
    run = button.get_attribute("data-pathways-xprof-run")
    assert run and run.endswith("-loop")

    trace_data: list[int] = []
    page.on(
        "response",
        lambda r: (
            trace_data.append(r.status)
            if "/xprof/data/plugin/profile/data" in r.url and "trace_viewer" in r.url
            else None
        ),
    )
    # At the size, the file browser open as a newcomer has it.
    page.set_viewport_size({"width": 1280, "height": 800})
    page.evaluate("window.jupyterapp.commands.execute('filebrowser:activate')")
    lab_url = page.url
    # What the tab says while XProf loads, recorded in the page (a quiet machine may load it in a few seconds).
    page.evaluate(RECORD_STATUS)
    pages = len(page.context.pages)
    button.click()
    page.locator(f"{TAB} .jp-PathwaysXprof[data-state='shown']").wait_for(timeout=XPROF_SHOWN_MS)
    tab = page.locator(f"{TAB} iframe.jp-PathwaysXprof-frame")
    # A JupyterLab tab, not a new browser page, and it points at our run.
    assert len(page.context.pages) == pages
    assert "run=" + run.replace("/", "%2F") in tab.get_attribute("src")
    page.wait_for_function("window.__xprofStatus.at(-1)?.[1] === 'shown'", timeout=5_000)
    seen = page.evaluate("window.__xprofStatus")
    assert any(state == "loading" and re.search(r"XProf \(run .+\)… \d+ s", text) for text, state in seen), seen
    assert seen[-1][1] == "shown", seen

    # In the main area, a tab of the notebook's tab bar, at the main area's width.
    where = page.evaluate(
        "() => { const s = window.jupyterapp.shell; const x = [...s.widgets('main')].find(w => w.id === 'pathways-xprof');"
        " const nb = [...s.widgets('main')].find(w => w.title.label === 'profile.ipynb');"
        " return {main: !!x, current: s.currentWidget?.id, sameBar: !!nb && x.parent === nb.parent}; }"
    )
    assert where == {"main": True, "current": "pathways-xprof", "sameBar": True}, where
    box = page.locator(TAB).bounding_box()
    assert box["width"] > 1000, box

    # The trace is drawn at the tab's width, XProf's tool drawer closed.
    xprof = page.frame_locator(f"{TAB} iframe").frame_locator("#xprof")
    xprof.get_by_text(re.compile(re.escape(run.split("/")[-1]))).first.wait_for(state="attached")
    assert xprof.locator("mat-sidenav.mat-drawer-opened").count() == 0
    viewer = xprof.locator("iframe[src*='trace_viewer_index.html']")
    assert viewer.bounding_box()["width"] > 900, viewer.bounding_box()
    # Its processes unfolded (Expand All): the threads' rows under each process, where XLA's ops run.
    trace_frame = next(f for f in page.frames if "trace_viewer_index.html" in f.url)
    trace_frame.wait_for_function(
        # A plain loop: the trace viewer's web components polyfill makes its node lists unspreadable.
        "() => { const ps = document.getElementsByClassName('process-track-base');"
        " for (let i = 0; i < ps.length; i++) { if (!ps[i].expanded) return false; } return ps.length > 0; }",
        timeout=10_000,
    )
    for _ in range(180):  # 90 s
        if any(status == 200 for status in trace_data):
            break
        page.wait_for_timeout(500)
    assert 200 in trace_data, f"trace viewer data requests: {trace_data}"
    # XProf rewrites its parent's address as it navigates (?run=...&tag=trace_viewer@...): never the
    # lab's. (The lab itself shows /lab/tree/NOTEBOOK for a document and /lab for another tab.)
    assert urlsplit(page.url).query == urlsplit(lab_url).query == "", (page.url, lab_url)
    assert urlsplit(page.url).path in ("/lab", urlsplit(lab_url).path), (page.url, lab_url)

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "xprof-1280-light.png"))
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.wait_for_timeout(500)  # the trace viewer redraws at the new width
    page.screenshot(path=str(ARTIFACTS / "xprof-1920-light.png"))
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    page.screenshot(path=str(ARTIFACTS / "xprof-1920-dark.png"))
    page.set_viewport_size({"width": 1280, "height": 800})
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "xprof-1280-dark.png"))
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached")
    page.set_viewport_size({"width": 1400, "height": 900})

    # XProf listens on its private Unix socket only: no TCP port (no gRPC worker port either),
    # so only the Jupyter server reaches it (tests/profiling/test_xprof_access.py tries as nobody).
    assert xprof_listeners(server, "-Hltnp") == []
    sockets = xprof_listeners(server, "-Hlxp")
    assert len(sockets) == 1 and (Path(sockets[0]).parent.stat().st_mode & 0o777) == 0o700, sockets


def test_panel_lists_the_capture_and_its_button_opens_the_latest(page, server):
    page.evaluate("window.jupyterapp.commands.execute('pathways:open-monitor')")
    event = page.locator("#pathways-monitor li.jp-PathwaysPanel-event[data-kind='profile']").first
    event.wait_for(timeout=30_000)
    assert "loop ->" in event.inner_text()
    page.get_by_role("button", name="Latest profile in XProf").click()
    runs = sorted(p.name for p in (server.root / "profiles").glob("*/plugins/profile/*"))
    assert runs
    # The frame gets its address once XProf answers (it is already running).
    frame = page.locator(f"{TAB} iframe[src*='{runs[-1]}&tag=trace_viewer']")
    frame.wait_for(state="attached", timeout=30_000)


def test_xprof_opens_as_a_tab_of_the_notebook_with_room_for_the_trace(page, server):
    """As a document opens: a tab beside the notebook's, over the main area, sidebars folded to make room."""
    page.set_viewport_size({"width": 1024, "height": 700})
    # Both sidebars open (the file browser and the Pathways panel): the notebook's area is ~450 px.
    page.evaluate("window.jupyterapp.shell.activateById('filebrowser'); window.jupyterapp.shell.expandRight()")
    page.wait_for_function(
        "() => !window.jupyterapp.shell.leftCollapsed && !window.jupyterapp.shell.rightCollapsed"
        " && document.getElementById('jp-main-dock-panel').getBoundingClientRect().width < 700",
        timeout=10_000,
    )
    # What the panel's button runs (test above).
    page.evaluate("window.jupyterapp.commands.execute('pathways:open-xprof')")
    tab = page.locator(TAB)
    tab.wait_for()
    # Lumino lays the folded sidebars out on its next frame.
    page.wait_for_function(
        "() => { const tab = document.getElementById('pathways-xprof').getBoundingClientRect().width;"
        " const main = document.getElementById('jp-main-dock-panel').getBoundingClientRect().width;"
        " return tab >= 0.95 * main && main >= 900; }",
        timeout=10_000,
    )
    main = page.locator("#jp-main-dock-panel").bounding_box()
    box = tab.bounding_box()
    assert box["width"] >= 0.95 * main["width"] and main["width"] >= 900, (box, main)
    page.screenshot(path=str(ARTIFACTS / "xprof-1024.png"))
    page.set_viewport_size({"width": 1400, "height": 900})


def test_latest_profile_of_a_kernel_without_captures_says_so_and_opens_nothing(page, server):
    """The followed kernel has no capture: its message, never another notebook's capture."""
    page.evaluate("window.jupyterapp.shell.widgets('main').find(w => w.id === 'pathways-xprof')?.dispose()")
    open_notebook(page, server, "other.ipynb")
    run_first_cell(page, "other ready")
    page.evaluate("window.jupyterapp.commands.execute('pathways:open-monitor')")
    page.locator("#pathways-monitor .jp-PathwaysPanel-following", has_text="other.ipynb").wait_for()
    page.locator("#pathways-monitor[data-state='live']").wait_for(state="attached", timeout=60_000)
    page.get_by_role("button", name="Latest profile in XProf").click()
    page.get_by_text("no capture in this kernel yet").first.wait_for(timeout=30_000)
    assert page.locator(TAB).count() == 0
