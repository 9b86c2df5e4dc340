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

import lab as labtools
import pytest
from test_browser import ARTIFACTS, open_notebook, run_first_cell, run_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

TAB = "#pathways-xprof"

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
    with labtools.browser(tmp_path_factory.mktemp("chromium")) as ctx:
        page = ctx.new_page()
        page.set_default_timeout(60_000)
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
    pages = len(page.context.pages)
    button.click()
    tab = page.locator(f"{TAB} iframe")
    tab.wait_for(state="attached", timeout=60_000)
    # A JupyterLab tab, not a new browser page, and it points at our run.
    assert len(page.context.pages) == pages
    assert "run=" + run.replace("/", "%2F") in tab.get_attribute("src")
    frame = page.frame_locator(f"{TAB} iframe")
    frame.get_by_text(re.compile(re.escape(run.split("/")[-1]))).first.wait_for(timeout=90_000)
    for _ in range(180):  # 90 s
        if any(status == 200 for status in trace_data):
            break
        page.wait_for_timeout(500)
    assert 200 in trace_data, f"trace viewer data requests: {trace_data}"
    page.wait_for_timeout(2_000)  # let the trace viewer draw for the screenshot
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "xprof.png"))

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
    src = page.locator(f"{TAB} iframe").get_attribute("src")
    runs = sorted(p.name for p in (server.root / "profiles").glob("*/plugins/profile/*"))
    assert runs and f"{runs[-1]}&tag=trace_viewer" in src, src


def test_xprof_opens_split_right_of_the_notebook_at_a_usable_width(page, server):
    """Beside the notebook (half the main area), not in the narrowest slot."""
    page.set_viewport_size({"width": 1024, "height": 700})
    page.evaluate("window.jupyterapp.commands.execute('pathways:open-monitor')")
    page.get_by_role("button", name="Latest profile in XProf").click()
    tab = page.locator(TAB)
    tab.wait_for()
    main = page.locator("#jp-main-dock-panel").bounding_box()
    box = tab.bounding_box()
    assert box["width"] >= 0.4 * main["width"], (box, main)
    # The notebook stays in view, left of XProf.
    notebook = page.evaluate(
        "() => { const w = [...window.jupyterapp.shell.widgets('main')].find(w => w.title.label === 'profile.ipynb');"
        " const r = w.node.getBoundingClientRect(); return {visible: w.isVisible, x: r.x, width: r.width}; }"
    )
    assert notebook["visible"] and box["x"] >= notebook["x"] + notebook["width"] - 10, (box, notebook)
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
