"""The frontend's side of monitor protocol v1 in Python, for tests: decode kernel messages, encode requests.

The panel does this in TypeScript (labextension/src/protocol/messages.ts); these
mirror its rules (docs/protocol.md, "Validation") so Python tests can read
what a real kernel sends as the panel would. The kernel itself only encodes
kernel messages and decodes requests (pathways_kernel/monitoring/protocol.py).
All three are checked against the protocol's schema, ``SCHEMA``
(pathways_kernel/monitoring/protocol.schema.json), which ``schema_errors`` reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pathways_kernel.monitoring.protocol import (
    _F32,
    _F64,
    _I32,
    _U8,
    _U16,
    VERSION,
    ChipHistory,
    HistoryMessage,
    MetricsMessage,
    ProtocolError,
    Request,
    SliceInfo,
    TopologyMessage,
    _int,
    _json_type,
    _missing,
    _number,
)
from pathways_kernel.monitoring.telemetry import SliceMetrics

SCHEMA: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "pathways_kernel" / "monitoring" / "protocol.schema.json").read_text()
)


def decode_topology(data: dict[str, Any], buffers: Sequence[Any]) -> TopologyMessage:
    _expect_kernel_envelope(data, "topology")
    n = _int(data, "chips", low=0)
    slices = tuple(
        SliceInfo(
            _int(s, "index", low=0),
            _state(s),
            _str(s, "kind"),
            tuple(_int_items(s, "shape")),
            _int(s, "chip_offset", low=0),
            _int(s, "chip_count", low=0),
        )
        for s in _list_of_dicts(data, "slices")
    )
    expected = 0
    for i, s in enumerate(slices):
        if i and s.index <= slices[i - 1].index:
            raise ProtocolError("topology: slices must be in ascending index order")
        if s.chip_offset != expected:
            raise ProtocolError(f"topology: slices[{i}].chip_offset is {s.chip_offset}, expected {expected}")
        expected += s.chip_count
    if expected != n:
        raise ProtocolError(f"topology: slices' chip_count add up to {expected}, but chips is {n}")
    _buffer_count(buffers, 3, "topology")
    return TopologyMessage(
        _int(data, "topology_seq", low=1),
        _str(data, "backend"),
        _str(data, "target"),
        _str(data, "platform"),
        _bool(data, "supports_fault_injection"),
        slices,
        _array(buffers[0], _I32, n, "chip_id"),
        _array(buffers[1], _U16, n, "chip_slice"),
        _array(buffers[2], _U16, 3 * n, "chip_coords").reshape(n, 3),
    )


def decode_metrics(data: dict[str, Any], buffers: Sequence[Any]) -> MetricsMessage:
    _expect_kernel_envelope(data, "metrics")
    n = _int(data, "chips", low=0)
    slices = tuple(
        SliceMetrics(
            _int(s, "index", low=0),
            _state(s),
            _fraction(s, "utilization"),
            _int(s, "memory_bytes", low=0),
            None if s.get("memory_limit_bytes", ...) is None else _int(s, "memory_limit_bytes", low=0),
        )
        for s in _list_of_dicts(data, "slices")
    )
    unit = _int(data, "memory_unit", low=1)
    if unit & (unit - 1):
        raise ProtocolError("metrics: memory_unit must be a power of two")
    window = _number(data, "window_s")
    if window <= 0:
        raise ProtocolError("metrics: window_s must be > 0")
    _buffer_count(buffers, 2, "metrics")
    return MetricsMessage(
        _int(data, "seq", low=1),
        _number(data, "time"),
        _int(data, "topology_seq", low=1),
        _str(data, "source"),
        window,
        unit,
        slices,
        _fraction(data, "utilization"),
        _int(data, "memory_bytes", low=0),
        _array(buffers[0], _U8, n, "utilization"),
        _array(buffers[1], _U8, n, "memory"),
    )


def decode_event(data: dict[str, Any]) -> dict[str, Any]:
    _expect_kernel_envelope(data, "event")
    e = data.get("event")
    if not isinstance(e, dict):
        raise ProtocolError("event: 'event' must be an object")
    _int(e, "seq", low=1)
    _number(e, "time")
    _str(e, "kind")
    _str(e, "detail")
    for key in ("slices_before", "slices_after"):
        if e.get(key) is not None:
            _int_items(e, key)
    if e.get("bytes") is not None:
        _int(e, "bytes", low=0)
    if e.get("step") is not None:
        _int(e, "step")
    if e.get("duration_s") is not None:
        _number(e, "duration_s")
    return e


def encode_request(request: Request) -> dict[str, Any]:
    data: dict[str, Any] = {"v": VERSION, "type": request.type, "request_id": request.request_id}
    if request.type == "subscribe":
        data["rate"] = request.rate
    elif request.type in ("fail_slice", "repair_slice"):
        data["slice"] = request.slice
    elif request.type == "chip_history":
        data["start"], data["stop"] = request.start, request.stop
    return data


def _expect_kernel_envelope(data: Any, kind: str) -> None:
    if not isinstance(data, dict):
        raise ProtocolError(f"{kind}: message must be a JSON object")
    if type(data.get("v")) is not int or data["v"] != VERSION:
        raise ProtocolError(f"{kind}: unsupported protocol version {data.get('v')!r}")
    if data.get("type") != kind:
        raise ProtocolError(f"expected a {kind} message, got {data.get('type')!r}")


def _fraction(d: dict, key: str) -> float:
    value = _number(d, key)
    if not 0.0 <= value <= 1.0:
        raise ProtocolError(f"'{key}' must be within [0, 1], got {value}")
    return value


def _str(d: dict, key: str) -> str:
    if key not in d:
        raise _missing(key, "")
    if not isinstance(d[key], str):
        raise ProtocolError(f"'{key}' must be a string, not {_json_type(d[key])}")
    return d[key]


def _bool(d: dict, key: str) -> bool:
    if key not in d or not isinstance(d[key], bool):
        raise ProtocolError(f"'{key}' must be a boolean")
    return d[key]


def _state(d: dict) -> str:
    state = d.get("state")
    if state not in ("up", "down"):
        raise ProtocolError(f"'state' must be 'up' or 'down', got {state!r}")
    return state


def _list_of_dicts(d: dict, key: str) -> list[dict]:
    value = d.get(key)
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise ProtocolError(f"'{key}' must be an array of objects")
    return value


def _int_items(d: dict, key: str) -> list[int]:
    value = d.get(key)
    if not isinstance(value, list) or not all(type(x) is int for x in value):
        raise ProtocolError(f"'{key}' must be an array of integers")
    return value


def _buffer_count(buffers: Sequence[Any], count: int, kind: str) -> None:
    if len(buffers) != count:
        raise ProtocolError(f"{kind}: expected {count} binary buffers, got {len(buffers)}")


def _array(buffer: Any, dtype: np.dtype, count: int, name: str) -> np.ndarray:
    raw = memoryview(buffer).cast("B")
    if raw.nbytes != count * dtype.itemsize:
        raise ProtocolError(f"buffer '{name}' has {raw.nbytes} bytes, expected {count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).copy()


def decode_history(data: dict[str, Any], buffers: Sequence[Any]) -> HistoryMessage:
    _expect_kernel_envelope(data, "history")
    t = _int(data, "points", low=0)
    slices = tuple(_int_items(data, "slices"))
    s = len(slices)
    window = _number(data, "window_s")
    if window <= 0:
        raise ProtocolError("history: window_s must be > 0")
    _buffer_count(buffers, 4, "history")
    time = _array(buffers[0], _F64, t, "time")
    if t > 1 and np.any(np.diff(time) < 0):
        raise ProtocolError("history: times must be ascending")
    return HistoryMessage(
        _int(data, "topology_seq", low=1),
        slices,
        window,
        time,
        _array(buffers[1], _F32, t * s, "utilization").reshape(t, s),
        _array(buffers[2], _F64, t * s, "memory_bytes").reshape(t, s),
        _array(buffers[3], _U8, t * s, "up").reshape(t, s).astype(bool),
    )


def decode_chip_history(data: dict[str, Any], buffers: Sequence[Any]) -> ChipHistory:
    """The ``reply`` to a ``chip_history`` request."""
    _expect_kernel_envelope(data, "reply")
    if data.get("ok") is not True or not isinstance(data.get("result"), dict):
        raise ProtocolError(str(data.get("error")))
    r = data["result"]
    start = _int(r, "start", low=0)
    stop = _int(r, "stop", low=start + 1)
    t = _int(r, "points", low=0)
    unit = _int(r, "memory_unit", low=1)
    c = stop - start
    _buffer_count(buffers, 3, "chip_history")
    return ChipHistory(
        _int(r, "topology_seq", low=1),
        start,
        stop,
        unit,
        _array(buffers[0], _F64, t, "time"),
        _array(buffers[1], _U8, t * c, "utilization").reshape(t, c),
        _array(buffers[2], _U8, t * c, "memory").reshape(t, c),
    )


def decode_reply(data: dict[str, Any], buffers: Sequence[Any]) -> dict[str, Any]:
    """A ``reply`` (its buffers, if any, are the result's: see ``decode_chip_history``)."""
    _expect_kernel_envelope(data, "reply")
    if data.get("request_id") is not None:
        _str(data, "request_id")
    if data.get("error") is not None:
        _str(data, "error")
    if data.get("result") is not None and not isinstance(data["result"], dict):
        raise ProtocolError("reply: 'result' must be an object or null")
    return {
        "request_id": _nullable(data, "request_id"),
        "ok": _bool(data, "ok"),
        "error": _nullable(data, "error"),
        "result": _nullable(data, "result"),
    }


def decode_no_backend(data: dict[str, Any], buffers: Sequence[Any]) -> dict[str, Any]:
    _expect_kernel_envelope(data, "no_backend")
    _buffer_count(buffers, 0, "no_backend")
    return {"error": _str(data, "error")}


def decode_starting(data: dict[str, Any], buffers: Sequence[Any]) -> dict[str, Any]:
    _expect_kernel_envelope(data, "starting")
    _buffer_count(buffers, 0, "starting")
    steps = _str_items(data, "steps")
    state = data.get("state")
    if state not in ("starting", "ready", "failed"):
        raise ProtocolError(f"'state' must be 'starting', 'ready' or 'failed', got {state!r}")
    if data.get("error") is not None:
        _str(data, "error")
    elapsed = _number(data, "elapsed_s")
    if elapsed < 0:
        raise ProtocolError(f"'elapsed_s' must be >= 0, got {elapsed}")
    return {
        "what": _str(data, "what"),
        "steps": steps,
        "done": _int(data, "done", low=0),
        "state": state,
        "error": _nullable(data, "error"),
        "elapsed_s": elapsed,
    }


def decode_metric_points(data: dict[str, Any], buffers: Sequence[Any]) -> dict[str, Any]:
    _expect_kernel_envelope(data, "metric_points")
    _buffer_count(buffers, 0, "metric_points")
    points = [
        {
            "seq": _int(o, "seq", low=1),
            "run": _str(o, "run"),
            "step": _int(o, "step"),
            "time": _number(o, "time"),
            "elapsed_s": _number(o, "elapsed_s"),
            "name": _str(o, "name"),
            "value": None if _nullable(o, "value") is None else _number(o, "value"),
            "cell": None if _nullable(o, "cell") is None else _int(o, "cell"),
            "earlier": _bool(o, "earlier"),
        }
        for o in _list_of_dicts(data, "points")
    ]
    return {"replay": _bool(data, "replay"), "points": points}


def decode_goodput_intervals(data: dict[str, Any], buffers: Sequence[Any]) -> dict[str, Any]:
    _expect_kernel_envelope(data, "goodput_intervals")
    _buffer_count(buffers, 0, "goodput_intervals")
    categories = _str_items(data, "categories")
    seconds = data.get("seconds")
    if not isinstance(seconds, dict):
        raise ProtocolError("'seconds' must be an object")
    step_time = data.get("step_time")
    if not isinstance(step_time, dict):
        raise ProtocolError("'step_time' must be an object")
    return {
        "run": _str(data, "run"),
        "kind": _str(data, "kind"),
        "header": _str(data, "header"),
        "started": _number(data, "started"),
        "wall_s": _number(data, "wall_s"),
        "categories": categories,
        "start_s": _optional_numbers(data, "start_s"),
        "end_s": _optional_numbers(data, "end_s"),
        "goodput": _optional_numbers(data, "goodput"),
        "seconds": {c: _optional_numbers(seconds, c) for c in categories},
        "steps": _int_items(data, "steps"),
        "step_time_mean_s": _optional_numbers(data, "step_time_mean_s"),
        "step_time_std_s": _optional_numbers(data, "step_time_std_s"),
        "step_time": {
            "steps": _int(step_time, "steps", low=0),
            **{
                k: None if _nullable(step_time, k) is None else _number(step_time, k)
                for k in ("median_s", "mean_s", "std_s")
            },
            "slowest": [
                {"step": _int(o, "step"), "seconds": _number(o, "seconds")}
                for o in _list_of_dicts(step_time, "slowest")
            ],
        },
    }


def decode_phases(data: dict[str, Any], buffers: Sequence[Any]) -> dict[str, Any]:
    _expect_kernel_envelope(data, "phases")
    _buffer_count(buffers, 0, "phases")
    spans = [
        {
            "seq": _int(o, "seq", low=1),
            "run": _str(o, "run"),
            "phase": _str(o, "phase"),
            "role": _str(o, "role"),
            "mesh": _str(o, "mesh"),
            "slices": _int_items(o, "slices"),
            "start": _number(o, "start"),
            "end": _number(o, "end"),
            "step": None if _nullable(o, "step") is None else _int(o, "step"),
        }
        for o in _list_of_dicts(data, "spans")
    ]
    return {"replay": _bool(data, "replay"), "spans": spans}


#: The decoder of each kernel message type.
DECODERS: dict[str, Callable[[dict[str, Any], Sequence[Any]], Any]] = {
    "topology": decode_topology,
    "history": decode_history,
    "metrics": decode_metrics,
    "event": lambda data, buffers: _no_buffers(decode_event(data), buffers, "event"),
    "reply": decode_reply,
    "no_backend": decode_no_backend,
    "metric_points": decode_metric_points,
    "goodput_intervals": decode_goodput_intervals,
    "phases": decode_phases,
    "starting": decode_starting,
}


def decode(data: Any, buffers: Sequence[Any] = ()) -> Any:
    """Any kernel message, by its ``type``."""
    kind = data.get("type") if isinstance(data, dict) else None
    if kind not in DECODERS:
        raise ProtocolError(f"unknown message type {kind!r}")
    return DECODERS[kind](data, buffers)


def _no_buffers(value: Any, buffers: Sequence[Any], kind: str) -> Any:
    _buffer_count(buffers, 0, kind)
    return value


def _nullable(d: dict, key: str) -> Any:
    if key not in d:
        raise _missing(key, "")
    return d[key]


def _str_items(d: dict, key: str) -> list[str]:
    value = d.get(key)
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ProtocolError(f"'{key}' must be an array of strings")
    return value


def _optional_numbers(d: dict, key: str) -> list[float | None]:
    value = d.get(key)
    if not isinstance(value, list) or not all(
        x is None or (type(x) in (int, float) and math.isfinite(x)) for x in value
    ):
        raise ProtocolError(f"'{key}' must be an array of numbers or nulls")
    return value


# -- the schema -------------------------------------------------------------------

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float) and math.isfinite(v),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "map": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "enum": lambda v: True,
}
DTYPES = {"int32": _I32, "uint16": _U16, "uint8": _U8, "float32": _F32, "float64": _F64}


