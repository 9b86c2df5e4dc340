"""Monitor protocol v1: encode, decode and validate ``pathways.monitor`` messages.

The contract is docs/protocol.md; field names here are the TypeScript side's
(``labextension/src/protocol.ts``). A message is ``(data, buffers)``: ``data``
the comm's JSON object, ``buffers`` its binary frames (little-endian arrays in
topology chip order). Pure functions, no Jupyter or JAX imports, so both the
comm and the benchmarks use exactly this path. Per-slice aggregates are the
telemetry hub's ``SliceMetrics``, field for field.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.monitoring.telemetry import SliceMetrics

VERSION = 1
TARGET = "pathways.monitor"

#: Kernel -> frontend message types.
KERNEL_TYPES = ("topology", "metrics", "event", "reply")
#: Frontend -> kernel request types and their own fields.
REQUEST_FIELDS: dict[str, tuple[str, ...]] = {
    "subscribe": ("rate",),
    "ping": (),
    "fail_slice": ("slice",),
    "restore_slice": ("slice",),
    "snapshot": (),
}
MAX_RATE_HZ = 10.0
MAX_REQUEST_ID = 128
#: Close reasons carried by the kernel's ``comm_close``.
CLOSE_REASONS = ("stale", "evicted", "shutdown")

MEMORY_SATURATED = 255
_U8 = np.dtype("<u1")
_U16 = np.dtype("<u2")
_I32 = np.dtype("<i4")

Message = tuple[dict[str, Any], list[bytes]]


class ProtocolError(PathwaysError, ValueError):
    """A message that does not follow protocol v1; ``request_id`` is echoed when valid."""

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.request_id = request_id


# -- kernel -> frontend --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SliceInfo:
    index: int
    state: str
    kind: str
    shape: tuple[int, ...]
    chip_offset: int
    chip_count: int


@dataclasses.dataclass(frozen=True)
class TopologyMessage:
    topology_seq: int
    backend: str
    target: str
    platform: str
    supports_fault_injection: bool
    slices: tuple[SliceInfo, ...]
    chip_id: np.ndarray  # int32 [N]
    chip_slice: np.ndarray  # uint16 [N]
    chip_coords: np.ndarray  # uint16 [N, 3]

    @property
    def chips(self) -> int:
        return int(self.chip_id.shape[0])


@dataclasses.dataclass(frozen=True)
class MetricsMessage:
    seq: int
    time: float
    topology_seq: int
    source: str
    window_s: float
    memory_unit: int
    slices: tuple[SliceMetrics, ...]
    utilization: float
    memory_bytes: int
    chip_utilization: np.ndarray  # uint8 [N], value / 255
    chip_memory: np.ndarray  # uint8 [N], value * memory_unit bytes

    @property
    def chips(self) -> int:
        return int(self.chip_utilization.shape[0])


def encode_topology(t: TopologyMessage) -> Message:
    n = t.chips
    if t.chip_slice.shape != (n,) or t.chip_coords.shape != (n, 3):
        raise ValueError("chip_slice must be [N] and chip_coords [N, 3]")
    data = {
        "v": VERSION,
        "type": "topology",
        "topology_seq": int(t.topology_seq),
        "backend": t.backend,
        "target": t.target,
        "platform": t.platform,
        "supports_fault_injection": bool(t.supports_fault_injection),
        "chips": n,
        "slices": [
            {
                "index": s.index,
                "state": s.state,
                "kind": s.kind,
                "shape": list(s.shape),
                "chip_offset": s.chip_offset,
                "chip_count": s.chip_count,
            }
            for s in t.slices
        ],
    }
    buffers = [
        np.ascontiguousarray(t.chip_id, _I32).tobytes(),
        np.ascontiguousarray(t.chip_slice, _U16).tobytes(),
        np.ascontiguousarray(t.chip_coords, _U16).tobytes(),
    ]
    return data, buffers


def encode_metrics(m: MetricsMessage) -> Message:
    data = {
        "v": VERSION,
        "type": "metrics",
        "seq": int(m.seq),
        "time": float(m.time),
        "topology_seq": int(m.topology_seq),
        "chips": m.chips,
        "source": m.source,
        "window_s": float(m.window_s),
        "memory_unit": int(m.memory_unit),
        "slices": [
            {
                "index": s.index,
                "state": s.state,
                "utilization": _unit_float(s.utilization),
                "memory_bytes": int(s.memory_bytes),
                "memory_limit_bytes": None if s.memory_limit_bytes is None else int(s.memory_limit_bytes),
            }
            for s in m.slices
        ],
        "utilization": _unit_float(m.utilization),
        "memory_bytes": int(m.memory_bytes),
    }
    buffers = [
        np.ascontiguousarray(m.chip_utilization, _U8).tobytes(),
        np.ascontiguousarray(m.chip_memory, _U8).tobytes(),
    ]
    return data, buffers


def encode_event(event: Any) -> Message:
    """``event``: an ``events.Event`` or its ``to_dict()``."""
    fields = event if isinstance(event, dict) else event.to_dict()
    e = {
        "seq": int(fields["seq"]),
        "time": float(fields["time"]),
        "kind": str(fields["kind"]),
        "slices_before": _int_list_or_none(fields.get("slices_before")),
        "slices_after": _int_list_or_none(fields.get("slices_after")),
        "bytes": None if fields.get("bytes") is None else int(fields["bytes"]),
        "duration_s": None if fields.get("duration_s") is None else float(fields["duration_s"]),
        "step": None if fields.get("step") is None else int(fields["step"]),
        "detail": str(fields.get("detail") or ""),
    }
    return {"v": VERSION, "type": "event", "event": e}, []


def encode_reply(request_id: str | None, ok: bool, error: str | None = None, result: dict | None = None) -> Message:
    return (
        {
            "v": VERSION,
            "type": "reply",
            "request_id": request_id,
            "ok": bool(ok),
            "error": None if ok else (error or "request failed"),
            "result": (result if result is not None else {}) if ok else None,
        },
        [],
    )


def close_data(reason: str) -> dict[str, Any]:
    """The ``data`` of a kernel-initiated ``comm_close``."""
    if reason not in CLOSE_REASONS:
        raise ValueError(f"unknown close reason {reason!r}")
    return {"v": VERSION, "type": "closed", "reason": reason}


# -- quantization --------------------------------------------------------------


def quantize_utilization(fraction: np.ndarray) -> np.ndarray:
    """Fractions in [0, 1] (clipped; NaN -> 0) to uint8 ``round(f * 255)``."""
    f = np.nan_to_num(np.asarray(fraction, np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    return np.rint(np.clip(f, 0.0, 1.0) * 255.0).astype(_U8)


def memory_unit_for(max_bytes: int) -> int:
    """Smallest power of two so that ``max_bytes`` fits in 254 units."""
    unit = 1
    while max_bytes > (MEMORY_SATURATED - 1) * unit:
        unit *= 2
    return unit


def quantize_memory(nbytes: np.ndarray, unit: int) -> np.ndarray:
    """Bytes to uint8 units of ``unit`` bytes (round to nearest, saturating at 255)."""
    units = np.rint(np.asarray(nbytes, np.float64) / unit)
    return np.clip(units, 0, MEMORY_SATURATED).astype(_U8)


# -- decoding (what the frontend does; used by tests and in-process consumers) --


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
    for key in ("bytes", "step"):
        if e.get(key) is not None:
            _int(e, key)
    if e.get("duration_s") is not None:
        _number(e, "duration_s")
    return e


# -- frontend -> kernel --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    """A validated frontend request."""

    type: str
    request_id: str
    rate: float | None = None
    slice: int | None = None


def encode_request(request: Request) -> dict[str, Any]:
    data: dict[str, Any] = {"v": VERSION, "type": request.type, "request_id": request.request_id}
    if request.type == "subscribe":
        data["rate"] = request.rate
    elif request.type in ("fail_slice", "restore_slice"):
        data["slice"] = request.slice
    return data


def decode_request(data: Any, buffers: Sequence[Any] = ()) -> Request:
    """Validate one incoming request (docs/protocol.md, "Validation").

    Raises:
      ProtocolError: anything malformed or unknown; ``request_id`` is set when
        the request carried a valid one, so the error reply can echo it.
    """
    if not isinstance(data, dict):
        raise ProtocolError(f"a request must be a JSON object, not {_json_type(data)}")
    request_id = data.get("request_id")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID:
        raise ProtocolError(f"request_id must be a non-empty string of at most {MAX_REQUEST_ID} characters")
    try:
        if buffers:
            raise ProtocolError("requests carry no binary buffers")
        v = data.get("v")
        if type(v) is not int or v != VERSION:
            raise ProtocolError(f"unsupported protocol version {v!r}; this kernel speaks v{VERSION}")
        kind = data.get("type")
        if not isinstance(kind, str) or kind not in REQUEST_FIELDS:
            raise ProtocolError(f"unknown request type {kind!r}; expected one of {', '.join(REQUEST_FIELDS)}")
        allowed = {"v", "type", "request_id", *REQUEST_FIELDS[kind]}
        extra = sorted(set(data) - allowed)
        if extra:
            raise ProtocolError(f"{kind}: unexpected field(s) {', '.join(map(str, extra))}")
        if kind == "subscribe":
            rate = _number(data, "rate", kind)
            if not 0 <= rate <= MAX_RATE_HZ:
                raise ProtocolError(f"subscribe: rate must be within [0, {MAX_RATE_HZ:g}] Hz, got {rate!r}")
            return Request(kind, request_id, rate=float(rate))
        if kind in ("fail_slice", "restore_slice"):
            return Request(kind, request_id, slice=_int(data, "slice", low=0, context=kind))
        return Request(kind, request_id)
    except ProtocolError as exc:
        exc.request_id = request_id
        raise


# -- field checks ---------------------------------------------------------------


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _expect_kernel_envelope(data: Any, kind: str) -> None:
    if not isinstance(data, dict):
        raise ProtocolError(f"{kind}: message must be a JSON object")
    if type(data.get("v")) is not int or data["v"] != VERSION:
        raise ProtocolError(f"{kind}: unsupported protocol version {data.get('v')!r}")
    if data.get("type") != kind:
        raise ProtocolError(f"expected a {kind} message, got {data.get('type')!r}")


def _missing(key: str, context: str) -> ProtocolError:
    return ProtocolError(f"{context + ': ' if context else ''}field '{key}' is missing")


def _int(d: dict, key: str, low: int | None = None, context: str = "") -> int:
    if key not in d:
        raise _missing(key, context)
    value = d[key]
    if type(value) is not int:
        raise ProtocolError(f"{context + ': ' if context else ''}'{key}' must be an integer, not {_json_type(value)}")
    if low is not None and value < low:
        raise ProtocolError(f"{context + ': ' if context else ''}'{key}' must be >= {low}, got {value}")
    return value


def _number(d: dict, key: str, context: str = "") -> float:
    if key not in d:
        raise _missing(key, context)
    value = d[key]
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ProtocolError(f"{context + ': ' if context else ''}'{key}' must be a finite number, not {value!r}")
    return float(value)


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


def _int_list_or_none(value: Any) -> list[int] | None:
    return None if value is None else [int(x) for x in value]


def _unit_float(value: float) -> float:
    v = float(value)
    return 0.0 if not math.isfinite(v) else min(1.0, max(0.0, v))


def _buffer_count(buffers: Sequence[Any], count: int, kind: str) -> None:
    if len(buffers) != count:
        raise ProtocolError(f"{kind}: expected {count} binary buffers, got {len(buffers)}")


def _array(buffer: Any, dtype: np.dtype, count: int, name: str) -> np.ndarray:
    raw = memoryview(buffer).cast("B")
    if raw.nbytes != count * dtype.itemsize:
        raise ProtocolError(f"buffer '{name}' has {raw.nbytes} bytes, expected {count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).copy()
