"""The local Pathways server, driven by JAX's own proxy client.

Each test starts ``pathways-local`` (a real process owning 2 slices x 4 CPU
devices) and one client process running this file as a script with
``JAX_PLATFORMS=proxy`` + ``pathwaysutils.initialize()``: JAX, pathwaysutils and
their proxy client exactly as a Pathways user runs them, with no hook of ours in
the client's JAX. The client prints one JSON object; the test reads what the
user would have seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import proxy_clients
import pytest

from pathways_kernel.backends import server_client

HERE = os.path.abspath(__file__)
STEPS = 20
BATCH = 64
# A copy big enough to take a while on any machine (about 1 s at 500 MiB/s), small enough
# for a shared one. Streams past 2 GiB go through the same code, but would need ~8 GiB here.
BIG = 512 << 20


def run_client(mode: str, target: str, *args: str, timeout: float = 240, env=None, prefix=()) -> dict:
    return proxy_clients.run_client(HERE, target, mode, target, *args, timeout=timeout, env=env, prefix=prefix)


@pytest.fixture
def server():
    started = server_client.start(2, 4)
    yield started
    started.stop()


# ---- the programs the client runs -------------------------------------------------


def batch(step: int):
    rng = np.random.default_rng(step)
    x = rng.normal(size=(BATCH, 8)).astype(np.float32)
    return x, (np.tanh(x @ np.arange(1, 9, dtype=np.float32)[:, None] / 8) + 0.5).astype(np.float32)


def initial_params():
    rng = np.random.default_rng(0)
    return {
        "w1": rng.normal(size=(8, 16)).astype(np.float32) * 0.3,
        "b1": np.zeros((16,), np.float32),
        "w2": rng.normal(size=(16, 1)).astype(np.float32) * 0.3,
    }


def train_data_parallel(devices, steps: int = STEPS):
    """Data-parallel MLP training with donated parameters; returns host params and losses."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    data = NamedSharding(mesh, P(("data", "model")))
    replicated = NamedSharding(mesh, P())

    def loss_fn(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    @jax.jit
    def step_fn(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), loss

    step_fn = jax.jit(step_fn, donate_argnums=0)
    params = jax.device_put(initial_params(), replicated)
    losses = []
    for step in range(steps):
        x, y = (jax.device_put(a, data) for a in batch(step))
        old = params
        params, loss = step_fn(params, x, y)
        losses.append(float(loss))
    donated = all(a.is_deleted() for a in jax.tree.leaves(old))
    return {k: np.asarray(v) for k, v in params.items()}, losses, donated


def client_basics(target: str, out_path: str) -> dict:
    import jax
    import jax.numpy as jnp
    import pathwaysutils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    result: dict = {
        "slice_indices": [d.slice_index for d in jax.devices()],
        "coords": [list(d.coords) for d in jax.devices()],
        "pathways": pathwaysutils.is_pathways_backend_used(),
        "arange": (jnp.arange(8.0) + 1).tolist(),
    }
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    x = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    xs = jax.device_put(x, NamedSharding(mesh, P("data", "model")))
    product = jax.jit(lambda a: a @ a.T + 1.0)(xs)
    result["sharded_equal"] = bool(np.allclose(np.asarray(product), x @ x.T + 1.0))
    result["sharded_spec"] = str(product.sharding.spec)
    other = Mesh(np.array(jax.devices()[4:]), ("d",))
    moved = jax.device_put(xs, NamedSharding(other, P("d")))
    result["moved_equal"] = bool(np.array_equal(np.asarray(moved), x))
    result["moved_devices"] = sorted(d.id for d in moved.sharding.device_set)
    gone = jnp.ones(4) * 3
    gone.block_until_ready()
    gone.delete()
    result["deleted"] = gone.is_deleted()
    result["flops"] = jax.jit(lambda a: a @ a).lower(xs).compile().cost_analysis().get("flops", 0.0)
    params, losses, donated = train_data_parallel(jax.devices())
    result["losses"] = losses
    result["donated"] = donated
    np.savez(out_path, **params)
    return result


def client_reference(out_path: str) -> dict:
    """The same training in plain CPU JAX with 8 devices, in this process."""
    import jax

    params, losses, _ = train_data_parallel(jax.devices())
    np.savez(out_path, **params)
    return {"losses": losses}


def client_slice_loss(target: str) -> dict:
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from pathwaysutils.elastic import elastic

    devices = jax.devices()
    slice0 = Mesh(np.array(devices[:4]), ("d",))
    both = Mesh(np.array(devices).reshape(2, 4), ("s", "d"))
    slice1 = Mesh(np.array(devices[4:]), ("d",))
    a0 = jax.device_put(np.arange(8.0), NamedSharding(slice0, P("d")))
    a01 = jax.device_put(np.arange(8.0), NamedSharding(both, P(("s", "d"))))
    a1 = jax.device_put(np.arange(8.0), NamedSharding(slice1, P("d")))
    double = jax.jit(lambda a: a * 2)
    double(a0).block_until_ready()

    def attempt(fn) -> dict:
        try:
            value = fn()
            return {"ok": np.asarray(value).tolist()}
        except jax.errors.JaxRuntimeError as error:
            return {"error": str(error).splitlines()[0], "slice_down": elastic.is_error_due_to_slice_down(error)}

    result: dict = {"health_before": sorted(elastic.get_active_slice_indices())}
    cli = [sys.executable, "-m", "pathways_kernel.server"]
    failed = subprocess.run([*cli, "fail", "1", "--server", target], capture_output=True, text=True, timeout=60)
    result["fail_cli"] = [failed.returncode, failed.stderr.strip()]
    result["read_a01"] = attempt(lambda: a01)
    result["read_a01_again"] = attempt(lambda: a01)
    result["jit_a01"] = attempt(lambda: double(a01))
    result["read_a1"] = attempt(lambda: a1)
    result["read_a0"] = attempt(lambda: a0)
    result["jit_a0"] = attempt(lambda: double(a0))
    result["new_on_slice1"] = attempt(lambda: jax.device_put(np.ones(4), NamedSharding(slice1, P("d"))) + 1)
    result["health_down"] = sorted(elastic.get_active_slice_indices())
    repaired = subprocess.run([*cli, "repair", "1", "--server", target], capture_output=True, text=True, timeout=60)
    result["repair_cli"] = [repaired.returncode, repaired.stderr.strip()]
    result["health_repaired"] = sorted(elastic.get_active_slice_indices())
    result["read_a1_after_repair"] = attempt(lambda: a1)
    result["new_after_repair"] = attempt(lambda: jax.device_put(np.ones(4), NamedSharding(slice1, P("d"))) + 1)
    status = subprocess.run([*cli, "status", "--server", target], capture_output=True, text=True, timeout=60)
    result["status"] = json.loads(status.stdout)
    return result


def linear_train_step():
    """The jitted SGD step of a linear model both elastic loops below train (JAX is imported in
    the client process only)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def train_step(params, x, y):
        def loss_fn(p):
            return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss

    return train_step


def elastic_training(target: str, inject=None) -> tuple[dict, list]:
    """A loop written the pathwaysutils way (``Manager()`` + ``elastic_retry``), resuming
    from the last host copy; ``inject(step, manager)`` acts on the server between steps."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from pathwaysutils.elastic import manager as elastic_manager

    manager = elastic_manager.Manager()
    attempts: list[list[int]] = []
    host = {"step": 0, "params": {"w": np.zeros((8, 1), np.float32), "b": np.zeros((1,), np.float32)}}

    train_step = linear_train_step()

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.2, timeout=120)
    def train():
        active = sorted(manager.active_slice_indices)
        attempts.append(active)
        devices = [d for i in active for d in manager.slice_to_devices[i]]
        mesh = Mesh(np.array(devices).reshape(len(active), -1), ("data", "model"))
        data = NamedSharding(mesh, P(("data", "model")))
        params = jax.device_put(host["params"], NamedSharding(mesh, P()))
        for step in range(host["step"], 24):
            if manager.available_inactive_slices:
                raise elastic_manager.ScaleUpSignalError()
            x, y = (jax.device_put(a, data) for a in batch(step))
            params, loss = train_step(params, x, y)
            float(loss)
            host.update(step=step + 1, params=jax.device_get(params))
            if inject:
                inject(step, manager)
        return host["params"]

    final = train()
    manager.close()
    return {k: np.asarray(v).tolist() for k, v in final.items()}, attempts