def schema_errors(fields: dict[str, Any], data: dict[str, Any], at: str = "") -> list[str]:
    """How ``data`` (a message's or a nested object's fields) departs from the schema's ``fields``:
    a field missing, one the schema does not name, a value of another type or out of range."""
    errors = [f"{at}{key}: not in the schema" for key in data if key not in fields]
    for key, spec in fields.items():
        if key not in data:
            errors.append(f"{at}{key}: missing")
        else:
            errors += _value_errors(spec, data[key], f"{at}{key}")
    return errors


def _value_errors(spec: dict[str, Any], value: Any, at: str) -> list[str]:
    if value is None:
        return [] if spec.get("nullable") else [f"{at}: null"]
    kind = spec["type"]
    if not _JSON_TYPES[kind](value):
        return [f"{at}: {_json_type(value)}, not {kind}"]
    if kind == "enum" and value not in spec["values"]:
        return [f"{at}: {value!r} not one of {spec['values']}"]
    if kind in ("integer", "number") and not spec.get("min", -math.inf) <= value <= spec.get("max", math.inf):
        return [f"{at}: {value} out of range"]
    if kind == "string" and not spec.get("minLength", 0) <= len(value) <= spec.get("maxLength", math.inf):
        return [f"{at}: length {len(value)} out of range"]
    if kind == "object" and "fields" in spec:
        return schema_errors(spec["fields"], value, f"{at}.")
    if kind == "map":
        return [e for k, v in value.items() for e in _value_errors(spec["values"], v, f"{at}.{k}")]
    if kind == "array":
        return [e for i, v in enumerate(value) for e in _value_errors(spec["items"], v, f"{at}[{i}]")]
    return []


