"""The monitor comm through a real `pathways` kernel: this test acts as the JupyterLab panel.

It opens `pathways.monitor` comms on a kernel subshell (what JupyterLab >= 4.4
does with commsOverSubshells), sends requests as `comm_msg`s and reads the
kernel's answers on IOPub, while a cell keeps the main shell busy.
"""

from __future__ import annotations

import json
import time
from typing import Any

import monitor_frontend
import pytest
from comm_frontend import Frontend
from comm_frontend import is_comm_close as _closed
from comm_frontend import is_comm_msg as _is

from pathways_kernel.monitoring import protocol as p
from pathways_kernel.monitoring.comm import STALE_AFTER_S


@pytest.fixture(scope="module")
def frontend(kernel):
    assert kernel.run("x = 1").status == "ok"
    return Frontend(kernel)


def test_topology_then_metrics_on_open(frontend):
    comm = frontend.open()
    msg = frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30)
    assert msg is not None, "no topology after comm_open"
    topology = monitor_frontend.decode_topology(msg["content"]["data"], msg["buffers"])
    assert [s.chip_count for s in topology.slices] == [4, 4]
    assert topology.chips == 8 and topology.backend == "embedded:2x4" and topology.supports_fault_injection
    msg = frontend.wait_for(lambda m: _is(m, comm, "metrics"), timeout=10)
    assert msg is not None, "no metrics after the topology"
    metrics = monitor_frontend.decode_metrics(msg["content"]["data"], msg["buffers"])
    assert metrics.chips == 8 and metrics.topology_seq == topology.topology_seq and metrics.source == "client"


@pytest.mark.serial  # timing: a reply within 5 s of its request
def test_metrics_and_replies_flow_while_a_cell_sleeps(frontend):
    comm = frontend.open()
    assert frontend.wait_for(lambda m: _is(m, comm, "metrics"), timeout=30) is not None
    frontend.kc.execute("import time; time.sleep(5)")
    busy = frontend.kernel.iopub(10)
    while busy is not None and not (
        busy["header"]["msg_type"] == "status"
        and busy["content"]["execution_state"] == "busy"
        and busy["parent_header"].get("msg_type") == "execute_request"
    ):
        if busy["header"]["msg_type"].startswith("comm"):
            frontend.inbox.append(busy)
        busy = frontend.kernel.iopub(10)
    assert busy is not None, "the cell never started"
    started, mark = time.time(), len(frontend.inbox)

    metrics = frontend.wait_for(lambda m: _is(m, comm, "metrics"), timeout=1.0, since=mark)
    assert metrics is not None, "no metrics within 1 s while the cell runs"

    asked = time.time()
    request_id = frontend.request(comm, "subscribe", rate=4)
    reply = frontend.reply_to(comm, request_id, timeout=1.0, since=mark)
    answered = time.time() - asked
    assert reply is not None, "subscribe was not answered within 1 s while the cell runs"
    assert reply["ok"] is True and reply["result"] == {"rate": 4.0}
    assert time.time() - started < 5, "the reply waited for the cell to finish"
    print(f"subscribe answered in {answered * 1000:.0f} ms during a busy cell")
    # Let the sleeping cell finish before the next test runs code.
    frontend.wait_for(lambda m: False, timeout=max(0.0, 5.5 - (time.time() - started)))


BAD_REQUESTS = [
    ("not an object", None),
    ({"v": 1, "type": "subscribe", "rate": 2}, None),
    ({"v": 2, "type": "ping", "request_id": "bad-version"}, "bad-version"),
    ({"v": 1, "type": "format_disk", "request_id": "bad-type"}, "bad-type"),
    ({"v": 1, "type": "subscribe", "request_id": "bad-rate", "rate": 99}, "bad-rate"),
    ({"v": 1, "type": "fail_slice", "request_id": "bad-slice", "slice": "1"}, "bad-slice"),
    ({"v": 1, "type": "fail_slice", "request_id": "extra", "slice": 1, "force": True}, "extra"),
    ({"v": 1, "type": "fail_slice", "request_id": "no-such-slice", "slice": 7}, "no-such-slice"),
]