def client_elastic(target: str) -> dict:
    import time

    expected, clean_attempts = elastic_training(target)

    def inject(step, manager):
        if step == 6:
            server_client.fail(target, 1)
        if step == 12 and 1 in manager.inactive_slice_indices:
            server_client.repair(target, 1)
            deadline = time.monotonic() + 60  # the Manager's own monitor sees the repair
            while not manager.available_inactive_slices and time.monotonic() < deadline:
                time.sleep(0.05)

    final, attempts = elastic_training(target, inject)
    return {"expected": expected, "clean_attempts": clean_attempts, "final": final, "attempts": attempts}


def hand_written_training(target: str, inject=None) -> tuple[dict, list]:
    """A loop written the MaxText way, with no pathwaysutils manager: it refuses to run unless
    ``is_pathways_backend_used()``, groups ``jax.devices()`` by ``d.slice_index`` itself, probes
    each slice with a tiny computation to find the live ones, and on an error that
    ``is_error_due_to_slice_down`` accepts goes back to its last host copy on the slices left; it
    scales back up when a probe finds a slice returned."""
    import jax
    import pathwaysutils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from pathwaysutils.elastic import elastic

    assert pathwaysutils.is_pathways_backend_used()
    by_slice: dict[int, list] = {}
    for d in jax.devices():
        by_slice.setdefault(d.slice_index, []).append(d)

    def live_slices() -> list[int]:
        live = []
        for index, devices in sorted(by_slice.items()):
            try:
                jax.device_put(
                    np.zeros(len(devices)), NamedSharding(Mesh(np.array(devices), ("d",)), P("d"))
                ).sum().item()
                live.append(index)
            except Exception as error:
                if not elastic.is_error_due_to_slice_down(error):
                    raise
        return live

    train_step = linear_train_step()

    attempts: list[list[int]] = []
    host = {"step": 0, "params": {"w": np.zeros((8, 1), np.float32), "b": np.zeros((1,), np.float32)}}
    while host["step"] < 24:
        active = live_slices()
        attempts.append(active)
        mesh = Mesh(np.array([d for i in active for d in by_slice[i]]).reshape(len(active), -1), ("data", "model"))
        data = NamedSharding(mesh, P(("data", "model")))
        params = jax.device_put(host["params"], NamedSharding(mesh, P()))
        start = host["step"]
        try:
            for step in range(start, 24):
                if step % 4 == 0 and step > start and len(live_slices()) > len(active):
                    break  # a slice came back: rebuild the mesh on all of them
                x, y = (jax.device_put(a, data) for a in batch(step))
                params, loss = train_step(params, x, y)
                float(loss)
                host.update(step=step + 1, params=jax.device_get(params))
                if inject:
                    inject(step)
        except Exception as error:
            if not elastic.is_error_due_to_slice_down(error):
                raise
    return {k: np.asarray(v).tolist() for k, v in host["params"].items()}, attempts


