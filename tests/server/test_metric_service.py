"""The local server's runtime metric service, read by ``tpu-info``'s own client functions.

The server (``pathways-local serve --metrics-port 0``) serves libtpu's
``RuntimeMetricService``; ``tpu_info.metrics.get_chip_usage_new`` reads it exactly as it reads
libtpu on a TPU host. A JAX proxy client (this file run as a script) keeps arrays on the
devices and keeps slice 0 busy; the test reads what ``tpu-info`` would show meanwhile.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest
from tpu_info import metrics as tpu_metrics

from pathways_kernel.backends import server_client
from pathways_kernel.core import server_protocol
from pathways_kernel.server import metric_service

HERE = os.path.abspath(__file__)
HELD = 64 << 20  # bytes the client keeps on device 0 (a 4096x4096 float32)


@pytest.fixture(scope="module")
def server():
    started = server_client.start(2, 4, metrics_port=0)
    yield started
    started.stop()


def usage(server) -> list[tpu_metrics.Usage]:
    # chip_type is only read for older chips' core counts; the new reader ignores it.
    return tpu_metrics.get_chip_usage_new(None, server.metrics_address)


def test_idle_chips_read_zero_with_their_kinds_hbm(server):
    read = usage(server)
    assert [u.device_id for u in read] == list(range(8))
    assert all(u.duty_cycle_pct == 0.0 for u in read)
    assert all(u.memory_usage == 0 for u in read)
    assert all(u.total_memory == metric_service.DEFAULT_HBM_BYTES for u in read)


@pytest.mark.serial  # timing: a duty cycle read a window after work started, and a window after it ended
def test_busy_devices_read_their_duty_cycle_and_arrays(server, tmp_path):
    ready = tmp_path / "ready"
    client = subprocess.Popen(
        [sys.executable, HERE, "busy", str(ready)],
        env=server_client.client_env(server.target),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():  # the client compiled and started its loop
            assert client.poll() is None and time.monotonic() < deadline, client.communicate()[1][-2000:]
            time.sleep(0.2)
        time.sleep(server_protocol.METRIC_WINDOW_S)  # a full window of work
        busy = usage(server)
    finally:
        client.terminate()
        client.wait(30)
    slice0, slice1 = busy[:4], busy[4:]
    assert all(u.duty_cycle_pct > 0 for u in slice0), busy
    assert all(u.duty_cycle_pct == 0 for u in slice1), busy
    assert slice0[0].memory_usage >= HELD, busy
    assert all(u.memory_usage == 0 for u in slice1), busy
    # The client is gone: its arrays with it, and a window later no device is busy.
    time.sleep(server_protocol.METRIC_WINDOW_S + 0.5)
    after = usage(server)
    assert all(u.duty_cycle_pct == 0 and u.memory_usage == 0 for u in after), after


def test_the_server_names_what_it_serves_for_another_metric(server):
    from tpu_info.proto import tpu_metric_service_pb2 as pb

    with grpc.insecure_channel(server.metrics_address) as channel:
        get = channel.unary_unary(
            f"/{server_protocol.METRIC_SERVICE}/GetRuntimeMetric",
            request_serializer=pb.MetricRequest.SerializeToString,
            response_deserializer=pb.MetricResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as raised:
            get(pb.MetricRequest(metric_name="tpu.runtime.hbm.utilization.percent"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert server_protocol.DUTY_CYCLE in raised.value.details()


def test_a_second_server_on_a_taken_metrics_port_serves_without_it(server):
    port = int(server.metrics_address.rsplit(":", 1)[1])
    second = server_client.start(1, 2, metrics_port=port)
    try:
        assert second.metrics_address is None and second.alive()
        assert "cannot serve runtime metrics on 127.0.0.1" in "\n".join(second.stderr_lines)
    finally:
        second.stop()


def test_each_kind_of_chip_has_its_own_hbm():
    mixed = server_client.start("v5p:2x2x1,v6e:2x2", metrics_port=0)
    try:
        totals = [u.total_memory for u in usage(mixed)]
    finally:
        mixed.stop()
    assert totals == [95 << 30] * 4 + [32 << 30] * 4


def busy_client(ready: str) -> None:
    """Keeps 64 MiB on device 0 and slice 0 (devices 0-3) computing until killed."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    held = jax.device_put(np.ones((4096, 4096), np.float32), jax.devices()[0])
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    x = jax.device_put(np.ones((4, 256, 256), np.float32), NamedSharding(mesh, P("x")))
    step = jax.jit(lambda a: jnp.tanh(a @ a) * 0.5)
    x = step(x).block_until_ready()
    open(ready, "w").close()
    while True:
        for _ in range(20):
            x = step(x)
        x.block_until_ready()
        assert held.shape  # kept alive


if __name__ == "__main__":
    import pathwaysutils

    pathwaysutils.initialize()
    busy_client(sys.argv[2])