def buffer_errors(spec: list[dict[str, Any]], data: dict[str, Any], buffers: Sequence[Any]) -> list[str]:
    """How ``buffers`` depart from the schema's buffer list: their number, each one's byte size."""
    if len(buffers) != len(spec):
        return [f"{len(buffers)} buffers, the schema says {len(spec)}"]
    errors = []
    for b, s in zip(buffers, spec, strict=True):
        size = buffer_count(s["shape"], data) * DTYPES[s["dtype"]].itemsize
        if memoryview(b).nbytes != size:
            errors.append(f"buffer {s['name']}: {memoryview(b).nbytes} bytes, the schema says {size}")
    return errors


def buffer_count(shape: list[Any], data: dict[str, Any]) -> int:
    """Elements of a buffer of ``shape`` (factors: a number, a field, or ``"a - b"``)."""
    count = 1
    for factor in shape:
        if isinstance(factor, int):
            count *= factor
        elif " - " in factor:
            a, b = factor.split(" - ")
            count *= data[a] - data[b]
        else:
            value = data[factor]
            count *= len(value) if isinstance(value, list) else value
    return count


def schema_buffers(spec: list[dict[str, Any]], values: list[list[float]]) -> list[bytes]:
    """An example's buffers (plain numbers) as the bytes the wire carries."""
    return [np.asarray(v, DTYPES[s["dtype"]]).tobytes() for s, v in zip(spec, values, strict=True)]