def client_hand_written(target: str) -> dict:
    expected, clean_attempts = hand_written_training(target)

    def inject(step):
        if step == 6:
            server_client.fail(target, 1)
        if step == 12:
            server_client.repair(target, 1)

    final, attempts = hand_written_training(target, inject)
    return {"expected": expected, "clean_attempts": clean_attempts, "final": final, "attempts": attempts}


def client_transfers(target: str) -> dict:
    """Round trips through the host-buffer store, and tiny ops while a large copy is in flight."""
    import threading
    import time

    import jax
    import jax.numpy as jnp
    import ml_dtypes

    device = jax.devices()[3]
    odd = np.arange((9 << 20) + 3, dtype=np.float32)  # not a whole number of chunks
    halves = (np.arange(1001) / 7).astype(ml_dtypes.bfloat16)
    result: dict = {
        "odd_equal": bool(np.array_equal(np.asarray(jax.device_put(odd, device) * 2), odd * 2)),
        "bf16_equal": bool(np.array_equal(np.asarray(jax.device_put(halves, device)), halves)),
        "column_equal": bool(
            np.array_equal(
                np.asarray(jax.device_put(odd[:4096].reshape(64, 64).T, device)), odd[:4096].reshape(64, 64).T
            )
        ),
    }
    big = jax.device_put(np.ones(BIG >> 2, np.float32), jax.devices()[0]) + 1
    big.block_until_ready()
    add = jax.jit(lambda a: a + 1)
    tiny = jnp.ones(4, device=jax.devices()[5])
    add(tiny).block_until_ready()
    for direction, transfer in (
        ("down", lambda: np.array(big, copy=True)),
        ("up", lambda: jax.device_put(np.full(BIG >> 2, 2.0, np.float32), jax.devices()[1]).block_until_ready()),
    ):
        span: dict = {}

        def run(transfer=transfer, span=span) -> None:
            span["start"] = time.monotonic()
            transfer()
            span["end"] = time.monotonic()

        thread = threading.Thread(target=run)
        thread.start()
        while "start" not in span:
            time.sleep(0.001)
        ops = []
        while thread.is_alive():
            start = time.monotonic()
            add(tiny).block_until_ready()
            ops.append((start, time.monotonic()))
        thread.join()
        inside = [(a, b) for a, b in ops if span["start"] < a and b < span["end"]]
        result[direction] = {"seconds": span["end"] - span["start"], "tiny_ops_inside": len(inside)}
    return result


