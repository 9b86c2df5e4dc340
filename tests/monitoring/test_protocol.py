"""Monitor protocol v1 (docs/protocol.md): round trips, quantization, validation of every malformed case."""

from __future__ import annotations

import dataclasses
import math

import monitor_frontend
import numpy as np
import pytest

from pathways_kernel.core.eventlog import Event
from pathways_kernel.monitoring import protocol as p
from pathways_kernel.monitoring.telemetry import SliceMetrics


def _topology(n_slices: int = 2, chips: int = 4) -> p.TopologyMessage:
    n = n_slices * chips
    return p.TopologyMessage(
        topology_seq=3,
        backend="local:2x4",
        target="embedded",
        platform="cpu",
        supports_fault_injection=True,
        slices=tuple(
            p.SliceInfo(i, "down" if i == 1 else "up", "cpu", (2, 2, 1), i * chips, chips) for i in range(n_slices)
        ),
        chip_id=np.arange(n, dtype=np.int32)[::-1].copy(),
        chip_slice=np.repeat(np.arange(n_slices, dtype=np.uint16), chips),
        chip_coords=np.array([[c % 2, c // 2, 0] for _ in range(n_slices) for c in range(chips)], np.uint16),
    )


def _metrics(n: int = 8) -> p.MetricsMessage:
    memory = np.array([0, 1, 2**20, 3 * 2**30, 5, 6, 7, 2**33][:n], np.int64)
    unit = p.memory_unit_for(int(memory.max()))
    return p.MetricsMessage(
        seq=7,
        time=1_700_000_000.25,
        topology_seq=3,
        source="client",
        window_s=2.0,
        memory_unit=unit,
        slices=(SliceMetrics(0, "up", 0.5, int(memory[:4].sum()), None), SliceMetrics(1, "down", 0.0, 0, 2**34)),
        utilization=0.5,
        memory_bytes=int(memory.sum()),
        chip_utilization=p.quantize_utilization(np.linspace(0, 1, n)),
        chip_memory=p.quantize_memory(memory, unit),
    )


def test_topology_round_trip_in_chip_order():
    t = _topology()
    data, buffers = p.encode_topology(t)
    assert data["v"] == 1 and data["type"] == "topology" and data["chips"] == 8
    assert [len(b) for b in buffers] == [8 * 4, 8 * 2, 8 * 3 * 2]
    back = monitor_frontend.decode_topology(data, buffers)
    assert back.slices == t.slices
    np.testing.assert_array_equal(back.chip_id, t.chip_id)
    np.testing.assert_array_equal(back.chip_slice, t.chip_slice)
    np.testing.assert_array_equal(back.chip_coords, t.chip_coords)
    assert (back.topology_seq, back.backend, back.target, back.platform, back.supports_fault_injection) == (
        3,
        "local:2x4",
        "embedded",
        "cpu",
        True,
    )


def test_metrics_round_trip_is_two_bytes_per_chip():
    m = _metrics()
    data, buffers = p.encode_metrics(m)
    assert sum(len(b) for b in buffers) == 2 * m.chips
    back = monitor_frontend.decode_metrics(data, buffers)
    assert back.slices == m.slices and back.seq == 7 and back.memory_unit == m.memory_unit
    np.testing.assert_array_equal(back.chip_utilization, m.chip_utilization)
    np.testing.assert_array_equal(back.chip_memory, m.chip_memory)


def test_buffers_are_little_endian():
    t = _topology(1, 1)
    t = p.TopologyMessage(**{**t.__dict__, "chip_id": np.array([0x01020304], np.int32)})
    _, buffers = p.encode_topology(t)
    assert buffers[0] == bytes([4, 3, 2, 1])


def test_utilization_quantization():
    q = p.quantize_utilization(np.array([0.0, 1.0, 0.5, -3, 7, math.nan], np.float32))
    assert q.dtype == np.uint8 and list(q) == [0, 255, 128, 0, 255, 0]


def test_memory_unit_keeps_every_chip_below_saturation():
    for top in (0, 1, 254, 255, 65535, 2**20, 95 * 2**30, 2**40):
        unit = p.memory_unit_for(top)
        assert unit >= 1 and unit & (unit - 1) == 0
        q = p.quantize_memory(np.array([top]), unit)
        assert q[0] < p.MEMORY_SATURATED
        assert abs(int(q[0]) * unit - top) <= unit / 2
    assert p.memory_unit_for(254) == 1 and p.memory_unit_for(255) == 2


def test_memory_saturates_instead_of_wrapping():
    assert p.quantize_memory(np.array([10**9]), 1)[0] == p.MEMORY_SATURATED


def test_event_and_reply():
    e = Event(4, 12.5, "reshard", (0, 1), (0,), 1024, 0.25, 10, "2 -> 1 slices")
    data, buffers = p.encode_event(e)
    assert buffers == []
    assert monitor_frontend.decode_event(data) == {
        "seq": 4,
        "time": 12.5,
        "kind": "reshard",
        "slices_before": [0, 1],
        "slices_after": [0],
        "bytes": 1024,
        "duration_s": 0.25,
        "step": 10,
        "detail": "2 -> 1 slices",
    }
    ok, _ = p.encode_reply("r1", True, result={"rate": 2.0})
    assert ok == {"v": 1, "type": "reply", "request_id": "r1", "ok": True, "error": None, "result": {"rate": 2.0}}
    bad, _ = p.encode_reply(None, False, "nope")
    assert bad["ok"] is False and bad["error"] == "nope" and bad["result"] is None


@pytest.mark.parametrize(
    "request_",
    [
        p.Request("subscribe", "a", rate=2.0),
        p.Request("subscribe", "b", rate=0.0),
        p.Request("ping", "c"),
        p.Request("fail_slice", "d", slice=1),
        p.Request("repair_slice", "e", slice=0),
        p.Request("snapshot", "f"),
        p.Request("chip_history", "g", start=4, stop=8),
    ],
)
def test_request_round_trip(request_):
    assert p.decode_request(monitor_frontend.encode_request(request_)) == request_


def _req(**fields):
    return {"v": 1, "type": "subscribe", "request_id": "r", "rate": 2, **fields}


@pytest.mark.parametrize(
    "data, buffers, echoed, message",
    [
        ("subscribe", [], None, "JSON object"),
        ([1, 2], [], None, "JSON object"),
        (None, [], None, "JSON object"),
        ({k: v for k, v in _req().items() if k != "request_id"}, [], None, "request_id"),
        (_req(request_id=""), [], None, "request_id"),
        (_req(request_id=7), [], None, "request_id"),
        (_req(request_id="x" * 129), [], None, "request_id"),
        (_req(), [b"\x00"], "r", "buffers"),
        ({k: v for k, v in _req().items() if k != "v"}, [], "r", "version"),
        (_req(v=2), [], "r", "version"),
        (_req(v="1"), [], "r", "version"),
        (_req(v=True), [], "r", "version"),
        (_req(v=1.0), [], "r", "version"),
        (_req(type="launch_missiles"), [], "r", "unknown request type"),
        (_req(type=None), [], "r", "unknown request type"),
        ({k: v for k, v in _req().items() if k != "type"}, [], "r", "unknown request type"),
        ({k: v for k, v in _req().items() if k != "rate"}, [], "r", "'rate' is missing"),
        (_req(rate="2"), [], "r", "finite number"),
        (_req(rate=True), [], "r", "finite number"),
        (_req(rate=None), [], "r", "finite number"),
        (_req(rate=math.nan), [], "r", "finite number"),
        (_req(rate=math.inf), [], "r", "finite number"),
        (_req(rate=-0.5), [], "r", "within"),
        (_req(rate=10.5), [], "r", "within"),
        (_req(extra=1), [], "r", "unexpected field"),
        ({"v": 1, "type": "ping", "request_id": "r", "rate": 1}, [], "r", "unexpected field"),
        ({"v": 1, "type": "fail_slice", "request_id": "r"}, [], "r", "'slice' is missing"),
        ({"v": 1, "type": "fail_slice", "request_id": "r", "slice": "1"}, [], "r", "integer"),
        ({"v": 1, "type": "fail_slice", "request_id": "r", "slice": 1.0}, [], "r", "integer"),
        ({"v": 1, "type": "fail_slice", "request_id": "r", "slice": True}, [], "r", "integer"),
        ({"v": 1, "type": "repair_slice", "request_id": "r", "slice": -1}, [], "r", ">= 0"),
        ({"v": 1, "type": "snapshot", "request_id": "r", "name": "x"}, [], "r", "unexpected field"),
        ({"v": 1, "type": "chip_history", "request_id": "r", "start": 0}, [], "r", "'stop' is missing"),
        ({"v": 1, "type": "chip_history", "request_id": "r", "start": 4, "stop": 4}, [], "r", ">= 5"),
        ({"v": 1, "type": "chip_history", "request_id": "r", "start": -1, "stop": 4}, [], "r", ">= 0"),
        ({"v": 1, "type": "chip_history", "request_id": "r", "start": 0, "stop": 4097}, [], "r", "at most 4096"),
    ],
)
def test_malformed_requests_are_rejected(data, buffers, echoed, message):
    with pytest.raises(p.ProtocolError) as info:
        p.decode_request(data, buffers)
    assert info.value.request_id == echoed
    assert message in str(info.value)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d, b: (d, b[:1]), "binary buffers"),
        (lambda d, b: (d, [b[0][:-1], b[1]]), "bytes"),
        (lambda d, b: ({**d, "chips": 9}, b), "bytes"),
        (lambda d, b: ({**d, "memory_unit": 3}, b), "power of two"),
        (lambda d, b: ({**d, "window_s": 0}, b), "window_s"),
        (lambda d, b: ({**d, "utilization": 1.5}, b), r"within \[0, 1\]"),
        (lambda d, b: ({**d, "v": 2}, b), "version"),
        (lambda d, b: ({**d, "type": "topology"}, b), "expected a metrics"),
        (lambda d, b: ({**d, "slices": [{**d["slices"][0], "state": "lost"}]}, b), "'state'"),
    ],
)
def test_malformed_metrics_are_rejected(mutate, message):
    data, buffers = mutate(*p.encode_metrics(_metrics()))
    with pytest.raises(p.ProtocolError, match=message):
        monitor_frontend.decode_metrics(data, buffers)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["slices"][1].update(chip_count=3), "add up to 7"),
        (lambda d: d["slices"][1].update(chip_offset=3), "chip_offset is 3, expected 4"),
        (lambda d: d["slices"][1].update(index=0), "ascending"),
        (lambda d: d["slices"][0].update(shape=[2, "2"]), "'shape'"),
        (lambda d: d.update(topology_seq=0), "'topology_seq' must be >= 1"),
        (lambda d: d.update(supports_fault_injection=1), "boolean"),
    ],
)
def test_malformed_topologies_are_rejected(mutate, message):
    data, buffers = p.encode_topology(_topology())
    mutate(data)
    with pytest.raises(p.ProtocolError, match=message):
        monitor_frontend.decode_topology(data, buffers)


