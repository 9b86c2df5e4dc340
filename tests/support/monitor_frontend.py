"""The frontend's side of monitor protocol v1 in Python, for tests: decode kernel messages, encode requests.

The panel does this in TypeScript (labextension/src/protocol.ts); these
mirror its rules (docs/protocol.md, "Validation") so Python tests can read
what a real kernel sends as the panel would. The kernel itself only encodes
kernel messages and decodes requests (pathways_kernel/monitoring/protocol.py).
"""

from __future__ import annotations

from collections.abc import Sequence
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
