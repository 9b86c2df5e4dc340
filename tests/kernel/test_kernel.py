"""The `pathways` kernel through jupyter_client: what a user sees in a notebook."""

import json
import subprocess
import sys

import pytest
from kernels import Kernel

pytestmark = pytest.mark.kernel


def one_line(reply):
    assert reply.status == "error", reply.text
    lines = [line for line in reply.error.splitlines() if line.strip()]
    assert len(lines) == 1, reply.error
    assert "Traceback" not in reply.error and "File " not in reply.error
    return lines[0]


def test_plain_jax_sees_the_session_devices_and_pw_is_bound(kernel):
    reply = kernel.run("import jax; print(len(jax.devices()), pw.status().slices_total)")
    assert reply.status == "ok", reply.error
    assert reply.text.split() == ["8", "2"]


def test_status(kernel):
    reply = kernel.run("%pathways status")
    assert reply.status == "ok", reply.error
    for expected in ("embedded:2x4", "cpu", "2/2 up", "chips     8", "devices   8", "jax       0."):
        assert expected in reply.text
    assert any("text/html" in bundle for bundle in reply.data)


def test_topology_is_html_in_notebooks_and_text_elsewhere(kernel):
    reply = kernel.run("%pathways topology")
    bundle = reply.data[0]
    assert "slice 0: up" in bundle["text/plain"] and "slice 1: up" in bundle["text/plain"]
    assert "pathways-topology" in bundle["text/html"]


def test_devices_lists_every_chip_with_its_slice(kernel):
    reply = kernel.run("%pathways devices")
    rows = reply.data[0]["text/plain"].splitlines()[1:]
    assert len(rows) == 8
    assert [row.split()[1] for row in rows] == ["0"] * 4 + ["1"] * 4


def test_help_lists_subcommands_and_each_has_its_own(kernel):
    reply = kernel.run("%pathways --help")
    assert reply.status == "ok"
    for sub in ("status", "topology", "devices", "mesh", "connect", "events"):
        assert f"\n  {sub} " in reply.text
    reply = kernel.run("%pathways mesh --help")
    assert "--dcn" in reply.text and "--ici" in reply.text and "usage" in reply.text.lower()
    reply = kernel.run("%pathways connect -h")
    assert "local:SxC" in reply.text


def test_mesh_is_bound_into_the_namespace(kernel):
    reply = kernel.run("%pathways mesh --dcn 2,1 --ici 2,2 --name m22\nprint(dict(m22.shape))")
    assert reply.status == "ok", reply.error
    assert "Mesh(data=4, model=2) over 8 devices -> bound to 'm22'" in reply.text
    assert "{'data': 4, 'model': 2}" in reply.text


