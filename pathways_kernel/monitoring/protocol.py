"""Monitor protocol v1: encode, decode and validate ``pathways.monitor`` messages.

The contract is docs/protocol.md; field names and limits here are the
TypeScript side's (``labextension/src/protocol/messages.ts``); all three follow the
schema ``protocol.schema.json`` beside this module (tests/monitoring/test_protocol.py and
labextension/test/schema.test.ts check each against it). A message is
``(data, buffers)``: ``data`` the comm's JSON object, ``buffers`` its binary
frames (little-endian arrays in topology chip order). Pure functions, no
Jupyter or JAX imports, so both the comm and the benchmarks use exactly this
path. Per-slice aggregates are the telemetry hub's ``SliceMetrics``, field for
field. This module holds what the kernel does: encode kernel messages, decode
requests; the frontend's decoders live in TypeScript (and, for tests, in
tests/support/monitor_frontend.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_kernel.core.errors import PathwaysError

# How chip values travel (one byte each) is part of the protocol; history keeps them the same way.
from pathways_kernel.monitoring.quantize import (  # noqa: F401
    MEMORY_SATURATED,
    memory_unit_for,
    quantize_memory,
    quantize_utilization,
)

if TYPE_CHECKING:  # only a type here: the protocol imports nothing of the hub
    from pathways_kernel.monitoring.telemetry import SliceMetrics

VERSION = 1
TARGET = "pathways.monitor"

#: Kernel -> frontend message types.
KERNEL_TYPES = (
    "topology",
    "history",
    "metrics",
    "event",
    "reply",
    "no_backend",
    "metric_points",
    "goodput_intervals",
    "phases",
    "starting",
)
#: States of a ``starting`` message.
START_STATES = ("starting", "ready", "failed")
#: Frontend -> kernel request types and their own fields.
REQUEST_FIELDS: dict[str, tuple[str, ...]] = {
    "subscribe": ("rate",),
    "ping": (),
    "fail_slice": ("slice",),
    "repair_slice": ("slice",),
    "snapshot": (),
    "chip_history": ("start", "stop"),
    "latest_profile": (),
}
MAX_RATE_HZ = 10.0
MAX_REQUEST_ID = 128
#: Characters of a bad value an error reply quotes (the rest is cut, marked with "...").
MAX_QUOTE = 40
#: Close reasons carried by the kernel's ``comm_close``.
CLOSE_REASONS = ("stale", "evicted", "shutdown")
#: Seconds between a frontend's pings; the kernel closes a comm silent for ``STALE_AFTER_S``.
PING_INTERVAL_S = 15
STALE_AFTER_S = 60
#: Fields of one training metric point (``metric_points``), as ``metric_log.Point`` names them.
METRIC_POINT_FIELDS = ("seq", "run", "step", "time", "elapsed_s", "name", "value", "cell", "earlier")
#: Newest metric points a new subscription catches up with (the rest are in ``pw.metrics()``).
MAX_REPLAY_POINTS = 20_000
#: Newest phase spans (``pw.phase``) a new subscription catches up with (``training/phases.py`` keeps as many).
MAX_REPLAY_SPANS = 20_000
#: Most chips one ``chip_history`` request may ask for (300 points x 2 bytes each: 2.4 MB at most).
MAX_CHIP_HISTORY = 4096

_U8 = np.dtype("<u1")
_U16 = np.dtype("<u2")
_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")
_F64 = np.dtype("<f8")

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


@dataclasses.dataclass(frozen=True)
class HistoryMessage:
    """Per-slice series of the kernel's history, oldest first (T points, S slices)."""

    topology_seq: int
    slices: tuple[int, ...]  # slice index of each column
    window_s: float
    time: np.ndarray  # float64 [T]
    utilization: np.ndarray  # float32 [T, S]
    memory_bytes: np.ndarray  # float64 [T, S]
    up: np.ndarray  # bool [T, S]

    @property
    def points(self) -> int:
        return int(self.time.shape[0])


def encode_history(h: HistoryMessage) -> Message:
    t, s = h.points, len(h.slices)
    for name in ("utilization", "memory_bytes", "up"):
        if getattr(h, name).shape != (t, s):
            raise ValueError(f"history {name} must be [points, slices] = [{t}, {s}]")
    data = {
        "v": VERSION,
        "type": "history",
        "topology_seq": int(h.topology_seq),
        "window_s": float(h.window_s),
        "points": t,
        "slices": [int(i) for i in h.slices],
    }
    buffers = [
        np.ascontiguousarray(h.time, _F64).tobytes(),
        np.ascontiguousarray(h.utilization, _F32).tobytes(),
        np.ascontiguousarray(h.memory_bytes, _F64).tobytes(),
        np.ascontiguousarray(h.up, _U8).tobytes(),
    ]
    return data, buffers


@dataclasses.dataclass(frozen=True)
class ChipHistory:
    """Per-chip series of chip positions ``start:stop``, oldest first (T points, C chips)."""

    topology_seq: int
    start: int
    stop: int
    memory_unit: int
    time: np.ndarray  # float64 [T]
    utilization: np.ndarray  # uint8 [T, C], value / 255
    memory: np.ndarray  # uint8 [T, C], value * memory_unit bytes

    @property
    def points(self) -> int:
        return int(self.time.shape[0])


