"""Profiling a cell in a real kernel on local:2x4, and the Pathways (proxy) path up to its boundary.

Kernel tests run ``%%pathways profile`` on a jitted, sharded loop and read what
a user sees: the inline summary, ``%pathways profiles``, the timeline, and one
line for every refused capture.

The proxy backend cannot run here (no Pathways server). Its path is tested
with the real pathwaysutils code and the fake GCS server as far as it goes:
the gs:// dir is checked on the (fake) bucket, pathwaysutils validates it
against its allowlist, builds the profile request and hands it to the IFRT
client as a plugin program (``PluginExecutable``). **That call is the
boundary**: Pathways' proxy would forward it to the workers, the CPU client
refuses it ("PjRtCompiler requires an HloProgram"). Past the boundary, a
trace the workers would write under ``gs://.../plugins/profile/RUN`` is read
back from the bucket and summarized.
"""

from __future__ import annotations

import glob
import os
import re
import types

import pytest
from kernels import Kernel

LOOP = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
m = pw.mesh()
x = jax.device_put(jnp.ones((512, 512)), NamedSharding(m, P("data", "model")))

@jax.jit
def train_step(x):
    return jnp.tanh(x @ x.T) * 0.5
"""

PROFILED = """%%pathways profile --name loop
for _ in range(20):
    x = train_step(x)
