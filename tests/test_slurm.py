"""Pathways on Slurm, against a real Slurm cluster on this machine (tests/slurm.py).

Two ``slurmd`` nodes (tpu-0, tpu-1) under one ``slurmctld`` and ``munged``.
No Pathways server image exists here, so a job's "Pathways proxy" is the
stand-in of tests/test_proxy.py (``stand_in_proxy.py``) run inside the job by
the shipped template: connecting gets through pre-flight, and JAX's real
proxy client then fails. Everything after that is tested on the embedded
backend bound to a job (``local:2x4 --slurm JOB``).
"""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from pathlib import Path

import monitor_frontend
import pytest
from kernels import Kernel
from slurm import slurm_cluster  # noqa: F401  (the `slurm` fixture)

pytestmark = pytest.mark.kernel

STAND_IN = Path(__file__).with_name("stand_in_proxy.py")
TEMPLATE = "pathways-job"
SLEEP = "#!/bin/bash\nsleep 300\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proxy_env(port: int) -> dict[str, str]:
    """What the template needs to run the stand-in as the job's proxy."""
    return {
        "PATHWAYS_PROXY_CMD": f"{sys.executable} {STAND_IN} {port}",
        "PATHWAYS_PROXY_PORT": str(port),
        "PATHWAYS_PROXY_HOST": "127.0.0.1",
    }


def kernel_env(slurm) -> dict[str, str]:
    """The kernel's environment: the cluster, and short retries of JAX's proxy client at the stand-in."""
    return {"SLURM_CONF": str(slurm.conf), "PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS": "2"}


def template_path() -> str:
    from pathways_kernel.backends.slurm import TEMPLATES

    return str(TEMPLATES[TEMPLATE])


def kernel_seconds(reply) -> float:
    stamps = [m["header"]["date"] for m in reply.messages if m["header"]["msg_type"] != "status"]
    return (max(stamps) - min(stamps)).total_seconds()


def shown(reply) -> list[str]:
    """Every text/plain the cell displayed or updated in place, in order."""
    return [
        m["content"]["data"].get("text/plain", "")
        for m in reply.messages
        if m["header"]["msg_type"] in ("display_data", "update_display_data")
    ]


@pytest.fixture(scope="module")
def kernel(slurm):
    k = Kernel("pathways", env=kernel_env(slurm))
    k.km.shutdown_wait_time = 60.0
    yield k
    if k.km.is_alive():
        k.shutdown()


@pytest.fixture
def cancel(slurm):
    """Job ids to cancel after the test (jobs the test itself submitted)."""
    jobs: list[str] = []
    yield jobs
    for job in jobs:
        slurm.run("scancel", job, check=False)
    for job in jobs:
        deadline = time.monotonic() + 10
        while (
            slurm.job(job).get("JobState") not in ("CANCELLED", "COMPLETED", "FAILED") and time.monotonic() < deadline
        ):
            time.sleep(0.1)


def test_pending_job_shows_its_reason_live_then_running_job_is_connected_through_preflight(slurm, kernel, cancel):
    port = free_port()
    job = slurm.submit_env(template_path(), proxy_env(port), "--hold", "--nodes=1", "--time=20", "--job-name=pw-held")
    cancel.append(job)
    # Released while the kernel waits, so the cell sees PENDING and then RUNNING.
    threading.Timer(2.5, slurm.run, args=("scontrol", "release", job)).start()
    reply = kernel.run(f"%pathways connect slurm:{job} --insecure")
    texts = shown(reply)
    assert any(f"slurm job {job} (pw-held): PENDING (JobHeldUser)" in t for t in texts), texts
    assert any("RUNNING" in t for t in texts), texts
    # Found the proxy through the job's comment and passed pre-flight: only
    # JAX's client, talking to the stand-in, fails (no Pathways image here).
    assert reply.status == "error"
    assert "the Pathways client failed after pre-flight passed" in reply.error, reply.error
    assert f"grpc://127.0.0.1:{port}" in reply.error and "stand-in proxy" in reply.error
    events = kernel.run("%pathways events --kind job_pending").text
    assert "JobHeldUser" in events
    assert "local:2x4" in kernel.run("%pathways status").text
    # A job the kernel did not submit is left running.
    assert slurm.job(job)["JobState"] == "RUNNING"


