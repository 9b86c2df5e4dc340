"""The first copy window on the local server: a loss while an elastic run copies the state it
was given loses nothing (issue #27 item 7).

The run's first snapshot (2 x 128 MiB) takes seconds on the server under load; a slice lost
meanwhile used to fail the copy, and the run had nothing to go back to. The copy now asks for
every read at once, and an injected loss lets the reads already asked for reach the server
first, which completes them: the run recovers from the state it was given. Two ``yes``
children load the machine, since the window is what load stretches.
"""

from __future__ import annotations

import pytest
from kernels import SERVER
from load import cpu_hogs

KERNEL_BACKEND = SERVER

SETUP = """
import threading, time, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
n = 128 * 2**20 // 4

def fresh():
    # The state as a first run gets it: just computed by an init function, maybe not ready yet.
    global a, b
    init = jax.jit(lambda x, v: jnp.tanh(x) * 0 + v, static_argnums=1)
    x = jax.device_put(np.ones((n // 1024, 1024), np.float32), NamedSharding(pw.mesh(), P('data')))
    a, b = init(x, 1.0), init(x, 2.0)

def lose_in_first_copy(delay):
    # Slice 1 goes `delay` s after the run's first copy starts; `seen` says whether it was still copying then.
    store, seen = pw.snapshot_store(), []
    def watch():
        deadline = time.monotonic() + 60
        copying = []
        while not copying and time.monotonic() < deadline:
            copying = [s for s in store.list() if s.name.startswith('elastic:') and not s.done()]
            time.sleep(0.002)
        time.sleep(delay)
        seen.append(bool(copying) and not copying[0].done())
        pw.fail_slice(1)
    threading.Thread(target=watch, daemon=True).start()
    return seen

def lose_as_first_copy_starts():
    # Slice 1 goes the moment the run's first copy has been asked for (before any of it can be done).
    from pathways_kernel.state import snapshot_store
    take, seen = snapshot_store.take, []
    def take_then_lose(tree, name, *args, **kwargs):
        snap = take(tree, name, *args, **kwargs)
        if name.startswith('elastic:') and not seen:
            seen.append(not snap.done())
            snapshot_store.take = take
            pw.fail_slice(1)
        return snap
    snapshot_store.take = take_then_lose
    return seen
"""

RUN = "%%pathways elastic --steps 6 --state a,b --snapshot-every 3\na = a + 1\nb = b + 1\n"


@pytest.mark.parametrize("loss", ["lose_as_first_copy_starts()", "lose_in_first_copy(0.3)"])
def test_a_loss_while_a_run_copies_256_mib_it_was_given_loses_nothing(kernel, loss):
    assert kernel.run(SETUP).status == "ok"
    try:
        with cpu_hogs():
            ready = kernel.run(f"fresh()\nseen = {loss}", timeout=240)
            assert ready.status == "ok", ready.error
            reply = kernel.run(RUN, timeout=300)
        assert reply.status == "ok", reply.error
        assert "6 steps" in reply.text and "1 recovery" in reply.text, reply.text + reply.error
        check = kernel.run("print(seen, float(a[0, 0]), float(b[-1, -1]), float(a.sum()) == 7.0 * a.size)")
        # The loss struck while the first copy was still being made, and nothing of the state was lost.
        assert check.text.strip() == "[True] 7.0 8.0 True", check.text + check.error
    finally:
        kernel.run("%pathways repair 1")
