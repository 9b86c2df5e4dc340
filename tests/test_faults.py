"""Fault injection on the local backend, through a real kernel: a lost slice's
arrays raise DATA_LOSS on every access, as pathwaysutils expects of Pathways."""

import itertools
import time

import pytest

from pathways_kernel import backends
from pathways_kernel.emulator import chaosmonkey
from pathways_kernel.emulator import faults
from pathways_kernel.core.errors import NotSupportedError, PathwaysError
from pathways_kernel.core.sessions import Session

SETUP = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from pathwaysutils.elastic.elastic import is_error_due_to_slice_down

def probe(fn):
    try:
        fn()
    except Exception as exc:
        if isinstance(exc, jax.errors.JaxRuntimeError) and "DATA_LOSS" in str(exc) and is_error_due_to_slice_down(exc, log_traceback=False):
            return "DATA_LOSS"
        return f"other error {type(exc).__name__}: {exc}"
    return "readable"

slice0, slice1 = (pw.topology().slices[i].devices for i in (0, 1))
mesh = pw.mesh()
mesh1 = Mesh(np.array(slice1).reshape(1, 4), ("data", "model"))
both = jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data", "model")))
on1 = jax.device_put(np.ones((4, 4)), NamedSharding(mesh1, P(None, "model")))
on0 = jax.device_put(np.full(4, 2.0), slice0[1])
double = jax.jit(lambda a: a * 2)
zeros_on1 = jax.jit(lambda: jax.numpy.zeros((4, 4)), out_shardings=NamedSharding(mesh1, P()))
print(float(double(on1).sum()), float(zeros_on1().sum()), np.asarray(both).sum())  # warm the fast paths
"""

ACCESS_PATHS = {
    "np.asarray": "np.asarray({x})",
    "float(x.sum())": "float({x}.sum())",
    "repr": "repr({x})",
    "print": "print({x})",
    "jax.device_get": "jax.device_get({x})",
    "device_put to a live device": "jax.device_put({x}, slice0[0])",
    "device_put onto its own sharding": "jax.device_put({x}, {x}.sharding)",
    "jit input": "double({x}).block_until_ready()",
    "block_until_ready": "{x}.block_until_ready()",
    "a shard's data": "np.asarray({x}.addressable_shards[0].data)",
    "item": "{x}[0, 0].item()",
}


@pytest.fixture(scope="module")
def lost(kernel):
    """A kernel whose slice 1 was lost with `both` (two slices) and `on1` on it."""
    setup = kernel.run(SETUP)
    assert setup.status == "ok", setup.error
    reply = kernel.run("%pathways fail 1")
    assert reply.status == "ok", reply.error
    assert "slice 1 down" in reply.text
    return kernel


def probe(kernel, expression: str) -> str:
    reply = kernel.run(f"print(probe(lambda: {expression}))")
    assert reply.status == "ok", reply.error
    return reply.text.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ACCESS_PATHS)
@pytest.mark.parametrize("array", ["both", "on1"])
def test_every_access_to_a_lost_array_raises_data_loss(lost, name, array):
    assert probe(lost, ACCESS_PATHS[name].format(x=array)) == "DATA_LOSS"


def test_displaying_a_lost_array_in_a_cell_shows_data_loss(lost):
    reply = lost.run("both")
    assert "DATA_LOSS: slice 1 was lost" in reply.error + reply.text


def test_new_work_placed_on_the_lost_slice_fails_the_same_way(lost):
    assert probe(lost, "np.asarray(jax.device_put(np.ones(4), slice1[2]))") == "DATA_LOSS"
    assert probe(lost, "float(zeros_on1().sum())") == "DATA_LOSS"  # jit with out_shardings on it
    assert probe(lost, "float(jax.jit(lambda a: a + 1, out_shardings=NamedSharding(mesh, P()))(np.float32(1)))") == "DATA_LOSS"  # spans both slices


def test_arrays_on_surviving_slices_are_untouched(lost):
    reply = lost.run("print(np.asarray(on0).tolist(), float(double(on0).sum()), float(jax.numpy.ones(3).sum()))")
    assert reply.status == "ok", reply.error
    assert reply.text.strip() == "[2.0, 2.0, 2.0, 2.0] 16.0 3.0"
    assert lost.run("print(pw.is_lost(on0), pw.is_lost(both), pw.is_lost(on1))").text.strip() == "False True True"


def test_health_check_reports_the_slice_down_until_restored(lost):
    reply = lost.run("%pathways health")
    assert reply.status == "ok", reply.error
    assert "slice 0: up" in reply.text and "slice 1: down" in reply.text
    assert "1/2 slices healthy" in reply.text


def test_restore_brings_the_slice_back_empty(lost):
    reply = lost.run("%pathways restore 1")
    assert "slice 1 up again" in reply.text
    try:
        # New arrays and computations work on slice 1 again, and the cached jit too.
        assert probe(lost, "float(jax.device_put(np.ones(4), slice1[2]).sum())") == "readable"
        assert probe(lost, "float(zeros_on1().sum())") == "readable"
        # Lost data stays lost, and so does what is computed from it.
        assert probe(lost, "np.asarray(both)") == "DATA_LOSS"
        assert probe(lost, "jax.device_put(both, both.sharding)") == "DATA_LOSS"
        assert probe(lost, "float(double(on1).sum())") == "DATA_LOSS"
        assert "2/2 slices healthy" in lost.run("%pathways health").text
    finally:
        assert "slice 1 down" in lost.run("%pathways fail 1").text


def test_hooks_follow_slice_states_set_directly_on_the_session(lost):
    # E.g. a test fixture or the monitor marking the slice up without restore_slice.
    lost.run("pw.session().set_slice_state(1, 'up')")
    try:
        assert probe(lost, "float(jax.device_put(np.ones(4), slice1[2]).sum())") == "readable"
    finally:
        lost.run("pw.session().set_slice_state(1, 'down')")
    assert probe(lost, "float(jax.device_put(np.ones(4), slice1[2]).sum())") == "DATA_LOSS"


def test_slice_events_are_logged(lost):
    reply = lost.run("print([(e.kind, e.slices_before, e.slices_after) for e in pw.events(kind='slice_down')][-1])")
    assert reply.text.strip() == "('slice_down', (0, 1), (0,))"


def test_bad_slice_index_is_one_line(lost):
    reply = lost.run("%pathways fail 7")
    assert reply.status == "error"
    assert reply.error.strip() == "PathwaysError: no slice 7: this session has slices 0..1"


def test_chaos_in_the_kernel_follows_its_seeded_schedule(lost):
    lost.run("%pathways restore 1")
    reply = lost.run("%pathways chaos --mtbf 0.05 --mttr 0.05 --seed 11")
    assert "chaos on (seed 11)" in reply.text
    time.sleep(1.0)
    off = lost.run("%pathways chaos --off")
    assert "chaos off after" in off.text
    check = lost.run(
        "import itertools\n"
        "from pathways_kernel.emulator import chaosmonkey\n"
        "applied = [(e.action, e.slice_index) for e in pw.session().component(chaosmonkey.Chaos).applied]\n"
        "expected = [(e.action, e.slice_index) for e in itertools.islice(chaosmonkey.schedule([0, 1], 0.05, 0.05, 11), len(applied))]\n"
        "logged = [e for e in pw.events() if 'chaos (seed 11)' in e.detail]\n"
        "print(len(applied) >= 4, applied == expected, len(logged) == len(applied))"
    )
    assert check.text.strip().splitlines()[-1] == "True True True", check.text + check.error
    lost.run("pw.restore_slice(0); pw.restore_slice(1); pw.fail_slice(1)")


STRESS = """
import threading, time
def expected(exc):
    return isinstance(exc, pw.PathwaysError) or (isinstance(exc, jax.errors.JaxRuntimeError) and is_error_due_to_slice_down(exc, log_traceback=False))