def test_connect_by_name_and_the_job_id_in_the_error_of_a_job_without_the_convention(slurm, kernel, cancel):
    job = slurm.submit(SLEEP, "--nodes=1", "--time=10", "--job-name=plain-sleep")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")
    reply = kernel.run("%pathways connect slurm:plain-sleep --insecure")
    assert reply.status == "error"
    line = reply.error.strip()
    assert len(line.splitlines()) == 1, line
    assert f"slurm job {job} (plain-sleep) is running but does not follow the Pathways convention" in line
    assert "pathways-proxy=grpc://HOST:PORT" in line
    assert kernel_seconds(reply) < 5.0


def bad_conf(slurm) -> Path:
    """A copy of slurm.conf pointing at a controller port where nothing listens."""
    path = slurm.dir / "unreachable.conf"
    path.write_text(slurm.conf.read_text().replace(f"SlurmctldPort={slurm.ctld_port}", f"SlurmctldPort={free_port()}"))
    return path


# (case, code run first, connect line, words the one line holds, code run after)
BAD = [
    (
        "no slurm commands",
        "import os; _path = os.environ['PATH']; os.environ['PATH'] = '/nonexistent'",
        "slurm:1",
        ["`scontrol` is not on PATH"],
        "os.environ['PATH'] = _path",
    ),
    (
        "slurmctld unreachable",
        "import os; os.environ['SLURM_CONF'] = '{bad_conf}'",
        "slurm:1",
        ["slurmctld is unreachable"],
        "os.environ['SLURM_CONF'] = '{conf}'",
    ),
    ("unknown job id", "", "slurm:999999", ["no Slurm job 999999"], ""),
    ("unknown job name", "", "slurm:no-such-job", ["no active Slurm job is named 'no-such-job'"], ""),
    ("finished job", "", "slurm:{finished}", ["has ended (COMPLETED"], ""),
    ("bad job", "", "slurm:a/b", ["bad Slurm job 'a/b'"], ""),
    ("slices do not fit", "", "local:2x4 --slurm {one_node}", ["the job's 1 nodes do not split into 2 slices"], ""),
    ("missing script", "", "slurm: --submit /no/such.sbatch", ["no such job script"], ""),
    (
        "still pending after --wait",
        "",
        "slurm:{held} --wait 1",
        ["PENDING (JobHeldUser) after waiting 1 s", "raise --wait"],
        "",
    ),
]


