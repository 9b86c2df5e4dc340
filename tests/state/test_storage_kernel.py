"""Durable state from the notebook: real kernels talking to a real fake-gcs-server.

%pathways snapshot --to / snapshots list|restore, pw.persist/pw.restore,
%pathways checkpoint, %pathways cache and PATHWAYS_COMPILE_CACHE, progress
updates, bad input as one line, and the storage server dying under an upload
while the kernel stays up.
"""

from __future__ import annotations

import os
import time

import pytest
from kernels import Kernel

pytestmark = pytest.mark.kernel
pytest_plugins = ["mounts"]  # full_disk, read_only

SETUP = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
m = pw.mesh()
state = {"w": jax.device_put(jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32), NamedSharding(m, P("data", "model"))),
         "b": jnp.ones(8, jnp.bfloat16)}
ref = {k: np.asarray(v).copy() for k, v in state.items()}
def same(tree):
    return all(np.asarray(tree[k]).tobytes() == ref[k].tobytes() and tree[k].dtype == ref[k].dtype for k in ref)
"""


def start_kernel(server, **extra: str) -> Kernel:
    return Kernel("pathways", env={**os.environ, **server.env, **extra})


@pytest.fixture(scope="module")
def nb(gcs_server):
    gcs_server.make_bucket("notebook")
    k = start_kernel(gcs_server)
    reply = k.run(SETUP)
    assert reply.status == "ok", reply.error
    yield k
    k.shutdown()


def ok(k: Kernel, code: str, timeout: float = 120):
    reply = k.run(code, timeout=timeout)
    assert reply.status == "ok", reply.error
    return reply


def one_line_error(k: Kernel, code: str) -> str:
    reply = k.run(code)
    assert reply.status == "error", reply.text
    lines = [line for line in reply.error.splitlines() if line.strip()]
    assert len(lines) == 1, reply.error  # no traceback
    assert ok(k, "1 + 1").text.strip() == "2"  # the kernel is still up
    return lines[0]


def wait_for(k: Kernel, condition: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ok(k, f"print(bool({condition}))").text.strip() == "True":
            return
        time.sleep(0.2)
    raise AssertionError(f"not true after {timeout} s: {condition}")


def test_snapshot_to_bucket_then_list_and_restore_on_fewer_slices(nb):
    reply = ok(nb, "%pathways snapshot state --step 1 --to gs://notebook/run")
    assert "persisting to gs://notebook/run/state-step1 in the background" in reply.text
    wait_for(nb, "[e for e in pw.events(kind='transfer') if 'state-step1' in e.detail]")

    listing = ok(nb, "%pathways snapshots list gs://notebook/run").text
    assert "state-step1" in listing and "step 1" in listing

    ok(nb, "pw.fail_slice(1)")
    try:
        reply = ok(nb, "%pathways snapshots restore gs://notebook/run/state-step1 --name back")
        assert "bound to 'back'" in reply.text
        check = ok(nb, "print(same(back), len(back['w'].sharding.device_set), back['w'].sharding.spec)").text
        assert check.split()[:2] == ["True", "4"], check  # restored bit-exact onto the 4 chips left
        assert "P('data', 'model')" in check
    finally:
        ok(nb, "pw.repair_slice(1)")

    # The Python twins.
    reply = ok(
        nb, "print([i.id for i in pw.snapshots_list('gs://notebook/run')], same(pw.restore('gs://notebook/run')))"
    )
    assert reply.text.strip() == "['state-step1'] True"


def test_bad_input_is_one_line_and_the_kernel_stays_up(nb):
    assert "unsupported storage URL 's3://x/y'" in one_line_error(nb, "%pathways snapshots list s3://x/y")
    assert "not a bucket name" in one_line_error(nb, "%pathways snapshots list gs://UPPER/x")
    assert "bucket 'no-such-bucket-here' does not exist" in one_line_error(
        nb, "%pathways snapshot state --to gs://no-such-bucket-here/p"
    )
    ok(nb, "pw.persist(state, 'gs://notebook/dupe', name='state').wait()")
    assert "already exists" in one_line_error(nb, "%pathways snapshot state --to gs://notebook/dupe")
    assert "no committed snapshot" in one_line_error(nb, "pw.restore('gs://notebook/nothing-here')")


def test_progress_is_shown_for_a_long_transfer(nb):
    reply = ok(
        nb,
        (
            "import pathways_kernel.state.progress as progress\n"
            "progress.THRESHOLD_S, progress.INTERVAL_S = 0.0, 0.05\n"
            "big = jnp.ones((4096, 4096), jnp.float32)\n"
            "t = pw.persist(big, 'gs://notebook/progress', name='big')\n"
            "t.wait()\n"
            "import time; time.sleep(0.3)\n"
            "progress.THRESHOLD_S, progress.INTERVAL_S = 1.0, 0.25"
        ),
    )
    updates = [m["content"]["data"] for m in reply.messages if m["header"]["msg_type"] == "update_display_data"]
    assert updates, [m["header"]["msg_type"] for m in reply.messages]
    assert "done, 64.0 MiB" in updates[-1]["text/plain"]
    assert any("<progress" in u.get("text/html", "") for u in updates[:-1])
    event = ok(nb, "print(pw.events(kind='transfer')[-1].to_text())").text
    assert "64.0 MiB" in event and "/s)" in event


def test_storage_server_killed_mid_upload_kernel_says_what_failed_and_retry_works(nb, gcs_server):
    ok(nb, "big2 = jnp.arange(16 * 1024 * 1024, dtype=jnp.float32)")
    ok(nb, "t = pw.persist(big2, 'gs://notebook/killed', name='big2')")
    gcs_server.kill()
    try:
        line = one_line_error(nb, "t.wait()")
        assert "StorageError" in line and "cannot reach Cloud Storage" in line, line
        event = ok(nb, "print(pw.events(kind='transfer')[-1].detail)").text
        assert "FAILED" in event
    finally:
        gcs_server.start()
    assert ok(nb, "print(pw.snapshots_list('gs://notebook/killed'))").text.startswith("no committed snapshots")
    ok(nb, "pw.persist(big2, 'gs://notebook/killed', name='big2').wait()")
    assert ok(nb, "print(bool((pw.restore('gs://notebook/killed') == big2).all()))").text.strip() == "True"


def test_checkpoint_save_list_restore_onto_a_smaller_mesh(nb):
    reply = ok(nb, "%pathways checkpoint save gs://notebook/ckpt --step 3 --vars state --wait")
    assert "done" in reply.text
    assert "steps 3" in ok(nb, "%pathways checkpoint list gs://notebook/ckpt").text
    assert "already exists" in one_line_error(nb, "%pathways checkpoint save gs://notebook/ckpt --step 3 --vars state")
    ok(nb, "pw.fail_slice(1)")
    try:
        ok(nb, "del state")
        reply = ok(nb, "%pathways checkpoint restore gs://notebook/ckpt")
        assert "restored state" in reply.text
        check = ok(nb, "print(same(state), len(state['w'].sharding.device_set))").text.split()
        assert check == ["True", "4"], check
    finally:
        ok(nb, "pw.repair_slice(1)")
    assert ok(nb, "print(pw.checkpoints_list('gs://notebook/ckpt'))").text.strip().endswith("(latest 3)")
    assert "no checkpoint step 9" in one_line_error(nb, "%pathways checkpoint restore gs://notebook/ckpt --step 9")
    assert "bucket 'no-such-ckpt-bucket' does not exist" in one_line_error(
        nb, "%pathways checkpoint save gs://no-such-ckpt-bucket/x --step 1 --vars state"
    )


def test_compile_cache_in_bucket_is_warm_in_a_fresh_kernel(gcs_server):
    gcs_server.make_bucket("jaxcache")
    code = (
        "import jax, jax.numpy as jnp\n"
        "f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())\n"
        "f(jnp.ones((128, 128))).block_until_ready()\n"
        "print([e.detail for e in pw.events(kind='compile') if 'lambda' in e.detail])"
    )
    cold = start_kernel(gcs_server)
    try:
        reply = ok(cold, "%pathways cache gs://jaxcache/cache --min-compile-s 0")
        assert "gs://jaxcache/cache" in reply.text
        assert "cache miss" in ok(cold, code).text
        assert "misses" in ok(cold, "%pathways cache").text
        # A library dropped every JAX listener (Tunix's MetricsLogger.close() does): the
        # next cell's compiles still count.
        ok(cold, "seen = pw.session().events.last(1)[0].seq\njax.monitoring.clear_event_listeners()")
        reply = ok(
            cold,
            "g = jax.jit(lambda x: jnp.sin(x @ x.T).sum())\n"
            "g(jnp.ones((128, 128))).block_until_ready()\n"
            "print([e.detail for e in pw.events(kind='compile') if e.seq > seen and 'lambda' in e.detail])",
        )
        assert "cache miss" in reply.text, reply.text
    finally:
        cold.shutdown()
    warm = start_kernel(gcs_server, PATHWAYS_COMPILE_CACHE="gs://jaxcache/cache")
    try:
        assert "cache hit" in ok(warm, code).text
        assert ok(warm, "%pathways cache off").text.strip() == "persistent compilation cache: off"
    finally:
        warm.shutdown()


# -- refusals: full disks, read-only stores, lost data, hostile input ----------------------
def test_full_disk_persist_and_checkpoint_are_one_line_and_leave_nothing(nb, full_disk):
    # 8 MiB that do not compress, in 8 sharded arrays: many writes in flight when the disk fills up.
    ok(
        nb,
        "noise = {str(i): jax.device_put(jax.random.normal(jax.random.key(i), (512, 512)), "
        "NamedSharding(m, P('data', 'model'))) for i in range(8)}",
    )
    line = one_line_error(nb, f"pw.persist(noise, '{full_disk}/snaps', name='noise').wait()")
    assert "StorageError" in line and "no space left" in line, line
    # orbax fails in several background threads, and tensorstore then completes writes into its closed
    # event loop ("Event loop is closed"): the user gets one line, not hundreds of stderr lines.
    line = one_line_error(nb, f"%pathways checkpoint save {full_disk}/ckpt --step 1 --vars noise --wait")
    assert "no space left" in line and "free some space or choose another directory" in line, line
    assert list(full_disk.iterdir()) == []  # no orbax temporary directory, no partial data
    reply = ok(nb, "%pathways checkpoint save gs://notebook/after-full --step 1 --vars noise --wait")
    assert "done" in reply.text and not reply.error.strip(), reply.error


def test_checkpoint_of_a_variable_lost_with_a_slice_names_it(nb, tmp_path):
    ok(nb, "onslice = jax.device_put(jnp.ones((8, 8)), NamedSharding(m, P('data', 'model')))\npw.fail_slice(1)")
    try:
        line = one_line_error(nb, f"%pathways checkpoint save {tmp_path}/ckpt --step 1 --vars onslice --wait")
        assert "cannot checkpoint onslice: its data was lost with a slice (DATA_LOSS)" in line, line
        assert "restore it from a snapshot or recompute it" in line
    finally:
        # state had a shard on slice 1 too: rebuild it rather than rely on healing.
        ok(
            nb,
            "pw.repair_slice(1)\ndel onslice\nm = pw.mesh()\n"
            "state = {'w': jax.device_put(jnp.asarray(ref['w']), NamedSharding(m, P('data', 'model'))), "
            "'b': jnp.asarray(ref['b'])}",
        )
    assert not (tmp_path / "ckpt").exists()


def test_read_only_store_lists_and_restores(nb, read_only):
    ok(
        nb,
        f"pw.persist(state, '{read_only.source}/snaps', name='state').wait()\n"
        f"%pathways checkpoint save {read_only.source}/ckpt --step 2 --vars state --wait",
    )
    assert "state" in ok(nb, f"%pathways snapshots list {read_only.path}/snaps").text
    reply = ok(nb, f"%pathways snapshots restore {read_only.path}/snaps --name from_ro\nprint(same(from_ro))")
    assert reply.text.strip().endswith("True"), reply.text
    assert "steps 2" in ok(nb, f"%pathways checkpoint list {read_only.path}/ckpt").text
    reply = ok(nb, f"%pathways checkpoint restore {read_only.path}/ckpt\nprint(same(state))")
    assert reply.text.strip().endswith("True") and not reply.error.strip(), reply.error
    line = one_line_error(nb, f"%pathways checkpoint save {read_only.path}/ckpt --step 3 --vars state")
    assert "read-only file system" in line, line
    line = one_line_error(nb, f"%pathways cache {read_only.path}/jax-cache")
    assert "StorageError" in line and "read-only file system; choose a writable directory" in line, line


@pytest.mark.parametrize(
    "code, says",
    [
        ("%pathways checkpoint save {d}/c --step=-1 --vars state", "argument --step: must be at least 0, got -1"),
        ("%pathways checkpoint save {d}/c --step nan --vars state", "argument --step: expected a whole number"),
        (
            "%pathways checkpoint save {d}/c --step 99999999999999999999 --vars state",
            "argument --step: must be at most",
        ),
        ("%pathways checkpoint save {d}/c --step 1 --keep 0 --vars state", "argument --keep: must be at least 1"),
        ("%pathways checkpoint save {d}/c --step 1 --vars state,,b", "argument --vars: an empty name"),
        ("%pathways checkpoint restore {d}/c --step=-2", "argument --step: must be at least 0"),
        ("%pathways cache {d}/cc --min-compile-s nan", "argument --min-compile-s: expected a finite number"),
        ("%pathways cache {d}/cc --min-compile-s=-1", "argument --min-compile-s: must be at least 0 s"),
        ("pw.checkpoint_save(state, '{d}/c', -1)", "bad checkpoint step -1"),
        ("%pathways snapshots list {d}/a\x00b", "control characters"),
        ("%pathways snapshots list gs://notebook/" + "p" * 2000, "prefix of 2000 bytes"),
    ],
)
def test_numbers_and_names_that_make_no_sense_are_refused(nb, tmp_path, code, says):
    line = one_line_error(nb, code.format(d=tmp_path))
    assert says in line and len(line) < 300, line
    assert not (tmp_path / "c").exists()


def test_restore_never_rebinds_the_notebooks_own_names(nb, tmp_path):
    ok(nb, f"pw.persist(state, '{tmp_path}/snaps', name='state').wait()")
    for name, says in [
        ("pw", "'pw' is the module pathways_kernel"),
        ("In", "'In' belongs to IPython"),
        ("class", "not a valid Python name"),
        ("len", "would shadow the Python builtin len"),
        ("''", "'' is not a valid Python name"),
    ]:
        line = one_line_error(nb, f"%pathways snapshots restore {tmp_path}/snaps --name {name}")
        assert says in line, line
    # A checkpoint whose variable names clash binds none of them.
    ok(nb, f"pw.checkpoint_save({{'pw': state['b'], 'fine': state['b']}}, '{tmp_path}/clash', 1).wait()")
    line = one_line_error(nb, f"%pathways checkpoint restore {tmp_path}/clash")
    assert "'pw' is the module pathways_kernel" in line, line
    assert ok(nb, "print(type(pw).__name__, 'fine' in dir())").text.strip() == "module False"


@pytest.fixture
def refusing_token_endpoint():
    """An OAuth token endpoint on 127.0.0.1 that refuses every key, as Google's does a revoked one
    (Google's own cannot be reached from a test)."""
    import http.server
    import json
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "endpoint, why",
    [("unreachable", "Connection refused"), ("refusing", "invalid_grant: Invalid JWT Signature.")],
)
def test_a_key_that_gets_no_token_is_named_never_called_missing_or_shown(tmp_path, monkeypatch, request, endpoint, why):
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    token_uri = (
        "http://127.0.0.1:1/token" if endpoint == "unreachable" else request.getfixturevalue("refusing_token_endpoint")
    )
    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        .decode()
    )
    key = {
        "type": "service_account",
        "project_id": "test",
        "private_key_id": "0123456789abcdef0123456789abcdef01234567",
        "private_key": pem,
        "client_email": "notebook@test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(key))
    # Real Cloud Storage, not the emulator: the kernel must not inherit the test run's emulator settings.
    for name in (
        "STORAGE_EMULATOR_HOST",
        "TENSORSTORE_GCS_HTTP_URL",
        "GOOGLE_AUTH_TOKEN_FOR_TESTING",
        "FSSPEC_GCS_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    k = Kernel(
        "pathways",
        env={"GOOGLE_APPLICATION_CREDENTIALS": str(key_file), "PATHWAYS_STORAGE_RETRY_S": "1"},
    )
    try:
        ok(k, "import jax.numpy as jnp\nx = jnp.ones(4)")
        for code in ("%pathways snapshot x --to gs://notebook-bucket/snaps", "%pathways cache gs://notebook-bucket/cc"):
            line = one_line_error(k, code)
            assert f"the service-account key {key_file} (GOOGLE_APPLICATION_CREDENTIALS) was found" in line, line
            assert f"getting an access token from {token_uri} failed: {why}" in line, line
            assert "no Google Cloud credentials" not in line and "application-default login" not in line, line
            secrets = (key["private_key_id"], *(row for row in pem.splitlines() if "PRIVATE KEY" not in row))
            assert not any(secret in line for secret in secrets)
    finally:
        k.shutdown()
