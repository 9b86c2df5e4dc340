"""Host snapshots on real JAX CPU devices (local:2x4): real copies, async, bounded, resharded restore."""

from __future__ import annotations

import gc
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from kernels import SERVER

import pathways_kernel as pw
from pathways_kernel.emulator import faults
from pathways_kernel.state import host_buffers, snapshots

# Kernels run on the product default, a local Pathways server (conftest._backend).
KERNEL_BACKEND = SERVER


@pytest.fixture
def mesh(local_session):
    return local_session.mesh()


def sharded(mesh, shape, spec, start=0.0):
    host = (np.arange(np.prod(shape), dtype=np.float32) + start).reshape(shape)
    return jax.device_put(host, NamedSharding(mesh, spec))


def test_snapshot_is_a_real_copy_that_outlives_the_device_array(mesh):
    x = sharded(mesh, (16, 8), P("data", "model"))
    y = jax.device_put(np.ones(5, np.float32), jax.devices()[0])  # single device: np.asarray is a view there
    snap = pw.snapshot({"x": x, "y": y}, name="copy").wait()
    hx, hy = (leaf.host for leaf in sorted(snap.leaves, key=lambda leaf: leaf.path))
    np.testing.assert_array_equal(hx, np.asarray(x))
    assert hx.flags.owndata and hx.flags.writeable and hy.flags.owndata
    assert not np.shares_memory(hy, np.asarray(y))
    hy[0] = 42.0  # writing the copy leaves the device array alone
    assert float(y[0]) == 1.0
    x.delete()
    y.delete()
    np.testing.assert_array_equal(snap.host_tree()["x"], np.arange(128, dtype=np.float32).reshape(16, 8))


def test_snapshot_returns_before_the_copy_is_done(mesh):
    @jax.jit
    def slow(x):
        return jax.lax.fori_loop(0, 300, lambda i, v: jnp.sin(v) * 1.0001 + 0.5, x)

    x = sharded(mesh, (1024, 1024), P("data", "model"))
    slow(x).block_until_ready()  # compile outside the timing
    pending = slow(x)
    t0 = time.perf_counter()
    snap = pw.snapshot(pending, name="async", step=7)
    returned = time.perf_counter() - t0
    assert not snap.done()
    snap.wait()
    waited = time.perf_counter() - t0
    assert snap.ok() and snap.step == 7
    assert returned < waited / 2, (returned, waited)
    np.testing.assert_allclose(snap.leaves[0].host, np.asarray(pending), rtol=0)


def test_records_partition_specs_and_mesh_axes(mesh):
    tree = {"w": sharded(mesh, (8, 8), P(None, "model")), "b": sharded(mesh, (8,), P()), "n": 3}
    snap = pw.snapshot(tree, name="specs").wait()
    by_path = {leaf.path: leaf for leaf in snap.leaves}
    assert by_path["['w']"].spec == P(None, "model")
    assert by_path["['w']"].mesh_axes == (("data", 2), ("model", 4))
    assert by_path["['b']"].spec == P()
    assert not by_path["['n']"].on_device and by_path["['n']"].host == 3
    assert snap.nbytes == 8 * 8 * 4 + 8 * 4


def test_store_keeps_the_last_k_per_name_and_frees_the_rest(mesh):
    store = pw.snapshot_store()
    store.configure(keep=3)
    try:
        refs = []
        for i in range(10):
            snap = pw.snapshot(sharded(mesh, (64, 64), P("data"), start=i), name="bounded", step=i).wait()
            refs.append(weakref.ref(snap))
            del snap
        kept = [s for s in store.list() if s.name == "bounded"]
        assert [s.step for s in kept] == [7, 8, 9]
        assert store.latest("bounded").step == 9
        del kept
        gc.collect()
        assert sum(r() is not None for r in refs) == 3  # older host copies were released
    finally:
        store.configure(keep=snapshots.DEFAULT_KEEP)
        store.drop("bounded")


def test_store_max_bytes_drops_oldest_first(mesh):
    store = snapshots.SnapshotStore(keep=5, max_bytes=3 * 64 * 64 * 4)
    for i in range(6):
        snap = snapshots.take(sharded(mesh, (64, 64), P("data")), name=f"v{i}").wait()
        store.add(snap)
    assert store.names() == ["v3", "v4", "v5"] and store.nbytes == 3 * 64 * 64 * 4