def client_plugins(target: str, trace_dir: str, local_dir: str, bucket_url: str) -> dict:
    """The plugin programs pathwaysutils sends, as its own code builds them, and colocated Python."""
    import datetime
    import time

    import jax
    import jax.numpy as jnp
    import ml_dtypes
    from jax.experimental import colocated_python
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from pathwaysutils import profiling
    from pathwaysutils.persistence import helper

    def attempt(fn) -> str:
        try:
            fn()
            return "ok"
        except Exception as error:  # what the user reads is the result
            return str(error).splitlines()[0]

    options = jax.profiler.ProfileOptions()
    options.session_id = "local"  # as pathwaysutils.profiling.start_trace sets it
    request = profiling._create_profile_request(trace_dir, options)
    profiling._start_pathways_trace_from_profile_request(request)
    (jnp.ones((64, 64)) @ jnp.ones((64, 64))).block_until_ready()
    profiling._profile_state.call_profile_executable()  # what stop_trace sends
    profiling._profile_state.reset()
    values = [jnp.arange(4.0)]
    timeout = datetime.timedelta(seconds=30)

    @colocated_python.colocated_python
    def colocated(x):
        import os
        import sys

        print(f"colocated call in pid {os.getpid()}", flush=True)
        # A chatty function: the launcher keeps only the server's last stderr lines.
        for i in range(1000):
            print(f"chatter {i}", file=sys.stderr)
        sys.stderr.flush()
        return x + os.getpid()

    @colocated_python.colocated_python
    def broken(x):
        raise KeyError("no shard file for this host")

    @colocated_python.colocated_python
    def slow(x):
        import time

        time.sleep(3.0 if float(x[0]) > 0 else 0.0)
        return x * 3

    first = colocated(values[0])
    second = colocated(values[0] * 2)  # output specs known now: dispatched without waiting
    result = {
        "colocated": [np.asarray(first).tolist(), np.asarray(second).tolist()],
        "colocated_devices": sorted(d.id for d in second.devices()),
        "client_pid": os.getpid(),
        "broken": attempt(lambda: np.asarray(broken(values[0]))),
    }

    # Its first call fixes a function's output shapes for inputs of those shapes, as on Pathways.
    @colocated_python.colocated_python
    def varying(x):
        import jax

        return jax.device_put(np.zeros(int(x[0]) + 1), x.sharding)

    one = jax.device_put(np.zeros(1), jax.devices()[2])
    result["varying"] = [np.asarray(varying(one)).tolist(), attempt(lambda: np.asarray(varying(one + 1)))]
    # String arrays (colocated Python's output specs travel as one) go both ways.
    words = np.array(["ab", "cde", ""], dtype=np.dtypes.StringDType())
    result["strings"] = np.asarray(jax.device_put(words, jax.devices()[5])).tolist()
    # While a colocated function runs, work that uses its output waits for it and the rest does not.
    # The first calls learn the output's shape (colocated Python) and the outputs of the sum and
    # the add (the client waits for a program's first execution), synchronously.
    float(jnp.sum(slow(values[0] * 0)) + 1)
    started = time.monotonic()
    chained = jnp.sum(slow(values[0] + 1)) + 1
    (jnp.arange(3) + 1).block_until_ready()
    result["tiny_during_slow_s"] = time.monotonic() - started
    result["chained"] = float(chained)
    result["chained_s"] = time.monotonic() - started

    # Persistence: the server writes what it holds and reads it back onto other devices.
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    slice1 = Mesh(np.array(jax.devices()[4:]), ("model",))
    host = {
        "w": np.arange(64.0, dtype=np.float32).reshape(8, 8),
        "b": (np.arange(8) / 3).astype(ml_dtypes.bfloat16),
        "i": np.arange(6, dtype=np.int32).reshape(2, 3),
    }
    arrays = [
        jax.device_put(host["w"], NamedSharding(mesh, P("data", "model"))),
        jax.device_put(host["b"], NamedSharding(mesh, P())),
        jax.device_put(host["i"], NamedSharding(mesh, P("data"))),
    ]  # one write takes arrays over the same devices (pathwaysutils' rule)
    targets = [NamedSharding(slice1, P("model")), NamedSharding(slice1, P("model")), NamedSharding(slice1, P())]
    for where, url in (("local", local_dir), ("gcs", bucket_url)):
        helper.write_arrays(url, list(host), arrays, timeout).result()
        back, done = helper.read_arrays(
            url, list(host), [a.dtype for a in arrays], [a.shape for a in arrays], targets, slice1.devices, timeout
        )
        done.result()
        result[where] = {
            "equal": [bool(np.array_equal(np.asarray(b), host[n])) for b, n in zip(back, host, strict=True)],
            "devices": sorted({d.id for b in back for d in b.devices()}),
        }
    # orbax with pathwaysutils' persistence handler (ENABLE_PATHWAYS_PERSISTENCE=1): the server writes.
    import orbax.checkpoint as ocp

    state = dict(zip(host, arrays, strict=True))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(f"{bucket_url}/orbax/1", state)
        checkpointer.wait_until_finished()
        back = checkpointer.restore(f"{bucket_url}/orbax/1", jax.tree.map(ocp.utils.to_shape_dtype_struct, state))
    result["orbax"] = [bool(np.array_equal(np.asarray(back[n]), host[n])) for n in host]
    result["missing"] = attempt(
        lambda: helper.read_arrays(local_dir, ["nope"], [np.float32], [(4,)], [targets[2]], slice1.devices, timeout)[
            1
        ].result()
    )
    return result