@pytest.mark.parametrize(
    "code, fragment",
    [
        ("%pathways frobnicate", "unknown subcommand 'frobnicate'"),
        ("%pathways connect local:0x4", "bad local spec 'local:0x4'"),
        ("%pathways connect local:abc", "bad local spec 'local:abc'"),
        ("%pathways connect local:2x4x9", "bad local spec 'local:2x4x9'"),
        ("%pathways mesh --dcn 4,1", "DCN shape 4x1 needs 4 slices but 2 are up"),
        ("%pathways mesh --ici 3,3", "needs 9 chips per slice"),
        ("clash = 3\n%pathways mesh --name clash", "'clash' already holds a value of type int"),
        ("%pathways mesh --bogus", "unrecognized arguments: --bogus"),
        ("%pathways status extra", "unrecognized arguments: extra"),
        ("pw.mesh(dcn=(5, 1))", "DCN shape 5x1 needs 5 slices"),
        ("%pathways connect local:" + "9" * 5000 + "x1", "that many devices is more than the 4096"),
        ("%pathways connect local:\uff12x\uff14", "bad local spec 'local:\\uff12x\\uff14'"),
        ("%pathways events --last=-5", "argument --last: must be at least 1, got -5"),
        ("%pathways events --last 0", "argument --last: must be at least 1, got 0"),
        ("%pathways events --last nan", "argument --last: expected a whole number"),
        ("%pathways events --last " + "9" * 5000, "argument --last: must be at most"),
        ("%pathways events --kind ''", "argument --kind: must not be empty"),
        ("%pathways mesh --axes ,,", "argument --axes: an empty name"),
        ("%pathways mesh --axes data,,model", "argument --axes: an empty name"),
        ("%pathways mesh --axes 'da ta,model'", "'da ta' is not a Python name"),
        ("%pathways mesh --dcn ''", "argument --dcn: must not be empty"),
        ("%pathways mesh --name ''", "argument --name: must not be empty"),
        ("%pathways mesh --name pw", "'pw' is the module pathways_kernel"),
        ("%pathways mesh --name pw --overwrite", "'pw' is the module pathways_kernel"),
        ("%pathways mesh --name Out --overwrite", "'Out' belongs to IPython"),
        ("%pathways mesh --name class", "'class' is not a valid Python name"),
        ("%pathways mesh --name list", "'list' would shadow the Python builtin list"),
        ("%pathways connect grpc://127.0.0.1:1 --timeout nan", "argument --timeout: expected a finite number"),
        ("%pathways connect grpc://127.0.0.1:1 --timeout=-1", "argument --timeout: must be more than 0 s"),
        ("%pathways connect grpc://127.0.0.1:1 --timeout 0", "argument --timeout: must be more than 0 s"),
        ("%pathways connect grpc://127.0.0.1:1 --timeout 1e300", "argument --timeout: must be at most 3600 s"),
        ("%pathways connect sps --count 0", "argument --count: must be at least 1"),
        ("%pathways reconnect --timeout inf", "argument --timeout: expected a finite number"),
        ("%pathways connect proxy:grpc://" + "h" * 5000 + ":1", "is not a host name"),
        ("%pathways connect grpc://127.0.0.1:\u0662\u0669\u0660\u0660\u0660", "expected grpc://HOST:PORT"),
        ("%pathways fail \u0661", "argument slice: expected a whole number (digits 0-9), got '\\u0661'"),
        ("%pathways repair \uff11", "argument slice: expected a whole number"),
        ("%pathways fail -1", "argument slice: must be at least 0"),
        ("%pathways snapshot --step \u0661", "argument --step: expected a whole number"),
        ("%pathways mesh --dcn \u0662,1", "bad shape"),
        ("%pathways monitor --events \u0665", "argument --events: expected a whole number"),
        ("%pathways monitor --rate \u0661", "argument --rate: expected a number"),
        ("%pathways connect slurm:1 --nodes-per-slice \u0661", "argument --nodes-per-slice: expected a whole number"),
        ("%pathways connect slurm:1 --wait \u0661", "argument --wait: expected a number"),
        ("%pathways chaos --mtbf \u0661 --mttr 1", "argument --mtbf: expected a number (digits 0-9)"),
        ("%pathways goodput --run ''", "argument --run: must not be empty"),
        ("%pathways snapshot x --to ''", "argument --to: must not be empty"),
        ("%pathways snapshot x --id ''", "argument --id: must not be empty"),
        ("%%pathways profile --name ''\n1", "argument --name: must not be empty"),
        ("%%pathways profile --logdir ''\n1", "argument --logdir: must not be empty"),
        ("%%pathways sidecar --slices 0,0\n1", "slice 0 is given twice"),
        ("%%pathways sidecar --slices \u0661\n1", "argument --slices: expected a whole number"),
        ("%%pathways sidecar --slices 0,,1\n1", "argument --slices: an empty slice index"),
        ("%pathways mesh --axes data,data", "argument --axes: 'data' is given twice"),
        ("%%pathways elastic --steps 2 --state w,w\nw = w + 1", "argument --state: 'w' is given twice"),
        ("%%pathways elastic --steps 2 --state pw\npass", "'pw' is the module pathways_kernel"),
        ("%%pathways elastic --steps 2 --state step\npass", "--state step: the loop binds"),
        ("%%pathways elastic --steps 2 --state mesh\npass", "--state mesh: the loop binds"),
        ("%pathways goodput --intervals \u0661\u0660", "argument --intervals: expected a whole number (digits 0-9)"),
        ("%pathways goodput --over-time --window \u0661", "argument --window: expected a number (digits 0-9)"),
        ("%%pathways sidecar --timeout nan\n1", "argument --timeout: expected a finite number"),
        ("%%pathways sidecar --timeout 0\n1", "argument --timeout: must be more than 0 s"),
        ("%%pathways sidecar --timeout 1e300\n1", "argument --timeout: must be at most 86400 s"),
        ("%pathways cache " + "../" * 40 + "proc", "cannot write JAX's compilation cache to /proc (from '../../"),
        ("%pathways " + "y" * 9000, "unknown subcommand 'yyy"),
        ("%pathways status " + "z" * 9000, "unrecognized arguments: zzz"),
    ],
)
def test_bad_input_is_one_clear_line_and_the_kernel_stays_healthy(kernel, code, fragment):
    line = one_line(kernel.run(code))
    assert fragment in line
    assert len(line) < 300  # what the user typed is not echoed back whole
    assert kernel.run("print(pw.status().devices, type(pw).__name__)").text.split() == ["8", "module"]


