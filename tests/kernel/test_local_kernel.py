"""A kernel on the product default (``local:2x4``) doing what users do there: a decode loop
that reads its tokens at the end, a read of a lost array, a host callback.

One kernel for the module (a local server each: ~5 s a start).
"""

from __future__ import annotations

import re

import pytest
from kernels import SERVER, Kernel
from load import cpu_hogs


@pytest.fixture(scope="module")
def kernel():
    """A kernel on local:2x4 whose server logs every request it serves (its debug log)."""
    k = Kernel("pathways", backend=SERVER, env={"PATHWAYS_LOCAL_LOG": "DEBUG"})
    yield k
    k.shutdown()


# While the kernel's main thread holds the GIL (as JAX's proxy client does while it waits for
# the server in ``Array.is_deleted()``; here a busy loop with a switch interval of 10 min), a
# second client of the kernel's server runs tiny ops, each a line of the server's debug log;
# what came back when is written to a file (a pipe would need a reader here).
SECOND_CLIENT = r"""
import sys, time, jax, numpy as np, pathwaysutils
pathwaysutils.initialize()
x = jax.device_put(np.ones(4, np.float32), jax.devices()[0])
add = jax.jit(lambda a: a + 1)
add(x).block_until_ready()
with open(sys.argv[1], "w", buffering=1) as out:
    print("ready", time.time(), file=out)
    for _ in range(20000):
        add(x).block_until_ready()
        print(time.time(), file=out)
"""
HOLD_THE_GIL = """
import os, subprocess, sys, tempfile, time
from pathways_kernel.core.sessions import session
from pathways_kernel.backends import server_client
log = tempfile.NamedTemporaryFile("r", suffix=".txt")
client = subprocess.Popen([sys.executable, "-c", SECOND_CLIENT, log.name],
                          env=server_client.client_env(session().backend.server.target), stderr=subprocess.DEVNULL)
deadline = time.monotonic() + 120  # its JAX import and connect
while not log.read(5) and client.poll() is None and time.monotonic() < deadline:
    log.seek(0); time.sleep(0.2)
before = sys.getswitchinterval()
sys.setswitchinterval(600)
held_from = time.time()
while time.time() < held_from + 8:
    pass
held_to = time.time()
sys.setswitchinterval(before)
client.kill(); client.wait(10)
log.seek(0)
times = [held_from] + [t for t in map(float, log.read().split()[2:]) if held_from <= t <= held_to] + [held_to]
print("ops", len(times) - 2, "longest wait", f"{max(b - a for a, b in zip(times, times[1:])):.1f} s")
"""


# A 2-layer transformer's per-token step with a donated KV cache, batch 8 sharded over
# slice 0: every step donates the cache, whose old handles the server destructs in batches.
DECODE = """
import time, jax, jax.numpy as jnp, numpy as np
from functools import partial
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(pw.topology().slices[0].devices), ("b",))
B, D, L, T = 8, 64, 2, 128
ks = iter(jax.random.split(jax.random.PRNGKey(0), 6 * L + 1))
layers = [{n: jax.random.normal(next(ks), s) * 0.05 for n, s in
           dict(wq=(D, D), wk=(D, D), wv=(D, D), wo=(D, D), w1=(D, 4 * D), w2=(4 * D, D)).items()} for _ in range(L)]
rep = NamedSharding(mesh, P())
layers, emb = jax.device_put((layers, jax.random.normal(next(ks), (100, D)) * 0.1), rep)
cache = jax.device_put(jnp.zeros((L, 2, B, T, D)), NamedSharding(mesh, P(None, None, "b")))
tok = jax.device_put(jnp.zeros((B,), jnp.int32), NamedSharding(mesh, P("b")))

@partial(jax.jit, donate_argnums=(2,))
def step(layers, emb, cache, tok, pos):
    x = emb[tok]
    for i, p in enumerate(layers):
        q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
        cache = cache.at[i, 0, :, pos].set(k).at[i, 1, :, pos].set(v)
        att = jnp.where(jnp.arange(T)[None] <= pos, jnp.einsum("bd,btd->bt", q, cache[i, 0]) / np.sqrt(D), -1e9)
        x = x + jnp.einsum("bt,btd->bd", jax.nn.softmax(att), cache[i, 1]) @ p["wo"]
        x = x + jax.nn.relu(x @ p["w1"]) @ p["w2"]
    return cache, jnp.argmax(x @ emb.T, -1).astype(jnp.int32)

out = []
start = time.perf_counter()
for i in range(TOKENS):
    cache, tok = step(layers, emb, cache, tok, i)
    out.append(tok)
tokens = np.stack([np.asarray(o) for o in out], 1)
print("decoded", tokens.shape, f"{(time.perf_counter() - start) / TOKENS * 1e3:.0f} ms/token")
"""