@pytest.mark.parametrize("case,before,line,words,after", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_one_line_within_5_s_and_the_kernel_stays_healthy(
    slurm, kernel, cancel, case, before, line, words, after
):
    values = {"conf": slurm.conf, "bad_conf": bad_conf(slurm) if "bad_conf" in before else ""}
    if "{finished}" in line:
        values["finished"] = slurm.submit("#!/bin/bash\ntrue\n", "--nodes=1")
        slurm.wait_job(values["finished"], "COMPLETED")
    if "{one_node}" in line:
        values["one_node"] = slurm.submit(SLEEP, "--nodes=1", "--time=10")
        cancel.append(values["one_node"])
        slurm.wait_job(values["one_node"], "RUNNING")
    if "{held}" in line:
        values["held"] = slurm.submit(SLEEP, "--hold", "--nodes=1")
        cancel.append(values["held"])
    if before:
        assert kernel.run(before.format(**values)).status == "ok"
    reply = kernel.run(f"%pathways connect {line.format(**values)}")
    if after:
        assert kernel.run(after.format(**values)).status == "ok"
    assert reply.status == "error"
    lines = [text for text in reply.error.splitlines() if text.strip()]
    assert len(lines) == 1, reply.error
    for word in words:
        assert word in lines[0], lines[0]
    assert kernel_seconds(reply) < 5.0, f"{case}: {kernel_seconds(reply):.1f} s"
    healthy = kernel.run("%pathways connect local:2x4\nimport jax.numpy as jnp; print(float(jnp.arange(4.0).sum()))")
    assert healthy.status == "ok" and "6.0" in healthy.text, healthy.error


def test_munge_down_is_one_line(slurm, kernel):
    slurm.stop_munge()
    try:
        reply = kernel.run("%pathways connect slurm:1")
    finally:
        slurm.start_munge()
    assert reply.status == "error"
    assert reply.error.strip() == (
        "BackendError: munge is not running on this host, so Slurm cannot authenticate: start munged "
        "(`munge -n | unmunge` should say Success)"
    )
    assert kernel_seconds(reply) < 5.0


def test_cancel_permission_denied_is_one_line(slurm, cancel, monkeypatch, tmp_path):
    from pathways_kernel.backends.slurm import BackendError, Slurm

    job = slurm.submit(SLEEP, "--nodes=1", "--time=10")
    cancel.append(job)
    # The real scancel, run by a user who does not own the job.
    wrapper = tmp_path / "scancel"
    wrapper.write_text('#!/bin/sh\nexec runuser -u nobody -- /usr/bin/scancel "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/sbin:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    start = time.monotonic()
    with pytest.raises(BackendError) as info:
        Slurm().cancel(job)
    assert str(info.value) == f"Slurm refused `scancel {job}`: permission denied (the job is not yours)"
    assert time.monotonic() - start < 5.0
    assert slurm.job(job)["JobState"] in ("PENDING", "RUNNING")


def test_node_down_loses_its_slice_with_slurms_reason_and_its_return_restores_it(slurm, kernel, cancel):
    job = slurm.submit(SLEEP, "--nodes=2", "--time=5", "--job-name=pw-bound")
    cancel.append(job)
    reply = kernel.run(
        f"%pathways connect local:2x4 --slurm {job} --feature slice --force\n"
        "import jax, jax.numpy as jnp\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "x = jax.device_put(jnp.arange(16.0), NamedSharding(pw.mesh(), P('data')))"
    )
    assert reply.status == "ok", reply.error
    bound = kernel.run("%pathways events --kind job_bound --last 1").text
    assert f"slurm job {job} (pw-bound): RUNNING" in bound and "slice 0 = tpu-0, slice 1 = tpu-1" in bound
    limit = kernel.run("%pathways events --kind job_time_limit --last 1").text
    assert f"slurm job {job}: time limit in 4:5" in limit and "TimeLimit=00:05:00" in limit

    slurm.set_node("tpu-1", "down", "cooling failure")
    wait = "import time\nwhile pw.topology().slice({i}).up {op} True: time.sleep(0.05)"
    assert kernel.run(wait.format(i=1, op="is"), timeout=10).status == "ok"
    down = kernel.run("%pathways events --kind slice_down --last 1").text
    assert "slices [0,1] -> [0]" in down and "slurm node tpu-1 DOWN: cooling failure" in down
    lost = kernel.run("float(x.sum())")
    assert lost.status == "error" and "DATA_LOSS" in lost.error
    assert "job_requeued" in kernel.run("%pathways events --kind job_requeued").text

    slurm.set_node("tpu-1", "resume")
    assert kernel.run(wait.format(i=1, op="is not"), timeout=10).status == "ok"
    up = kernel.run("%pathways events --kind slice_up --last 1").text
    assert "slices [0] -> [0,1]" in up and "slurm node tpu-1 back in service" in up
    fresh = kernel.run("print(float(jax.device_put(jnp.ones(16), NamedSharding(pw.mesh(), P('data'))).sum()))")
    assert fresh.text.strip() == "16.0", fresh.error
    # DRAIN and FAIL take a slice out of service as DOWN does.
    for state in ("drain", "fail"):
        slurm.set_node("tpu-0", state, f"{state} test")
        assert kernel.run(wait.format(i=0, op="is"), timeout=10).status == "ok"
        detail = kernel.run("print(pw.events(kind='slice_down')[-1].detail)").text
        assert "slurm node tpu-0 " in detail and state.upper() in detail and f"{state} test" in detail, detail
        slurm.set_node("tpu-0", "resume")
        assert kernel.run(wait.format(i=0, op="is not"), timeout=10).status == "ok"
    slurm.run("scancel", job)
    ended = "while not pw.events(kind='job_ended'): time.sleep(0.05)\nprint(pw.events(kind='job_ended')[-1].detail)"
    assert f"slurm job {job} (pw-bound): CANCELLED" in kernel.run(ended, timeout=10).text


def test_a_crashed_slurmd_loses_its_slice_once_slurm_marks_the_node_down(slurm, kernel, cancel):
    job = slurm.submit(SLEEP, "--nodes=2", "--time=5", "--job-name=pw-crash")
    cancel.append(job)
    assert kernel.run(f"%pathways connect local:2x4 --slurm {job} --force").status == "ok"
    slurm.kill_slurmd("tpu-1")
    try:
        # slurmctld gives a silent slurmd SlurmdTimeout (6 s here) before it marks the node DOWN.
        gone = kernel.run("import time\nwhile pw.topology().slice(1).up: time.sleep(0.05)", timeout=40)
        assert gone.status == "ok", gone.error
    finally:
        slurm.start_slurmd("tpu-1")
    down = kernel.run("%pathways events --kind slice_down --last 1").text
    assert "slurm node tpu-1 DOWN" in down and "Not responding" in down, down
    # ReturnToService=1: a node that was down for not responding comes back when its slurmd registers.
    back = kernel.run("while not pw.topology().slice(1).up: time.sleep(0.05)", timeout=40)
    assert back.status == "ok", back.error
    assert "slurm node tpu-1 back in service" in kernel.run("%pathways events --kind slice_up --last 1").text


ELASTIC_SETUP = """
import subprocess, time
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
rng = np.random.default_rng(0)
xs = rng.normal(size=(30, 16, 32)).astype(np.float32)
ys = rng.normal(size=(30, 16, 8)).astype(np.float32)

@jax.jit
def update(w, x, y):
    return w - 0.01 * jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)

def init():
    return jax.device_put(np.linspace(1.0, 2.0, 32 * 8, dtype=np.float32).reshape(32, 8),
                          NamedSharding(pw.mesh(), P(None, 'model')))

def node(state, until):
    subprocess.run(['scontrol', 'update', 'nodename=tpu-1', 'state=' + state, 'reason=elastic rehearsal'], check=True)
    while pw.topology().slice(1).up != until:
        time.sleep(0.05)

faults = {}
w = init()
"""

ELASTIC_STEP = """%%pathways elastic --steps 30 --state w --snapshot-every 5
if step == 12 and 'down' not in faults:
    faults['down'] = step
    node('down', until=False)
if step == 21 and 'up' not in faults:
    faults['up'] = step
    node('resume', until=True)
batch = NamedSharding(mesh, P('data'))
w = update(w, jax.device_put(xs[step], batch), jax.device_put(ys[step], batch))
"""


def test_elastic_cell_on_local_slurm_survives_a_node_down_and_matches_the_fault_free_run(slurm, kernel, cancel):
    job = slurm.submit(SLEEP, "--nodes=2", "--time=10", "--job-name=pw-elastic")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")
    setup = kernel.run(f"%pathways connect local:2x4 --slurm {job} --nodes-per-slice 1 --force\n" + ELASTIC_SETUP)
    assert setup.status == "ok", setup.error
    # Fault-free first: the faults are marked as already done, so the cell injects none.
    assert kernel.run("faults.update(down=-1, up=-1)").status == "ok"
    reference = kernel.run(ELASTIC_STEP, timeout=120)
    assert reference.status == "ok", reference.error
    assert kernel.run("expected = np.asarray(w); faults.clear(); w = init()").status == "ok"
    seq = kernel.run("print(pw.events()[-1].seq)").text.strip()
    run = kernel.run(ELASTIC_STEP, timeout=120)
    assert run.status == "ok", run.error
    assert kernel.run("np.testing.assert_allclose(np.asarray(w), expected, rtol=1e-5)").status == "ok"
    kinds = kernel.run(f"print([e.kind for e in pw.session().events.since({seq})])").text
    for kind in ("slice_down", "retry", "slice_up", "scale_up"):
        assert f"'{kind}'" in kinds, kinds
    down = kernel.run("%pathways events --kind slice_down --last 1").text
    assert "slurm node tpu-1 DOWN: elastic rehearsal" in down


def test_a_submitted_job_is_cancelled_at_kernel_shutdown_and_others_are_not(slurm, cancel, capfd):
    port = free_port()
    other = slurm.submit(SLEEP, "--nodes=1", "--time=10", "--job-name=not-mine")
    cancel.append(other)
    slurm.wait_job(other, "RUNNING")
    k = Kernel("pathways", env={**kernel_env(slurm), **proxy_env(port)})
    k.km.shutdown_wait_time = 60.0
    try:
        reply = k.run(
            f"%pathways connect slurm:pw-mine --insecure --submit {TEMPLATE} --nodes=1 --time=10 --output={slurm.dir}/%j.out"
        )
        # It got as far as the proxy's pre-flight, as with a job found running.
        assert "the Pathways client failed after pre-flight passed" in reply.error, reply.error
        mine = k.run("from pathways_kernel.backends import slurm as _s; print(*_s.submitted_jobs())").text.strip()
        cancel.append(mine)
        submitted = k.run("%pathways events --kind job_submitted").text
        assert f"slurm job {mine} (pathways-job): cancelled when this kernel exits" in submitted
        assert slurm.job(mine)["JobName"] == "pw-mine" and slurm.job(mine)["JobState"] == "RUNNING"
        # The kernel also follows a job it did not submit.
        bound = k.run(f"%pathways connect local:1x4 --slurm {other}")
        assert bound.status == "ok", bound.error
    finally:
        assert k.shutdown() == 0
    assert f"pathways-kernel: cancelled Slurm job {mine} (submitted by this kernel)" in capfd.readouterr().err
    assert slurm.wait_job(mine, "CANCELLED", timeout=10)["JobState"] == "CANCELLED"
    assert slurm.job(other)["JobState"] == "RUNNING"


def monitor(kernel):
    """A monitor comm opened as the panel does (tests/test_monitor_kernel.py), and its first topology's target."""
    from test_monitor_kernel import Frontend, _is

    frontend = Frontend(kernel)
    comm = frontend.open()
    first = frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30)
    assert first is not None, "no topology after comm_open"

    def next_target(than: str, timeout: float = 5) -> tuple[str, int]:
        """The target of the next topology message whose target differs from ``than``, and its topology_seq."""
        mark = len(frontend.inbox)
        msg = frontend.wait_for(
            lambda m: _is(m, comm, "topology") and m["content"]["data"]["target"] != than, timeout, since=mark
        )
        assert msg is not None, f"no topology with a target other than {than!r} within {timeout} s"
        topology = monitor_frontend.decode_topology(msg["content"]["data"], msg["buffers"])
        return topology.target, topology.topology_seq

    return first["content"]["data"]["target"], first["content"]["data"]["topology_seq"], next_target


def test_the_monitor_topology_target_is_the_job_id_and_its_time_left_resent_when_slurm_changes_it(
    slurm, kernel, cancel
):
    job = slurm.submit(SLEEP, "--nodes=2", "--time=30", "--job-name=pw-panel")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")
    assert kernel.run(f"%pathways connect local:2x4 --slurm {job} --force").status == "ok"
    target, seq, next_target = monitor(kernel)
    left = re.fullmatch(rf"slurm job {job} · (\d+) min left", target)
    assert left is not None and 25 <= int(left.group(1)) <= 29, target

    # The admin shortens the job: the panel's header follows within one poll and a sample.
    slurm.run("scontrol", "update", f"jobid={job}", "timelimit=12")
    shorter, shorter_seq = next_target(target)
    assert re.fullmatch(rf"slurm job {job} · 1[01] min left", shorter), shorter
    assert shorter_seq > seq
    slurm.run("scancel", job)
    ended, _ = next_target(shorter)
    if ended == f"slurm job {job} · COMPLETING":
        ended, _ = next_target(ended)
    assert ended == f"slurm job {job} · CANCELLED"


def test_a_job_preempted_by_a_higher_tier_partition_loses_every_slice_and_gets_them_back_when_it_runs_again(
    slurm, kernel, cancel
):
    job = slurm.submit(SLEEP, "--nodes=2", "--time=10", "--job-name=pw-victim")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")
    reply = kernel.run(
        f"%pathways connect local:2x4 --slurm {job} --feature slice --force\n"
        "import time, jax, jax.numpy as jnp\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "x = jax.device_put(jnp.arange(16.0), NamedSharding(pw.mesh(), P('data')))"
    )
    assert reply.status == "ok", reply.error
    # Same nodes, partition `urgent` (PriorityTier 10 over 1, PreemptMode=REQUEUE in tests/slurm.py).
    urgent = slurm.submit(SLEEP, "--nodes=2", "--time=5", "--partition=urgent", "--job-name=pw-urgent")
    cancel.append(urgent)
    gone = kernel.run("while len(pw.topology().down_slices) < 2: time.sleep(0.05)", timeout=20)
    assert gone.status == "ok", gone.error
    assert slurm.job(urgent)["JobState"] == "RUNNING"
    preempted = kernel.run("%pathways events --kind job_preempted --last 1").text
    assert f"slurm job {job} preempted by job {urgent} (partition urgent) and requeued (PENDING" in preempted
    assert f"slurm job {job} requeued" not in kernel.run("%pathways events --kind job_requeued").text
    downs = kernel.run("print(*[e.detail for e in pw.events(kind='slice_down')[-2:]], sep='\\n')").text.splitlines()
    assert len(downs) == 2 and all(
        d.startswith(f"slurm job {job} preempted by job {urgent} (partition urgent): ") for d in downs
    ), downs
    lost = kernel.run("float(x.sum())")
    assert lost.status == "error" and "DATA_LOSS" in lost.error

    # The preemptor done and its nodes idle, the requeued job starts again (now, not after Slurm's requeue delay).
    slurm.run("scancel", urgent)
    slurm.wait_job(urgent, "CANCELLED")
    slurm.wait_nodes("idle")
    slurm.run("scontrol", "update", f"jobid={job}", "starttime=now")
    back = kernel.run("while pw.topology().down_slices: time.sleep(0.05)", timeout=40)
    assert back.status == "ok", back.error
    ups = kernel.run("print(*[e.detail for e in pw.events(kind='slice_up')[-2:]], sep='\\n')").text.splitlines()
    assert [u.split(":")[0] for u in ups] == [f"slurm job {job} running again on tpu-{i}" for i in (0, 1)], ups
    fresh = kernel.run("print(float(jax.device_put(jnp.ones(16), NamedSharding(pw.mesh(), P('data'))).sum()))")
    assert fresh.text.strip() == "16.0", fresh.error
