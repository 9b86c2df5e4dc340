"""The local Pathways server: who may reach it, and how it fails (each failure one line).

Real processes only: ``pathways-local`` servers, JAX's own proxy client (this file
run as a script), a raw gRPC client speaking the proxy protocol for requests JAX's
public API cannot make, and a process of another user (``nobody``) for access.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import grpc
import pytest
from waiting import wait_until

from pathways_kernel.backends import server_client
from pathways_kernel.core.errors import BackendError
from pathways_kernel.server import protos

HERE = os.path.abspath(__file__)
CLI = [sys.executable, "-m", "pathways_kernel.server"]


def client_faults(target: str, marker: str) -> dict:
    """A program the compiler rejects, then steps until the server is killed under it."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    result: dict = {}
    x = jnp.ones(4)
    try:
        jax.ffi.ffi_call("pathways_local_no_such_kernel", jax.ShapeDtypeStruct((4,), jnp.float32))(
            x
        ).block_until_ready()
        result["rejected"] = None
    except Exception as error:  # what the user sees, whatever its type
        result["rejected"] = str(error)
    result["still_works"] = float(jnp.sum(x + 1))
    # Colocated Python that imports what only the client has (a sidecar image that lacks it).
    from jax.experimental import colocated_python

    sys.path.insert(0, os.path.dirname(marker))
    with open(os.path.join(os.path.dirname(marker), "client_only_module.py"), "w") as f:
        f.write("def triple(x):\n    return x * 3\n")
    import client_only_module

    @colocated_python.colocated_python
    def uses_client_module(v):
        return client_only_module.triple(v)

    try:
        result["unpicklable"] = str(np.asarray(uses_client_module(x)))
    except Exception as error:
        result["unpicklable"] = str(error)
    result["still_works_after"] = float(jnp.sum(x + 2))
    step = jax.jit(lambda a: jnp.tanh(a @ a.T) @ a)
    a = jnp.asarray(np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32))
    open(marker, "w").close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            a = step(a)
            float(a[0, 0])
        except Exception as error:
            result["after_kill"] = str(error)
            break
    return result


# ---- access --------------------------------------------------------------------------


