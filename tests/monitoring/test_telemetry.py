"""The telemetry hub on real JAX CPU devices (local:2x4), in process."""

from __future__ import annotations

import contextvars
import gc
import threading
import time

import monitor_frontend
import numpy as np
import pytest

import pathways_kernel as pw
from pathways_kernel.core.sessions import session as current_session
from pathways_kernel.monitoring import telemetry
from pathways_kernel.monitoring.comm import MonitorServer
from pathways_kernel.monitoring.connection import Connection


@pytest.fixture(scope="module")
def session():
    s = current_session()
    if s.backend.spec != "embedded:2x4" or s.topology.down_slices:
        # Another module left this process's session elsewhere: start clean.
        s = pw.connect("embedded:2x4", force=True)
    return s


class Collector:
    def __init__(self):
        self.metrics: list[telemetry.Metrics] = []
        self.events = []
        self.topologies = []
        self.closed = threading.Event()
        self.cond = threading.Condition()

    def on_metrics(self, m):
        with self.cond:
            self.metrics.append(m)
            self.cond.notify_all()

    def on_event(self, e):
        with self.cond:
            self.events.append(e)
            self.cond.notify_all()

    def on_topology(self, t, seq):
        with self.cond:
            self.topologies.append((t, seq))
            self.cond.notify_all()

    def wait(self, predicate, timeout=10.0):
        with self.cond:
            assert self.cond.wait_for(predicate, timeout), "timed out waiting for the hub"

    def subscribe(self, hub, rate=None):
        return hub.subscribe(self.on_metrics, self.on_event, self.on_topology, self.closed.set, rate=rate)


def _slice_mesh(session, index):
    import jax

    devices = session.topology.slice(index).devices
    return jax.sharding.Mesh(np.array(devices), ("model",))


def test_memory_is_counted_per_chip_and_per_slice(session):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    hub = telemetry.hub(session)
    c = Collector()
    sub = c.subscribe(hub, rate=10)
    try:
        c.wait(lambda: c.metrics)
        base = c.metrics[-1]
        # 4 MiB over slice 0's 4 chips: 1 MiB each; slice 1 holds none of it.
        x = jax.device_put(jnp.ones((1024, 1024), jnp.float32), NamedSharding(_slice_mesh(session, 0), P("model")))
        x.block_until_ready()
        n = len(c.metrics)
        c.wait(lambda: len(c.metrics) > n + 1)
        m = c.metrics[-1]
        grew = m.memory - base.memory
        assert list(grew[:4]) == [2**20] * 4 and list(grew[4:]) == [0] * 4
        assert m.slices[0].memory_bytes - base.slices[0].memory_bytes == 4 * 2**20
        assert m.slices[0].memory_limit_bytes is None  # CPU devices report no memory_stats
        del x
    finally:
        sub.close()


def test_utilization_follows_work_in_flight(session):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    hub = telemetry.hub(session)
    hub.configure(sample_hz=20, window_s=0.5)
    c = Collector()
    sub = c.subscribe(hub, rate=20)
    try:
        x = jax.device_put(jnp.ones((1024, 1024), jnp.float32), NamedSharding(_slice_mesh(session, 0), P("model")))
        f = jax.jit(lambda a: jnp.tanh(a @ a.T) / 1024)
        f(x).block_until_ready()
        busy_seen = []
        for _ in range(3):  # a long chain in flight on slice 0 only
            y = x
            for _ in range(40):
                y = f(y)
            n = len(c.metrics)
            c.wait(lambda n=n, y=y: len(c.metrics) > n + 3 or y.is_ready(), timeout=30)
            busy_seen.append(max(m.slices[0].utilization for m in c.metrics[n:]) if len(c.metrics) > n else 0.0)
            y.block_until_ready()
            if max(busy_seen) > 0.5:
                break
        assert max(busy_seen) > 0.5, f"slice 0 never looked busy: {busy_seen}"
        assert all(m.slices[1].utilization == 0 for m in c.metrics), "slice 1 had no work"
        # Once idle, the window drains back to 0.
        n = len(c.metrics)
        c.wait(lambda: len(c.metrics) > n + 15)
        assert c.metrics[-1].slices[0].utilization == 0
    finally:
        sub.close()
        hub.configure(sample_hz=telemetry.DEFAULT_SAMPLE_HZ, window_s=telemetry.DEFAULT_WINDOW_S)


