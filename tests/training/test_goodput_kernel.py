"""Goodput in a real `pathways` kernel (jupyter_client): the notebook's idle time
between cells, and `%pathways goodput` / `%%pathways elastic` as a user runs them."""

import re
import time

import pytest
from kernels import EMBEDDED, SERVER

# Accounting ratios of cells timed in wall seconds: run with the machine to themselves.
pytestmark = [pytest.mark.kernel, pytest.mark.serial]

# Kernels run on the product default, a local Pathways server (conftest._backend).
KERNEL_BACKEND = SERVER

SETUP = """
import time
import jax, jax.numpy as jnp
import pathways_kernel as pw
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = pw.mesh()
w = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P()))
"""


def test_idle_time_between_cells_is_the_notebooks_own_badput_apart_from_training(kernel):
    assert kernel.run(SETUP).status == "ok"
    reply = kernel.run("""
for x in pw.steps([jnp.ones((8, 64))] * 20, name="cell-loop"):
    jnp.tanh(x @ w).block_until_ready()
    time.sleep(0.01)
idle_before = pw.goodput().idle_s
""")
    assert reply.status == "ok", reply.error
    time.sleep(1.5)  # the user reads the output: slices held, no work
    reply = kernel.run("print(round(pw.goodput().idle_s - idle_before, 2))")
    assert reply.status == "ok", reply.error
    assert 1.4 <= float(reply.text.strip()) <= 3.0

    shown = kernel.run("%pathways goodput")
    assert shown.status == "ok", shown.error
    assert "steps 'cell-loop': goodput" in shown.text
    assert "notebook: idle between cells with slices held" in shown.text
    # The training figure is the run's own: the idle second is not in it.
    run = kernel.run("print(pw.goodput('cell-loop').goodput > 0.5)")
    assert run.text.strip() == "True", kernel.run("print(pw.goodput('cell-loop'))").text


def test_an_elastic_cell_ends_with_a_goodput_event_and_an_unknown_run_is_one_line(kernel):
    assert kernel.run(SETUP).status == "ok"
    assert kernel.run("params = {'w': w}").status == "ok"
    reply = kernel.run("""%%pathways elastic --steps 12 --state params --snapshot-every 4
params = {'w': params['w'] * 0.99}
time.sleep(0.01)
""")
    assert reply.status == "ok", reply.error
    event = kernel.run("print(pw.events(kind='goodput')[-1].detail)")
    assert "elastic 'params': goodput" in event.text and "12 steps" in event.text
    shown = kernel.run("%pathways goodput --run params")
    assert "elastic 'params'" in shown.text and "ml-goodput-measurement: goodput" in shown.text
    missing = kernel.run("%pathways goodput --run nope")
    assert "PathwaysError: no run named 'nope'" in missing.error
    assert "Traceback" not in missing.error


def test_goodput_cloud_logging_from_the_magic_is_refused_on_the_embedded_backend_in_one_line(kernel):
    reply = kernel.run("%pathways goodput --cloud-logging my-job")
    assert "Cloud Logging of goodput is for Pathways on GKE" in reply.error, reply.error
    assert "Traceback" not in reply.error and len(reply.error.strip().splitlines()) == 1
    off = kernel.run("%pathways goodput --cloud-logging off")
    assert off.status == "ok" and "Cloud Logging off" in off.text
    shown = kernel.run("%pathways goodput --help")
    assert "--cloud-logging JOB|off" in shown.text


FIRST_RUN = """
import threading
from pathways_kernel.state import host_copy

def hold_copier(seconds):  # a run's first copy queues behind, as a large state's copy takes a while
    release = threading.Event()
    for _ in range(2):
        host_copy._COPIER.submit(release.wait, 10.0)
    threading.Timer(seconds, release.set).start()

def timed_run(name):
    began = time.perf_counter()
    try:
        get_ipython().run_cell_magic('pathways', f'elastic --steps 10 --state {name} --snapshot-every 5', f'{name} = {name} + 1')
    except Exception as error:
        print(type(error).__name__)
    cell_s = time.perf_counter() - began
    run = pw.goodput(name)
    print('accounted', round(run.wall_s / cell_s, 3), 'stall', round(run.seconds['snapshot_stall'], 2))

first = jax.device_put(jnp.ones((8, 64)), NamedSharding(mesh, P('data')))
second = jax.device_put(jnp.ones((8, 64)), NamedSharding(mesh, P('data')))
third = jax.device_put(jnp.ones((8, 64)), NamedSharding(mesh, P('data')))
"""


def accounted_and_stall(text: str) -> tuple[float, float]:
    found = re.search(r"accounted ([0-9.]+) stall ([0-9.]+)", text)
    assert found, text
    return float(found[1]), float(found[2])