def test_malformed_requests_get_error_replies_and_execute_nothing(frontend, kernel):
    comm = frontend.open()
    assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30) is not None
    for data, request_id in BAD_REQUESTS:
        mark = len(frontend.inbox)
        frontend.send(comm, data)
        reply = frontend.reply_to(comm, request_id, timeout=10, since=mark)
        assert reply is not None, f"no reply to {data!r}"
        assert reply["ok"] is False and reply["error"], reply
    mark = len(frontend.inbox)
    frontend.send(comm, {"v": 1, "type": "fail_slice", "request_id": "with-buffers", "slice": 1}, buffers=[b"\x01\x02"])
    reply = frontend.reply_to(comm, "with-buffers", timeout=10, since=mark)
    assert reply is not None and reply["ok"] is False and "buffers" in reply["error"]
    # Nothing was failed: both slices are still up.
    assert "2/2 up" in kernel.run("pw.status()").text


def test_snapshot_request_snapshots_notebook_arrays(frontend, kernel):
    assert kernel.run("import jax.numpy as jnp; weights = jnp.ones((256, 256))").status == "ok"
    comm = frontend.open()
    assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30) is not None
    mark = len(frontend.inbox)
    request_id = frontend.request(comm, "snapshot")
    reply = frontend.reply_to(comm, request_id, timeout=30, since=mark)
    assert reply is not None and reply["ok"] is True, reply
    assert "weights" in reply["result"]["name"] and reply["result"]["nbytes"] >= 256 * 256 * 4


def test_snapshot_request_after_a_loss_reports_what_its_events_report(frontend, kernel):
    import re

    setup = kernel.run(
        "import jax, numpy as np\n"
        "a0 = jax.device_put(np.ones(2**20, np.float32), pw.topology().slices[0].devices[0])\n"
        "a1 = jax.device_put(np.ones(4 * 2**20, np.float32), pw.topology().slices[1].devices[0])\n"
        "pw.fail_slice(1)\n"
        "seq0 = pw.session().events.last(1)[0].seq"
    )
    try:
        assert setup.status == "ok", setup.error
        comm = frontend.open()
        assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30) is not None
        mark = len(frontend.inbox)
        reply = frontend.reply_to(comm, frontend.request(comm, "snapshot"), timeout=30, since=mark)
        assert reply is not None and reply["ok"] is True, reply
        names = reply["result"]["name"].split(",")
        assert "a0" in names and "a1" not in names, names  # a1 was lost with slice 1: nothing to copy
        events = kernel.run(
            "[s.wait() for s in pw.snapshot_store().list() if s.name in "
            f"{names!r}]\n"
            "print([(e.bytes, e.detail) for e in pw.session().events.since(seq0) if e.kind == 'snapshot'])"
        )
        snapshots = eval(events.text.strip().splitlines()[-1])
        arrays = sum(int(re.search(r"(\d+) arrays?", detail).group(1)) for _, detail in snapshots)
        assert (reply["result"]["leaves"], reply["result"]["nbytes"]) == (arrays, sum(b for b, _ in snapshots))
        assert any("'a0' 1 array" in detail for _, detail in snapshots), snapshots
    finally:
        kernel.run("pw.repair_slice(1); del a0, a1")


