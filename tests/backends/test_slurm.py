"""Pathways on Slurm, against a real Slurm cluster on this machine (tests/support/slurm.py).

Two ``slurmd`` nodes (tpu-0, tpu-1) under one ``slurmctld`` and ``munged``.
No Pathways server image exists here, so a job's "Pathways proxy" is the
stand-in of tests/backends/test_proxy.py (``stand_in_proxy.py``) run inside the job by
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
from kernels import SERVER, Kernel
from slurm import slurm_cluster  # noqa: F401  (the `slurm` fixture)

pytestmark = pytest.mark.kernel

# Kernels run on the product default, a local Pathways server (conftest._backend): the
# slices bound to a job are the server's.
KERNEL_BACKEND = SERVER

STAND_IN = Path(__file__).resolve().parents[1] / "support" / "stand_in_proxy.py"
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
    k = Kernel("pathways", env=kernel_env(slurm), backend=KERNEL_BACKEND)
    k.km.shutdown_wait_time = 60.0
    # The kernel's own start first (its local server): the tests time what Slurm does from their cells on.
    assert k.run("pass").status == "ok"
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


def test_pw_connect_takes_a_slurm_job_id_as_the_magic_does(slurm, kernel, cancel):
    port = free_port()
    job = slurm.submit_env(template_path(), proxy_env(port), "--nodes=1", "--time=20", "--job-name=pw-twin")
    cancel.append(job)
    # `slurm:4` also reads as HOST:PORT; the Python twin must still find the job.
    for spec in (f"slurm:{job}", "slurm:pw-twin"):
        reply = kernel.run(f"pw.connect({spec!r}, insecure=True)")
        assert reply.status == "error"
        assert "the Pathways client failed after pre-flight passed" in reply.error, reply.error
        assert f"grpc://127.0.0.1:{port}" in reply.error


@pytest.mark.serial  # timing: the kernel's answer within 5 s
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


@pytest.mark.serial  # timing: the kernel's answer within 5 s
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


@pytest.mark.serial  # timing: the kernel's answer within 5 s
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


@pytest.mark.serial  # timing: the answer within 5 s
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


WAIT_SLICE = "import time\nwhile pw.topology().slice({i}).up is {up}: time.sleep(0.05)"


def test_with_no_kill_a_failed_node_leaves_the_job_and_its_slice_comes_back_only_with_a_new_job(slurm, kernel, cancel):
    job = slurm.submit(SLEEP, "--nodes=2", "--no-kill", "--time=5", "--job-name=pw-bound")
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
    # Under 5 minutes left, by the time (re)starting the local server took.
    assert f"slurm job {job}: time limit in 4:" in limit and "TimeLimit=00:05:00" in limit

    # DRAIN and FAIL leave the node in the job: its slice is out while they last.
    for state in ("drain", "fail"):
        slurm.set_node("tpu-0", state, f"{state} test")
        assert kernel.run(WAIT_SLICE.format(i=0, up=True), timeout=20).status == "ok"
        detail = kernel.run("print(pw.events(kind='slice_down')[-1].detail)").text
        assert "slurm node tpu-0 " in detail and state.upper() in detail and f"{state} test" in detail, detail
        slurm.set_node("tpu-0", "resume")
        assert kernel.run(WAIT_SLICE.format(i=0, up=False), timeout=20).status == "ok"
        assert "slurm node tpu-0 back in service" in kernel.run("%pathways events --kind slice_up --last 1").text

    # DOWN: the job runs on without the node (--no-kill), and its slice is lost.
    x_lost = kernel.run("float(x.sum())")
    assert x_lost.status == "error" and "DATA_LOSS" in x_lost.error  # slice 0 was lost by the drain
    kernel.run("x = jax.device_put(jnp.arange(16.0), NamedSharding(pw.mesh(), P('data')))")
    slurm.set_node("tpu-1", "down", "cooling failure")
    assert kernel.run(WAIT_SLICE.format(i=1, up=True), timeout=20).status == "ok"
    down = kernel.run("%pathways events --kind slice_down --last 1").text
    assert "slices [0,1] -> [0]" in down and "slurm node tpu-1 DOWN: cooling failure" in down, down
    assert slurm.job(job)["JobState"] == "RUNNING" and slurm.job(job)["NodeList"] == "tpu-0"
    lost = kernel.run("float(x.sum())")
    assert lost.status == "error" and "DATA_LOSS" in lost.error

    # Back in service, the node is idle, outside the job: not a slice_up.
    slurm.set_node("tpu-1", "resume")
    slurm.wait_nodes("idle", names=["tpu-1"])
    stays = kernel.run(
        "deadline = time.monotonic() + 3\n"
        "while time.monotonic() < deadline and not pw.topology().slice(1).up: time.sleep(0.05)\n"
        "print(pw.status())"
    )
    assert "slices    1/2 up" in stays.text, stays.text

    # The job ending takes the last slice: nothing of the allocation is left.
    slurm.run("scancel", job)
    ended = "while 'CANCELLED' not in pw.status().target: time.sleep(0.05)"  # COMPLETING first
    assert kernel.run(ended, timeout=20).status == "ok"
    status = kernel.run("print(pw.status())").text
    assert f"slurm job {job} · CANCELLED" in status and "slices    0/2 up" in status, status
    ended = kernel.run("print(pw.events(kind='job_ended')[-1].detail)").text
    assert f"slurm job {job} (pw-bound): CANCELLED" in ended

    # A new job with the nodes, bound in the same session, brings both slices back.
    again = slurm.submit(SLEEP, "--nodes=2", "--no-kill", "--time=5", "--job-name=pw-again")
    cancel.append(again)
    rebound = kernel.run(f"%pathways connect local:2x4 --slurm {again} --feature slice")
    assert rebound.status == "ok", rebound.error
    assert "2/2 up" in rebound.text, rebound.text
    ups = kernel.run("print(*[e.detail for e in pw.events(kind='slice_up')[-2:]], sep='\\n')").text.splitlines()
    assert [u.split(":")[0] for u in ups] == [f"slurm job {again} running on tpu-{i}" for i in (0, 1)], ups
    still_lost = kernel.run("float(x.sum())")
    assert still_lost.status == "error" and "DATA_LOSS" in still_lost.error
    fresh = kernel.run("print(float(jax.device_put(jnp.ones(16), NamedSharding(pw.mesh(), P('data'))).sum()))")
    assert fresh.text.strip() == "16.0", fresh.error
    slurm.run("scancel", again)


def test_a_requeued_job_takes_every_slice_down_and_an_elastic_run_waits_for_it_to_run_again(slurm, kernel, cancel):
    # Without --no-kill a node failure ends the job's allocation: Slurm requeues it (PENDING, BeginTime).
    job = slurm.submit(SLEEP, "--nodes=2", "--time=10", "--job-name=pw-requeue")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")
    setup = kernel.run(
        f"%pathways connect local:2x4 --slurm {job} --nodes-per-slice 1 --force\n" + ELASTIC_SETUP + f"JOB = {job!r}\n"
        "import threading\n"
        "def requeue():\n"
        "    x = jax.device_put(jnp.arange(16.0), NamedSharding(pw.mesh(), P('data')))\n"
        "    subprocess.run(['scontrol', 'update', 'nodename=tpu-1', 'state=down', 'reason=requeue rehearsal'], check=True)\n"
        "    deadline = time.monotonic() + 20\n"
        "    while pw.topology().up_slices and time.monotonic() < deadline: time.sleep(0.05)\n"
        "    seen['pending'] = str(pw.status())\n"
        "    try: float(x.sum())\n"
        "    except Exception as exc: seen['x'] = str(exc)\n"
        "    threading.Thread(target=run_again).start()\n"
        "def run_again():\n"
        "    subprocess.run(['scontrol', 'update', 'nodename=tpu-1', 'state=resume'], check=True)\n"
        "    while subprocess.run(['squeue', '-h', '-j', JOB, '-o', '%T'], capture_output=True, text=True).stdout.strip() != 'PENDING': time.sleep(0.1)\n"
        "    subprocess.run(['scontrol', 'update', 'jobid=' + JOB, 'starttime=now'], check=True)\n"
        "seen = {}\n"
    )
    assert setup.status == "ok", setup.error
    assert kernel.run("faults.update(down=-1)").status == "ok"
    reference = kernel.run(ELASTIC_STEP, timeout=120)
    assert reference.status == "ok", reference.error
    assert kernel.run("expected = np.asarray(w); faults.clear(); w = init()").status == "ok"
    seq = kernel.run("print(pw.events()[-1].seq)").text.strip()
    run = kernel.run(REQUEUE_STEP, timeout=240)
    assert run.status == "ok", run.error
    seen = kernel.run("print(seen['pending']); print(seen['x'])").text
    # While the job is pending, no slice is up, pw.status() says why, and arrays on every slice are lost.
    assert "slices    0/2 up" in seen and f"slurm job {job} · PENDING (BeginTime)" in seen, seen
    assert "DATA_LOSS" in seen
    assert kernel.run("np.testing.assert_allclose(np.asarray(w), expected, rtol=1e-5)").status == "ok"
    events = kernel.run(f"print(*[(e.kind, e.detail) for e in pw.session().events.since({seq})], sep='\\n')").text
    downs = [line for line in events.splitlines() if line.startswith("('slice_down'")]
    assert len(downs) == 2 and all(f"slurm job {job} requeued (PENDING" in d for d in downs), events
    assert "slurm node tpu-1 DOWN: requeue rehearsal" in downs[-1], downs
    for kind in ("job_requeued", "retry", "job_running", "slice_up"):
        assert f"('{kind}'" in events, events
    assert f"slurm job {job} running again on tpu-1" in events
    assert "2/2 up" in kernel.run("%pathways status").text


def test_a_crashed_slurmd_loses_its_slice_once_slurm_marks_the_node_down(slurm, kernel, cancel):
    job = slurm.submit(SLEEP, "--nodes=2", "--no-kill", "--time=5", "--job-name=pw-crash")
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
    # ReturnToService=1: the node is back when its slurmd registers, but no longer in the job (--no-kill).
    slurm.wait_nodes("idle", names=["tpu-1"])
    assert slurm.job(job)["NodeList"] == "tpu-0"
    assert "slices    1/2 up" in kernel.run("print(pw.status())").text
    slurm.run("scancel", job)


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
batch = NamedSharding(mesh, P('data'))
w = update(w, jax.device_put(xs[step], batch), jax.device_put(ys[step], batch))
"""