@pytest.mark.serial  # timing: how long the server's answers stop while the kernel holds the GIL
def test_the_server_answers_while_the_kernel_holds_the_gil(kernel):
    """The server answers on while the kernel holds the GIL for 8 s: its output goes to files.
    It stopped for the rest of the 8 s after ~64 KiB of log (blocked writing to a full pipe whose
    reader, a thread of the kernel, waited for the GIL), and for good when the kernel held the
    GIL waiting for the server: the decode loop below hung so, 3 runs in 3."""
    kernel.run(f"SECOND_CLIENT = {SECOND_CLIENT!r}")
    with cpu_hogs(2):
        reply = kernel.run(HOLD_THE_GIL, timeout=240)
    assert reply.status == "ok", reply.error
    ops, wait = re.search(r"ops (\d+) longest wait ([\d.]+) s", reply.text).groups()
    assert int(ops) > 0 and float(wait) < 3.0, reply.text


def test_a_decode_loop_read_at_the_end_completes_under_load(kernel):
    """The loop's tokens come back (it hung, 3 runs in 3, while the server logged each failed
    destruct of a donated cache: ~1,500 tracebacks, into the full pipe of the test above)."""
    with cpu_hogs(2):
        reply = kernel.run(DECODE.replace("TOKENS", "120"), timeout=150)
    assert reply.status == "ok", reply.error
    assert "decoded (8, 120)" in reply.text, reply.text


LOSE_A_SLICE = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
spread = NamedSharding(pw.mesh(), P("data", "model"))
w = jax.device_put(np.ones((8, 8)), spread)
kept = jax.device_put(np.ones((8, 8)), spread)
pw.snapshot_variables(["kept"])[0].wait()
"""


def test_reading_a_lost_array_is_one_line_naming_its_snapshot(kernel):
    """The server's DATA_LOSS is one line that names the lost variables read and whether a
    snapshot brings each back (it was a 30-line JAX traceback through array.py and profiler.py)."""
    assert kernel.run(LOSE_A_SLICE).status == "ok"
    try:
        # Read in the cell of the loss, before healing: `kept` has a snapshot, `w` none.
        both = kernel.run("pw.fail_slice(1)\nnp.asarray(kept) + np.asarray(w)")
        none = kernel.run("float(w[0, 0])")  # `kept` was healed when that cell ended
    finally:
        assert kernel.run("pw.repair_slice(1)").status == "ok"
    for reply in (none, both):
        assert reply.status == "error"
        assert len(reply.error.strip().splitlines()) == 1, reply.error
        assert reply.error.strip().startswith("JaxRuntimeError: DATA_LOSS: slice 1"), reply.error
    assert "`w` has none: recompute or reload" in none.error and "kept" not in none.error, none.error
    assert "`kept` has a snapshot (%pathways snapshots): restored onto the live slices" in both.error, both.error
    assert "`w` has none" in both.error, both.error


def test_an_eager_host_callback_is_the_same_line_as_one_inside_jit(kernel):
    """``jax.debug.print`` outside jit says what inside jit says (it was JAX's raw
    'jax.debug.callback failed to find a local CPU device')."""
    eager = kernel.run("import jax\njax.debug.print('x {}', 1)")
    jitted = kernel.run("jax.jit(lambda x: jax.debug.print('x {}', x))(1.0)")
    for reply in (eager, jitted):
        assert reply.status == "error"
        lines = reply.error.strip().splitlines()
        assert len(lines) == 1 and "host callbacks (jax.debug.print" in lines[0], reply.error
        assert "do not run on local:2x4" in lines[0] and "embedded:2x4" in lines[0], reply.error
    assert eager.error.split(":", 1)[1] == jitted.error.split(":", 1)[1], (eager.error, jitted.error)