CLIENTS = {
    "basics": client_basics,
    "slice_loss": client_slice_loss,
    "elastic": client_elastic,
    "hand_written": client_hand_written,
    "transfers": client_transfers,
    "plugins": client_plugins,
}


# ---- the tests -----------------------------------------------------------------------


def test_jax_runs_through_the_server_as_on_pathways(server, tmp_path):
    got = run_client("basics", server.target, str(tmp_path / "server.npz"))
    reference_env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    reference_env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8")
    expected = run_client("reference", "-", str(tmp_path / "cpu.npz"), env=reference_env)

    assert got["slice_indices"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert got["coords"][:4] == [[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]]
    assert got["pathways"] is True
    assert got["arange"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert got["sharded_equal"] is True
    assert got["moved_equal"] is True and got["moved_devices"] == [4, 5, 6, 7]
    assert got["deleted"] is True
    assert got["flops"] > 0
    assert got["donated"] is True
    np.testing.assert_allclose(got["losses"], expected["losses"], rtol=1e-5)
    ours, theirs = np.load(tmp_path / "server.npz"), np.load(tmp_path / "cpu.npz")
    for name in theirs.files:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-7)


def test_a_slice_lost_on_the_server_fails_its_arrays_and_work(server):
    got = run_client("slice_loss", server.target)

    assert got["health_before"] == [0, 1]
    assert got["fail_cli"][0] == 0, got["fail_cli"]
    for key in ("read_a01", "read_a01_again", "jit_a01", "read_a1", "new_on_slice1"):
        assert "DATA_LOSS" in got[key].get("error", ""), (key, got[key])
        assert got[key]["slice_down"] is True, key
    assert got["read_a0"] == {"ok": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]}
    assert got["jit_a0"] == {"ok": [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]}
    assert got["health_down"] == [0]
    assert got["repair_cli"][0] == 0
    assert got["health_repaired"] == [0, 1]
    assert got["read_a1_after_repair"]["slice_down"] is True  # repair brings the slice back empty
    assert got["new_after_repair"] == {"ok": [2.0, 2.0, 2.0, 2.0]}
    assert got["status"]["down"] == []
    assert len(got["status"]["bytes_per_device"]) == 8 and got["status"]["bytes_per_device"][0] > 0


