""" "Run All" with the Pathways panel and dashboard open, in a real JupyterLab through Debian's Chromium.

The monitor talks to the kernel the whole time (metrics pushed twice a second to two
views, liveness every 15 s); none of it may cost an execution or the kernel's Busy.
"""

from __future__ import annotations

import json

import lab as labtools
import pytest
from test_browser import ARTIFACTS, PANEL, clear_outputs, open_monitor, open_notebook, wait_for_kernel

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

DASHBOARD = "#pathways-dashboard"
CELLS = 10
ROUNDS = 20
#: Every this many rounds the page is loaded again first.
RELOAD_EVERY = 5
# Each cell counts its own runs in the kernel, and takes long enough for monitor traffic to fall inside it.
SOURCE = "import time\ntime.sleep(0.1)\nn{i} = globals().get('n{i}', 0) + 1\nprint('cell {i} run', n{i})"

# What the notebook's own kernel connection sends and receives, as JupyterLab sees it.
RECORD = """() => {
    const nb = window.jupyterapp.shell.widgets('main').find(w => w.title.label === 'runall.ipynb');
    const kernel = nb.sessionContext.session.kernel;
    window.__pwLog = [];
    kernel.anyMessage.connect((_, {msg, direction}) => {
        const type = msg.header.msg_type;
        if (['status', 'execute_request', 'execute_reply'].includes(type)) {
            window.__pwLog.push({
                direction, type,
                state: msg.content.execution_state ?? msg.content.status ?? '',
                parentType: msg.parent_header?.msg_type ?? '',
                id: type === 'execute_request' ? msg.header.msg_id : (msg.parent_header?.msg_id ?? ''),
            });
        }
    });
}"""

# Settled: no cell waits for its execution any more and the kernel is idle.
SETTLED = """() => {
    const nb = window.jupyterapp.shell.widgets('main').find(w => w.title.label === 'runall.ipynb');
    const cells = [...nb.content.model.cells];
    return nb.sessionContext.session.kernel.status === 'idle'
        && cells.every(c => c.executionState !== 'running');
}"""

CELL_STATE = """() => {
    const nb = window.jupyterapp.shell.widgets('main').find(w => w.title.label === 'runall.ipynb');
    return [...nb.content.model.cells].map(c => ({
        count: c.executionCount,
        outputs: [...Array(c.outputs.length).keys()].map(k => (c.outputs.get(k).toJSON().text ?? '').toString()),
    }));
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-runall")
    labtools.notebook(root / "runall.ipynb", [SOURCE.format(i=i) for i in range(CELLS)])
    lab = labtools.Lab(root)
    yield lab
    lab.stop()


@pytest.fixture
def page(server, tmp_path_factory):
    with labtools.page_of(tmp_path_factory) as page:
        yield page


def untracked(page) -> set[str]:
    """The request types whose status JupyterLab does not take as the kernel's (the server's list)."""
    raw = page.evaluate("() => document.getElementById('jupyter-config-data').textContent")
    return set(json.loads(raw).get("untracked_message_types", []))


def test_run_all_twenty_times_with_the_panel_and_dashboard_open_runs_every_cell_once_busy_throughout(page, server):
    open_notebook(page, server, "runall.ipynb")
    open_monitor(page)
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=90_000)
    page.evaluate("window.jupyterapp.commands.execute('pathways:open-dashboard')")
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached", timeout=90_000)
    page.wait_for_timeout(1_500)  # the layout is saved shortly after it changes
    ignored = untracked(page)

    problems: list[str] = []
    for round_ in range(1, ROUNDS + 1):
        if round_ % RELOAD_EVERY == 1:
            # Run All at once after a page load, while the panel and the dashboard attach again.
            page.goto(server.url("runall.ipynb").replace("&reset", ""))
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            wait_for_kernel(page)
            page.evaluate(RECORD)
        clear_outputs(page)
        start = page.evaluate("() => window.__pwLog.length")
        # Not awaited: the command's promise settles only when every cell has run.
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        page.wait_for_function(SETTLED, timeout=240_000)
        cells = page.evaluate(CELL_STATE)
        log = page.evaluate(f"() => window.__pwLog.slice({start})")
        found = check_round(round_, cells, log, ignored)
        if found and not problems:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "run-all-failure.png"))
            (ARTIFACTS / "run-all-failure.json").write_text(json.dumps(log, indent=1))
        problems += found
    # Both views were there throughout, live.
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached")
    page.locator(f"{DASHBOARD}[data-state='live']").wait_for(state="attached")
    assert not problems, "\n".join(problems)


def check_round(round_: int, cells: list[dict], log: list[dict], ignored: set[str]) -> list[str]:
    """What went wrong in one "Run All": a cell not run exactly once, or a status JupyterLab took as the kernel's between its cells."""
    problems = []
    ran = [c["outputs"] for c in cells]
    if ran != [[f"cell {i} run {round_}\n"] for i in range(CELLS)]:
        problems.append(f"round {round_}: outputs {ran}")
    counts = [c["count"] for c in cells]
    if None in counts or counts != list(range(counts[0], counts[0] + CELLS)):
        problems.append(f"round {round_}: prompts {counts}")
    requests = [m["id"] for m in log if m["type"] == "execute_request"]
    replies = [(m["id"], m["state"]) for m in log if m["type"] == "execute_reply"]
    if len(requests) != CELLS or replies != [(r, "ok") for r in requests]:
        problems.append(f"round {round_}: sent {len(requests)} execute_requests, replies {replies}")
    # Busy throughout: of the statuses JupyterLab takes as the kernel's, from the first cell's
    # busy to the last cell's idle, every idle is followed at once by a busy of a cell
    # (the next one's, or the running one's again after another request's idle).
    shown = [(m["state"], m["parentType"]) for m in log if m["type"] == "status" and m["parentType"] not in ignored]
    ids = [m["id"] for m in log if m["type"] == "status" and m["parentType"] not in ignored]
    if requests and requests[0] in ids and requests[-1] in ids:
        first = ids.index(requests[0])
        last = len(ids) - 1 - ids[::-1].index(requests[-1])
        window = shown[first : last + 1]
        gaps = [
            (i, window[i - 1 : i + 2])
            for i, (state, _) in enumerate(window[:-1])
            if state == "idle" and window[i + 1] != ("busy", "execute_request")
        ]
        pairs = sum(s == ("idle", "execute_request") for s in window)
        if gaps or pairs != CELLS or window[-1] != ("idle", "execute_request"):
            problems.append(f"round {round_}: not busy throughout: {gaps or window}")
    else:
        problems.append(f"round {round_}: no status of its first and last cell reached the page")
    return problems