def test_topology_with_wrong_buffers_is_rejected():
    data, buffers = p.encode_topology(_topology())
    with pytest.raises(p.ProtocolError, match="chip_coords"):
        monitor_frontend.decode_topology(data, [buffers[0], buffers[1], buffers[2][:-2]])
    with pytest.raises(p.ProtocolError, match="3 binary buffers"):
        monitor_frontend.decode_topology(data, buffers[:2])


def _history(points: int = 5, slices: tuple[int, ...] = (0, 1)) -> p.HistoryMessage:
    t, s = points, len(slices)
    up = np.ones((t, s), bool)
    up[3:, 1] = False  # slice 1 lost at its 4th point: down from then on only
    return p.HistoryMessage(
        topology_seq=3,
        slices=slices,
        window_s=900.0,
        time=1_700_000_000.0 + 0.5 * np.arange(t),
        utilization=np.linspace(0, 1, t * s, dtype=np.float32).reshape(t, s),
        memory_bytes=np.arange(t * s, dtype=np.float64).reshape(t, s) * 2**30,
        up=up,
    )


def test_history_round_trip_keeps_when_each_slice_was_up():
    h = _history()
    data, buffers = p.encode_history(h)
    assert data == {"v": 1, "type": "history", "topology_seq": 3, "window_s": 900.0, "points": 5, "slices": [0, 1]}
    assert [len(b) for b in buffers] == [5 * 8, 10 * 4, 10 * 8, 10]
    back = monitor_frontend.decode_history(data, buffers)
    np.testing.assert_array_equal(back.time, h.time)
    np.testing.assert_array_equal(back.utilization, h.utilization)
    np.testing.assert_array_equal(back.memory_bytes, h.memory_bytes)
    assert back.up[:, 1].tolist() == [True, True, True, False, False]