latest, stop, reads = {}, threading.Event(), [0]
def reader():
    while not stop.is_set():
        try:
            x = latest.get("w")
            if x is not None:
                reads[0] += 1  # attempts: under this much chaos most reads meet lost data
                [np.asarray(s.data) for s in x.addressable_shards]; jax.device_get(x)
        except Exception as exc:
            if not expected(exc): raise
thread = threading.Thread(target=reader); thread.start()
pw.chaos(0.02, 0.02, seed=3)
steps, end = 0, time.time() + 3
while time.time() < end:
    try:
        w = jax.device_put(np.ones((128, 128), np.float32), NamedSharding(pw.mesh(), P("data", "model")))
        for _ in range(3):
            w = double(w); latest["w"] = w
        float(w.sum()); steps += 1
    except Exception as exc:
        if not expected(exc): raise
status = pw.chaos_off(); stop.set(); thread.join()
print(status.applied >= 20, reads[0] > 0)
"""


def test_chaos_while_threads_read_arrays_keeps_the_kernel_alive(lost):
    # Swapping buffers under a host read in flight used to abort the process.
    reply = lost.run(STRESS, timeout=120)
    assert reply.status == "ok", reply.error
    assert "True True" in reply.text.splitlines()
    lost.run("pw.restore_slice(0); pw.restore_slice(1); pw.fail_slice(1)")


# -- without a kernel ---------------------------------------------------------
def test_chaos_schedule_is_deterministic_for_a_seed():
    first = list(itertools.islice(chaosmonkey.schedule([0, 1, 2], 10.0, 2.0, seed=5), 200))
    again = list(itertools.islice(chaosmonkey.schedule([0, 1, 2], 10.0, 2.0, seed=5), 200))
    other = list(itertools.islice(chaosmonkey.schedule([0, 1, 2], 10.0, 2.0, seed=6), 200))
    assert first == again
    assert first != other
    assert [e.at for e in first] == sorted(e.at for e in first)
    # Failures and repairs alternate per slice, and one slice always stays up.
    up = {0: True, 1: True, 2: True}
    for event in first:
        assert up[event.slice_index] == (event.action == "fail")
        up[event.slice_index] = event.action == "restore"
        assert any(up.values())
    assert {e.slice_index for e in first if e.action == "fail"} == {0, 1, 2}


def test_chaos_rejects_settings_that_cannot_work():
    with pytest.raises(PathwaysError, match="positive --mtbf"):
        chaosmonkey.schedule([0, 1], 0, 1, seed=0)
    with pytest.raises(PathwaysError, match="--min-up"):
        chaosmonkey.schedule([0, 1], 1, 1, seed=0, min_up=2)


def test_fault_injection_is_refused_on_a_pathways_backend():
    # The proxy backend is built, not connected: refusal happens before any device is touched.
    proxy = Session(backends.from_spec("grpc://127.0.0.1:9"))
    for attempt in (
        lambda: faults.injector(proxy).fail(0),
        lambda: faults.injector(proxy).restore(0),
        lambda: chaosmonkey.Chaos(proxy).start(1.0, 1.0, seed=0),
    ):
        with pytest.raises(NotSupportedError, match=r"only for the embedded local backend; this session runs proxy:grpc://127\.0\.0\.1:9"):
            attempt()