def test_slice_down_changes_topology_zeroes_its_chips_and_reaches_subscribers(session):
    hub = telemetry.hub(session)
    c = Collector()
    sub = c.subscribe(hub, rate=10)
    seq = hub.topology_seq
    try:
        session.set_slice_state(1, "down", detail="test")
        c.wait(lambda: c.topologies and any(e.kind == "slice_down" for e in c.events))
        topology, new_seq = c.topologies[-1]
        assert new_seq == seq + 1 and not topology.slice(1).up
        c.wait(lambda: c.metrics and c.metrics[-1].topology_seq == new_seq)
        m = c.metrics[-1]
        assert m.slices[1].state == "down" and m.slices[1].utilization == 0 and m.slices[1].memory_bytes == 0
        assert not m.memory[4:].any()
    finally:
        session.set_slice_state(1, "up", detail="test")
        sub.close()


def test_rates_pause_and_idle(session):
    hub = telemetry.hub(session)
    paused = Collector()
    sub = paused.subscribe(hub, rate=0)
    try:
        session.events.emit("compile", detail="from test_rates_pause_and_idle")
        paused.wait(lambda: paused.events)
        time.sleep(0.6)
        assert paused.metrics == [], "rate 0 still received metrics"
        assert sub.set_rate(100) == hub.sample_hz  # capped at the sampling rate
        paused.wait(lambda: paused.metrics)
    finally:
        sub.close()
    # Nobody subscribed: the hub drops from its 4 Hz to one sample a second, for the history only
    # (a fixed 0.8 s window expecting none caught that once-a-second sample on a loaded CI machine).
    assert hub.sample_hz >= 4
    time.sleep(1.2)
    seq = hub.latest().seq
    time.sleep(3.0)
    assert hub.latest().seq - seq <= 4, "still sampling at the subscribers' rate with nobody subscribed"
    with pytest.raises(pw.PathwaysError, match="sample rate"):
        hub.configure(sample_hz=0)


class RecordingComm:
    """An in-process stand-in for a kernel comm: decodes what a frontend would get."""

    def __init__(self):
        self.sent: list[tuple[dict, list]] = []
        self.cond = threading.Condition()
        self._closed = False

    def on_msg(self, callback):
        self.callback = callback

    def on_close(self, callback):
        pass

    def send(self, data=None, metadata=None, buffers=None):
        with self.cond:
            self.sent.append((data, list(buffers or [])))
            self.cond.notify_all()

    def close(self, data=None, metadata=None, buffers=None):
        self._closed = True
        self.send(data)

    def wait(self, predicate, timeout=15.0):
        with self.cond:
            assert self.cond.wait_for(lambda: any(predicate(d, b) for d, b in self.sent), timeout)
            return next((d, b) for d, b in self.sent if predicate(d, b))


def test_connection_streams_the_protocol_and_closes_when_stale(session):
    comm = RecordingComm()
    server = MonitorServer(stale_after_s=2.0)
    conn = Connection(comm, server)
    conn.start(contextvars.copy_context())
    data, buffers = comm.wait(lambda d, b: d.get("type") == "topology")
    topology = monitor_frontend.decode_topology(data, buffers)
    data, buffers = comm.wait(lambda d, b: d.get("type") == "metrics")
    metrics = monitor_frontend.decode_metrics(data, buffers)
    assert metrics.chips == topology.chips == 8 and metrics.topology_seq == topology.topology_seq
    # Never heard from (no ping): closed as stale, with the reason.
    data, _ = comm.wait(lambda d, b: d.get("type") == "closed")
    assert data == {"v": 1, "type": "closed", "reason": "stale"} and comm._closed and conn.closed
    assert server.connections == []


