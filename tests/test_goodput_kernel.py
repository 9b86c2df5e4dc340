"""Goodput in a real `pathways` kernel (jupyter_client): the notebook's idle time
between cells, and `%pathways goodput` / `%%pathways elastic` as a user runs them."""

import time

import pytest

pytestmark = pytest.mark.kernel

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
    assert run.text.strip() == "True"


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