@pytest.mark.backend(EMBEDDED)
def test_a_kernels_first_elastic_run_accounts_for_the_whole_cell_and_its_first_snapshot(fresh_kernel):
    """Embedded for now: on the local server the magic's own work around the run (~0.15-0.2 s of a
    1.3 s cell under CI's load: accounted 0.855 in one clean-clone run) is not yet inside the run's
    wall time; on the embedded backend it is within 5 %."""
    assert fresh_kernel.run(SETUP + FIRST_RUN).status == "ok"
    # The kernel's first run imports for a while before its first step (its first copy meanwhile).
    reply = fresh_kernel.run("hold_copier(1.0)\ntimed_run('first')")
    assert reply.status == "ok", reply.error
    accounted, _stall = accounted_and_stall(reply.text)
    assert accounted >= 0.95, reply.text
    # The next run's first copy takes 1 s: its first step waits for it.
    reply = fresh_kernel.run("hold_copier(1.0)\ntimed_run('second')")
    assert reply.status == "ok", reply.error
    accounted, stall = accounted_and_stall(reply.text)
    assert accounted >= 0.95 and stall >= 0.8, reply.text
    # A slice lost while that copy is made: its time is still all accounted for. On the embedded backend
    # the run cannot start (ElasticError); on the local server the copy sometimes completes before the
    # server drops the slice, and the run then recovers from it (seen both ways).
    reply = fresh_kernel.run("hold_copier(1.0)\nthreading.Timer(0.3, pw.fail_slice, (1,)).start()\ntimed_run('third')")
    try:
        assert reply.status == "ok", reply.error
        assert "ElasticError" in reply.text or "10 steps in" in reply.text and "1 recovery" in reply.text, reply.text
        accounted, stall = accounted_and_stall(reply.text)
        assert accounted >= 0.95 and stall >= 0.2, reply.text
    finally:
        fresh_kernel.run("%pathways repair 1")


def test_goodput_over_time_is_a_stacked_chart_under_the_cell_and_bad_windows_are_one_line(kernel):
    assert kernel.run(SETUP).status == "ok"
    reply = kernel.run("""
for step in pw.steps(range(40), name="charted"):
    jnp.tanh(w @ w).block_until_ready()
    time.sleep(0.2 if step == 30 else 0.01)
""")
    assert reply.status == "ok", reply.error
    # The cell's number as the notebook shows it (In [n]), from the kernel's execute_input.
    cell = next(m["content"]["execution_count"] for m in reply.messages if m["header"]["msg_type"] == "execute_input")

    shown = kernel.run("%pathways goodput --over-time --intervals 6")
    assert shown.status == "ok", shown.error
    bundle = shown.data[-1]
    html, text = bundle["text/html"], bundle["text/plain"]
    assert html.count("<svg") == 1 and "var(--jp-" in html and "productive steps" in html
    assert re.match(rf"run 'charted' \(steps, cell \[{cell}\], 1 attempt, [\d:.]+-[\d:.]+ UTC, [\d.]+ s\)", text)
    assert len(re.findall(r"\n\s+\d+\.\d\d-\s*\d+\.\d\d s", text)) == 6, text
    assert re.search(
        r"step time: median [\d.]+ ms, .* over 39 steps; slowest: (step \d+ [\d.]+ ms, )?step 30 2\d\d\.\d ms", text
    ), text
    report = kernel.run("%pathways goodput --run charted --no-field")
    assert report.text.startswith(f"run 'charted' (steps, cell [{cell}], 1 attempt, "), report.text
    assert re.search(r"slowest: (step \d+ [\d.]+ ms, )?step 30 ", report.text), report.text

    for bad, message in (
        ("--window nan", "window_s must be a finite number of seconds above 0, got nan"),
        ("--window -1", "window_s must be a finite number of seconds above 0, got -1.0"),
        ("--window 0", "window_s must be a finite number of seconds above 0, got 0.0"),
        ("--window 1e12", "window 1e+12 s is longer than run 'charted'"),
        ("--intervals 0", "intervals must be from 1 to 1000, got 0"),
        ("--intervals 100000000", "intervals must be from 1 to 1000, got 100000000"),
        ("--run nope", "no run named 'nope' in this session"),
    ):
        refused = kernel.run(f"%pathways goodput --over-time {bad}")
        assert refused.status == "error" and message in refused.error, (bad, refused.error)
        assert "Traceback" not in refused.error and len(refused.error.strip().splitlines()) == 1, refused.error


def test_the_monitor_gets_each_finished_runs_intervals_and_a_new_comm_the_newest(kernel):
    import json

    from comm_frontend import Frontend
    from comm_frontend import is_comm_msg as _is

    from pathways_kernel.monitoring import protocol as p

    assert kernel.run(SETUP).status == "ok"
    frontend = Frontend(kernel)
    comm = frontend.open()
    assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=60) is not None
    since = len(frontend.inbox)
    frontend.kc.execute("""
for step in pw.steps(range(30), name="published"):
    jnp.tanh(w @ w).block_until_ready()
    time.sleep(0.15 if step == 20 else 0.01)
""")  # not kernel.run: it would take the comm messages
    msg = frontend.wait_for(
        lambda m: _is(m, comm, "goodput_intervals") and m["content"]["data"]["run"] == "published", 60, since
    )
    assert msg is not None, "no goodput_intervals when the run ended"
    data = msg["content"]["data"]
    json.dumps(data, allow_nan=False)
    n = p.GOODPUT_INTERVALS
    assert data["kind"] == "steps" and data["header"].startswith("run 'published' (steps, cell [")
    assert data["categories"][0] == "productive" and len(data["categories"]) == 10
    assert all(len(data[k]) == n for k in ("start_s", "end_s", "goodput", "steps", "step_time_mean_s"))
    assert data["end_s"][-1] == data["wall_s"] and sum(data["steps"]) == 29
    widths = [b - a for a, b in zip(data["start_s"], data["end_s"], strict=True)]
    totals = [sum(data["seconds"][c][i] for c in data["categories"]) for i in range(n)]
    assert all(abs(t - w) <= 0.02 * max(widths) for t, w in zip(totals[:-1], widths[:-1], strict=True)), totals
    slowest = {s["step"]: s["seconds"] for s in data["step_time"]["slowest"]}
    assert slowest.get(20, 0) >= 0.15, slowest  # the first step, compiling, may be slower still

    again = frontend.open()
    replayed = frontend.wait_for(lambda m: _is(m, again, "goodput_intervals"), timeout=60)
    assert replayed is not None and replayed["content"]["data"] == data