def test_pathwaysutils_elastic_loop_survives_a_server_side_loss_and_scale_up(server):
    got = run_client("elastic", server.target)

    assert got["clean_attempts"] == [[0, 1]]
    assert got["attempts"] == [[0, 1], [0], [0, 1]]
    for name in ("w", "b"):
        np.testing.assert_allclose(got["final"][name], got["expected"][name], rtol=1e-5, atol=1e-6)


def test_a_loop_written_the_maxtext_way_survives_a_server_side_loss_and_scale_up(server):
    got = run_client("hand_written", server.target)

    assert got["clean_attempts"] == [[0, 1]]
    # The loss sends it to slice 0 alone; the repair brings it back onto both.
    assert got["attempts"] == [[0, 1], [0], [0, 1]], got["attempts"]
    for name in ("w", "b"):
        np.testing.assert_allclose(got["final"][name], got["expected"][name], rtol=1e-5, atol=1e-6)


def test_transfers_round_trip_and_a_large_copy_does_not_stall_tiny_ops(server):
    got = run_client("transfers", server.target)

    assert got["odd_equal"] and got["bf16_equal"] and got["column_equal"], got
    for direction in ("down", "up"):
        # The session answers a tiny op while the copy is in flight, not after it.
        assert got[direction]["tiny_ops_inside"] >= 1, got


@pytest.mark.serial  # timing: a tiny op beside a slow one within 2 s
def test_pathwaysutils_profile_persistence_and_colocated_python_run_in_the_server(tmp_path, gcs_server, capfd):
    import tensorstore as ts

    server = server_client.start(2, 4, env=gcs_server.env)
    try:
        bucket = gcs_server.make_bucket("persisted")
        env = {**server_client.client_env(server.target), **gcs_server.env, "ENABLE_PATHWAYS_PERSISTENCE": "1"}
        got = run_client("plugins", server.target, str(tmp_path), str(tmp_path / "saved"), bucket + "/run", env=env)
    finally:
        server.stop()

    # The server's own trace, in the run directory the request's session names.
    trace = tmp_path / "plugins" / "profile" / "local" / "pathways-local-server.xplane.pb"
    assert trace.exists() and trace.stat().st_size > 0, list(tmp_path.rglob("*"))
    # Colocated Python runs in the server's process, on the server's arrays.
    assert got["client_pid"] != server.pid
    assert got["colocated"] == [[server.pid + i for i in range(4)], [server.pid + 2 * i for i in range(4)]]
    assert got["colocated_devices"] == [0]
    # What it prints goes to the stderr of the process that started the server (a kernel's log).
    assert f"pathways-local: colocated call in pid {server.pid}" in capfd.readouterr().err
    # A server that logs for hours does not grow the kernel: its last lines are kept, not all.
    assert len(server.stderr_lines) <= 200 and "chatter 999" in server.stderr_lines, len(server.stderr_lines)
    assert got["broken"] == "INTERNAL: KeyError: 'no shard file for this host'", got
    assert got["strings"] == ["ab", "cde", ""], got
    assert got["varying"][0] == [0.0], got
    assert got["varying"][1].startswith("INVALID_ARGUMENT: varying returned float32[2] as output 0, not the float32[1]")
    assert got["chained"] == 3 * (1 + 2 + 3 + 4) + 1 and got["chained_s"] >= 3.0, got
    assert got["tiny_during_slow_s"] < 2.0, got
    # Written by the server, read back by it onto slice 1, equal, to a directory and to GCS.
    for where in ("local", "gcs"):
        assert got[where] == {"equal": [True, True, True], "devices": [4, 5, 6, 7]}, (where, got[where])
    # Stored as zarr arrays, one per name: what orbax's own metadata reader opens.
    stored = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / "saved" / "w")}}).result()
    assert np.array_equal(stored.read().result(), np.arange(64.0, dtype=np.float32).reshape(8, 8))
    assert got["orbax"] == [True, True, True], got
    assert got["missing"].startswith("NOT_FOUND: read ") and "nope" in got["missing"], got


if __name__ == "__main__":
    mode, target, *rest = sys.argv[1:]
    if mode == "reference":
        import jax

        jax.config.update("jax_num_cpu_devices", 8)
        print(json.dumps(client_reference(*rest)), flush=True)
    else:
        import pathwaysutils

        pathwaysutils.initialize()
        print(json.dumps(CLIENTS[mode](target, *rest)), flush=True)