def test_empty_history_is_a_valid_message():
    data, buffers = p.encode_history(_history(points=0))
    assert monitor_frontend.decode_history(data, buffers).points == 0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d, b: (d, b[:3]), "4 binary buffers"),
        (lambda d, b: ({**d, "points": 6}, b), "bytes"),
        (lambda d, b: ({**d, "slices": [0]}, b), "bytes"),
        (lambda d, b: (d, [b[0][::-1], *b[1:]]), "ascending"),
        (lambda d, b: ({**d, "window_s": 0}, b), "window_s"),
    ],
)
def test_malformed_histories_are_rejected(mutate, message):
    data, buffers = mutate(*p.encode_history(_history()))
    with pytest.raises(p.ProtocolError, match=message):
        monitor_frontend.decode_history(data, buffers)


def test_chip_history_reply_carries_the_series_as_buffers():
    util = np.arange(12, dtype=np.uint8).reshape(3, 4)
    h = p.ChipHistory(3, 4, 8, 4096, np.array([1.0, 2.0, 3.0]), util, util[::-1].copy())
    data, buffers = p.encode_chip_history_reply("c1", h)
    assert data["type"] == "reply" and data["ok"] and data["request_id"] == "c1"
    assert data["result"] == {"topology_seq": 3, "start": 4, "stop": 8, "points": 3, "memory_unit": 4096}
    back = monitor_frontend.decode_chip_history(data, buffers)
    np.testing.assert_array_equal(back.utilization, util)
    np.testing.assert_array_equal(back.memory, util[::-1])
    with pytest.raises(p.ProtocolError, match="bytes"):
        monitor_frontend.decode_chip_history(data, [buffers[0], buffers[1][:-1], buffers[2]])


