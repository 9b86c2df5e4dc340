"""Goodput accounting on real JAX CPU slices (local:2x4): each badput category
appears when its cause is provoked and not otherwise, and the categories plus
productive time add up to the wall time measured around the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import jax
import jax.numpy as jnp

# The field library is imported when a report first asks for its figure; do it now, outside the timed runs.
import ml_goodput_measurement.src.goodput_elastic  # noqa: F401
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pathways_kernel as pw
from pathways_kernel.emulator import chaosmonkey, faults
from pathways_kernel.training import accounting, goodput, goodput_report

# Accounting ratios of loops timed in wall seconds: run with the machine to themselves.
pytestmark = pytest.mark.serial

#: A category "appears" above this many seconds and is "absent" below ABSENT_S.
APPEARS_S = 0.02
ABSENT_S = 0.005
STEP_S = 0.01


@pytest.fixture(autouse=True)
def all_slices_up(local_session):
    chaosmonkey.chaos_off()
    yield local_session
    chaosmonkey.chaos_off()


def present(seconds: dict[str, float]) -> set[str]:
    return {k for k in goodput.BADPUT if seconds[k] > APPEARS_S}


def absent_but(seconds: dict[str, float], *allowed: str) -> None:
    """Every badput category but ``allowed`` (and loop overhead) is all but zero."""
    for category in goodput.BADPUT:
        if category not in allowed and category != goodput.OTHER:
            assert seconds[category] < ABSENT_S, (category, seconds)


def adds_up(report: goodput_report.Report, wall: float) -> None:
    total = sum(report.seconds.values())
    assert abs(total - wall) <= 0.01 * wall, (total, wall, report.seconds)


@jax.jit
def matmul(w, x):
    return jnp.tanh(x @ w)


W = None


@pytest.fixture(autouse=True)
def warm(all_slices_up):
    """Weights on the session's devices and ``matmul`` compiled for them, before any timed loop."""
    global W
    W = jnp.ones((64, 64))
    matmul(W, jnp.ones((8, 64))).block_until_ready()


def timed(fn):
    """Wall time of ``fn()``; what it returns is freed after the clock stops (freeing is not the run's)."""
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def test_a_loop_with_nothing_wrong_is_productive_and_adds_up_to_its_wall_time():
    xs = [jnp.ones((8, 64))] * 30

    def loop():
        for x in pw.steps(xs, name="clean"):
            matmul(W, x).block_until_ready()
            time.sleep(STEP_S)

    wall = timed(loop)
    report = pw.goodput("clean")
    adds_up(report, wall)
    absent_but(report.seconds)
    assert report.goodput > 0.95
    assert report.runs[0]["seconds"]["productive"] > 30 * STEP_S
    event = pw.events(kind="goodput")[-1]
    assert event.step == 30 and "clean" in event.detail and "goodput" in event.detail


def test_a_recompile_counts_as_compile_and_a_slow_iterator_as_data_wait():
    @jax.jit
    def fresh(w, x):  # never compiled before this test
        return jnp.sin(x @ w) * 2

    def slow_batches():
        for i in range(20):
            time.sleep(0.03)
            # step 10 changes the batch shape: a recompile
            yield jnp.ones((8 if i < 10 else 16, 64))

    def loop():
        for x in pw.steps(slow_batches(), name="compiles"):
            fresh(W, x).block_until_ready()
            time.sleep(STEP_S)

    wall = timed(loop)
    report = pw.goodput("compiles")
    adds_up(report, wall)
    assert present(report.seconds) >= {"compile", "data_wait"}
    assert report.seconds["data_wait"] >= 0.9 * 20 * 0.03
    absent_but(report.seconds, "compile", "data_wait")