def test_fail_and_repair_slice_from_the_panel(frontend, kernel):
    comm = frontend.open()
    assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30) is not None
    mark = len(frontend.inbox)
    request_id = frontend.request(comm, "fail_slice", slice=1)
    reply = frontend.reply_to(comm, request_id, timeout=30, since=mark)
    assert reply == {
        "v": 1,
        "type": "reply",
        "request_id": request_id,
        "ok": True,
        "error": None,
        "result": {"slice": 1, "changed": True},
    }
    down = frontend.wait_for(
        lambda m: _is(m, comm, "topology") and m["content"]["data"]["slices"][1]["state"] == "down",
        timeout=5,
        since=mark,
    )
    assert down is not None, "no topology with slice 1 down"
    event = frontend.wait_for(
        lambda m: _is(m, comm, "event") and m["content"]["data"]["event"]["kind"] == "slice_down", timeout=5, since=mark
    )
    assert event is not None and event["content"]["data"]["event"]["slices_after"] == [0]
    metrics = frontend.wait_for(
        lambda m: (
            _is(m, comm, "metrics") and m["content"]["data"]["topology_seq"] == down["content"]["data"]["topology_seq"]
        ),
        timeout=5,
        since=mark,
    )
    assert metrics is not None and metrics["content"]["data"]["slices"][1]["state"] == "down"

    mark = len(frontend.inbox)
    request_id = frontend.request(comm, "repair_slice", slice=1)
    reply = frontend.reply_to(comm, request_id, timeout=30, since=mark)
    assert reply is not None and reply["ok"] is True and reply["result"]["changed"] is True
    assert "2/2 up" in kernel.run("pw.status()").text


def test_twenty_reloads_keep_live_comms_bounded(frontend, kernel):
    opened = [frontend.open() for _ in range(20)]
    last = opened[-1]
    assert frontend.wait_for(lambda m: _is(m, last, "topology"), timeout=30) is not None
    # The oldest were told why they were closed; the newest still answers.
    closed = frontend.wait_for(lambda m: _closed(m, opened[0]), timeout=10)
    assert closed is not None and closed["content"]["data"] == {"v": 1, "type": "closed", "reason": "evicted"}
    mark = len(frontend.inbox)
    request_id = frontend.request(last, "ping")
    assert frontend.reply_to(last, request_id, timeout=10, since=mark)["ok"] is True
    reply = kernel.run(
        "from pathways_kernel.monitoring import comm as _mc; print(len(_mc.server().connections), _mc.MAX_COMMS)"
    )
    live, cap = map(int, reply.text.split())
    assert live <= cap, f"{live} live monitor comms after 20 opens (cap {cap})"


def test_notebook_dashboard_updates_while_a_later_cell_runs(kernel):
    reply = kernel.run("dash = pw.monitor(rate=4); dash")
    assert reply.status == "ok", reply.error
    assert any("application/vnd.jupyter.widget-view+json" in d for d in reply.data)
    before = int(kernel.run("print(dash.updates)").text)
    kernel.kc.execute("import time; time.sleep(2)")
    updates = 0
    deadline = time.time() + 10
    while time.time() < deadline:
        msg = kernel.iopub(0.2)
        if msg is None:
            continue
        if msg["header"]["msg_type"] == "comm_msg" and msg["content"]["data"].get("method") == "update":
            updates += 1
        if (
            msg["header"]["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
            and msg["parent_header"].get("msg_type") == "execute_request"
        ):
            break
    # Idle chips leave the bars alone; the header's clock still ticks every second.
    assert updates >= 1, "the dashboard did not move while the cell ran"
    after = int(kernel.run("print(dash.updates)").text)
    assert after > before
    reply = kernel.run("%pathways monitor --rate 0")
    assert "rate must be within" in reply.error and "Traceback" not in reply.error
    # Re-running the cell does not pile up live dashboards.
    reply = kernel.run(
        "from pathways_kernel.monitoring import widget as _w\n"
        "for _ in range(6):\n"
        "    %pathways monitor\n"
        "print(_w.live_dashboards(), _w.MAX_DASHBOARDS, dash.closed)"
    )
    assert reply.status == "ok", reply.error
    live, cap, first_closed = reply.text.split()[-3:]
    assert int(live) <= int(cap) and first_closed == "True", reply.text


def test_a_long_cell_does_not_make_a_main_shell_comm_stale(frontend, kernel):
    # A frontend without subshells cannot ping while a cell runs; its comm must survive the cell.
    assert (
        kernel.run("from pathways_kernel.monitoring import comm as _mc; _mc.server().stale_after_s = 1.5").status
        == "ok"
    )
    try:
        comm = frontend.open(main_shell=True)
        assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30) is not None
        mark = len(frontend.inbox)
        frontend.kc.execute("import time; time.sleep(4)")
        started = time.time()
        closed = frontend.wait_for(lambda m: _closed(m, comm), timeout=3.5, since=mark)
        assert closed is None, f"closed as stale {time.time() - started:.1f} s into a running cell"
        # Once the cell is over, silence counts again.
        closed = frontend.wait_for(lambda m: _closed(m, comm), timeout=15, since=mark)
        assert closed is not None and closed["content"]["data"]["reason"] == "stale"
        assert time.time() - started > 4
    finally:
        kernel.run(f"_mc.server().stale_after_s = {STALE_AFTER_S}")