REQUEUE_STEP = """%%pathways elastic --steps 30 --state w --snapshot-every 5
if step == 12 and 'down' not in faults:
    faults['down'] = step
    requeue()
batch = NamedSharding(mesh, P('data'))
w = update(w, jax.device_put(xs[step], batch), jax.device_put(ys[step], batch))
"""


def test_elastic_cell_on_local_slurm_survives_a_node_down_and_matches_the_fault_free_run(slurm, kernel, cancel):
    job = slurm.submit(SLEEP, "--nodes=2", "--no-kill", "--time=10", "--job-name=pw-elastic")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")
    setup = kernel.run(f"%pathways connect local:2x4 --slurm {job} --nodes-per-slice 1 --force\n" + ELASTIC_SETUP)
    assert setup.status == "ok", setup.error
    # Fault-free first: the faults are marked as already done, so the cell injects none.
    assert kernel.run("faults.update(down=-1)").status == "ok"
    reference = kernel.run(ELASTIC_STEP, timeout=120)
    assert reference.status == "ok", reference.error
    assert kernel.run("expected = np.asarray(w); faults.clear(); w = init()").status == "ok"
    seq = kernel.run("print(pw.events()[-1].seq)").text.strip()
    run = kernel.run(ELASTIC_STEP, timeout=120)
    assert run.status == "ok", run.error
    assert kernel.run("np.testing.assert_allclose(np.asarray(w), expected, rtol=1e-5)").status == "ok"
    kinds = kernel.run(f"print([e.kind for e in pw.session().events.since({seq})])").text
    for kind in ("slice_down", "retry"):
        assert f"'{kind}'" in kinds, kinds
    down = kernel.run("%pathways events --kind slice_down --last 1").text
    assert "slurm node tpu-1 DOWN: elastic rehearsal" in down
    # The job ran on with tpu-0 (--no-kill), and so did the run, on slice 0.
    assert slurm.job(job)["JobState"] == "RUNNING" and slurm.job(job)["NodeList"] == "tpu-0"
    slurm.set_node("tpu-1", "resume")
    slurm.run("scancel", job)


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
    """A monitor comm opened as the panel does (tests/monitoring/test_monitor_kernel.py), and its first topology's target."""
    from comm_frontend import Frontend
    from comm_frontend import is_comm_msg as _is

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
    # Same nodes, partition `urgent` (PriorityTier 10 over 1, PreemptMode=REQUEUE in tests/support/slurm.py).
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


