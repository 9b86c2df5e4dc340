"""Metrics kept per run and step (pw.log, an elastic state's loss), as a DataFrame and as
TensorBoard event files, on real JAX CPU devices (local:2x4)."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tensorboardX.crc32c import crc32c
from tensorboardX.proto import event_pb2

import pathways_kernel as pw
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.training.metric_log import metric_log


@pytest.fixture
def session(local_session):
    return local_session


def _train(name: str, steps: int, scale: float = 1.0) -> None:
    for i in pw.steps(range(steps), name=name, progress=False):
        pw.log(loss=jnp.float32(scale / (i + 1)), acc=i)


def test_pw_metrics_has_every_logged_value_per_run_and_step(session):
    _train("fit", 5)
    _train("fit", 3, scale=2.0)
    frame = pw.metrics("fit")
    assert list(frame.columns) == ["run", "step", "time", "elapsed_s", "loss", "acc"]
    assert frame["run"].tolist() == ["fit #1"] * 5 + ["fit #2"] * 3
    assert frame["step"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert frame["loss"].tolist() == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4, 1 / 5, 2, 1, 2 / 3])
    assert frame["acc"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert all(run["elapsed_s"].is_monotonic_increasing for _name, run in frame.groupby("run"))
    assert str(frame["time"].dtype).startswith("datetime64")
    one = pw.metrics("fit #2")
    assert one["loss"].tolist() == pytest.approx([2, 1, 2 / 3])
    assert {"fit #1", "fit #2"} <= set(pw.metrics()["run"])
    with pytest.raises(PathwaysError, match=r"no metrics for run 'nosuch' \(runs with metrics: .*'fit #2'"):
        pw.metrics("nosuch")


def test_an_elastic_run_keeps_the_loss_in_its_state_at_every_step(session):
    mesh = pw.mesh(name=None)

    @pw.elastic(snapshot_every=100)
    def halve(state, step, mesh):
        w = state["w"] * 0.5
        return {"w": w, "loss": jnp.mean(w)}

    w = jax.device_put(jnp.full((8, 8), 4.0), NamedSharding(mesh, P(None, "model")))
    halve({"w": w, "loss": jnp.float32(4.0)}, steps=6, progress=False)
    frame = pw.metrics("halve")
    last = frame[frame["run"] == frame["run"].iloc[-1]]
    assert last["step"].tolist() == [0, 1, 2, 3, 4, 5]
    assert last["loss"].tolist() == pytest.approx([2, 1, 0.5, 0.25, 0.125, 0.0625])


def test_a_loss_given_to_pw_log_is_the_one_kept_not_the_states(session):
    @pw.elastic(snapshot_every=100)
    def count(state, step, mesh):
        pw.log(loss=float(step) * 10)
        return {"loss": jnp.float32(-1.0)}

    count({"loss": jnp.float32(0.0)}, steps=3, progress=False)
    frame = pw.metrics("count")
    assert frame["loss"].tolist() == [0.0, 10.0, 20.0]


def test_new_points_reach_the_logs_listeners_as_they_are_read(session):
    got: list = []
    seen = threading.Event()

    def listener(points):
        got.extend(points)
        seen.set()

    unsubscribe = metric_log().subscribe(listener)
    try:
        _train("listened", 2)
        assert seen.wait(30), "no points published"
        metric_log().flush()
    finally:
        unsubscribe()
    mine = [p.to_dict() for p in got if p.run.startswith("listened #")]
    assert [(p["step"], p["name"]) for p in mine] == [(0, "loss"), (0, "acc"), (1, "loss"), (1, "acc")]
    assert set(mine[0]) == {"seq", "run", "step", "time", "elapsed_s", "name", "value", "cell", "earlier"}


def read_events(path: Path) -> list:
    """TensorBoard's event file: TFRecords (length, masked CRC of it, an Event proto, masked CRC of it)."""

    def masked(data: bytes) -> int:
        crc = crc32c(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    data, events, at = path.read_bytes(), [], 0
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        assert header_crc == masked(header)
        body = data[at + 12 : at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length : at + 16 + length])
        assert body_crc == masked(body)
        event = event_pb2.Event()
        event.ParseFromString(body)
        events.append(event)
        at += 16 + length
    return events


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    series: dict[str, list] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in read_events(path):
            for value in event.summary.value:
                series.setdefault(value.tag, []).append((event.step, value.simple_value, event.wall_time))
    return series


def test_metrics_to_tensorboard_writes_kept_then_new_points_one_run_per_directory(session, tmp_path):
    _train("tb", 3)
    metric_log().flush()
    writer = pw.metrics_to_tensorboard(tmp_path)
    try:
        _train("tb", 2, scale=4.0)
        metric_log().flush()
    finally:
        writer.close()
    first, second = (Path(writer.run_dir(r)) for r in pw.metrics("tb")["run"].unique()[-2:])
    assert first.parent == second.parent == tmp_path
    assert first.name.startswith("tb_") and second.name.startswith("tb_") and first != second
    one, two = scalars(first), scalars(second)
    assert [(s, round(v, 4)) for s, v, _t in one["loss"]] == [(0, 1.0), (1, 0.5), (2, 0.3333)]
    assert [(s, v) for s, v, _t in two["loss"]] == [(0, 4.0), (1, 2.0)]
    assert [(s, v) for s, v, _t in two["acc"]] == [(0, 0.0), (1, 1.0)]
    frame = pw.metrics("tb")
    assert two["loss"][0][2] == pytest.approx(frame["time"].iloc[-2].timestamp(), abs=1e-3)


def test_a_script_that_logs_device_values_leaves_no_reader_running_at_exit():
    # A daemon thread still inside jaxlib when the interpreter stops its threads aborts the process.
    script = textwrap.dedent(
        """
        import atexit, threading
        atexit.register(lambda: print("left at exit:", sorted(
            t.name for t in threading.enumerate() if t.name.startswith("pathways-metrics") and t.is_alive())))
        import jax.numpy as jnp
        import pathways_kernel as pw
        for i in pw.steps(range(50)):
            pw.log(loss=jnp.float32(i) * 2)
        print("reading:", any(t.name == "pathways-metrics" for t in threading.enumerate()))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reading: True" in done.stdout and "left at exit: []" in done.stdout, done.stdout
