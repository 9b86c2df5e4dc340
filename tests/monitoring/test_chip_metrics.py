"""What the monitor shows of chips on ``local:``, read through libtpu's runtime metric protocol.

A real kernel on ``local:2x4`` whose server also serves its runtime metrics on a loopback
port (``PATHWAYS_LOCAL_METRICS_PORT=0``), so this test reads them with ``tpu-info``'s own
client while the kernel's monitor reads them on the server's socket: both must show the
same chips the same way, and chips that run nothing must read 0 %.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from kernels import SERVER, Kernel
from tpu_info import metrics as tpu_metrics

from pathways_kernel.core.backend import ChipMetrics, ChipReadings
from pathways_kernel.core.errors import BackendError

# A subscription to the hub, as the panel's comm makes one: (time, per-chip utilization, memory,
# source, seconds the sample took: the service was read within them before ``time``).
WATCH = """
from pathways_kernel.monitoring import telemetry
seen, hub = [], telemetry.hub()
sub = hub.subscribe(on_metrics=lambda m: seen.append(
    (m.time, m.utilization.tolist(), m.memory.tolist(), m.source, hub.last_sample_s)), rate=4)
"""


@pytest.fixture(scope="module")
def kernel():
    k = Kernel("pathways", backend=SERVER, env={"PATHWAYS_LOCAL_METRICS_PORT": "0"})
    reply = k.run(
        "import json, time, jax, jax.numpy as jnp, numpy as np\n"
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
        "print(pw.session().backend.server.metrics_address)",
        timeout=240,
    )
    assert reply.status == "ok", reply.error
    k.metrics_address = reply.text.strip().splitlines()[0]
    yield k
    k.shutdown()


def printed(reply) -> object:
    """The JSON line a cell printed last (other lines are the kernel's notices)."""
    return json.loads([line for line in reply.text.splitlines() if line.startswith(("{", "["))][-1])


def tpu_info_reads(kernel) -> list[tpu_metrics.Usage]:
    return tpu_metrics.get_chip_usage_new(None, kernel.metrics_address)


def test_idle_chips_read_zero_when_the_monitor_opens_after_a_run(kernel):
    # What a notebook leaves behind (a few training steps, arrays never read, a slice lost and
    # repaired under an array), then the monitor opens once the work is over. The client-side
    # measure took arrays whose readiness it had not asked yet for work in flight: 25 % on every
    # chip for a second, then 12 %, with nothing running.
    reply = kernel.run(
        "f = jax.jit(lambda a: jnp.tanh(a @ a))\n"
        "kept = [f(jnp.ones((256, 256)) * i) for i in range(5)]\n"
        "mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ('data', 'model'))\n"
        "params = jax.device_put(np.ones((64, 64), np.float32), NamedSharding(mesh, P(None, 'model')))\n"
        "for _ in range(5):\n"
        "    params = f(params); float(params.sum())\n"
        "unread = jnp.ones((1024, 1024))\n"
        "on1 = jax.device_put(np.ones((512, 512), np.float32), pw.topology().slices[1].devices[0])\n"
        "pw.fail_slice(1); pw.repair_slice(1)\n"
        "time.sleep(1.5)\n" + WATCH + "time.sleep(2.5)\n"
        "print(json.dumps([{'util': m[1], 'source': m[3]} for m in seen]))",
        timeout=180,
    )
    assert reply.status == "ok", reply.error
    shown = printed(reply)
    assert len(shown) >= 4 and {m["source"] for m in shown} == {"runtime metrics (pathways-local), 1 s"}, shown
    assert all(m["util"] == [0.0] * 8 for m in shown), shown
    assert all(u.duty_cycle_pct == 0.0 for u in tpu_info_reads(kernel))


@pytest.mark.serial  # timing: pairs of reads at most one 0.25 s sample apart
def test_monitor_figures_equal_tpu_info_s_within_one_sample_window(kernel):
    reads: list[tuple[float, list[float], list[int]]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            before = time.time()
            usage = tpu_info_reads(kernel)
            reads.append(
                (before, time.time(), [u.duty_cycle_pct / 100 for u in usage], [u.memory_usage for u in usage])
            )
            time.sleep(0.1)

    assert kernel.run(WATCH + "mark = len(seen)").status == "ok"
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        # Slice 0 computes for ~4 s, then everything idles for 2 s.
        reply = kernel.run(
            "mesh = Mesh(np.array(jax.devices()[:4]), ('x',))\n"
            "x = jax.device_put(np.ones((4, 256, 256), np.float32), NamedSharding(mesh, P('x')))\n"
            "step = jax.jit(lambda a: jnp.tanh(a @ a) * 0.5)\n"
            "x = step(x).block_until_ready()\n"
            "end = time.time() + 4\n"
            "while time.time() < end:\n"
            "    x = step(step(step(x))); x.block_until_ready()\n"
            "time.sleep(2)\n"
            "print(json.dumps(seen[mark:]))",
            timeout=180,
        )
    finally:
        stop.set()
        poller.join(10)
    assert reply.status == "ok", reply.error
    shown = printed(reply)
    period = 0.25  # the hub's 4 Hz samples: one sample window

    def apart(read, m) -> float:
        """The most seconds there can be between tpu-info's read and the monitor's (each took a while)."""
        return max(read[1], m[0]) - min(read[0], m[0] - m[4])

    compared = busy = 0
    for read in reads:
        _, _, duty, memory = read
        near = [m for m in shown if apart(read, m) <= period]
        if not near:  # a loaded machine answered one of them late
            continue
        compared += 1
        busy += duty[0] > 0.05
        # The same service read at most a sample apart: a 1 s duty cycle moves by at most that much,
        # and bytes that stayed put meanwhile (arrays were made and freed around it) are the same bytes.
        # No array made or freed for a second either side (tpu-info was reading all along).
        covered = reads[0][0] <= read[0] - 1.0 and read[1] + 1.0 <= reads[-1][1]
        steady = covered and all(r[3] == memory for r in reads if abs(r[0] - read[0]) <= 1.0)
        assert any(
            all(abs(a - b) <= apart(read, m) + 0.02 for a, b in zip(m[1], duty, strict=True))
            and (m[2] == memory or not steady)
            for m in near
        ), (read, near)
    assert compared >= 8 and busy >= 4, (compared, busy)
    assert shown[-1][1] == [0.0] * 8, shown[-1]


class FlakyService(ChipMetrics):
    """A chip service that answers until told not to (a loaded machine's late answers)."""

    name = "runtime metrics, 1 s"

    def __init__(self):
        self.answers = True

    def read(self) -> ChipReadings:
        if not self.answers:
            raise BackendError("the runtime metric service did not answer: Deadline Exceeded")
        return ChipReadings(
            {d: 0.5 for d in range(8)}, {d: 1 << 20 for d in range(8)}, {d: 16 << 30 for d in range(8)}, 1.0
        )


def test_a_late_answer_keeps_the_service_s_figures_for_a_while_then_says_it_is_the_client_s():
    import pathways_kernel as pw
    from pathways_kernel.core.sessions import session as current_session
    from pathways_kernel.monitoring import sources

    session = current_session()
    if session.backend.spec != "embedded:2x4" or session.topology.down_slices:
        session = pw.connect("embedded:2x4", force=True)
    layout = sources.Layout.of(session.topology)
    service = FlakyService()
    now = [0.0]
    source = sources.ChipSource(session.backend, service, clock=lambda: now[0])
    assert source.sample(layout).busy.tolist() == [0.5] * 8
    service.answers = False
    late = source.sample(layout)  # within 3 windows: the service's last figures, not the client's
    assert late.busy.tolist() == [0.5] * 8 and late.window_s == 1.0 and source.name == "runtime metrics, 1 s"
    now[0] = 3.5  # past 3 windows of 1 s
    gone = source.sample(layout)
    assert gone.window_s is None and source.name == "client (runtime metrics, 1 s unavailable)"


def test_where_asking_an_array_waits_on_the_server_a_silent_service_asks_no_array(monkeypatch):
    """On ``local:`` (JAX's proxy client) ``is_deleted`` of an array passed to a step is a request
    the client waits for holding the GIL: measuring from the client while the server does not
    answer froze the kernel (tests/server/test_server_stopped.py). The last memory figures stay."""
    import jax

    import pathways_kernel as pw
    from pathways_kernel.core.sessions import session as current_session
    from pathways_kernel.monitoring import sources

    class ProxiedBackend:
        array_queries_wait_on_server = True

        def is_leftover(self, array: object) -> bool:
            return False

    def asked(*args: object) -> None:
        raise AssertionError("the monitor asked JAX's client about its arrays")

    session = current_session()
    if session.backend.spec != "embedded:2x4" or session.topology.down_slices:
        session = pw.connect("embedded:2x4", force=True)
    layout = sources.Layout.of(session.topology)
    service = FlakyService()
    now = [0.0]
    source = sources.ChipSource(ProxiedBackend(), service, clock=lambda: now[0])  # type: ignore[arg-type]
    source.sample(layout)
    service.answers = False
    now[0] = 3.5
    monkeypatch.setattr(jax, "live_arrays", asked)
    gone = source.sample(layout)
    assert gone.busy.tolist() == [0.0] * 8 and gone.memory is not None and gone.memory.tolist() == [1 << 20] * 8
    assert source.name == "runtime metrics, 1 s unavailable: last memory figures, no duty cycle"
