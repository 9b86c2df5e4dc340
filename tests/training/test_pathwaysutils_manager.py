"""Code written the pathwaysutils way runs unchanged on the embedded backend.

The training loop below is what pathwaysutils' ``Manager.elastic_retry``
documents (and MaxText's elastic_train does): a ``Manager()`` over
``jax.devices()``, a function retried on slice loss, a mesh over the active
slices, state resumed from the last host copy, and a ``ScaleUpSignalError``
once the monitor reports a slice back. Nothing in it knows about
pathways_kernel; only the fault injection (``pw.fail_slice``/``pw.repair_slice``)
does.
"""

from __future__ import annotations

import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pathways_kernel as pw

STEPS = 30
BATCH = 64


def run_elastic_training(on_step=lambda step, manager: None):
    """The user's program. Returns (final params, active slices of each attempt)."""
    from pathwaysutils.elastic import elastic
    from pathwaysutils.elastic import manager as elastic_manager

    manager = elastic_manager.Manager()
    attempts: list[frozenset[int]] = []
    host_state = {"step": 0, "params": {"w": np.zeros((8, 1), np.float32), "b": np.zeros((1,), np.float32)}}

    def batch(step):
        rng = np.random.default_rng(step)
        x = rng.normal(size=(BATCH, 8)).astype(np.float32)
        return x, (x @ np.arange(1, 9, dtype=np.float32)[:, None] + 0.5)

    @jax.jit
    def train_step(params, x, y):
        def loss_fn(p):
            return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=60)
    def train():
        active = sorted(manager.active_slice_indices)
        attempts.append(frozenset(active))
        devices = [d for i in active for d in manager.slice_to_devices[i]]
        mesh = Mesh(np.array(devices).reshape(len(active), -1), ("data", "model"))
        data = NamedSharding(mesh, P(("data", "model")))
        replicated = NamedSharding(mesh, P())
        params = jax.device_put(host_state["params"], replicated)
        for step in range(host_state["step"], STEPS):
            if manager.available_inactive_slices:
                raise elastic_manager.ScaleUpSignalError()
            x, y = (jax.device_put(a, data) for a in batch(step))
            params, loss = train_step(params, x, y)
            float(loss)  # raises JaxRuntimeError (DATA_LOSS) once a slice of the mesh is lost
            host_state.update(step=step + 1, params=jax.device_get(params))
            on_step(step, manager)
        return host_state["params"]

    assert elastic.get_active_slice_indices() == {0, 1}
    return train(), attempts


def test_manager_sees_the_embedded_slices(local_session):
    from pathwaysutils.elastic import elastic
    from pathwaysutils.elastic import manager as elastic_manager

    manager = elastic_manager.Manager()
    assert {i: [d.id for d in ds] for i, ds in manager.slice_to_devices.items()} == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    assert manager.active_slice_indices == {0, 1}
    pw.fail_slice(1)
    assert elastic.get_active_slice_indices(manager.slice_to_devices) == {0}
    with pytest.raises(TimeoutError):
        elastic.wait_for_slices(2, poll_interval=0.05, timeout=0.2, slice_to_devices=manager.slice_to_devices)
    pw.repair_slice(1)
    assert elastic.wait_for_slices(2, poll_interval=0.05, timeout=5) == {0, 1}


def test_elastic_retry_loop_survives_a_loss_and_scales_up(local_session):
    expected, clean_attempts = run_elastic_training()
    assert clean_attempts == [{0, 1}]

    def inject(step, manager):
        if step == 7:
            pw.fail_slice(1)
        if step == 15 and 1 in manager.inactive_slice_indices:
            pw.repair_slice(1)
            # The repair is seen by the Manager's own monitor thread.
            deadline = time.monotonic() + 10
            while not manager.available_inactive_slices and time.monotonic() < deadline:
                time.sleep(0.01)

    final, attempts = run_elastic_training(inject)

    assert attempts == [{0, 1}, {0}, {0, 1}]
    np.testing.assert_allclose(final["w"], expected["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(final["b"], expected["b"], rtol=1e-5, atol=1e-6)


def test_manager_works_when_pathwaysutils_is_imported_after_the_session_starts():
    # As in a fresh kernel: the backend is active before the notebook imports pathwaysutils.
    code = (
        "import sys, pathways_kernel as pw\n"
        "pw.session().topology\n"
        "assert 'pathwaysutils' not in sys.modules\n"
        "from pathwaysutils.elastic import manager\n"
        "print(sorted(manager.Manager().active_slice_indices))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 1]"


def test_pathwaysutils_helper_follows_the_backend(local_session):
    from pathwaysutils.elastic import elastic

    class Device:
        slice_index = 3

    device = Device()
    assert elastic.get_slice_to_devices([device]) == {3: [device]}
    assert elastic.get_slice_to_devices(jax.devices()).keys() == {0, 1}
    session = pw.connect("embedded:1x8", force=True)
    try:
        assert elastic.get_slice_to_devices(jax.devices()).keys() == {0}
        session.backend.close()  # what switching to a proxy backend does first
        with pytest.raises(AttributeError):  # CPU devices have no slice_index
            elastic.get_slice_to_devices(jax.devices())
    finally:
        pw.connect("embedded:2x4", force=True)
    assert elastic.get_slice_to_devices(jax.devices()).keys() == {0, 1}