class Recorder:
    """A slice sink that records what the watch did to each slice: the watch's judgement is what is tested."""

    def __init__(self, slices: int = 2):
        self.slices, self.calls, self.downs = slices, [], set()

    def slice_count(self) -> int:
        return self.slices

    def down_slices(self) -> tuple[int, ...]:
        return tuple(sorted(self.downs))

    def down(self, index: int, detail: str) -> None:
        self.calls.append(("down", index, detail))
        self.downs.add(index)

    def up(self, index: int, detail: str) -> None:
        self.calls.append(("up", index, detail))
        self.downs.discard(index)


def watch_of(slurm, job, sink, monkeypatch):
    """A watch of ``job`` whose polls the test makes (no thread), so that a failure can fall between two."""
    from pathways_kernel.backends.slurm import Slurm
    from pathways_kernel.backends.slurm_watch import JobWatch
    from pathways_kernel.core.eventlog import EventLog

    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    client = Slurm()
    events = EventLog()
    watch = JobWatch(client, client.job(job), events, sink, feature="slice")
    watch.poll()
    return watch, events


def test_a_node_that_fails_and_returns_between_two_polls_still_loses_its_slice(slurm, cancel, monkeypatch):
    job = slurm.submit(SLEEP, "--nodes=2", "--no-kill", "--time=30", "--job-name=pw-flap")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")
    sink = Recorder()
    watch, _ = watch_of(slurm, job, sink, monkeypatch)
    assert sink.calls == []
    # As with ReturnToService=2: the node is DOWN for less than a poll, then back in service.
    slurm.set_node("tpu-1", "down", "flap")
    slurm.set_node("tpu-1", "resume")
    slurm.wait_nodes("idle", names=["tpu-1"])
    watch.poll()
    assert sink.calls == [("down", 1, f"slurm node tpu-1 (IDLE now); it left slurm job {job}")]
    watch.poll()
    assert len(sink.calls) == 1  # in service again, but outside the job: not a slice_up
    slurm.run("scancel", job)