def encode_chip_history_reply(request_id: str, h: ChipHistory) -> Message:
    """The ``reply`` to ``chip_history``: its ``result`` says the shape, three buffers carry the series."""
    t, c = h.points, h.stop - h.start
    if h.utilization.shape != (t, c) or h.memory.shape != (t, c):
        raise ValueError(f"chip history series must be [points, chips] = [{t}, {c}]")
    data, _ = encode_reply(
        request_id,
        True,
        result={
            "topology_seq": int(h.topology_seq),
            "start": int(h.start),
            "stop": int(h.stop),
            "points": t,
            "memory_unit": int(h.memory_unit),
        },
    )
    buffers = [
        np.ascontiguousarray(h.time, _F64).tobytes(),
        np.ascontiguousarray(h.utilization, _U8).tobytes(),
        np.ascontiguousarray(h.memory, _U8).tobytes(),
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


def encode_reply(
    request_id: str | None, ok: bool, error: str | None = None, result: dict[str, Any] | None = None
) -> Message:
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


def request_failed(kind: str, exc: BaseException) -> str:
    """The ``error`` of a reply to a valid request of type ``kind`` that failed: read like a
    refused one (``chip_history: ...``), one line, with no exception class name."""
    message = " ".join(str(exc).split()) or "request failed"
    return message if message.startswith(kind) else f"{kind}: {message}"


def close_data(reason: str) -> dict[str, Any]:
    """The ``data`` of a kernel-initiated ``comm_close``."""
    if reason not in CLOSE_REASONS:
        raise ValueError(f"unknown close reason {reason!r}")
    return {"v": VERSION, "type": "closed", "reason": reason}


def encode_starting(
    what: str, steps: Sequence[str], done: int, state: str, error: str | None, elapsed_s: float
) -> Message:
    """The kernel's backend is starting (``core/startup.py``'s ``Progress``): what, its steps, how many are done."""
    if state not in START_STATES:
        raise ValueError(f"unknown start state {state!r}")
    return {
        "v": VERSION,
        "type": "starting",
        "what": str(what),
        "steps": [str(step) for step in steps],
        "done": max(0, min(int(done), len(steps))),
        "state": state,
        "error": None if error is None else str(error),
        "elapsed_s": round(max(float(elapsed_s), 0.0), 1),
    }, []


def encode_no_backend(error: str) -> Message:
    """The kernel has no backend (``error``: why, one line); topology follows once one connects."""
    return {"v": VERSION, "type": "no_backend", "error": str(error) or "no backend"}, []


def encode_metric_points(points: Sequence[Any], replay: bool) -> Message:
    """Training metric points (``metric_log.Point`` or its ``to_dict()``), oldest first.

    ``replay``: the session's points so far (the newest ``MAX_REPLAY_POINTS``), sent
    once per subscription; they replace whatever the frontend held. A value that is
    not finite travels as null (JSON has no NaN).
    """
    rows = []
    for point in points:
        # A point's own fields, not to_dict(): dataclasses.asdict deep-copies, 4x the cost of the
        # whole encoding, and a new dashboard waits for the 20,000-point catch-up.
        f = point if isinstance(point, dict) else point.__dict__
        value = float(f["value"])
        cell = f.get("cell")
        rows.append(
            {
                "seq": int(f["seq"]),
                "run": str(f["run"]),
                "step": int(f["step"]),
                "time": float(f["time"]),
                "elapsed_s": float(f["elapsed_s"]),
                "name": str(f["name"]),
                "value": value if math.isfinite(value) else None,
                # The cell the run started in, so views name it "run 'train' (cell 4)".
                "cell": int(cell) if cell is not None else None,
                # Logged by an earlier kernel of this session (read back after a restart).
                "earlier": bool(f.get("earlier", False)),
            }
        )
    return {"v": VERSION, "type": "metric_points", "replay": bool(replay), "points": rows}, []


def encode_phases(spans: Sequence[Any], replay: bool) -> Message:
    """Phases a loop marked (``training.phases.Span``), oldest first: where each role's time went.

    ``replay``: the session's spans so far (the newest ``MAX_REPLAY_SPANS``), sent once per
    subscription; they replace whatever the frontend held. ``start``/``end`` are unix times.
    """
    rows = [
        {
            "seq": int(s.seq),
            "run": str(s.run),
            "phase": str(s.phase),
            "role": str(s.role),
            "mesh": str(s.mesh),
            "slices": [int(i) for i in s.slices],
            "start": float(s.start),
            "end": float(s.end),
            "step": None if s.step is None else int(s.step),
        }
        for s in spans
    ]
    return {"v": VERSION, "type": "phases", "replay": bool(replay), "spans": rows}, []


# -- quantization --------------------------------------------------------------


# -- frontend -> kernel --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    """A validated frontend request."""

    type: str
    request_id: str
    rate: float | None = None
    slice: int | None = None
    start: int | None = None
    stop: int | None = None


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
            raise ProtocolError(f"unsupported protocol version {quote(v)}; this kernel speaks v{VERSION}")
        kind = data.get("type")
        if not isinstance(kind, str) or kind not in REQUEST_FIELDS:
            raise ProtocolError(f"unknown request type {quote(kind)}; expected one of {', '.join(REQUEST_FIELDS)}")
        allowed = {"v", "type", "request_id", *REQUEST_FIELDS[kind]}
        extra = [key for key in data if key not in allowed]
        if extra:
            names = ", ".join(quote(key) for key in extra[:3]) + (
                f" and {len(extra) - 3} more" if len(extra) > 3 else ""
            )
            raise ProtocolError(f"{kind}: unexpected field(s) {names}")
        if kind == "subscribe":
            rate = _number(data, "rate", kind)
            if not 0 <= rate <= MAX_RATE_HZ:
                raise ProtocolError(f"subscribe: rate must be within [0, {MAX_RATE_HZ:g}] Hz, got {rate!r}")
            return Request(kind, request_id, rate=float(rate))
        if kind in ("fail_slice", "repair_slice"):
            return Request(kind, request_id, slice=_int(data, "slice", low=0, context=kind))
        if kind == "chip_history":
            start = _int(data, "start", low=0, context=kind)
            stop = _int(data, "stop", low=start + 1, context=kind)
            if stop - start > MAX_CHIP_HISTORY:
                raise ProtocolError(f"chip_history: at most {MAX_CHIP_HISTORY} chips at once, asked for {stop - start}")
            return Request(kind, request_id, start=start, stop=stop)
        return Request(kind, request_id)
    except ProtocolError as exc:
        exc.request_id = request_id
        raise


# -- field checks ---------------------------------------------------------------


def quote(value: Any) -> str:
    """``repr(value)`` cut to ``MAX_QUOTE`` characters: an error reply never echoes a large bad input."""
    if isinstance(value, (dict, list)):
        return f"a JSON {_json_type(value)} of {len(value)} items"
    text = repr(value[: MAX_QUOTE + 1] if isinstance(value, str) else value)
    return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 3] + "..."


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _missing(key: str, context: str) -> ProtocolError:
    return ProtocolError(f"{context + ': ' if context else ''}field '{key}' is missing")