def test_restore_onto_the_surviving_slice_keeps_specs(mesh):
    tree = {"w": sharded(mesh, (8, 16), P("data", "model")), "r": sharded(mesh, (6,), P("data"))}
    expected = jax.device_get(tree)
    snap = pw.snapshot(tree, name="reshard", step=3).wait()
    faults.fail_slice(1)
    with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS"):
        np.asarray(tree["w"])
    restored = pw.restore_snapshot(snap)
    live = {d.id for d in pw.session().live_devices()}
    for key in ("w", "r"):
        np.testing.assert_array_equal(np.asarray(restored[key]), expected[key])
        assert {d.id for d in restored[key].sharding.device_set} <= live
    assert restored["w"].sharding.spec == P("data", "model")
    assert restored["w"].sharding.mesh.shape == {"data": 1, "model": 4}
    event = pw.events(1, kind="restore")[0]
    assert event.step == 3 and event.bytes == snap.nbytes and event.slices_after == (0,)


def test_restore_replicates_axes_the_new_mesh_lacks(mesh):
    snap = pw.snapshot(sharded(mesh, (8, 8), P("data", "model")), name="axes").wait()
    other = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("x",))
    restored = pw.restore_snapshot(snap, other)
    assert restored.sharding.spec == P(None, None)
    np.testing.assert_array_equal(np.asarray(restored), np.arange(64, dtype=np.float32).reshape(8, 8))


def test_snapshot_of_lost_data_fails_and_the_older_one_is_latest(mesh):
    good = pw.snapshot(sharded(mesh, (8, 8), P("data")), name="lossy", step=1).wait()
    x = sharded(mesh, (8, 8), P("data"), start=100)
    faults.fail_slice(0)
    bad = pw.snapshot(x, name="lossy", step=2) if _start_ok(x) else None
    if bad is not None:
        with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS"):
            bad.wait()
    assert pw.snapshot_store().latest("lossy") is good


def _start_ok(x) -> bool:
    """Starting a snapshot of lost data may already raise; either way it is not kept."""
    try:
        x.copy_to_host_async()
    except jax.errors.JaxRuntimeError:
        return False
    return True


def test_from_host_round_trip(mesh):
    host = {"a": np.arange(16, dtype=np.float32).reshape(4, 4), "b": np.zeros(3, np.int32)}
    snap = pw.Snapshot.from_host(host, {"a": P("data", "model"), "b": None}, {"data": 2, "model": 4}, name="fh", step=5)
    assert snap.done() and snap.ok() and snap.step == 5
    restored = pw.restore_snapshot(snap, mesh)
    assert restored["a"].sharding.spec == P("data", "model")
    np.testing.assert_array_equal(np.asarray(restored["a"]), host["a"])
    assert restored["b"].dtype == np.int32


def test_snapshot_magics_in_the_kernel(kernel):
    reply = kernel.run(
        "import jax, numpy as np\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "m = pw.mesh()\n"
        "w = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(m, P('data', 'model')))\n"
        "b = {'bias': jax.device_put(np.zeros(8, np.float32), NamedSharding(m, P()))}"
    )
    assert reply.status == "ok", reply.error
    reply = kernel.run("%pathways snapshot w b --step 4")
    assert reply.status == "ok", reply.error
    assert "snapshot 'w' step 4: 1 array, 256 B" in reply.text and "snapshot 'b' step 4" in reply.text
    reply = kernel.run("pw.snapshot_store().latest('w').wait().leaves[0].spec")
    assert "PartitionSpec('data', 'model')" in reply.text or "P('data', 'model')" in reply.text
    reply = kernel.run("%pathways snapshots")
    assert "snapshot 'w' step 4" in reply.text and "ok" in reply.text
    kernel.run("w")  # displayed: IPython's Out now holds the array
    reply = kernel.run("%pathways snapshot")
    assert "snapshot 'w'" in reply.text and "'Out'" not in reply.text, reply.text
    reply = kernel.run("%pathways snapshot nosuchvar")
    assert reply.status == "error" and reply.error.strip().splitlines()[-1].startswith(
        "NamespaceError: no variable 'nosuchvar'"
    )


def test_autosnapshot_snapshots_changed_variables_after_each_cell(kernel):
    reply = kernel.run("%pathways autosnapshot on --max-bytes 100000")
    assert reply.status == "ok" and "autosnapshot on" in reply.text, reply.error
    kernel.run("import jax.numpy as jnp\nauto_v = jnp.arange(16.0)\nbig = jnp.zeros(100000)")
    reply = kernel.run("s = pw.snapshot_store().latest('auto_v'); print(s.step, s.leaves[0].host[3])")
    assert reply.text.strip() == "None 3.0", reply.text + reply.error
    reply = kernel.run("%pathways autosnapshot")
    assert "skipped (too large): big" in reply.text
    before = kernel.run("print(id(pw.snapshot_store().latest('auto_v')))").text
    kernel.run("x_unrelated = 1")
    assert kernel.run("print(id(pw.snapshot_store().latest('auto_v')))").text == before  # unchanged: not re-taken
    kernel.run("auto_v = auto_v + 1")
    assert kernel.run("print(pw.snapshot_store().latest('auto_v').leaves[0].host[3])").text.strip() == "4.0"
    reply = kernel.run("%pathways autosnapshot off")
    assert "autosnapshot off" in reply.text