def test_close_reasons():
    assert p.close_data("evicted") == {"v": 1, "type": "closed", "reason": "evicted"}
    with pytest.raises(ValueError):
        p.close_data("bored")


@pytest.mark.parametrize(
    "data",
    [
        {"v": 1, "type": "x" * 10_000_000, "request_id": "r"},
        {"v": "1" * 10_000_000, "type": "ping", "request_id": "r"},
        {"v": 1, "type": "ping", "request_id": "r", "y" * 10_000_000: 1},
        {"v": 1, "type": "ping", "request_id": "r", **{f"field{i}": i for i in range(100_000)}},
        {"v": 1, "type": "subscribe", "request_id": "r", "rate": "9" * 10_000_000},
        {"v": 1, "type": "subscribe", "request_id": "r", "rate": ["9"] * 1_000_000},
        {"v": 1, "type": [1] * 1_000_000, "request_id": "r"},
    ],
)
def test_an_error_quotes_only_a_short_prefix_of_bad_input(data):
    with pytest.raises(p.ProtocolError) as info:
        p.decode_request(data)
    data, _ = p.encode_reply(info.value.request_id, False, str(info.value))
    assert data["request_id"] == "r"
    assert len(str(data)) < 400, str(data)[:400]


def test_quote_marks_the_cut():
    assert p.quote("abc") == "'abc'"
    assert p.quote("x" * 100) == "'" + "x" * (p.MAX_QUOTE - 4) + "..."
    assert len(p.quote("x" * 100)) == p.MAX_QUOTE
    assert p.quote({"a": 1}) == "a JSON object of 1 items"