def test_a_job_requeued_and_running_again_between_two_polls_loses_and_regains_every_slice(slurm, cancel, monkeypatch):
    job = slurm.submit(SLEEP, "--nodes=2", "--time=30", "--job-name=pw-rerun")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")
    sink = Recorder()
    watch, events = watch_of(slurm, job, sink, monkeypatch)
    slurm.set_node("tpu-1", "down", "flap")
    slurm.set_node("tpu-1", "resume")
    slurm.wait_job(job, "PENDING")
    slurm.run("scontrol", "update", f"jobid={job}", "starttime=now")
    slurm.wait_job(job, "RUNNING")
    watch.poll()
    assert [c[:2] for c in sink.calls] == [("down", 0), ("down", 1), ("up", 0), ("up", 1)], sink.calls
    assert sink.calls[0][2] == f"slurm job {job} requeued (running again), restart 1"
    assert sink.calls[2][2] == f"slurm job {job} running again on tpu-0"
    assert [e.kind for e in events.since(0)] == ["job_requeued", "job_running"]


def test_on_a_slurm_session_a_pending_job_has_no_slice_up_until_it_runs_again(slurm, cancel, monkeypatch):
    """The sink of ``slurm:JOB`` (the session marks its slices), on an in-process session.

    No Pathways server runs here, so the session's backend is the embedded
    one; what is tested is the session's slices following the job.
    """
    import pathways_kernel as pw
    from pathways_kernel.backends.slurm_watch import SessionSlices

    job = slurm.submit(SLEEP, "--nodes=2", "--time=30", "--job-name=pw-proxyside")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")
    session = pw.connect("embedded:2x4", force=True)
    watch, _ = watch_of(slurm, job, SessionSlices(session.backend), monkeypatch)
    try:
        slurm.set_node("tpu-1", "down", "node failure")
        slurm.wait_job(job, "PENDING")
        watch.poll()
        assert session.status().slices_up == 0
        details = [e.detail for e in pw.events(kind="slice_down")[-2:]]
        assert all(d.startswith(f"slurm job {job} requeued (PENDING, BeginTime), restart 1") for d in details)
        slurm.set_node("tpu-1", "resume")
        slurm.run("scontrol", "update", f"jobid={job}", "starttime=now")
        slurm.wait_job(job, "RUNNING")
        watch.poll()
        assert session.status().slices_up == 2
    finally:
        slurm.run("scontrol", "update", "nodename=tpu-1", "state=resume", check=False)
        for index in range(2):
            session.set_slice_state(index, "up")