float(x.sum())
"""


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    k = Kernel("pathways", env={"PATHWAYS_PROFILE_DIR": str(root)})
    assert k.run(LOOP).status == "ok"
    yield k, root
    k.shutdown()


@pytest.fixture(scope="module")
def loop_reply(profiled):
    """The reply to the profiled loop, captured once."""
    k, _ = profiled
    reply = k.run(PROFILED)
    assert reply.status == "ok", reply.error
    return reply


#: One row of the top ops: per device, summed over devices, share, count, op (XLA op, module; N devices).
OP_ROW = re.compile(r"^ +([\d.]+) ms +([\d.]+) ms +(\d+)% +(\d+)  (\S+)  \(([^;]+); (\d+) devices?\)$", re.M)


@pytest.mark.kernel
def test_profiled_loop_summary_names_its_ops_and_both_slices(profiled, loop_reply):
    k, root = profiled
    reply = loop_reply
    text = reply.text
    # The cell's last expression is shown, as in any cell, then the summary.
    assert re.search(r"^\d+\.\d+$", text.splitlines()[0]), text
    assert re.search(r"profile loop: wall [\d.]+ ms, compile [\d.]+ ms", text), text
    assert re.search(r"slice 0 .* devices 0,1,2,3", text), text
    assert re.search(r"slice 1 .* devices 4,5,6,7", text), text
    assert "top ops by self time" in text and "jit_train_step; " in text, text
    # The loop's matmul is all-gathered across the model axis: XLA's own op names.
    assert "all-gather" in text, text

    html = next(d["text/html"] for d in reply.data if "pathways-profile" in d.get("text/html", ""))
    run = re.search(r"data-pathways-xprof-run='([^']+)'", html).group(1)
    assert run.endswith("-loop") and "Open in XProf" in html
    # The run is where XProf looks: <root>/<run session>/plugins/profile/<run>.
    session_dir, run_name = run.split("/")
    # Named by time only: notebooks save the run in their links (it carried the kernel's pid).
    assert re.fullmatch(r"\d{8}-\d{6}(-\d+)?", session_dir), run
    assert glob.glob(str(root / session_dir / "plugins" / "profile" / run_name / "*.xplane.pb"))


@pytest.mark.kernel
def test_ops_are_named_by_their_jax_source_with_xlas_op_beside(loop_reply):
    rows = OP_ROW.findall(loop_reply.text)
    assert rows, loop_reply.text
    ops = {(op, detail) for *_, op, detail, _ in rows}
    # The matmul's all-gather is named by the jnp line it came from; XLA's name stays beside it.
    assert ("jit(train_step)/dot_general", "all-gather, jit_train_step") in ops, loop_reply.text
    # XLA:CPU's fusions (ynn_fusion, ..._fusion) never stand for the op: they carry a JAX name.
    named_by_xla = [op for op, _ in ops if not op.startswith("jit(")]
    assert all("fusion" not in op for op in named_by_xla), loop_reply.text
    assert any(op.startswith("jit(train_step)/") and "fusion" in detail for op, detail in ops), loop_reply.text


@pytest.mark.kernel
def test_self_times_are_per_device_means_and_the_sum_over_devices_is_labelled(loop_reply):
    text = loop_reply.text
    wall_ms = float(re.search(r"wall ([\d.]+) ms", text).group(1))
    assert re.search(
        r"top ops by self time: per device \(mean over the devices that ran it\), summed over devices", text
    )
    assert re.search(r"share of all devices' [\d.]+ ms \(8 devices\)", text), text
    rows = OP_ROW.findall(text)
    for per_device, summed, _, _, op, _, devices in rows:
        n = int(devices)
        assert n <= 8 and float(per_device) <= wall_ms, (op, text)
        # The sum is the mean times the devices, to the rounding of each figure.
        assert abs(float(summed) - float(per_device) * n) <= 0.1 * n + 0.1, (op, text)
    # The all-gather ran on every device of both slices: its sum is over 8 devices, not the wall time's.
    assert any(op == "jit(train_step)/dot_general" and devices == "8" for *_, op, _, devices in rows), text


@pytest.mark.kernel
def test_each_devices_time_is_shown_under_its_slice_and_the_summary_says_what_the_trace_shows(loop_reply):
    text = loop_reply.text
    slice0 = re.search(r"^  slice 0 .*\n    (.*)$", text, re.M).group(1)
    slice1 = re.search(r"^  slice 1 .*\n    (.*)$", text, re.M).group(1)
    assert re.findall(r"device (\d) [\d.]+ ms", slice0) == ["0", "1", "2", "3"], text
    assert re.findall(r"device (\d) [\d.]+ ms", slice1) == ["4", "5", "6", "7"], text
    assert (
        "in XProf: one process /host:CPU runs every device on its threads (XLA:CPU); an op's device is its "
        "device_ordinal, and the capture's span pathways.slices says which slice holds which device "
        "(slice 0: devices 0,1,2,3; slice 1: devices 4,5,6,7)" in text
    ), text
    html = next(d["text/html"] for d in loop_reply.data if "pathways-profile" in d.get("text/html", ""))
    assert "one process /host:CPU" in html and "jit(train_step)/dot_general" in html


@pytest.mark.kernel
def test_latest_profile_is_this_kernels_own_capture_or_says_it_has_none(profiled, loop_reply):
    from comm_frontend import Frontend

    k, root = profiled
    other = Kernel("pathways", env={"PATHWAYS_PROFILE_DIR": str(root)})  # another notebook, same profile root
    try:
        frontend = Frontend(other)
        comm = frontend.open()
        request_id = frontend.request(comm, "latest_profile")
        reply = frontend.reply_to(comm, request_id, timeout=60)
        assert reply is not None and reply["ok"], reply
        # The first notebook's capture is in XProf's runs, but this kernel has none of its own.
        assert reply["result"]["run"] is None, reply
        assert reply["result"]["message"].startswith("no capture in this kernel yet"), reply

        assert (
            other.run("%%pathways profile --name mine\nimport jax.numpy as jnp\njnp.ones(4).block_until_ready()").status
            == "ok"
        )
        request_id = frontend.request(comm, "latest_profile")
        mine = frontend.reply_to(comm, request_id, timeout=60)["result"]
        assert mine["run"].endswith("-mine") and mine["name"] == "mine", mine
        assert glob.glob(
            str(root / mine["run"].split("/")[0] / "plugins" / "profile" / mine["run"].split("/")[1] / "*.xplane.pb")
        )
    finally:
        other.shutdown()
    # The first kernel answers with its own newest capture, not the other's newer one.
    frontend = Frontend(k)
    comm = frontend.open()
    request_id = frontend.request(comm, "latest_profile")
    own = frontend.reply_to(comm, request_id, timeout=60)["result"]
    assert own["run"] is not None and not own["run"].endswith("-mine"), own


@pytest.mark.kernel
def test_profiles_lists_captures_and_timeline_has_them(profiled):
    k, root = profiled
    assert k.run("%%pathways profile --name second\nx = train_step(x)").status == "ok"
    listing = k.run("%pathways profiles").text
    names = re.findall(r"^(\S+)\s+\d\d:\d\d:\d\d\s+([\d.]+ (?:B|KiB|MiB))\s+(\S+)$", listing, re.M)
    assert [n for n, _, _ in names][-2:] == ["loop", "second"], listing
    assert all(where.startswith(str(root)) for _, _, where in names), listing
    events = k.run("print([e.detail for e in pw.events(kind='profile')])").text
    assert "second ->" in events and "loop ->" in events, events


def one_line_error(reply) -> str:
    assert reply.status == "error"
    lines = [line for line in reply.error.splitlines() if line.strip()]
    assert len(lines) == 1, reply.error
    return lines[0]


@pytest.mark.kernel
def test_nested_and_concurrent_captures_are_refused_in_one_line(profiled):
    k, _ = profiled
    nested = k.run("%%pathways profile --name outer\nwith pw.profile('inner'):\n    x = train_step(x)")
    assert re.match(r"ProfileError: profile 'outer' is still capturing .* one trace at a time", one_line_error(nested))

    concurrent = k.run(
        "import threading, time\n"
        "started, done = threading.Event(), threading.Event()\n"
        "def hold():\n"
        "    with pw.profile('background'):\n"
        "        started.set(); done.wait(30)\n"
        "t = threading.Thread(target=hold); t.start(); started.wait(30)\n"
        "try:\n"
        "    with pw.profile('foreground'):\n"
        "        pass\n"
        "finally:\n"
        "    done.set(); t.join()\n"
    )
    assert re.match(r"ProfileError: profile 'background' is still capturing", one_line_error(concurrent))
    # Both refusals freed nothing they did not hold: the next capture works.
    again = k.run("%%pathways profile --name after\nx = train_step(x)")
    assert again.status == "ok" and "profile after:" in again.text, again.error


@pytest.mark.kernel
@pytest.mark.parametrize(
    "line, message",
    [
        (
            "--logdir gs://bucket/profiles",
            r"ProfileError: gs:// profile dirs are for the proxy backend.*runs embedded:2x4",
        ),
        ("--logdir /etc/hostname/profiles", r"ProfileError: cannot write profiles there: .*is a file, not a directory"),
        ("--host-tracer-level 7", r"ProfileError: host tracer level 7 is not one of 0 \(off\)"),
        ("--name 'a b'", r"ProfileError: bad profile name 'a b'"),
        ("--logdir /proc/x", r"ProfileError: cannot write profiles there: .*/proc/x"),
        ("--name ''", r"UsageError: %pathways profile: argument --name: must not be empty"),
        ("--logdir ''", r"UsageError: %pathways profile: argument --logdir: must not be empty"),
    ],
)
def test_bad_input_is_one_line(profiled, line, message):
    k, _ = profiled
    reply = k.run(f"%%pathways profile {line}\nx = train_step(x)")
    assert re.match(message, one_line_error(reply)), reply.error
    # Nothing was left capturing.
    assert k.run("%%pathways profile\nx = train_step(x)").status == "ok"


# -- the proxy backend, up to the boundary ------------------------------------
@pytest.fixture
def proxy_backend():
    """A proxy backend object (never connected: no Pathways server runs here)."""
    from pathways_kernel.backends.proxy import ProxyBackend

    return ProxyBackend.from_spec("proxy:grpc://127.0.0.1:1")


def test_proxy_needs_a_gs_dir_on_an_existing_bucket(gcs_server, proxy_backend, monkeypatch):
    from pathways_kernel.profiling.capture import PathwaysTracer, ProfileError, tracer_for

    monkeypatch.delenv("PATHWAYS_PROFILE_DIR", raising=False)
    with pytest.raises(ProfileError, match=r"the Pathways workers write traces to Cloud Storage: pass --logdir gs://"):
        tracer_for(proxy_backend, None)
    with pytest.raises(ProfileError, match=r"bucket 'no-such-bucket' does not exist"):
        tracer_for(proxy_backend, "gs://no-such-bucket/profiles")
    gcs_server.make_bucket("traces")
    tracer, log_dir, prefix = tracer_for(proxy_backend, "gs://traces/profiles")
    assert isinstance(tracer, PathwaysTracer) and log_dir == "gs://traces/profiles" and prefix == ""


def test_proxy_trace_request_goes_as_far_as_the_ifrt_client(gcs_server, local_session, monkeypatch, tmp_path):
    import jax

    from pathways_kernel.profiling.capture import PathwaysTracer, ProfileError, _options, profile

    gcs_server.make_bucket("traces")
    monkeypatch.setenv("PATHWAYS_PROFILING_ALLOWED_GCS_BUCKETS", "gs://allowed")
    tracer = PathwaysTracer()
    with pytest.raises(ProfileError, match=r"cannot profile into gs://traces/p: .*not in allowed buckets"):
        tracer.start("gs://traces/p", _options("run", 2, False))
    monkeypatch.setenv("PATHWAYS_PROFILING_ALLOWED_GCS_BUCKETS", "gs://traces")
    # The boundary: the profile request reached the IFRT client as a plugin program.
    with pytest.raises(ProfileError, match=r"Pathways workers did not start tracing into gs://traces/p: .*HloProgram"):
        tracer.start("gs://traces/p", _options("run", 2, False))
    # The failed start left neither pathwaysutils nor jax.profiler tracing.
    with profile("after", logdir=str(tmp_path)) as capture:
        jax.numpy.ones(4).block_until_ready()
    assert capture.size and not capture.error


def test_a_trace_the_workers_wrote_to_gcs_is_listed_and_summarized(gcs_server, local_session, tmp_path):
    import jax
    import jax.numpy as jnp

    from pathways_kernel.profiling.capture import Capture, _size, profile

    with profile("local", logdir=str(tmp_path)) as local:
        f = jax.jit(lambda a: jnp.tanh(a @ a))
        f(jnp.ones((128, 128))).block_until_ready()
    gcs_server.make_bucket("traces")
    bucket = gcs_server.client().bucket("traces")
    run_dir = "gs://traces/p/plugins/profile/20261201-000000-remote"
    for path in glob.glob(os.path.join(local.where, "*.xplane.pb")):
        bucket.blob(f"p/plugins/profile/20261201-000000-remote/worker-{os.path.basename(path)}").upload_from_filename(
            path
        )
    remote = Capture("remote", "gs://traces/p", "20261201-000000-remote", run_dir, "proxy:grpc://x:1", 0.0)
    remote.size = _size(run_dir)
    assert remote.size == sum(os.path.getsize(p) for p in glob.glob(os.path.join(local.where, "*.xplane.pb")))
    text = remote.to_text()
    assert (
        "profile remote:" in text
        and "devices 0" in text
        and "jit(<lambda>)/dot_general  (ynn_fusion, jit__lambda" in text
    ), text
    assert "Open in XProf" not in remote._repr_html_()  # XProf in JupyterLab serves the local root only


@pytest.mark.kernel
def test_without_xprof_the_summary_names_the_extra_instead_of_the_button(profiled):
    k, _ = profiled
    # What an environment without the extra looks like to an import: no module xprof.
    reply = k.run(
        "import sys\nsys.modules['xprof'] = None\ntry:\n"
        "    with pw.profile('no-xprof') as capture:\n        x = train_step(x)\n"
        "    print(capture._repr_html_())\nfinally:\n    del sys.modules['xprof']"
    )
    assert reply.status == "ok", reply.error
    assert "Open in XProf" not in reply.text
    assert "XProf is not installed here: pip install &#x27;pathways-kernel[profile]&#x27;" in reply.text, reply.text


@pytest.mark.kernel
def test_python_tracer_adds_python_calls_to_the_trace(profiled):
    k, _ = profiled
    count = (
        "from jax.profiler import ProfileData\n"
        "def python_events(capture):\n"
        "    pb = glob.glob(capture.where + '/*.xplane.pb')[0]\n"
        "    cpu = ProfileData.from_file(pb).find_plane_with_name('/host:CPU')\n"
        "    return sum(e.name.startswith('$') for line in cpu.lines for e in line.events)\n"
        "import glob\n"
        "with pw.profile('plain') as plain:\n    x = train_step(x)\n"
        "with pw.profile('traced', python_tracer=True) as traced:\n    x = train_step(x)\n"
        "print(python_events(plain), python_events(traced))"
    )
    reply = k.run(count)
    assert reply.status == "ok", reply.error
    plain, traced = map(int, reply.text.split())
    assert plain == 0 and traced > 0, reply.text


def test_a_capture_whose_trace_is_gone_shows_why_instead_of_raising(local_session, tmp_path):
    import shutil

    import jax.numpy as jnp

    from pathways_kernel.profiling.capture import profile

    with profile("gone", logdir=str(tmp_path)) as capture:
        jnp.ones(4).block_until_ready()
    # A newer capture ends: the older one's summary now comes from its file.
    with profile("newer", logdir=str(tmp_path)):
        jnp.ones(4).block_until_ready()
    shutil.rmtree(capture.where)
    assert "no summary: no trace (*.xplane.pb) under" in capture.to_text()
    assert "no summary" in capture._repr_html_()


def test_a_capture_writes_only_the_trace_xprof_reads_and_shows_what_that_file_says(local_session, tmp_path):
    import socket

    import jax
    import jax.numpy as jnp
    from jax.profiler import ProfileData

    from pathways_kernel.profiling import summary
    from pathways_kernel.profiling.capture import _read_xspaces, profile

    f = jax.jit(lambda a: jnp.tanh(a @ a))
    with profile("one-file", logdir=str(tmp_path)) as capture:
        for _ in range(5):
            f(jnp.ones((256, 256))).block_until_ready()
    # No trace.json.gz beside it: XProf converts the XSpace itself.
    assert os.listdir(capture.where) == [f"{socket.gethostname()}.xplane.pb"]
    assert capture.size == os.path.getsize(os.path.join(capture.where, os.listdir(capture.where)[0]))
    # Outside the profile root XProf in JupyterLab serves: no button, but how to open it.
    assert "Open in XProf" not in capture._repr_html_() and f"xprof --logdir {tmp_path}" in capture._repr_html_()
    shown = capture.summary()  # from the trace in memory
    slice_of = {i: i // 4 for i in range(8)}
    assert shown == summary.summarize(_read_xspaces(capture.where), "one-file", slice_of)
    # In the trace viewer, the capture's span has one under it that says which devices are which slice.
    cpu = ProfileData.from_file(glob.glob(os.path.join(capture.where, "*.xplane.pb"))[0]).find_plane_with_name(
        "/host:CPU"
    )
    spans = [e.name for line in cpu.lines for e in line.events if e.name.startswith("pathways.")]
    assert spans == [
        "pathways.profile:one-file",
        "pathways.slices: slice 0 = devices 0,1,2,3 | slice 1 = devices 4,5,6,7",
    ]
    assert shown.top_ops and all(op.occurrences == 5 for op in shown.top_ops), shown.to_text()


def test_a_trace_that_cannot_be_written_is_one_line_under_the_capture(local_session, tmp_path):
    import jax.numpy as jnp

    from pathways_kernel.profiling.capture import profile

    (tmp_path / "plugins").write_text("not a directory")
    with profile("unwritable", logdir=str(tmp_path)) as capture:
        jnp.ones(4).block_until_ready()
    assert re.fullmatch(
        r"unwritable  0 B  \S+\n  cannot write the trace to \S+/plugins/profile/\S+-unwritable: .+", capture.to_text()
    ), capture.to_text()


@pytest.mark.parametrize(
    "kwargs, says",
    [({"name": ""}, r"bad profile name ''"), ({"logdir": ""}, r"cannot write profiles there: no storage URL given")],
)
def test_the_python_twin_refuses_an_empty_name_or_dir_instead_of_a_default(local_session, kwargs, says):
    from pathways_kernel.profiling.capture import ProfileError, captures, profile

    before = len(captures())
    with pytest.raises(ProfileError, match=says), profile(**kwargs):
        pass
    assert len(captures()) == before  # nothing was captured under a default


# -- jax.profiler itself on local:2x4 -----------------------------------------
# Not under load: what is checked is which directory a trace may go to, not how long it takes.
@pytest.mark.kernel
def test_jax_profiler_trace_into_a_local_dir_on_the_local_server_traces_both_processes(tmp_path):
    k = Kernel("pathways", backend="local:2x4")
    try:
        assert k.run(LOOP + "import os\nos.chdir(" + repr(str(tmp_path)) + ")").status == "ok"
        # pathwaysutils' own check (right on GKE) refused it: "ValueError: Path must be a GCS path".
        traced = k.run("with jax.profiler.trace('relative/trace'):\n    x = train_step(x)\nfloat(x.sum())")
        assert traced.status == "ok", traced.error
        # Both are there when the block ends: the kernel's, and the server's (it resolves the
        # relative path from the kernel's working directory, not its own).
        (run,) = glob.glob(str(tmp_path / "relative" / "trace" / "plugins" / "profile" / "*"))
        assert {"pathways-local-server.xplane.pb", f"{os.uname().nodename}.xplane.pb"} <= set(os.listdir(run))
        started = k.run(
            "jax.profiler.start_trace(" + repr(str(tmp_path / "started")) + ")\n"
            "x = train_step(x)\n"
            "jax.profiler.stop_trace()"
        )
        assert started.status == "ok", started.error
        assert glob.glob(str(tmp_path / "started" / "plugins" / "profile" / "*" / "pathways-local-server.xplane.pb"))
        remote = one_line_error(k.run("with jax.profiler.trace('gs://bucket/trace'):\n    x = train_step(x)"))
        assert remote.startswith(
            "TraceDirError: cannot trace into gs://bucket/trace on local:2x4: its Pathways server "
        )
        assert "use jax.profiler.trace('/tmp/trace') (or %%pathways profile)" in remote
        # Nothing was left tracing: a capture of the magic works after all three; one with --logdir
        # is its owner's only, the server's file too (they were 0755 directories and 0644 files).
        again = k.run(f"%%pathways profile --name after --logdir {tmp_path / 'mine'}\nx = train_step(x)")
        assert again.status == "ok" and "profile after:" in again.text, again.error
        made = [tmp_path / "mine", *(tmp_path / "mine").rglob("*")]
        assert any(p.name == "pathways-local-server.xplane.pb" for p in made), made
        wrong = {str(p): oct(p.stat().st_mode & 0o777) for p in made if p.stat().st_mode & 0o777 not in (0o700, 0o600)}
        assert not wrong and all(p.stat().st_mode & 0o777 == 0o700 for p in made if p.is_dir()), wrong
    finally:
        k.shutdown()


def test_kernels_profiling_in_the_same_second_get_their_own_session_dirs(tmp_path, monkeypatch):
    """Session dirs are named by time, not pid: the second kernel of a second takes -2 (made exclusively)."""
    from pathways_kernel.profiling import capture

    monkeypatch.setattr(capture, "time", types.SimpleNamespace(strftime=lambda fmt: "20261205-010203"))
    names = []
    for _ in range(3):
        monkeypatch.setattr(capture, "_session_dir", None)  # another kernel process
        names.append(capture._this_session_dir(str(tmp_path)))
    assert names == ["20261205-010203", "20261205-010203-2", "20261205-010203-3"]
    assert all((tmp_path / name).is_dir() and (tmp_path / name).stat().st_mode & 0o777 == 0o700 for name in names)