def test_host_buffers_of_dead_snapshots_are_reused_only_when_nobody_holds_them(mesh):
    host_buffers.BUFFERS.clear()
    x = sharded(mesh, (64, 64), P("data", "model"))
    held = snapshots.take(x).wait()
    kept = held.leaves[0].host
    del held
    dead = snapshots.take(x).wait()
    address = dead.leaves[0]._buffer.array.ctypes.data  # peek without taking the buffer
    del dead  # its buffer is recycled by the next copy
    y = sharded(mesh, (64, 64), P("data", "model"), start=1000)
    fresh = snapshots.take(y).wait()
    assert fresh.leaves[0].host.ctypes.data == address  # the dead snapshot's buffer, reused
    np.testing.assert_array_equal(fresh.leaves[0].host, np.asarray(y))
    np.testing.assert_array_equal(kept, np.arange(64 * 64, dtype=np.float32).reshape(64, 64))  # held: untouched
    assert kept.ctypes.data != address


def test_a_host_buffer_anyone_still_reaches_is_never_overwritten(mesh):
    """Ownership, not reference counts: held leaves, handed-out buffers and restored arrays keep their bytes."""
    host_buffers.BUFFERS.clear()
    x = sharded(mesh, (64, 64), P("data", "model"))
    expected = np.asarray(x).copy()
    held_leaf = snapshots.take(x).wait().leaves[0]  # the snapshot dies, its leaf is still held
    handed = snapshots.take(x).wait()
    handed_out = handed.leaves[0].host
    restored = snapshots.restore(handed, mesh, emit=False)
    del handed  # dead, but its buffer was handed out (and may back `restored`)
    for start in range(1, 30):  # many same-shaped snapshots, each dropped at once
        snapshots.take(sharded(mesh, (64, 64), P("data", "model"), start=1000 * start)).wait()
    np.testing.assert_array_equal(held_leaf.host, expected)
    np.testing.assert_array_equal(handed_out, expected)
    np.testing.assert_array_equal(np.asarray(restored[0] if isinstance(restored, list) else restored), expected)
    assert host_buffers.BUFFERS.nbytes <= 64 * 64 * 4  # the dropped ones were recycled, within the bound


def test_a_failed_copy_does_not_keep_the_lost_arrays_alive(mesh):
    """The snapshot's error is kept for wait(); the device arrays it failed on are not."""
    import sys

    from pathways_kernel.emulator.faults import fail_slice, repair_slice

    x = sharded(mesh, (64, 64), P("data", "model"))
    fail_slice(1)
    try:
        held_before = sys.getrefcount(x)
        snap = snapshots.take(x)
        with pytest.raises(Exception, match="DATA_LOSS"):
            snap.wait()
        assert sys.getrefcount(x) == held_before  # nothing of the failed snapshot holds x
        with pytest.raises(Exception, match="DATA_LOSS"):
            snap.wait()  # still says why
    finally:
        repair_slice(1)


def test_a_snapshot_leaves_no_device_arrays_behind_and_a_loss_counts_only_the_users(mesh):
    """A snapshot is host memory: reading the shards must not leave per-device arrays live."""
    y = sharded(mesh, (16, 32), P("data", "model"))
    r = sharded(mesh, (8,), P())
    one = jax.device_put(np.ones(5, np.float32), jax.devices()[3])
    before = {id(a) for a in jax.live_arrays()}
    pw.snapshot({"y": y, "r": r, "one": one}, name="leaves-nothing").wait()
    extra = [a for a in jax.live_arrays() if id(a) not in before]
    assert extra == [], [(a.shape, a.sharding) for a in extra]
    report = faults.fail_slice(0)
    assert (report.arrays, report.nbytes) == (3, y.nbytes + r.nbytes + one.nbytes), report


def test_snapshotting_a_lost_variable_is_one_line_and_snapshot_all_skips_it(kernel):
    reply = kernel.run(
        "import jax, numpy as np\n"
        "keep0 = jax.device_put(np.ones(4, np.float32), pw.topology().slices[0].devices[0])\n"
        "gone1 = jax.device_put(np.ones(4, np.float32), pw.topology().slices[1].devices[0])\n"
        "pw.fail_slice(1)"
    )
    try:
        assert reply.status == "ok", reply.error
        named = kernel.run("%pathways snapshot gone1")
        assert named.status == "error" and named.error.strip().splitlines()[-1].startswith(
            "NamespaceError: gone1 lost its data with a slice (DATA_LOSS): nothing to snapshot"
        ), named.error
        everything = kernel.run("%pathways snapshot")
        assert "snapshot 'keep0'" in everything.text and "gone1" not in everything.text, everything.text
    finally:
        kernel.run("pw.repair_slice(1); del keep0, gone1")