def test_comm_follows_a_backend_switch(frontend, kernel):
    comm = frontend.open()
    assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30) is not None
    mark = len(frontend.inbox)
    # Not kernel.run: it would swallow the comm's messages while it waits for the cell.
    kernel.kc.execute("pw.connect('embedded:4x2', force=True)")
    msg = frontend.wait_for(
        lambda m: _is(m, comm, "topology") and m["content"]["data"]["backend"] == "embedded:4x2", timeout=15, since=mark
    )
    assert msg is not None, "no topology for the new backend"
    assert [s.chip_count for s in monitor_frontend.decode_topology(msg["content"]["data"], msg["buffers"]).slices] == [
        2,
        2,
        2,
        2,
    ]
    assert (
        frontend.wait_for(
            lambda m: _is(m, comm, "metrics") and len(m["content"]["data"]["slices"]) == 4, timeout=15, since=mark
        )
        is not None
    )


# -- the protocol keeps its promises -------------------------------------------------


def _replies(frontend: Frontend, comm_id: str, since: int) -> list[dict[str, Any]]:
    return [m["content"]["data"] for m in frontend.inbox[since:] if _is(m, comm_id, "reply")]


def test_a_10_mb_bad_field_gets_a_short_error_reply(frontend):
    comm = frontend.open()
    assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30) is not None
    for bad in (
        {"type": "x" * 10_000_000},
        {"type": "ping", "x" * 10_000_000: 1},
        {"type": "subscribe", "rate": "9" * 10_000_000},
    ):
        mark = len(frontend.inbox)
        frontend.send(comm, {"v": 1, "request_id": "big", **bad})
        msg = frontend.wait_for(
            lambda m: _is(m, comm, "reply") and m["content"]["data"]["request_id"] == "big", timeout=60, since=mark
        )
        assert msg is not None, "no reply to a 10 MB request"
        reply = msg["content"]["data"]
        assert reply["ok"] is False and "..." in reply["error"], reply["error"][:200]
        size = len(json.dumps(msg["content"]))
        assert size < 2_000, f"a {size:,}-byte error reply to a 10 MB field"