def test_the_contract_states_the_limits_the_code_enforces():
    """docs/protocol.md, protocol.py and (via crosslang.test.ts) protocol.ts say the same thing."""
    from pathlib import Path

    from pathways_kernel.monitoring import comm, connection

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    assert f"comm target `{p.TARGET}`" in doc and f"protocol version, always `{p.VERSION}`" in doc
    for kind in p.KERNEL_TYPES:
        assert f"### `{kind}`" in doc, kind
    for kind, fields in p.REQUEST_FIELDS.items():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{kind}`")), None)
        assert row is not None, f"request {kind} missing from the requests table"
        assert all(f"`{field}`" in row for field in fields), row
    assert f"`0 <= rate <= {p.MAX_RATE_HZ:g}` (Hz)" in doc
    assert f"longer than {p.MAX_REQUEST_ID} characters" in doc
    assert f"at most {p.MAX_QUOTE} characters of a bad value" in doc
    assert f"every {p.PING_INTERVAL_S} s" in doc and f"(default {p.STALE_AFTER_S})" in doc
    assert f"(default {comm.MAX_COMMS})" in doc and comm.STALE_AFTER_S == p.STALE_AFTER_S
    assert " | ".join(f'"{r}"' for r in p.CLOSE_REASONS) in doc
    assert f"when {connection.MAX_PENDING_REPLIES} replies wait" in doc
    assert f"beyond {connection.MAX_QUEUED_EVENTS}" in doc
    assert f"the last {connection.REPLAY_EVENTS} events" in doc
    assert f"at most {p.MAX_CHIP_HISTORY} chips" in doc
    for table_row in (
        "| `topology_seq`              | integer >= 1",
        "| `topology_seq`          | integer >= 1",
        '| `event.detail`      | string            | free text, may be `""`; always present',
    ):
        assert table_row in doc, table_row


@pytest.mark.kernel
def test_every_refused_request_reads_the_same_way(kernel):
    """Issue 22.10: `chip_history` errors (and any request refused after it was decoded) carried a
    `PathwaysError: ` prefix where requests refused while decoding carry none."""
    import re

    from comm_frontend import Frontend

    frontend = Frontend(kernel)
    comm = frontend.open()
    refused = {
        "past the last chip": ("chip_history", {"start": 4, "stop": 9}),
        "malformed": ("chip_history", {"start": 4, "stop": 3}),
        "no such slice": ("fail_slice", {"slice": 7}),
    }
    errors = {}
    for why, (kind, fields) in refused.items():
        reply = frontend.reply_to(comm, frontend.request(comm, kind, **fields), timeout=30)
        assert reply["ok"] is False, (why, reply)
        errors[why] = reply["error"]
    for why, error in errors.items():
        kind = refused[why][0]
        assert error.startswith(f"{kind}: "), (why, error)
        assert not re.match(r"\w+(Error|Exception): ", error), (why, error)
        assert "\n" not in error
    assert errors["past the last chip"] == "chip_history: chips 4:9 asked for, but the topology has 8"
    assert errors["no such slice"] == "fail_slice: no slice 7: this session has slices 0..1"


def test_goodput_intervals_are_json_columns_named_as_the_contract_says():
    import json
    from pathlib import Path

    categories = ("productive", "compile")
    columns = {
        "start_s": [0.0, 0.5],
        "end_s": [0.5, 1.0],
        "goodput": [0.2, 0.9],
        "productive": [0.1, 0.45],
        "compile": [0.4, 0.05],
        "steps": [0, 12],
        "step_time_mean_s": [math.nan, 0.04],
        "step_time_std_s": [math.nan, 0.01],
    }
    run = {"run": "train", "kind": "elastic", "header": "run 'train' (...)", "started": 1.7e9, "wall_s": 1.0}
    stats = {"steps": 12, "median_s": 0.04, "mean_s": 0.04, "std_s": 0.01, "slowest": [(3, 0.07)]}
    data, buffers = p.encode_goodput_intervals(run, categories, columns, stats)
    assert buffers == [] and data["type"] == "goodput_intervals" and "goodput_intervals" in p.KERNEL_TYPES
    json.dumps(data, allow_nan=False)  # an interval without steps has no step time: null, not NaN
    assert data["step_time_mean_s"] == [None, 0.04] and data["seconds"] == {
        "productive": [0.1, 0.45],
        "compile": [0.4, 0.05],
    }
    assert data["step_time"]["slowest"] == [{"step": 3, "seconds": 0.07}]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    section = doc.split("### `goodput_intervals`")[1].split("\n### ")[0]
    for field in set(data) - {"v", "type"}:
        assert f"`{field}`" in section, field
    for field in data["step_time"]:
        assert f"`{field}`" in section, field


# -- the schema (pathways_kernel/monitoring/protocol.schema.json): the kernel's encoders, the
# -- test frontend's decoders and (labextension/test/schema.test.ts) the TypeScript side agree with it

SCHEMA = monitor_frontend.SCHEMA


def test_the_schema_holds_the_kernels_types_requests_and_limits():
    assert (SCHEMA["version"], SCHEMA["target"]) == (p.VERSION, p.TARGET)
    assert set(SCHEMA["kernel"]) == set(p.KERNEL_TYPES)
    assert {k: tuple(v["fields"]) for k, v in SCHEMA["requests"]["types"].items()} == p.REQUEST_FIELDS
    assert tuple(SCHEMA["close_reasons"]) == p.CLOSE_REASONS
    assert SCHEMA["closed"]["fields"]["reason"]["values"] == list(p.CLOSE_REASONS)
    assert {name: getattr(p, name) for name in SCHEMA["constants"]} == SCHEMA["constants"]
    assert SCHEMA["requests"]["envelope"]["request_id"]["maxLength"] == p.MAX_REQUEST_ID
    assert SCHEMA["requests"]["types"]["subscribe"]["fields"]["rate"]["max"] == p.MAX_RATE_HZ


def _span():
    from pathways_kernel.training.phases import Span

    return Span(1, "grpo", "rollout", "rollout", "slice 1 · TPU v6 lite", (1,), 1.7e9, 1.7e9 + 0.25, 0)


def _kernel_messages() -> dict[str, p.Message]:
    """One message of each type, as the kernel's encoders write them."""
    from pathways_kernel.profiling import capture

    util = np.arange(12, dtype=np.uint8).reshape(3, 4)
    chips = p.ChipHistory(3, 4, 8, 4096, np.array([1.0, 2.0, 3.0]), util, util.copy())
    event = Event(seq=4, time=1.7e9, kind="reshard", slices_before=(0, 1), slices_after=(0,), step=7)
    point = {"seq": 1, "run": "train #1", "step": 3, "time": 1.7e9, "elapsed_s": 0.5, "name": "loss", "value": 2.5}
    columns = {"start_s": [0.0], "end_s": [1.0], "goodput": [0.5], "productive": [0.5], "steps": [3]}
    columns |= {"step_time_mean_s": [0.1], "step_time_std_s": [math.nan]}
    run = {"run": "train", "kind": "elastic", "header": "run 'train'", "started": 1.7e9, "wall_s": 1.0}
    stats = {"steps": 3, "median_s": 0.1, "mean_s": 0.1, "std_s": 0.0, "slowest": [(2, 0.2)]}
    return {
        "topology": p.encode_topology(_topology()),
        "history": p.encode_history(_history()),
        "metrics": p.encode_metrics(_metrics()),
        "event": p.encode_event(event),
        "reply": p.encode_reply("r1", True, result={"rate": 2.0}),
        "no_backend": p.encode_no_backend("proxy unreachable"),
        "metric_points": p.encode_metric_points([point], replay=True),
        "goodput_intervals": p.encode_goodput_intervals(run, ("productive",), columns, stats),
        "phases": p.encode_phases([_span()], replay=True),
        "starting": p.encode_starting(
            "starting the local Pathways server", ("process up", "devices"), 1, "starting", None, 2.5
        ),
        "chip_history": p.encode_chip_history_reply("c1", chips),
        "latest_profile": p.encode_reply("l1", True, result=capture.latest_for_xprof()),
    }


@pytest.mark.parametrize("kind", [*p.KERNEL_TYPES, *SCHEMA["results"]])
def test_the_kernel_encodes_every_message_type_as_the_schema_says(kind):
    """A field the kernel writes that the schema does not name (or the reverse) fails here."""
    data, buffers = _kernel_messages()[kind]
    if kind in SCHEMA["results"]:
        spec = SCHEMA["results"][kind]
        assert monitor_frontend.schema_errors(SCHEMA["kernel"]["reply"]["fields"], _body(data)) == []
        data = data["result"]
    else:
        spec = SCHEMA["kernel"][kind]
        assert (data["v"], data["type"]) == (p.VERSION, kind)
        data = _body(data)
    assert monitor_frontend.schema_errors(spec["fields"], data) == []
    assert monitor_frontend.buffer_errors(spec["buffers"], data, buffers) == []


def test_the_kernels_close_data_is_as_the_schema_says():
    for reason in p.CLOSE_REASONS:
        data = p.close_data(reason)
        assert (data["v"], data["type"]) == (p.VERSION, "closed")
        assert monitor_frontend.schema_errors(SCHEMA["closed"]["fields"], _body(data)) == []


def _body(data: dict) -> dict:
    return {k: v for k, v in data.items() if k not in ("v", "type")}


def _example(kind: str) -> tuple[dict, list[bytes]]:
    spec = SCHEMA["kernel"][kind]
    data = {"v": p.VERSION, "type": kind, **spec["example"]["data"]}
    return data, monitor_frontend.schema_buffers(spec["buffers"], spec["example"]["buffers"])


def _field_paths(fields: dict, data: dict, at: tuple = ()) -> list[tuple[tuple, dict]]:
    """Each field of ``fields`` (and of nested objects, of an array's first object) with its path in ``data``."""
    paths = []
    for key, spec in fields.items():
        paths.append(((*at, key), spec))
        value = data[key]
        if spec["type"] == "object" and "fields" in spec and isinstance(value, dict):
            paths += _field_paths(spec["fields"], value, (*at, key))
        if spec["type"] == "array" and spec["items"].get("fields") and value:
            paths += _field_paths(spec["items"]["fields"], value[0], (*at, key, 0))
    return paths


def _mutated(data: dict, path: tuple, value: object = ...) -> dict:
    """A deep copy of ``data`` with the field at ``path`` removed (``...``) or set to ``value``."""
    import copy

    out = copy.deepcopy(data)
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    if value is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


_WRONG = {"integer": "1", "number": "x", "string": 1, "boolean": 1, "object": [], "map": [], "array": {}, "enum": "?"}


def test_every_schema_example_is_valid():
    for kind, spec in [*SCHEMA["kernel"].items(), *SCHEMA["results"].items()]:
        example = spec["example"]
        assert monitor_frontend.schema_errors(spec["fields"], example["data"]) == [], kind
        buffers = monitor_frontend.schema_buffers(spec["buffers"], example["buffers"])
        assert monitor_frontend.buffer_errors(spec["buffers"], example["data"], buffers) == [], kind


@pytest.mark.parametrize("kind", SCHEMA["kernel"])
def test_the_test_frontend_decodes_every_type_and_checks_every_field_of_the_schema(kind):
    """monitor_frontend decodes each type's example, and refuses it without any field or with a
    value of another type: a field the schema names that the decoder does not read fails here."""
    data, buffers = _example(kind)
    decoded = monitor_frontend.decode(data, buffers)
    spec = SCHEMA["kernel"][kind]
    names = {*spec["fields"], *(b.get("python", b["name"]) for b in spec["buffers"])}
    if isinstance(decoded, dict):
        assert set(decoded) == (set(spec["fields"]["event"]["fields"]) if kind == "event" else names)
    else:
        own = {f.name for f in dataclasses.fields(decoded)}
        assert own <= names and all(hasattr(decoded, n) for n in names), (own, names)
    for path, field in _field_paths(spec["fields"], data):
        if not field.get("nullable"):
            with pytest.raises(p.ProtocolError):
                monitor_frontend.decode(_mutated(data, path), buffers)
        with pytest.raises(p.ProtocolError):
            monitor_frontend.decode(_mutated(data, path, _WRONG[field["type"]]), buffers)


def test_the_test_frontend_decodes_a_chip_history_reply_as_the_schema_says():
    spec = SCHEMA["results"]["chip_history"]
    result = spec["example"]["data"]
    data = {"v": p.VERSION, "type": "reply", "request_id": "c", "ok": True, "error": None, "result": result}
    buffers = monitor_frontend.schema_buffers(spec["buffers"], spec["example"]["buffers"])
    decoded = monitor_frontend.decode_chip_history(data, buffers)
    names = {*spec["fields"], *(b["name"] for b in spec["buffers"])}
    assert {f.name for f in dataclasses.fields(decoded)} <= names and all(hasattr(decoded, n) for n in names)
    for key in spec["fields"]:
        with pytest.raises(p.ProtocolError):
            monitor_frontend.decode_chip_history(_mutated(data, ("result", key)), buffers)


@pytest.mark.parametrize("kind", SCHEMA["requests"]["types"])
def test_requests_as_the_schema_says_pass_the_kernel_and_each_missing_field_is_refused(kind):
    spec = SCHEMA["requests"]["types"][kind]
    data = {"v": p.VERSION, "type": kind, "request_id": "r", **spec["example"]}
    request = p.decode_request(data)
    assert monitor_frontend.encode_request(request) == data
    for key in spec["fields"]:
        with pytest.raises(p.ProtocolError):
            p.decode_request(_mutated(data, (key,)))
    with pytest.raises(p.ProtocolError, match="unexpected field"):
        p.decode_request({**data, "extra": 1})
