"""Durable snapshots against a real GCS-compatible server (fake-gcs-server) and local paths.

In-process: the storage layer, crash-safe commit, bad input, and a storage
server killed at seeded random points during uploads. The notebook side
(magics, kernel staying up, progress, checkpoints, compile cache) is in
test_storage_kernel.py.
"""

from __future__ import annotations

import http.server
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from pathways_kernel.core import locations, storage_errors
from pathways_kernel.core.errors import NotSupportedError, PathwaysError, StorageError, one_line
from pathways_kernel.core.eventlog import EventLog
from pathways_kernel.state import compile_cache, storage
from pathways_kernel.state.manifest import MANIFEST, SnapshotInfo
from pathways_kernel.state.snapshots import Snapshot

pytest_plugins = ["mounts"]  # full_disk, read_only


def host_snapshot(seed: int, name: str = "state", step: int | None = None, mib: float = 1.0) -> Snapshot:
    rng = np.random.default_rng(seed)
    n = int(mib * (1 << 20) / 4)
    tree = {
        "params": {
            "w": rng.standard_normal((n // 256, 256), dtype=np.float32),
            "b": rng.integers(-9, 9, 256, dtype=np.int8),
        },
        "opt": [rng.standard_normal(1000).astype(ml_dtypes.bfloat16), np.float32(seed)],
    }
    specs = {"params": {"w": P("data", "model"), "b": None}, "opt": [P("model"), None]}
    return Snapshot.from_host(tree, specs, (("data", 2), ("model", 4)), name, step)


def same(a: Snapshot, b: Snapshot) -> bool:
    """Bit-exact leaves, dtypes, shapes and specs (in leaf order)."""
    if len(a.leaves) != len(b.leaves):
        return False
    for x, y in zip(a.leaves, b.leaves, strict=True):
        hx, hy = np.asarray(x.host), np.asarray(y.host)
        if (
            hx.dtype != hy.dtype
            or hx.shape != hy.shape
            or hx.tobytes() != hy.tobytes()
            or x.spec != y.spec
            or x.path != y.path
        ):
            return False
    return True


def persist(snap: Snapshot, url: str, snapshot_id: str | None = None) -> SnapshotInfo:
    return storage.persist(snap, url, snapshot_id, events=EventLog()).wait()


def load(url: str) -> Snapshot:
    return storage.load(url, events=EventLog())


# -- URLs and plain input -------------------------------------------------------
@pytest.mark.parametrize(
    "url, says",
    [
        ("s3://bucket/x", "unsupported storage URL"),
        ("gs://", "not a bucket name"),
        ("gs://Upper_Case/x", "not a bucket name"),
        ("gs://ab/x", "not a bucket name"),
        ("gs://bucket/a//b", "empty or relative"),
        ("http:/weird", "malformed storage URL"),
        ("", "no storage URL"),
        ("gs://bucket/" + "p" * 2000, "prefix of 2000 bytes"),
        ("gs://bucket/a\x00b", "control characters"),
        ("gs://bucket/a\nb", "control characters"),
        ("/tmp/a\x00b", "control characters"),
        ("/tmp/" + "d" * 300, "too long"),
        ("/tmp/" + "d/" * 2100, "too long"),
    ],
)
def test_malformed_urls_are_one_clear_line(url, says):
    with pytest.raises(StorageError) as info:
        locations.parse_url(url)
    line = one_line(info.value)
    assert says in line and "\n" not in line
    assert len(line) < 300  # a 4 KiB URL is not echoed back whole


def test_dot_dot_in_a_local_path_names_the_normalised_directory(tmp_path):
    (tmp_path / "a").mkdir()
    assert locations.parse_url(f"{tmp_path}/a/../snaps").path == f"{tmp_path}/snaps"
    assert locations.parse_url(f"file://{tmp_path}/a/../snaps").path == f"{tmp_path}/snaps"
    snap = host_snapshot(4)
    info = persist(snap, f"{tmp_path}/a/../snaps")
    assert info.url == f"{tmp_path}/snaps/state"
    assert [i.id for i in storage.list_snapshots(f"{tmp_path}/snaps")] == ["state"]
    assert same(snap, load(f"file://{tmp_path}/a/../snaps/state"))


def test_a_leaf_of_zeros_persists_and_restores(tmp_path):
    """Tensorstore skips chunks equal to the fill value unless told; optimizer state starts at zero."""
    snap = Snapshot.from_host(
        {"mu": np.zeros((512, 256), np.float32), "b": np.ones(4, np.int8)}, {"mu": None, "b": None}, (), "opt"
    )
    persist(snap, str(tmp_path))
    assert same(snap, load(str(tmp_path)))


def test_urls_parse_to_bucket_and_prefix(tmp_path):
    assert locations.parse_url("gs://my-bucket/runs/a/") == locations.Location("gs", "my-bucket", "runs/a")
    assert locations.parse_url(str(tmp_path)).path == str(tmp_path)
    assert locations.parse_url(f"file://{tmp_path}").path == str(tmp_path)


# -- the round trip -------------------------------------------------------------
def test_persist_list_restore_bit_exact(gcs_server):
    url = gcs_server.make_bucket("roundtrip") + "/runs"
    snap = host_snapshot(1, step=5)
    events = EventLog()
    info = storage.persist(snap, url, events=events).wait()
    assert info.id == "state-step5" and info.url == f"{url}/state-step5"

    listed = storage.list_snapshots(url)
    assert [i.id for i in listed] == ["state-step5"]
    assert listed[0].nbytes == snap.nbytes and listed[0].step == 5

    manifest = listed[0].manifest
    objects = [o for leaf in manifest["leaves"] for o in leaf["objects"]]
    assert objects and all(o["crc32c"] and o["generation"] and o["size"] for o in objects)
    assert {leaf["dtype"] for leaf in manifest["leaves"]} >= {"float32", "int8", "bfloat16"}

    for source in (info.url, url):  # a snapshot, or a prefix (its newest)
        back = load(source)
        assert same(snap, back) and back.step == 5 and back.name == "state"
        assert set(back.host_tree()) == {"params", "opt"}

    (transfer,) = events.last(kind="transfer")
    assert transfer.bytes == snap.nbytes and "MiB/s" in transfer.detail or "KiB/s" in transfer.detail


def test_local_paths_work_the_same_way(tmp_path):
    url = str(tmp_path / "snaps")
    snap = host_snapshot(2)
    persist(snap, url)
    assert [i.id for i in storage.list_snapshots(url)] == ["state"]
    assert same(snap, load(url + "/state"))
    with pytest.raises(StorageError, match="already exists"):
        persist(host_snapshot(3), url)
    assert same(snap, load(url + "/state"))


def modes(root: Path) -> dict[str, int]:
    """Permission bits of ``root`` and of everything under it, by path relative to ``root``'s parent."""
    return {str(p.relative_to(root.parent)): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")]}


def test_a_snapshot_persisted_to_a_directory_is_its_owners_only(tmp_path):
    # Directories made on the way and by tensorstore were 0755 and its files 0644: readable by every user.
    persist(host_snapshot(4), str(tmp_path / "new" / "snaps"))
    found = modes(tmp_path / "new")
    assert any(name.endswith("/manifest.json") for name in found) and len(found) > 5, found
    wrong = {
        name: oct(mode) for name, mode in found.items() if mode != (0o700 if (tmp_path / name).is_dir() else 0o600)
    }
    assert not wrong, wrong


def test_duplicate_id_is_refused_never_overwritten(gcs_server):
    url = gcs_server.make_bucket("dupes") + "/p"
    first = host_snapshot(10)
    persist(first, url, "same")
    with pytest.raises(StorageError, match="already exists.*never overwritten"):
        persist(host_snapshot(11), url, "same")
    assert same(first, load(f"{url}/same"))


def test_racing_uploads_of_one_id_commit_exactly_one(gcs_server):
    url = gcs_server.make_bucket("racers") + "/p"
    snaps = [host_snapshot(20 + i, mib=0.25) for i in range(6)]
    results: list = [None] * len(snaps)

    def run(i):
        try:
            results[i] = persist(snaps[i], url, "contested")
        except StorageError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(snaps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in enumerate(results) if isinstance(r, SnapshotInfo)]
    assert len(winners) == 1, results
    assert all("already exists" in str(r) for r in results if isinstance(r, StorageError))
    assert same(snaps[winners[0]], load(f"{url}/contested"))
    # The losers take their data objects back: only the winner's upload is left in the bucket.
    names = [b.name for b in gcs_server.client().list_blobs("racers", prefix="p/contested/")]
    assert {n.split("/")[2] for n in names if "/data." in n} == {f"data.{results[winners[0]].manifest['token']}"}


def test_corrupted_object_is_detected_on_restore(gcs_server):
    url = gcs_server.make_bucket("corrupt") + "/p"
    info = persist(host_snapshot(30), url, "victim")
    name = next(o["name"] for leaf in info.manifest["leaves"] for o in leaf["objects"] if "/c/" in o["name"])
    blob = gcs_server.client().bucket("corrupt").blob(f"p/victim/{name}")
    data = bytearray(blob.download_as_bytes())
    data[0] ^= 0xFF
    blob.upload_from_string(bytes(data))
    with pytest.raises(StorageError, match=f"damaged: object {name} changed since the commit"):
        load(info.url)


def test_corrupted_local_chunk_fails_its_crc32c(tmp_path):
    """Locally there are no server checksums or generations: the chunk's own CRC32C catches it."""
    info = persist(host_snapshot(31), str(tmp_path), "victim")
    name = next(o["name"] for leaf in info.manifest["leaves"] for o in leaf["objects"] if "/c/" in o["name"])
    chunk = tmp_path / "victim" / name
    data = bytearray(chunk.read_bytes())
    data[0] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="damaged: a chunk fails its CRC32C check"):
        load(info.url)


# -- failures a user can run into ---------------------------------------------------
def test_missing_bucket_is_one_line(gcs_server):
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        persist(host_snapshot(40), "gs://no-such-bucket/p")
    with pytest.raises(StorageError, match="does not exist"):
        storage.list_snapshots("gs://no-such-bucket/p")


def test_nothing_committed_is_one_line(gcs_server):
    url = gcs_server.make_bucket("empty-bucket") + "/nothing"
    with pytest.raises(StorageError, match="no committed snapshot"):
        load(url)


def test_too_large_for_memory_is_refused_before_downloading(gcs_server):
    """A manifest that promises more bytes than this host has: refused in one line."""
    url = gcs_server.make_bucket("huge") + "/p"
    info = persist(host_snapshot(50, mib=0.1), url, "real")
    manifest = dict(info.manifest, id="huge", nbytes=1 << 50)
    gcs_server.client().bucket("huge").blob("p/huge/manifest.json").upload_from_string(json.dumps(manifest))
    with pytest.raises(StorageError) as exc:
        load(f"{url}/huge")
    assert "needs 1048576.0 GiB of host memory" in str(exc.value) and "available" in str(exc.value)


class _Forbidden(http.server.BaseHTTPRequestHandler):
    """Answers every request the way GCS answers a caller without access."""

    def _deny(self):
        body = json.dumps(
            {
                "error": {
                    "code": 403,
                    "message": "caller does not have storage.objects.get access",
                    "errors": [{"reason": "forbidden"}],
                }
            }
        ).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _deny

    def log_message(self, *args):
        pass


def test_permission_denied_is_one_line(gcs_server, monkeypatch):
    """fake-gcs-server has no IAM, so a 127.0.0.1 server answering 403 stands in for GCS here."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(StorageError, match="permission denied") as exc:
            persist(host_snapshot(60), "gs://locked/p")
        assert "\n" not in one_line(exc.value)
        with pytest.raises(StorageError, match="permission denied"):
            storage.list_snapshots("gs://locked/p")
    finally:
        server.shutdown()


def test_tensorstore_errors_map_to_the_same_lines():
    """What tensorstore raises for bulk data (ValueError with a status); mapping only."""
    where = "gs://bkt/p"
    denied = ValueError("PERMISSION_DENIED: Error writing: [http_response_code='403'] [http_response_body='...']")
    assert "permission denied" in str(storage_errors.storage_error(denied, "persist", where))
    missing = ValueError("NOT_FOUND: Not Found [http_response_code='404']")
    assert "bucket 'bkt' does not exist" in str(storage_errors.storage_error(missing, "persist", where))
    down = ValueError("ABORTED: All 2 retry attempts failed: CURL error Could not connect to server")
    assert "cannot reach Cloud Storage" in str(storage_errors.storage_error(down, "persist", where))


def test_full_disk_is_one_line_and_leaves_nothing_behind(full_disk, monkeypatch):
    monkeypatch.setattr(storage, "CHUNK_BYTES", 128 << 10)  # many writes still in flight when the first fails
    url = str(full_disk / "run")
    with pytest.raises(StorageError) as info:
        persist(host_snapshot(70, mib=4), url)
    line = one_line(info.value)
    assert "no space left" in line and "free some space or choose another directory" in line, line
    assert list(full_disk.iterdir()) == []  # the partial data is gone: the disk is not left full
    small = host_snapshot(71, mib=0.25)
    persist(small, url)  # so a smaller one fits afterwards
    assert same(small, load(url))


def test_read_only_directory_can_be_listed_and_restored_but_not_written(read_only, tmp_path):
    snap = host_snapshot(80)
    persist(snap, str(read_only.source / "run"))
    url = str(read_only.path / "run")
    assert [i.id for i in storage.list_snapshots(url)] == ["state"]
    assert same(snap, load(url))  # the newest under a prefix, found by listing
    assert same(snap, load(url + "/state"))
    assert storage.list_snapshots(str(read_only.path / "nothing-here")) == []
    with pytest.raises(StorageError, match="read-only file system; choose a writable directory"):
        persist(host_snapshot(81), url, "more")
    with pytest.raises(StorageError, match="read-only file system") as info:
        compile_cache.enable(str(read_only.path / "jax-cache"))
    assert "\n" not in one_line(info.value)


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_retry_time_that_is_not_a_time_falls_back_to_the_default(tmp_path, monkeypatch, value):
    monkeypatch.setenv(locations.RETRY_ENV, value)
    assert locations.retry_seconds() == locations.DEFAULT_RETRY_S
    snap = host_snapshot(90, mib=0.1)
    persist(snap, str(tmp_path))
    assert same(snap, load(str(tmp_path)))


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1.0])
def test_compile_cache_refuses_a_minimum_compile_time_that_is_not_a_time(tmp_path, seconds):
    with pytest.raises(PathwaysError, match="bad minimum compile time"):
        compile_cache.enable(str(tmp_path), seconds)
    assert compile_cache.status().location is None


@pytest.mark.parametrize(
    "tamper, says",
    [
        (lambda m: m["leaves"][0].update(array="../../../../etc"), "is damaged: its manifest names data outside"),
        (lambda m: m["leaves"][0].update(dtype="object"), "is damaged: its manifest names data outside"),
        (lambda m: m["leaves"][0].update(shape=[3, 3]), "is damaged: its manifest names data outside"),
        (lambda m: m["leaves"][0].update(keys=[["seq", 10**12]]), "is damaged: its manifest names data outside"),
        (lambda m: [leaf.update(keys=[["dict", "same"]]) for leaf in m["leaves"]], "key paths do not form one tree"),
    ],
)
def test_a_tampered_manifest_is_refused_not_followed(tmp_path, tamper, says):
    """A bucket others can write may hold any manifest: it must not steer reads outside the snapshot,
    view raw bytes as Python objects, or build a list of 10**12 items."""
    info = persist(host_snapshot(95, mib=0.1), str(tmp_path), "victim")
    path = tmp_path / "victim" / MANIFEST
    manifest = json.loads(path.read_text())
    tamper(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(StorageError, match=says):
        load(info.url)
    if "outside" in says:
        assert storage.list_snapshots(str(tmp_path)) == []  # never offered for restore


def test_a_tampered_checkpoint_layout_is_refused(tmp_path, local_session):
    import jax.numpy as jnp

    from pathways_kernel.state import checkpoints

    checkpoints.save({"w": jnp.ones(8)}, str(tmp_path), 1).wait()
    layout = tmp_path / "1" / "layout" / "metadata"  # orbax JsonSave
    saved = json.loads(layout.read_text())
    saved["leaves"][0]["dtype"] = "object"
    layout.write_text(json.dumps(saved))
    with pytest.raises(StorageError, match="checkpoint step 1 in .* is damaged: its layout names non-numeric dtypes"):
        checkpoints.restore(str(tmp_path), 1)


# -- the storage server dies mid-upload -------------------------------------------------
def test_server_killed_during_uploads_never_leaves_a_partial_snapshot(gcs_server, monkeypatch):
    """Kill fake-gcs-server at 12 seeded random points of an upload, bring it back on the same
    port with the same files: only complete snapshots are ever listed, every listed one and
    the last committed one restore bit-exact, the failure is one line, and a retry succeeds."""
    monkeypatch.setattr(storage, "CHUNK_BYTES", 256 << 10)  # ~16 objects per 4 MiB snapshot
    monkeypatch.setenv(locations.RETRY_ENV, "1")
    url = gcs_server.make_bucket("faults") + "/run"
    rng = random.Random(20261129)
    expected: dict[str, Snapshot] = {}

    base = host_snapshot(100, mib=4)
    persist(base, url, "base")
    expected["base"] = base
    warm = host_snapshot(101, mib=4)
    start = time.perf_counter()
    persist(warm, url, "warm")  # timed once connections are warm, like the rounds below
    expected["warm"] = warm
    upload_s = time.perf_counter() - start

    failures = 0
    for round_ in range(12):
        snap_id = f"r{round_:02d}"
        snap = host_snapshot(200 + round_, mib=4)
        delay = rng.uniform(0.0, 1.2 * upload_s)  # mostly mid-upload, sometimes just after the commit
        killer = threading.Timer(delay, gcs_server.kill)
        killer.start()
        try:
            persist(snap, url, snap_id)
            committed = True
        except StorageError as exc:
            committed = False
            failures += 1
            line = one_line(exc)
            assert "\n" not in line and ("cannot reach" in line or "failed" in line), line
        killer.join()
        gcs_server.start()

        listed = {i.id for i in storage.list_snapshots(url)}
        assert set(expected) <= listed
        assert listed <= set(expected) | {snap_id}, f"round {round_}: unexpected {listed - set(expected)}"
        if committed:
            assert snap_id in listed
        if snap_id in listed:
            expected[snap_id] = snap  # committed before the kill, even if the reply was lost
            with pytest.raises(StorageError, match="already exists"):
                persist(snap, url, snap_id)
        else:
            persist(snap, url, snap_id)  # the retry, against the restarted server
            expected[snap_id] = snap
        last = list(expected)[-1]  # the newest committed
        assert same(expected[last], load(f"{url}/{last}"))
    assert same(base, load(f"{url}/base"))
    assert {i.id for i in storage.list_snapshots(url)} == set(expected)
    assert failures >= 3, f"only {failures} of 12 kills landed mid-upload; the test is not testing much"


def test_compile_cache_on_the_proxy_backend_says_pathways_keeps_its_own(monkeypatch):
    """A session on the proxy backend, never connected: no Pathways proxy can run here."""
    import importlib

    from pathways_kernel.backends.proxy import ProxyBackend

    sessions = importlib.import_module("pathways_kernel.core.sessions")  # the module; pw.session is the function

    monkeypatch.setattr(sessions, "_current", sessions.Session(ProxyBackend.from_spec("grpc://127.0.0.1:1")))
    with pytest.raises(NotSupportedError, match="Pathways manages its own persistent compilation cache"):
        compile_cache.enable("gs://any-bucket/cache")


def test_kernelspec_compile_cache_option_sets_the_env(tmp_path):
    from pathways_kernel import kernelspec

    path = kernelspec.install(
        "pw-cache-test", backend="local:2x2", compile_cache="gs://my-cache/jax", prefix=str(tmp_path)
    )
    spec = json.loads((Path(path) / "kernel.json").read_text())
    assert spec["env"] == {"PATHWAYS_BACKEND": "local:2x2", compile_cache.ENV: "gs://my-cache/jax"}
    with pytest.raises(StorageError, match="not a bucket name"):
        kernelspec.install("pw-cache-bad", compile_cache="gs://Bad Bucket/x", prefix=str(tmp_path))


def test_importing_the_package_leaves_logging_and_the_unraisable_hook_alone():
    # The filter that quiets orbax's error logs and the hook that drops its "Event loop is
    # closed" are installed only while a checkpoint save runs, not by importing pathways_kernel.
    code = (
        "import logging, sys\n"
        "before = sys.unraisablehook\n"
        "import pathways_kernel\n"
        "print(sys.unraisablehook is before, len(logging.getLogger('absl').filters))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["True", "0"], done.stdout