def _int(d: dict[str, Any], key: str, low: int | None = None, context: str = "") -> int:
    if key not in d:
        raise _missing(key, context)
    value = d[key]
    if type(value) is not int:
        raise ProtocolError(f"{context + ': ' if context else ''}'{key}' must be an integer, not {_json_type(value)}")
    if low is not None and value < low:
        raise ProtocolError(f"{context + ': ' if context else ''}'{key}' must be >= {low}, got {value}")
    return value


def _number(d: dict[str, Any], key: str, context: str = "") -> float:
    if key not in d:
        raise _missing(key, context)
    value = d[key]
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ProtocolError(f"{context + ': ' if context else ''}'{key}' must be a finite number, not {quote(value)}")
    return float(value)


def _int_list_or_none(value: Any) -> list[int] | None:
    return None if value is None else [int(x) for x in value]


def _unit_float(value: float) -> float:
    v = float(value)
    return 0.0 if not math.isfinite(v) else min(1.0, max(0.0, v))


#: Intervals a finished run's ``goodput_intervals`` message splits it into.
GOODPUT_INTERVALS = 50


def encode_goodput_intervals(
    run: dict[str, Any], categories: Sequence[str], columns: dict[str, Sequence[Any]], step_time: dict[str, Any]
) -> Message:
    """A finished run's goodput over time (``pw.goodput_over_time``), as columns a chart reads.

    ``run``: ``run``, ``kind``, ``header``, ``started`` (unix time), ``wall_s``;
    ``columns``: ``start_s``, ``end_s``, ``goodput``, ``steps``, ``step_time_mean_s``,
    ``step_time_std_s`` and one per category, each one value per interval;
    ``step_time``: the run's figures (``goodput_timeline.step_time_stats``). A value
    that is not finite (an interval without steps has no step time) travels as null.
    """

    def number(value: Any) -> float | None:
        value = float(value)
        return value if math.isfinite(value) else None

    def column(name: str) -> list[float | None]:
        return [number(v) for v in columns[name]]

    return {
        "v": VERSION,
        "type": "goodput_intervals",
        "run": str(run["run"]),
        "kind": str(run["kind"]),
        "header": str(run["header"]),
        "started": float(run["started"]),
        "wall_s": float(run["wall_s"]),
        "categories": [str(c) for c in categories],
        "start_s": column("start_s"),
        "end_s": column("end_s"),
        "goodput": column("goodput"),
        "seconds": {str(c): column(c) for c in categories},
        "steps": [int(v) for v in columns["steps"]],
        "step_time_mean_s": column("step_time_mean_s"),
        "step_time_std_s": column("step_time_std_s"),
        "step_time": {
            "steps": int(step_time.get("steps", 0)),
            **{k: number(step_time[k]) if k in step_time else None for k in ("median_s", "mean_s", "std_s")},
            "slowest": [{"step": int(s), "seconds": float(t)} for s, t in step_time.get("slowest", [])],
        },
    }, []