def test_the_server_listens_on_a_socket_only_its_user_can_reach():
    server = server_client.start(1, 2)
    try:
        assert server.target.startswith("grpc://unix:")
        path = server.target.removeprefix("grpc://unix:")
        directory = os.path.dirname(path)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is not installed: cannot connect as another user")
        connect = f"import socket; socket.socket(socket.AF_UNIX).connect({path!r}); print('connected')"
        as_nobody = [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            connect,
        ]
        refused = subprocess.run(as_nobody, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "PermissionError" in refused.stderr
        mine = subprocess.run(["/usr/bin/python3", "-c", connect], capture_output=True, text=True, timeout=60)
        assert mine.stdout.strip() == "connected"
    finally:
        server.stop()
    assert not os.path.exists(directory)


def test_serve_binds_loopback_by_default_and_says_when_a_port_is_taken():
    server = server_client.start(1, 2, host="127.0.0.1")
    try:
        assert server.target.startswith("grpc://127.0.0.1:")
        port = server.target.rsplit(":", 1)[1]
        taken = subprocess.run(
            [*CLI, "serve", "--slices", "1x2", "--port", port], capture_output=True, text=True, timeout=120
        )
        assert taken.returncode == 1
        assert taken.stderr.strip() == (
            f"pathways-local: cannot listen on 127.0.0.1:{port}: Address already in use; "
            "pick another with --port, or --port 0 for a free one"
        )
    finally:
        server.stop()


def test_serving_another_address_says_what_it_exposes():
    # 192.0.2.1 (TEST-NET-1) is on no interface here: the server cannot bind, and says only that.
    out = subprocess.run(
        [*CLI, "serve", "--slices", "1x2", "--host", "192.0.2.1"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1
    assert out.stderr.startswith("pathways-local: cannot listen on 192.0.2.1:0: Cannot assign requested address;")
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    # An address this machine has, but not loopback: it serves, after saying what that exposes.
    host = _an_address_not_loopback()
    if host is None:
        pytest.skip("this machine has no address besides loopback")
    serving = subprocess.Popen(
        [*CLI, "serve", "--slices", "1x2", "--host", host], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert serving.stderr is not None
        warning = serving.stderr.readline()  # printed before serving; bounded by the test's timeout
        assert warning.startswith(
            f"pathways-local: WARNING: --host {host} serves without authentication or encryption:"
        )
        assert "can run programs as" in warning
    finally:
        serving.kill()
        serving.wait(timeout=30)


def _an_address_not_loopback() -> str | None:
    """An address of this machine's own interfaces that is not loopback (what a route out uses)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # UDP: no packet is sent, only a route chosen
        except OSError:
            return None
        host = probe.getsockname()[0]
    return None if host.startswith("127.") or host == "0.0.0.0" else host


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["serve", "--port", "70000"], "argument --port: '70000' is not a port from 0 to 65535"),
        (["serve", "--port", "-1"], "argument --port: '-1' is not a port from 0 to 65535"),
        (
            ["serve", "--port", "\u0664\u0664\u0666\u0664"],
            "argument --port: '\\u0664\\u0664\\u0666\\u0664' is not a port",
        ),
        (
            ["serve", "--slices", "\uff12x\uff14"],
            "argument --slices: '\\uff12x\\uff14' is not SLICESxCHIPS (digits 0-9)",
        ),
        (
            ["serve", "--slices", "\u0662x\u0664"],
            "argument --slices: '\\u0662x\\u0664' is not SLICESxCHIPS (digits 0-9)",
        ),
        (["serve", "--slices", "100000x100000"], "'100000x100000' is 10000000000 devices, more than the 4096 devices"),
        (["serve", "--slices", "9" * 5000 + "x1"], "is more than the 4096 devices a local server emulates"),
        (["serve", "--slices", "0x4"], "slices and chips must be at least 1"),
        (["serve", "--slices", "2x4x1"], "'2x4x1' is not SLICESxCHIPS"),
        (["serve", "--host", "not a host"], "cannot listen on not a host:0: Name or service not known"),
        (["fail", "\uff11", "--server", "grpc://127.0.0.1:1"], "argument slice: expected a whole number (digits 0-9)"),
        (
            ["repair", "\u0661", "--server", "grpc://127.0.0.1:1"],
            "argument slice: expected a whole number (digits 0-9)",
        ),
        (["fail", "-1", "--server", "grpc://127.0.0.1:1"], "argument slice: must be at least 0, got -1"),
        (["fail", "9" * 5000, "--server", "grpc://127.0.0.1:1"], "argument slice: must be at most 4095"),
    ],
)
def test_bad_arguments_are_one_line_and_nothing_is_served(arguments, message):
    out = subprocess.run([*CLI, *arguments], capture_output=True, text=True, timeout=120)
    assert out.returncode in (1, 2) and out.stdout == "", out.stdout
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert message in out.stderr and "WARNING" not in out.stderr
    assert len(out.stderr) < 300


def test_a_server_that_cannot_start_is_one_line_with_its_own_reason():
    with pytest.raises(BackendError) as failed:
        server_client.start(1, 2, host="192.0.2.1")
    assert str(failed.value).startswith(
        "the local Pathways server did not start: pathways-local: cannot listen on 192.0.2.1:0: "
        "Cannot assign requested address;"
    ), str(failed.value)


def test_a_socket_path_no_client_could_reach_or_that_is_a_file_is_refused_and_the_file_kept(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    notes = private / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(BackendError) as failed:
        server_client.start(1, 2, socket_path=str(notes))
    assert str(failed.value).endswith(f"{notes} exists and is not a socket; choose another path"), str(failed.value)
    assert notes.read_text() == "mine"
    with pytest.raises(BackendError) as failed:
        server_client.start(1, 2, socket_path=str(private / "Server.sock"))
    assert "has capitals, and JAX's proxy client lower-cases JAX_BACKEND_TARGET" in str(failed.value)
    assert "\n" not in str(failed.value)


# ---- bad requests, on the wire -----------------------------------------------------------


def test_bad_requests_are_answered_in_one_line_naming_what_is_wrong():
    server = server_client.start(1, 2)
    try:
        channel = grpc.insecure_channel(server.target.removeprefix("grpc://"))
        service = "/xla.ifrt.proxy.GrpcIfrtService/"
        version_request = protos.proxy("GrpcGetVersionRequest")
        get_version = channel.unary_unary(
            service + "GetVersion",
            request_serializer=version_request.SerializeToString,
            response_deserializer=protos.proxy("GrpcGetVersionResponse").FromString,
        )
        old = version_request()
        old.min_version.protocol_version, old.max_version.protocol_version = 1, 5
        with pytest.raises(grpc.RpcError) as refused:
            get_version(old, timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "protocol 1..5, the local Pathways server 16..25" in refused.value.details()

        version = protos.proxy("IfrtProxyVersion")(protocol_version=25, ifrt_serdes_version_number=3)
        metadata = protos.proxy("GrpcIfrtSessionMetadata")(version=version).SerializeToString()
        session = channel.stream_stream(
            service + "IfrtSession",
            request_serializer=protos.proxy("IfrtRequest").SerializeToString,
            response_deserializer=protos.proxy("IfrtResponse").FromString,
        )
        requests = [protos.proxy("IfrtRequest")() for _ in range(3)]
        requests[0].init_request.SetInParent()
        make = requests[1].make_array_from_host_buffer_request
        make.dtype.kind = make.dtype.DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_name["KIND_F32"].number
        make.shape.dims.append(4)
        single = protos.ifrt("SingleDeviceShardingProto")(device_id=99)
        make.sharding.serialized_sharding.type_name = "xla::ifrt::SingleDeviceSharding"
        make.sharding.serialized_sharding.data = single.SerializeToString()
        make.host_buffer_handle, make.array_handle = 1, 2
        requests[2].bitcast_arrays_request.SetInParent()
        for op_id, request in enumerate(requests, 1):
            request.request_metadata.op_id = op_id
        responses = {
            r.response_metadata.op_id: r
            for r in session(
                iter(requests), metadata=[("ifrt-proxy-grpc-ifrt-session-metadata-bin", metadata)], timeout=60
            )
        }
        assert responses[1].init_response.all_devices[1].attributes.attributes["slice_index"].int64_value == 0
        assert (
            responses[2].response_metadata.status.message == "device 99 does not exist (this server has devices 0..1)"
        )
        assert (
            responses[3].response_metadata.status.message
            == "the local Pathways server does not serve bitcast_arrays_request"
        )
        assert responses[3].response_metadata.status.code == 12  # UNIMPLEMENTED
        channel.close()
    finally:
        server.stop()


def test_a_lost_array_is_answered_not_deleted_as_pathways_does():
    # On the session itself, in this process (one CPU device): JAX's client answers
    # is_deleted() here without asking the server; an error status to IsArrayDeleted made it
    # log an error line per ask.
    import jax
    import numpy as np

    from pathways_kernel.server import service
    from pathways_kernel.server.arrays import ServerArray, Sharding
    from pathways_kernel.server.devices import Topology

    server = service.Server(Topology(1, 1))
    session = server.open_session(None)
    session.arrays.put(7, ServerArray.from_jax(jax.device_put(np.arange(4.0), jax.devices()[0]), Sharding((0,), None)))
    assert server.fail_slice(0) == 1

    def ask(fill) -> object:
        request = protos.proxy("IfrtRequest")()
        fill(request)
        answers: list = []
        session._process(request, answers.append)
        return answers[0]

    def is_deleted(handle: int):
        return ask(lambda r: setattr(r.is_array_deleted_request, "array_handle", handle))

    lost = is_deleted(7)
    assert lost.response_metadata.status.code == 0, lost.response_metadata.status.message
    assert lost.is_array_deleted_response.deleted is False
    assert is_deleted(8).response_metadata.status.code == 5  # NOT_FOUND: no such handle
    # A failed request's named result holds its error, and is not deleted either.
    failed = ask(
        lambda r: (r.copy_arrays_request.array_handles.append(8), r.copy_arrays_request.result_handles.append(9))
    )
    assert failed.response_metadata.status.code == 5
    assert is_deleted(9).response_metadata.status.code == 0
    server.pool.shutdown()


# ---- what JAX's client sees -----------------------------------------------------------


def test_a_rejected_program_and_a_killed_server_are_one_line_each(tmp_path):
    server = server_client.start(1, 2)
    marker = tmp_path / "stepping"
    client = None
    try:
        client = subprocess.Popen(
            [sys.executable, HERE, "faults", server.target, str(marker)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=server_client.client_env(server.target),
        )
        wait_until(lambda: marker.exists() or client.poll() is not None, 180)
        assert marker.exists(), client.communicate()[1][-2000:]
        time.sleep(0.5)  # mid-loop
        os.kill(server.pid, signal.SIGKILL)
        out, err = client.communicate(timeout=180)
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        server.stop()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, err[-2000:]
    got = json.loads(lines[-1])
    assert "\n" not in got["rejected"].strip()
    assert "pathways_local_no_such_kernel" in got["rejected"]
    assert got["still_works"] == 8.0
    assert got["unpicklable"].startswith("INVALID_ARGUMENT: colocated Python "), got["unpicklable"]
    assert (
        "cannot unpickle the function in the server: ModuleNotFoundError: No module named 'client_only_module'"
        in (got["unpicklable"])
    )
    assert "\n" not in got["unpicklable"].strip() and got["still_works_after"] == 12.0
    assert "\n" not in got["after_kill"].strip()
    # The call that meets the dead server says it is gone (gRPC words it 'Connection to IFRT proxy server
    # was terminated' or 'Socket closed', by where the kill fell); any later one says writes are refused.
    assert got["after_kill"].startswith(("UNAVAILABLE: ", "FAILED_PRECONDITION: GrpcClientSession")), got["after_kill"]


if __name__ == "__main__":
    mode, target, *rest = sys.argv[1:]
    import pathwaysutils

    pathwaysutils.initialize()
    print(json.dumps({"faults": client_faults}[mode](target, *rest)), flush=True)


def test_an_output_stored_after_its_slice_was_swept_is_lost_too():
    """Work in flight when a slice goes: the control thread marks slice 1 down and sweeps the
    arrays stored so far while an execution that checked the slice was up is still making its
    output. Stored after the sweep, that output must fail as the swept ones do, not survive."""
    import types

    import numpy as np

    from pathways_kernel.server.arrays import ArrayStore, ServerArray
    from pathways_kernel.server.devices import Topology
    from pathways_kernel.server.errors import DATA_LOSS, ServerError

    topology = Topology(2, 4)
    store = ArrayStore(topology.check_up)
    on_slice = {
        index: ServerArray(
            np.dtype("float32"), (4,), types.SimpleNamespace(device_ids=list(range(4 * index, 4 * index + 4))), []
        )
        for index in (0, 1)
    }
    topology.fail(1)
    store.lose({4, 5, 6, 7}, ServerError(DATA_LOSS, "slice 1 was lost"))  # the sweep, before the output lands
    store.put(10, on_slice[1])
    store.put(11, on_slice[0])

    with pytest.raises(ServerError) as lost:
        store.get(10)
    assert lost.value.code == DATA_LOSS and "slice 1 is down" in lost.value.message
    assert store.get(11) is on_slice[0]  # the live slice's output is untouched