def test_a_slow_loader_is_data_wait_of_its_own_loop():
    def slow_samples(step, shard, num_shards):
        time.sleep(0.05)
        return np.full((16 // num_shards, 4), step, np.float32)

    with pw.loader(slow_samples, spec=P("data"), prefetch=0, name="slow") as batches:
        start = time.perf_counter()  # the loop's clock starts at its first batch
        for _ in zip(range(8), batches, strict=False):
            time.sleep(STEP_S)
    wall = time.perf_counter() - start
    report = pw.goodput("loader slow")
    assert report.accounts[0].kind == "loader" and report.accounts[0].ended
    adds_up(report, wall)
    assert report.seconds["data_wait"] >= 0.9 * 8 * 0.05
    absent_but(report.seconds, "data_wait", "compile")


def state_on(mesh, mib: float = 0.1):
    n = int(mib * (1 << 20)) // 4 // 64 // 8 * 8
    return {"w": jax.device_put(np.ones((n, 64), np.float32), NamedSharding(mesh, P("data")))}


@jax.jit
def nudge(state):
    return jax.tree.map(lambda p: p * 0.999, state)


def slow_nudge(state, step, mesh):
    time.sleep(STEP_S)
    return nudge(state)


def test_an_elastic_run_without_faults_has_no_loss_categories():
    train = pw.elastic(slow_nudge, snapshot_every=10, name="calm")
    state = state_on(pw.session().mesh())
    nudge(state)
    wall = timed(lambda: train(state, steps=40))
    report = pw.goodput("calm")
    adds_up(report, wall)
    absent_but(report.seconds, "snapshot_stall", "compile")
    assert report.accounts[0].steps == 40


def test_a_snapshot_slower_than_a_step_stalls_the_loop():
    # 64 MiB copied to host after every step, against a step of a few ms.
    train = pw.elastic(lambda st, step, mesh: nudge(st), snapshot_every=1, name="stalls")
    state = state_on(pw.session().mesh(), mib=64)
    jax.block_until_ready(nudge(state))
    wall = timed(lambda: train(state, steps=6))
    report = pw.goodput("stalls")
    adds_up(report, wall)
    assert "snapshot_stall" in present(report.seconds)
    absent_but(report.seconds, "snapshot_stall", "compile")


def test_a_lost_slice_is_recovery_and_redone_steps_then_the_run_goes_on():
    failed = []

    def step_fn(st, step, mesh):
        if step == 15 and not failed:
            failed.append(step)
            faults.fail_slice(1)
        time.sleep(STEP_S)
        return nudge(st)

    train = pw.elastic(step_fn, snapshot_every=10, name="loses")
    state = state_on(pw.session().mesh())
    wall = timed(lambda: train(state, steps=30))
    report = pw.goodput("loses")
    account = report.accounts[0]
    adds_up(report, wall)
    assert present(report.seconds) >= {"recovery", "redone"}
    # Steps 10..15 ran twice: the snapshot was of step 10, the loss was seen after step 15.
    assert account.steps == 30 and account.recoveries == 1
    assert account.steps_redone == train.last_run.steps_lost == 6
    assert report.seconds["redone"] >= 6 * STEP_S
    absent_but(report.seconds, "recovery", "redone", "compile", "snapshot_stall")


def test_no_slice_up_is_slice_wait_until_one_comes_back():
    down = []

    def step_fn(st, step, mesh):
        if step == 5 and not down:
            down.append(step)
            faults.fail_slice(1)
            faults.fail_slice(0)
            threading.Timer(0.5, faults.repair_slice, (0,)).start()
        return nudge(st)

    train = pw.elastic(step_fn, snapshot_every=5, name="waits")
    state = state_on(pw.session().mesh())
    wall = timed(lambda: train(state, steps=10))
    report = pw.goodput("waits")
    adds_up(report, wall)
    assert 0.4 <= report.seconds["slice_wait"] <= 0.5 + 0.3, report.seconds
    assert report.seconds["recovery"] > 0 and report.accounts[0].recoveries == 1


def test_mfu_on_the_embedded_backend_is_a_fraction_of_the_measured_peak():
    x = jnp.ones((8, 64))
    for i, batch in enumerate(pw.steps([x] * 20, name="mfu")):
        if i == 0:
            per_step = pw.flops(matmul, W, batch)
        matmul(W, batch).block_until_ready()
    report = pw.goodput("mfu")
    assert per_step == pytest.approx(2 * 8 * 64 * 64, rel=0.1)
    assert 0 < report.mfu <= 1
    assert "measured" in report.to_text()


def test_mfu_of_a_run_on_some_slices_counts_only_their_chips():
    # An RL trainer on slice 0 while the rollout has slice 1: the trainer's MFU is over its 4 chips,
    # not the session's 8 (it read half its utilization before).
    slice_0 = jax.sharding.Mesh(np.array(pw.session().topology.slices[0].devices), ("data",))
    sharding = NamedSharding(slice_0, P())

    def step_fn(st, step, mesh):
        if step == 0:
            pw.flops(matmul, W, st)
        return matmul(W, st)

    train = pw.elastic(step_fn, slices=[0], snapshot_every=5, name="mfu-slice-0")
    train(jax.device_put(jnp.ones((8, 64)), sharding), steps=10)
    everywhere = pw.elastic(step_fn, snapshot_every=5, name="mfu-all")
    everywhere(jax.device_put(jnp.ones((8, 64)), NamedSharding(pw.session().mesh(), P())), steps=10)

    text = pw.goodput().to_text()
    one = pw.goodput("mfu-slice-0")
    assert one.mfu is not None and 0 < one.mfu <= 1
    assert re.search(r"MFU [\d.]+% over 4 chips", one.to_text()), one.to_text()
    assert re.search(r"MFU [\d.]+% over 8 chips", pw.goodput("mfu-all").to_text()), text


def test_a_first_run_does_not_wait_for_the_field_library_and_its_figure_still_covers_the_run():
    """A process's first run used to import ml-goodput-measurement (scipy.stats, ~1.7 s here)
    inside its first step; the library is now imported when its figure is first asked for."""
    script = textwrap.dedent("""
        import gc, sys, time
        import jax.numpy as jnp
        import pathways_kernel as pw
        # A full collection of the imports' objects (0.1-0.5 s) landing in the 0.6 s second run read
        # as data_wait there; where it lands moves with what the package imports. Frozen, it is cheap.
        pw.steps; gc.collect(); gc.freeze()
        for name in ("first", "second"):
            for x in pw.steps([jnp.ones((8, 8))] * 30, name=name):
                (x @ x).block_until_ready()
                time.sleep(0.02)
            if name == "first":
                print("imported", "ml_goodput_measurement" in sys.modules)
        # The second run's (the first one's compile is badput the two count differently).
        account = pw.goodput("second").accounts[0]
        print("field", round(account.field()["goodput"]), round(100 * account.goodput))
    """)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PATHWAYS_BACKEND": "embedded:2x4"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    said = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert said["imported"] == "False", out.stdout
    field, ours = map(int, said["field"].split())
    assert field > 0 and abs(field - ours) <= 3, out.stdout


def test_the_field_library_agrees_on_a_loop_it_can_model():
    def batches():
        for i in range(30):
            if i % 5 == 0:
                time.sleep(0.02)
            yield jnp.ones((8, 64))

    for x in pw.steps(batches(), name="agree"):
        matmul(W, x).block_until_ready()
        time.sleep(STEP_S)
    account = pw.goodput("agree").accounts[0]
    field = account.field()
    assert field["goodput"] == pytest.approx(100 * account.goodput, abs=3)
    # It sees the same waits (those between two step starts; the first, before step 0, is its OTHER).
    assert 0 < field["badput"]["custom:DATA_WAIT"] <= 100 * account.seconds["data_wait"] / account.wall_s + 1


def test_an_unknown_run_is_one_line():
    with pytest.raises(pw.PathwaysError, match="no run named 'nope'"):
        pw.goodput("nope")


def test_a_checkpoint_save_inside_a_loop_counts_as_checkpoint_save(tmp_path):
    state = state_on(pw.session().mesh(), mib=8)
    for step, _ in enumerate(pw.steps(range(6), name="checkpoints")):
        state = nudge(state)
        if step % 3 == 0:
            pw.checkpoint_save(state, str(tmp_path / "ckpt"), step).wait()
    report = pw.goodput("checkpoints")
    assert "checkpoint_save" in present(report.seconds)
    absent_but(report.seconds, "checkpoint_save", "compile", "snapshot_stall")


# -- Cloud Logging, opt-in on Pathways on GKE -------------------------------------
@pytest.fixture
def proxy_session():
    """A session on the proxy backend, never connected: no Pathways proxy can run here."""
    from pathways_kernel.backends.proxy import ProxyBackend
    from pathways_kernel.core.sessions import Session

    return Session(ProxyBackend.from_spec("grpc://127.0.0.1:1"))


def test_the_compile_listener_belongs_to_the_session_and_leaves_with_it(proxy_session):
    # jax.monitoring has no public listing of its listeners; this only reads the list.
    from jax._src import monitoring as jax_monitoring

    before = list(jax_monitoring.get_event_duration_listeners())
    accounting.begin("listened", "test", proxy_session, progress=False).end()
    during = list(jax_monitoring.get_event_duration_listeners())
    proxy_session.close()
    assert len(during) == len(before) + 1
    assert list(jax_monitoring.get_event_duration_listeners()) == before


def test_compiles_still_count_after_a_library_clears_jax_listeners(local_session):
    """Tunix's ``MetricsLogger.close()`` calls ``jax.monitoring.clear_event_listeners()``: the next
    run's compile went uncounted, and the session's close failed on JAX's assert at shutdown."""
    from jax import monitoring
    from jax._src import monitoring as jax_monitoring  # read and restored: no public listing

    others = [
        (monitoring.register_event_listener, list(jax_monitoring.get_event_listeners())),
        (monitoring.register_event_duration_secs_listener, list(jax_monitoring.get_event_duration_listeners())),
    ]
    accounting.begin("before-clear", "test", local_session, progress=False).end()
    monitoring.clear_event_listeners()
    try:

        @jax.jit
        def fresh(x):  # never compiled before this test
            return jnp.cos(x) * 7 - 2

        def loop():
            for x in pw.steps([jnp.ones((8, 33))] * 3, name="after-clear"):
                fresh(x).block_until_ready()

        loop()
        report = pw.goodput("after-clear")
        assert report.seconds.get("compile", 0.0) > 0, report.to_text()
    finally:
        for register, listeners in others:
            present_now = {id(c) for c in jax_monitoring.get_event_listeners()} | {
                id(c) for c in jax_monitoring.get_event_duration_listeners()
            }
            for callback in listeners:
                if id(callback) not in present_now:
                    register(callback)


class CloudLoggingStandIn:
    """Stands in for the library's ``_CloudLogger``: Cloud Logging cannot run here.
    Keeps what it is given, filtered by job name as the library's writer is."""

    made: list[CloudLoggingStandIn] = []

    def __init__(self, job_name: str, log_name: str):
        self.job_name, self.log_name, self.entries = job_name, log_name, []
        self.project_id = "test-project"
        CloudLoggingStandIn.made.append(self)

    def write_cloud_logging_entry(self, entry):
        if entry["job_name"] == self.job_name:
            self.entries.append(entry)


def test_cloud_logging_is_refused_on_the_embedded_backend_and_bad_job_names_in_one_line(local_session, proxy_session):
    from pathways_kernel.core.errors import NotSupportedError, PathwaysError

    with pytest.raises(
        NotSupportedError, match=r"^Cloud Logging of goodput is for Pathways on GKE .* runs embedded:2x4"
    ):
        pw.goodput_cloud_logging("my-job")
    for bad in ["", " ", "-job", "a" * 64, "my job", "job/1", "ü", 7, float("nan")]:
        with pytest.raises(PathwaysError, match=r"^goodput job name must be 1-63 letters") as caught:
            pw.goodput_cloud_logging(bad, session=proxy_session, logger_factory=CloudLoggingStandIn)
        assert "\n" not in str(caught.value)
    assert "off" in pw.goodput_cloud_logging(None, session=proxy_session)


def test_cloud_logging_without_credentials_is_one_line_and_quick(proxy_session, monkeypatch, tmp_path):
    """The library's real writer, with no credentials anywhere (the metadata server
    looked up on 127.0.0.1:9, where nothing listens)."""
    from pathways_kernel.core.errors import PathwaysError

    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    started = time.perf_counter()
    with pytest.raises(
        PathwaysError, match=r"^no Google Cloud credentials for Cloud Logging: on GKE use Workload Identity"
    ):
        pw.goodput_cloud_logging("my-job", session=proxy_session)
    assert time.perf_counter() - started < 5


def test_cloud_logging_writes_each_new_run_as_a_job_of_its_own_until_turned_off(proxy_session):
    CloudLoggingStandIn.made.clear()
    said = pw.goodput_cloud_logging("exp1", session=proxy_session, logger_factory=CloudLoggingStandIn)
    assert (
        said
        == "goodput: new runs also write to Cloud Logging in project test-project, log goodput_exp1, job exp1-<run>-<n>"
    )
    for _ in range(2):
        account = accounting.begin("train loop", "steps", proxy_session)
        with account.spent("data_wait"):
            time.sleep(0.01)
        account.end()
    writers = [w for w in CloudLoggingStandIn.made if not w.job_name.endswith("-check")]
    assert [w.job_name for w in writers] == ["exp1-train-loop-1", "exp1-train-loop-2"]
    assert {w.log_name for w in writers} == {"goodput_exp1"}
    # What went to Cloud Logging is what the run's own log holds, so the figures agree.
    assert writers[-1].entries == account._field.log.entries
    kinds = {k for e in writers[-1].entries for k in e if k != "job_name"}
    assert {"job_start_time", "job_end_time", "custom_badput_event_type"} <= kinds, kinds
    pw.goodput_cloud_logging(None, session=proxy_session)
    account = accounting.begin("after", "steps", proxy_session)
    account.end()
    assert len([w for w in CloudLoggingStandIn.made if not w.job_name.endswith("-check")]) == 2


def test_loop_overhead_while_the_device_still_computes_the_step_is_not_badput(local_session):
    """Steps return once dispatched: the loop's own work after one ran while the
    device computed it, and only what remains once the step is done is overhead."""

    @jax.jit
    def slow(x):
        for _ in range(12):
            x = jnp.tanh(x @ x)
        return x

    x = jnp.ones((1024, 1024), jnp.float32) * 1e-3
    slow(x).block_until_ready()  # compiled
    busy = accounting.begin("overlap", "steps", local_session)
    busy.step_begin(0)
    out = slow(x)
    busy.step_end(out)
    assert not out.is_ready(), "the step must still be computing for this test to mean anything"
    time.sleep(0.03)  # the loop's own work, with the device busy
    assert not out.is_ready()
    busy.step_begin(1)
    busy.step_end(None)
    busy.end()
    assert busy.seconds[goodput.OTHER] < ABSENT_S, busy.seconds

    done = accounting.begin("no-overlap", "steps", local_session)
    done.step_begin(0)
    out = slow(x).block_until_ready()
    done.step_end(out)
    time.sleep(0.03)  # the same work, with the device idle
    done.step_begin(1)
    done.step_end(None)
    done.end()
    assert done.seconds[goodput.OTHER] >= 0.03, done.seconds


def test_the_attempts_of_an_elastic_retry_job_are_one_run_and_the_time_between_them_is_badput_by_cause():
    # Written the pathwaysutils way: a Manager(), a function it retries on a slice loss, state from a host copy.
    from pathwaysutils.elastic import manager as elastic_manager

    manager = elastic_manager.Manager()
    host = {"step": 0, "state": jax.device_get(state_on(pw.session().mesh()))}
    attempts = []

    @manager.elastic_retry(poll_interval=0.05, timeout=60)  # waits for every slice before each attempt
    def train():
        attempts.append(sorted(manager.active_slice_indices))
        devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
        mesh = jax.sharding.Mesh(np.array(devices).reshape(len(attempts[-1]), -1), ("data", "model"))
        state = jax.device_put(host["state"], NamedSharding(mesh, P("data")))
        time.sleep(0.3)  # re-initialising: building the model, loading data
        for step in pw.steps(range(host["step"], 30), name="retried"):
            if step == 12 and len(attempts) == 1:
                faults.fail_slice(1)
                threading.Timer(1.0, faults.repair_slice, (1,)).start()
            time.sleep(STEP_S)
            state = nudge(state)
            float(state["w"][0, 0])  # raises DATA_LOSS once slice 1 is lost
            if (step + 1) % 5 == 0:
                host.update(step=step + 1, state=jax.device_get(state))
        return state

    wall = timed(train)
    assert attempts == [[0, 1], [0, 1]]
    assert [a.name for a in goodput.ledger().runs].count("retried") == 1
    report = pw.goodput("retried")
    account = report.accounts[0]
    adds_up(report, wall)
    # Steps 10 and 11 ran twice (the host copy was of step 10), and step 12 was cut short.
    assert account.steps == 30 and account.steps_redone == 2 and account.recoveries == 1
    # The wait for slice 1 (repaired 1 s after the loss; the health probes pathwaysutils compiles
    # meanwhile are part of the wait: they counted as compile, leaving 0.08 s of a 1 s wait in one CI
    # run) and the second attempt's re-initialisation.
    assert report.seconds["slice_wait"] >= 0.7 and report.seconds["recovery"] >= 0.3, report.to_text()
    # The first attempt's initialisation is the loop's own setup.
    assert present(report.seconds) <= {"slice_wait", "recovery", "redone", "compile", "other"}, report.to_text()