def test_the_template_submits_with_no_kill_so_a_failed_node_leaves_the_job_and_its_workers_running(slurm, cancel):
    port = free_port()
    env = {**proxy_env(port), "PATHWAYS_WORKER_CMD": "sleep 300"}
    job = slurm.submit_env(template_path(), env, "--nodes=2", "--time=10", "--job-name=pw-template")
    cancel.append(job)
    slurm.wait_job(job, "RUNNING")

    def steps() -> str:
        return slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%i %N").stdout

    deadline = time.monotonic() + 30
    while f"{job}.0 " not in steps() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"{job}.0 tpu-[0-1]" in steps(), steps()
    slurm.set_node("tpu-1", "down", "template test")
    try:
        deadline = time.monotonic() + 20
        while slurm.job(job)["NodeList"] != "tpu-0" and time.monotonic() < deadline:
            time.sleep(0.1)
        info = slurm.job(job)
        assert info["JobState"] == "RUNNING" and info["NodeList"] == "tpu-0", info
        # The workers' step (srun --no-kill) runs on too, with the worker on tpu-0.
        assert f"{job}.0 " in steps(), steps()
    finally:
        slurm.run("scontrol", "update", "nodename=tpu-1", "state=resume", check=False)
        slurm.run("scancel", job)


def test_submitting_a_script_without_no_kill_warns_once(slurm, kernel, cancel, tmp_path):
    script = tmp_path / "plain.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\nsleep 300\n")
    kill_ok = tmp_path / "elastic.sbatch"
    kill_ok.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --no-kill\nsleep 300\n")
    warning = "plain.sbatch is submitted without --no-kill, so Slurm ends the whole job when one node fails"
    said = []
    for path in (script, script, kill_ok, TEMPLATE):
        reply = kernel.run(f"%pathways connect slurm:pw-warn --wait 0 --submit {path} --hold")
        assert reply.status == "error" and "PENDING (JobHeldUser)" in reply.error, reply.error
        said.append(reply.error)
        cancel.append(
            kernel.run("from pathways_kernel.backends import slurm as _s; print(_s.submitted_jobs()[-1])").text.strip()
        )
    assert said[0].count(warning) == 1, said[0]
    assert not any("--no-kill" in text for text in said[1:]), said


@pytest.mark.parametrize(
    "directives,options,env,kills",
    [
        ("", (), "", True),
        ("#SBATCH --no-kill\n", (), "", False),
        ("#SBATCH -N 2 -k\n", (), "", False),
        ("", ("--no-kill",), "", False),
        ("#SBATCH --no-kill\n", ("--no-kill=off",), "", True),
        ("", (), "1", False),
        ("echo hi\n#SBATCH --no-kill\n", (), "", True),  # sbatch stops reading at the first command
    ],
)
def test_what_counts_as_submitting_with_no_kill(tmp_path, monkeypatch, directives, options, env, kills):
    from pathways_kernel.backends.slurm import kills_on_node_failure

    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n# a comment\n" + directives + "sleep 1\n")
    monkeypatch.setenv("SBATCH_NO_KILL", env)
    assert kills_on_node_failure(script, options) is kills