def test_memory_stats_are_used_where_the_backend_reports_them(session):
    # Stand-in devices: CPU devices report no memory_stats(), TPUs (not here) do.
    import types

    from pathways_kernel.core.backend import Placement
    from pathways_kernel.core.slices import Topology

    def device(i):
        stats = {"bytes_in_use": (i + 1) * 2**20, "bytes_limit": 16 * 2**30}
        return types.SimpleNamespace(id=1000 + i, platform="tpu", memory_stats=lambda: stats)

    devices = [device(i) for i in range(4)]
    placements = [Placement(i // 2, (i % 2, 0, 0), 0, "TPU v5p") for i in range(4)]
    layout = telemetry.Layout.of(Topology.from_placements(devices, placements, "tpu"))
    sample = telemetry.ClientSource().sample(layout)
    assert list(sample.memory) == [2**20, 2 * 2**20, 3 * 2**20, 4 * 2**20]
    m = telemetry.aggregate(layout, 1, 1, "client", 2.0, sample.busy, sample.memory, sample.memory_limit)
    assert [s.memory_bytes for s in m.slices] == [3 * 2**20, 7 * 2**20]
    assert [s.memory_limit_bytes for s in m.slices] == [32 * 2**30, 32 * 2**30]


def test_memory_never_counts_arrays_lost_with_a_slice(session):
    """Slice 1 is lost while a thread is inside a long call (a busy cell): neither while the
    slice is down nor after its repair do its lost arrays' bytes count, on any slice or in
    the total."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from pathways_kernel.emulator import faults

    hub = telemetry.hub(session)
    c = Collector()
    sub = c.subscribe(hub, rate=10)
    busy = None
    try:
        # The figure counts every live array of the process: arrays an earlier test in the same
        # worker left for the collector are collected first, and the base is a figure seen twice.
        gc.collect()
        c.wait(lambda: c.metrics)
        n = len(c.metrics)
        c.wait(lambda: len(c.metrics) > n + 1 and c.metrics[-1].memory_bytes == c.metrics[-2].memory_bytes)
        base = c.metrics[-1].memory_bytes
        # From host data: a device_put from a device array leaves per-shard views live, which
        # the client-side figures count as well (their buffers are the array's).
        on0 = NamedSharding(_slice_mesh(session, 0), P("model"))
        kept = jax.device_put(np.ones((1024, 1024), np.float32), on0)
        single = jax.device_put(np.ones(2 * 2**20, np.float32), session.topology.slice(1).devices[0])
        both = jax.device_put(np.ones((1024, 1024), np.float32), NamedSharding(session.mesh(), P("data")))

        @jax.jit
        def slow(x):
            return jax.lax.fori_loop(0, 200, lambda i, v: jnp.tanh(v @ v.T) * 0.5, x)

        slow(kept).block_until_ready()  # compiled before the loss
        pending = slow(kept)
        inside = threading.Event()
        busy = threading.Thread(target=lambda: (inside.set(), pending.block_until_ready()), daemon=True)
        busy.start()
        inside.wait()
        expected = base + _device_bytes(kept) + _device_bytes(pending)  # slice 0's; nothing of slice 1's
        faults.fail_slice(1)
        c.wait(lambda: c.metrics[-1].slices[1].state == "down", timeout=60)
        down_from = len(c.metrics)
        c.wait(lambda: len(c.metrics) > down_from + 4, timeout=60)
        faults.repair_slice(1)
        c.wait(lambda: c.metrics[-1].slices[1].state == "up", timeout=60)
        up_from = len(c.metrics)
        c.wait(lambda: len(c.metrics) > up_from + 8, timeout=60)
        seen = [(m.slices[1].state, (m.memory_bytes - base) / 2**20) for m in c.metrics[down_from:]]
        assert all(m.memory_bytes == expected for m in c.metrics[down_from:]), seen
        assert pw.is_lost(single) and pw.is_lost(both)
    finally:
        sub.close()
        if session.topology.down_slices:
            faults.repair_slice(1)
        if busy is not None:
            busy.join(60)


def _device_bytes(array) -> int:
    """Bytes ``array`` holds on all its devices together (replicas count on each)."""
    shard = array.sharding.shard_shape(array.shape)
    return int(np.prod(shard)) * array.dtype.itemsize * len(array.sharding.device_set)


def test_an_array_with_a_shard_on_a_down_slice_counts_nowhere_from_the_moment_it_is_down(session):
    """Between the slice_down event and the swap of its buffers (which a read in flight
    delays) an array spanning the lost slice already holds nothing usable on the others."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    hub = telemetry.hub(session)
    c = Collector()
    sub = c.subscribe(hub, rate=10)
    try:
        c.wait(lambda: c.metrics)
        n = len(c.metrics)
        c.wait(lambda: len(c.metrics) > n + 1)
        base = c.metrics[-1].memory_bytes
        both = jax.device_put(np.ones((1024, 1024), np.float32), NamedSharding(session.mesh(), P("data")))
        held = base + _device_bytes(both)
        c.wait(lambda: c.metrics[-1].memory_bytes == held, timeout=60)
        session.set_slice_state(1, "down", detail="test: no buffer swapped yet")
        c.wait(lambda: c.metrics[-1].slices[1].state == "down", timeout=60)
        down_from = len(c.metrics)
        c.wait(lambda: len(c.metrics) > down_from + 3, timeout=60)
        assert [m.memory_bytes - base for m in c.metrics[down_from:]] == [0] * (len(c.metrics) - down_from)
    finally:
        session.set_slice_state(1, "up", detail="test")
        sub.close()