@pytest.mark.serial  # timing: 5000 requests against the comm's deadlines
def test_5000_requests_get_exactly_5000_replies(frontend, kernel):
    comm = frontend.open()
    assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30) is not None
    # A slow consumer: the kernel's IOPub takes 1 ms a message for this comm, so replies pile up.
    slow = (
        "import time\n"
        "from pathways_kernel.monitoring import comm as _mc\n"
        f"_conn = next(c for c in _mc.server().connections if c.comm_id == {comm!r})\n"
        "_send = _conn.comm.send\n"
        "_conn.comm.send = lambda *a, **k: (time.sleep(0.001), _send(*a, **k))[1]"
    )
    assert kernel.run(slow).status == "ok"
    mark = len(frontend.inbox)
    ids = [f"flood-{i}" for i in range(5000)]
    for i, request_id in enumerate(ids):
        # Every third one valid (ping), the rest large unknown types: the kernel must answer all of them.
        kind = "ping" if i % 3 == 0 else f"unknown-{i}-" + "y" * 2_000
        frontend.send(comm, {"v": 1, "type": kind, "request_id": request_id})
    deadline = time.time() + 180
    answered, checked = 0, mark
    while answered < len(ids) and time.time() < deadline:
        frontend.pump(0.5)  # one message (a reply, or a request's busy or idle)
        answered += sum(_is(m, comm, "reply") for m in frontend.inbox[checked:])
        checked = len(frontend.inbox)
    replies = _replies(frontend, comm, mark)
    assert sorted(r["request_id"] for r in replies) == sorted(ids), f"{len(replies)} replies to {len(ids)} requests"
    assert sum(r["ok"] for r in replies) == len(range(0, 5000, 3))
    assert max(len(json.dumps(r)) for r in replies) < 1_000
    # And the comm still streams.
    assert frontend.wait_for(lambda m: _is(m, comm, "metrics"), timeout=10, since=mark) is not None


def test_monitor_requests_never_show_the_kernel_idle_while_a_cell_runs(frontend, kernel):
    """JupyterLab takes every IOPub status as the kernel's: monitor traffic on a subshell publishes none."""
    _never_idle_during_a_cell(frontend)


@pytest.mark.serial  # timing: replies within 4 s
def test_a_stock_kernel_with_the_extension_keeps_its_status_too():
    from kernels import Kernel

    k = Kernel("python3")
    try:
        assert k.run("%load_ext pathways_kernel").status == "ok"
        _never_idle_during_a_cell(Frontend(k))
    finally:
        k.shutdown()


def _never_idle_during_a_cell(frontend: Frontend) -> None:
    comm = frontend.open()
    assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=60) is not None
    frontend.wait_for(lambda m: False, timeout=0.5)
    statuses = len(frontend.statuses)
    frontend.kc.execute("import time; time.sleep(4)")
    started = time.time()
    frontend.wait_for(lambda m: False, timeout=0.5)
    mark = len(frontend.inbox)
    asked = [
        frontend.request(comm, "ping"),
        frontend.request(comm, "subscribe", rate=2),
        frontend.request(comm, "fail_slice", slice=1),
        frontend.request(comm, "repair_slice", slice=1),
        frontend.request(comm, "snapshot"),
    ]
    for request_id in asked:
        assert frontend.reply_to(comm, request_id, timeout=3, since=mark) is not None, "not answered during the cell"
    assert time.time() - started < 4, "the replies waited for the cell"
    shown = _during_the_cell(frontend, statuses)
    # Each request keeps its own busy/idle pair (the protocol's promise)...
    assert shown.count(("busy", "comm_msg")) == shown.count(("idle", "comm_msg")) == len(asked), shown
    # ...and the cell's busy follows each idle at once, so JupyterLab shows the kernel busy throughout.
    assert _stays_busy(shown), shown


def _stays_busy(shown: list[tuple[str, str]]) -> bool:
    """Whether every idle a frontend takes as the kernel's is followed at once by the cell's busy."""
    return all(
        parent in ("comm_info_request", "kernel_info_request") or shown[i + 1 : i + 2] == [("busy", "execute_request")]
        for i, (state, parent) in enumerate(shown)
        if state == "idle"
    )


def _during_the_cell(frontend: Frontend, since: int) -> list[tuple[str, str]]:
    """(state, parent msg_type) of each status from ``since`` up to the running cell's idle."""
    frontend.wait_for(
        lambda m: any(
            s["content"]["execution_state"] == "idle" and s["parent_header"].get("msg_type") == "execute_request"
            for s in frontend.statuses[since:]
        ),
        timeout=15,
    )
    shown = [(s["content"]["execution_state"], s["parent_header"].get("msg_type")) for s in frontend.statuses[since:]]
    return shown[: shown.index(("idle", "execute_request"))]