def test_a_huge_magic_line_is_refused_at_once_and_short_ones_still_expand_variables(kernel):
    # IPython's $var expansion takes time quadratic in the line: 100,000 characters hung the kernel.
    # Not under load: the refusal costs the same on any machine; a loaded one only made the hang longer.
    for code in ("%pathways status " + "x" * 100_000, "%%pathways profile " + "x" * 100_000 + "\n1"):
        line = one_line(kernel.run(code, timeout=30))
        assert "the line is 100,0" in line and "more than the 10,000 a %pathways line may have" in line
        assert len(line) < 300
    reply = kernel.run("sub, name = 'mesh', 'm'\n%pathways $sub --name {name + '_expanded'}\nprint(m_expanded.size)")
    assert reply.status == "ok", reply.error
    assert "bound to 'm_expanded'" in reply.text and reply.text.split()[-1] == "8"


def test_an_elastic_cell_that_deletes_its_state_is_one_line_and_the_state_is_kept(kernel):
    assert kernel.run("import jax.numpy as jnp\nw = jnp.zeros(4)").status == "ok"
    reply = kernel.run("%%pathways elastic --steps 3 --state w --no-progress\nw = w + 1\nif step == 1:\n    del w")
    assert "the cell deleted --state w at step 1 (now back as the step began)" in one_line(reply)
    assert kernel.run("print(float(w.sum()))").text.strip() == "4.0"


def test_connect_before_first_computation_switches_the_backend(fresh_kernel):
    reply = fresh_kernel.run("%pathways status")
    assert "embedded:2x4" in reply.text
    reply = fresh_kernel.run("%pathways connect embedded:4x2")
    assert reply.status == "ok", reply.error
    assert "embedded:4x2" in reply.text and "4/4 up" in reply.text
    reply = fresh_kernel.run("import jax; print(len(jax.devices()), [len(s.chips) for s in pw.topology().slices])")
    assert reply.text.strip() == "8 [2, 2, 2, 2]"


def test_connect_after_computation_says_what_would_be_lost_and_how(fresh_kernel):
    fresh_kernel.run("import jax.numpy as jnp\nx = jnp.ones((1024, 256))")
    line = one_line(fresh_kernel.run("%pathways connect embedded:1x8"))
    assert "holds 1 device array (1.0 MiB) on embedded:2x4" in line
    assert "--force" in line and "restart the kernel" in line
    # still on the old backend, array intact
    assert fresh_kernel.run("print(float(x.sum()))").text.strip() == "262144.0"
    reply = fresh_kernel.run("%pathways connect embedded:1x8 --force\nimport jax; print(len(pw.topology().slices))")
    assert reply.status == "ok", reply.error
    assert reply.text.strip().endswith("1")
    # The session the forced connect started has a log of its own, opened by that connect.
    connects = fresh_kernel.run("print([e.detail for e in pw.events(kind='connect')])").text
    assert connects.count("embedded:") == 1 and "embedded:1x8" in connects, connects


def test_load_ext_in_a_stock_ipython_kernel():
    """No backend named: JAX already runs in the kernel, so the session is embedded and keeps its arrays."""
    k = Kernel("python3", backend=None)
    try:
        assert k.run("import jax.numpy as jnp; x = jnp.arange(4.0)").status == "ok"
        reply = k.run("%load_ext pathways_kernel\n%pathways status\nprint(float(x.sum()))")
        assert reply.status == "ok", reply.error
        assert "embedded:2x4" in reply.text and "6.0" in reply.text, reply.text
        line = one_line(k.run("%pathways connect local:nope"))
        assert line.startswith("SpecError: bad local spec")
    finally:
        assert k.shutdown() == 0


def test_install_adds_a_kernelspec_with_its_backend(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathways_kernel",
            "install",
            "--prefix",
            str(tmp_path),
            "--name",
            "pathways-4x2",
            "--backend",
            "local:4x2",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Installed kernelspec pathways-4x2" in result.stdout
    spec = json.loads((tmp_path / "share/jupyter/kernels/pathways-4x2/kernel.json").read_text())
    assert spec["env"] == {"PATHWAYS_BACKEND": "local:4x2"}
    assert spec["display_name"] == "Pathways (JAX, local:4x2)"
    assert spec["argv"][1:3] == ["-m", "pathways_kernel"]


def test_install_refuses_a_bad_backend_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pathways_kernel", "install", "--prefix", str(tmp_path), "--backend", "local:0x1"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("SpecError: bad local spec")
    assert not (tmp_path / "share").exists()


def test_installed_kernel_runs_on_its_backend(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pathways_kernel",
            "install",
            "--prefix",
            str(tmp_path),
            "--name",
            "pw42",
            "--backend",
            "local:4x2",
        ],
        check=True,
        capture_output=True,
    )
    k = Kernel("pw42", jupyter_path=str(tmp_path / "share/jupyter"))
    try:
        assert "4/4 up" in k.run("%pathways status").text
    finally:
        k.shutdown()


def test_kernel_exits_cleanly(fresh_kernel):
    fresh_kernel.run("%pathways status")
    assert fresh_kernel.shutdown() == 0