def test_a_subshell_created_during_a_cell_leaves_the_kernel_busy(frontend):
    """The panel attaching mid-cell creates its subshell on the control channel; that idle is not the kernel's."""
    frontend.kc.execute("import time; time.sleep(3)")
    frontend.wait_for(lambda m: False, timeout=0.5)
    since = len(frontend.statuses)
    Frontend(frontend.kernel)
    shown = _during_the_cell(frontend, since)
    assert ("idle", "create_subshell_request") in shown, shown  # its frontend waits for that idle
    assert _stays_busy(shown), shown


def test_comm_info_requests_keep_the_senders_comms_and_show_no_kernel_status(frontend, kernel):
    """Liveness without a status JupyterLab takes as the kernel's: a comm_info_request on the comm's subshell."""
    assert (
        kernel.run("from pathways_kernel.monitoring import comm as _mc; _mc.server().stale_after_s = 1.5").status
        == "ok"
    )
    try:
        before = len(frontend.statuses)
        comm = frontend.open()
        assert frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=30) is not None
        # The comm_open's own idle may come after its topology.
        comm_open_idle = ("idle", "comm_open")
        frontend.wait_for(
            lambda m: (
                comm_open_idle
                in [
                    (s["content"]["execution_state"], s["parent_header"].get("msg_type"))
                    for s in frontend.statuses[before:]
                ]
            ),
            timeout=30,
        )
        mark, statuses = len(frontend.inbox), len(frontend.statuses)
        started = time.time()
        while time.time() - started < 4:
            frontend._send("comm_info_request", {"target_name": p.TARGET})
            assert frontend.wait_for(lambda m: _closed(m, comm), timeout=0.5, since=mark) is None, (
                f"closed {time.time() - started:.1f} s in, while the frontend kept asking"
            )
        shown = {
            (s["content"]["execution_state"], s["parent_header"].get("msg_type")) for s in frontend.statuses[statuses:]
        }
        assert shown <= {("busy", "comm_info_request"), ("idle", "comm_info_request")}, shown
        # Silent, it goes stale.
        closed = frontend.wait_for(lambda m: _closed(m, comm), timeout=30, since=mark)
        assert closed is not None and closed["content"]["data"]["reason"] == "stale"
    finally:
        kernel.run(f"_mc.server().stale_after_s = {STALE_AFTER_S}")


def test_a_kernel_without_a_backend_says_why_and_follows_a_connect():
    import os

    from kernels import Kernel

    k = Kernel("pathways", env={**os.environ, "PATHWAYS_BACKEND": "proxy:grpc://127.0.0.1:1"})
    try:
        frontend = Frontend(k)
        comm = frontend.open()
        msg = frontend.wait_for(lambda m: _is(m, comm, "no_backend") or _closed(m, comm), timeout=120)
        assert msg is not None and _is(msg, comm, "no_backend"), msg
        error = msg["content"]["data"]["error"]
        assert "127.0.0.1:1" in error and "\n" not in error, error
        # Still answered: a ping keeps the comm, an action says why it cannot work.
        mark = len(frontend.inbox)
        assert frontend.reply_to(comm, frontend.request(comm, "ping"), timeout=10, since=mark)["ok"] is True
        reply = frontend.reply_to(comm, frontend.request(comm, "fail_slice", slice=0), timeout=10, since=mark)
        assert reply["ok"] is False and "fail_slice: no backend: ConnectError: cannot connect" in reply["error"], reply
        assert "%pathways connect local:2x4" in reply["error"]
        # Once a backend connects, the same comm shows it.
        k.kc.execute("%pathways connect local:2x4")
        topology = frontend.wait_for(lambda m: _is(m, comm, "topology"), timeout=60, since=mark)
        assert topology is not None and topology["content"]["data"]["backend"] == "local:2x4"
        assert not any(_closed(m, comm) for m in frontend.inbox)
    finally:
        k.shutdown()
