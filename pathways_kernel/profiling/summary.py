"""What a capture shows inline: wall time, device busy time per slice, top ops,
compile time and host gaps.

The trace is read through XLA's own data model of an XSpace
(``jax.profiler.ProfileData``, the classes xprof's converters mirror), not by
walking protobufs. Two layouts of device work exist:

- TPU/GPU: a ``/device:TPU:N`` plane whose ``XLA Ops`` line holds the ops
  that ran on device N (what Pathways workers write).
- XLA:CPU (the embedded backend): ops run on host threads of the
  ``/host:CPU`` plane; each op event carries ``hlo_op``, ``hlo_module`` and
  ``device_ordinal`` stats, which is how we tell the devices apart.

Only the time inside the capture's own annotation (``WINDOW_PREFIX``) counts,
so start-up of the profiler is not charged to the cell.

Ops are named by their JAX source: the ``op_name`` of the HLO instruction's
metadata (``jit(train_step)/dot_general``), read from the HLO modules the
profiler puts in the ``/host:metadata`` plane, keyed by ``program_id``; the
XLA op (``all-gather``, ``ynn_fusion``) and module stay beside it.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.protowire import read_varint
from pathways_kernel.core.text import count

#: The TraceAnnotation a capture wraps its body in; its span is the window.
WINDOW_PREFIX = "pathways.profile:"
#: The span under the window that says which devices are which slice (for the trace viewer).
SLICES_PREFIX = "pathways.slices: "
#: JAX's trace event for compiling one computation (any backend).
COMPILE_EVENT = "backend_compile_and_load"
#: A stretch with no device busy shorter than this is dispatch jitter, not a gap.
GAP_MIN_NS = 1_000_000
#: Rows in the top-ops table.
TOP_OPS = 10

_DEVICE_PLANE = re.compile(r"^/device:[A-Z]+:(\d+)$")
# Host threads on which XLA:CPU runs the ops of its devices; their bookkeeping events.
_CPU_OP_LINES = ("tf_XLAEigen", "tf_XLAPjRtCpuClient")
_NOT_OPS = ("ThreadpoolListener", "end: ", "Wait", "Rendezvous")
# Other runtime threads (compiler, codegen): thousands of pass events, none we summarize.
_RUNTIME_LINES = ("tf_",)


@dataclasses.dataclass(frozen=True)
class OpStat:
    name: str  # the JAX source of the op (its HLO metadata's op_name), else the XLA op
    xla_op: str  # XLA's instruction, e.g. all-gather, ynn_fusion
    module: str
    occurrences: int
    self_ns: int  # summed over the devices it ran on
    devices: int  # how many devices ran it

    @property
    def mean_ns(self) -> int:
        """Self time per device: the mean over the devices that ran it."""
        return self.self_ns // max(1, self.devices)

    @property
    def detail(self) -> str:
        """What XLA calls it: its op and module."""
        return f"{self.xla_op}, {self.module}" if self.name != self.xla_op else self.module


@dataclasses.dataclass(frozen=True)
class SliceBusy:
    index: int
    devices: tuple[int, ...]  # device ids seen busy in the trace
    busy_ns: int  # mean over the slice's devices
    device_busy: tuple[tuple[int, int], ...] = ()  # (device id, busy ns) of each of the slice's devices

    def fraction(self, wall_ns: int) -> float:
        return self.busy_ns / wall_ns if wall_ns else 0.0


@dataclasses.dataclass(frozen=True)
class Summary(TextDisplay):
    """The inline summary of one capture."""

    name: str
    wall_ns: int
    slices: tuple[SliceBusy, ...]
    top_ops: tuple[OpStat, ...]
    device_ns: int  # self time of every op on every device
    compile_ns: int
    compiles: int
    gaps_ns: int  # time in the window with no device busy
    gaps: int
    longest_gap_ns: int
    busy_devices: int = 0  # devices that ran an op
    #: What the trace viewer shows of the devices: one process ``/host:CPU`` on the embedded backend.
    host_planes: tuple[str, ...] = ()

    def to_text(self) -> str:
        lines = [
            f"profile {self.name}: wall {_ms(self.wall_ns)}, compile {_ms(self.compile_ns)} ({self.compiles}x), "
            f"host gaps {_ms(self.gaps_ns)} ({self.gaps} over {_ms(GAP_MIN_NS)}, longest {_ms(self.longest_gap_ns)})"
        ]
        for s in self.slices:
            lines.append(
                f"  slice {s.index}  busy {_ms(s.busy_ns)} per device ({s.fraction(self.wall_ns):.0%})  "
                f"devices {_ids(s.devices)}"
            )
            if s.device_busy:
                lines.append("    " + "  ".join(f"device {d} {_ms(ns)}" for d, ns in s.device_busy))
        if self.top_ops:
            lines.append(
                f"  top ops by self time: per device (mean over the devices that ran it), summed over devices, "
                f"share of all devices' {_ms(self.device_ns)} ({count(self.busy_devices, 'device')})"
            )
            lines.append(f"    {'per device':>10}  {'summed':>10}  share  count  op (XLA op, module)")
            for op in self.top_ops:
                lines.append(
                    f"    {_ms(op.mean_ns):>10}  {_ms(op.self_ns):>10}  {_share(op.self_ns, self.device_ns):>5}  "
                    f"{op.occurrences:>5}  {op.name}  ({op.detail}; {count(op.devices, 'device')})"
                )
        else:
            lines.append("  no device ops ran inside the capture")
        trace = self.trace_note()
        if trace:
            lines.append(f"  {trace}")
        return "\n".join(lines)

    def trace_note(self) -> str:
        """What the trace viewer shows of the devices, where that is not one row per device."""
        if self.host_planes != ("/host:CPU",) or not self.slices:
            return ""
        slices = "; ".join(f"slice {s.index}: devices {_ids(tuple(d for d, _ in s.device_busy))}" for s in self.slices)
        return (
            "in XProf: one process /host:CPU runs every device on its threads (XLA:CPU); an op's device is its "
            f"device_ordinal, and the capture's span {SLICES_PREFIX.rstrip(': ')} says which slice holds which device "
            f"({slices})"
        )

    def html_rows(self) -> str:
        """The summary's tables, for a capture's HTML view."""
        head = (
            f"wall <b>{_ms(self.wall_ns)}</b> · compile <b>{_ms(self.compile_ns)}</b> ({self.compiles}×) · "
            f"host gaps <b>{_ms(self.gaps_ns)}</b> ({self.gaps}, longest {_ms(self.longest_gap_ns)})"
        )
        slices = "".join(
            f"<tr><td>slice {s.index}</td><td>{_ms(s.busy_ns)}</td><td>{s.fraction(self.wall_ns):.0%}</td>"
            f"<td>{html.escape(', '.join(f'{d}: {_ms(ns)}' for d, ns in s.device_busy) or _ids(s.devices))}</td></tr>"
            for s in self.slices
        )
        ops = "".join(
            f"<tr><td>{html.escape(op.name)}</td><td>{html.escape(op.xla_op)}</td><td>{html.escape(op.module)}</td>"
            f"<td>{op.occurrences}</td><td>{_ms(op.mean_ns)}</td><td>{_ms(op.self_ns)} ({op.devices})</td>"
            f"<td>{_share(op.self_ns, self.device_ns)}</td></tr>"
            for op in self.top_ops
        )
        trace = self.trace_note()
        return (
            f"<div>{head}</div>"
            "<table class='pathways-profile-slices'><thead><tr><th>slice</th><th>busy per device</th><th>of wall</th>"
            f"<th>devices (busy)</th></tr></thead><tbody>{slices}</tbody></table>"
            "<table class='pathways-profile-ops'><thead><tr><th>op</th><th>XLA op</th><th>module</th><th>count</th>"
            "<th>self time per device</th><th>summed over devices (devices)</th>"
            f"<th>share</th></tr></thead><tbody>{ops or '<tr><td colspan=7>no device ops</td></tr>'}</tbody></table>"
            + (f"<div>{html.escape(trace)}</div>" if trace else "")
        )


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms" if ns < 10e9 else f"{ns / 1e9:.2f} s"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def _ids(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids)) if ids else "none busy"


def summarize(xspaces: Iterable[bytes], name: str, slice_of: Mapping[int, int]) -> Summary:
    """Summarize the serialized XSpaces of one capture.

    Args:
      xspaces: the ``*.xplane.pb`` contents (one per traced host).
      name: the capture's name, for the heading.
      slice_of: device id -> slice index, from the session's topology.
    """
    from jax.profiler import ProfileData

    ops = _Ops()
    compiles: list[tuple[int, int]] = []
    windows: list[tuple[int, int]] = []
    host_planes: list[str] = []
    for data in xspaces:
        ops.op_names.update(op_names(data))
        for plane in ProfileData.from_serialized_xspace(data).planes:
            match = _DEVICE_PLANE.match(plane.name)
            if match:
                _read_device_plane(plane, int(match.group(1)), ops)
            elif plane.name.startswith("/host:") and _read_host_plane(plane, ops, compiles, windows):
                host_planes.append(plane.name)
    device, start_ns, end_ns, key = ops.arrays()
    if windows:
        start, end = min(w[0] for w in windows), max(w[1] for w in windows)
    elif len(device):
        start, end = int(start_ns.min()), int(end_ns.max())
    else:
        start = end = 0
    inside = (end_ns > start) & (start_ns < end)
    in_window = [c for c in compiles if c[0] < end and c[1] > start]
    summary = _summary(
        name,
        start,
        end,
        device[inside],
        start_ns[inside],
        end_ns[inside],
        key[inside],
        ops.names(),
        in_window,
        slice_of,
    )
    return dataclasses.replace(summary, host_planes=tuple(host_planes))


class _Ops:
    """Ops as columns, their names interned, for numpy: a 10 s capture on the emulated
    devices holds 50,000-100,000 ops, whose sums in Python took half the summary's time."""

    def __init__(self) -> None:
        self.devices: list[int] = []
        self.starts: list[float] = []
        self.durations: list[float] = []
        self.keys: list[int] = []
        # (XLA op, module, program id): one program's op; the same module compiled
        # twice (one device, then sharded) is two programs with different ops.
        self.key_of: dict[tuple[str, str, int], int] = {}
        self.op_names: dict[tuple[int, str], str] = {}  # (program id, XLA op) -> JAX op_name

    def key(self, op: str, module: str, program: int = -1) -> int:
        key = self.key_of.get((op, module, program))
        if key is None:
            key = self.key_of[op, module, program] = len(self.key_of)
        return key

    def names(self) -> list[tuple[str, str, str]]:
        """(JAX name, XLA op, module) of each key: ops of one source line and module read as one."""
        return [(self.op_names.get((program, op)) or op, op, module) for op, module, program in self.key_of]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(device, start ns, end ns, key) per op."""
        start = np.asarray(self.starts, dtype=np.float64).astype(np.int64)
        end = start + np.asarray(self.durations, dtype=np.float64).astype(np.int64)
        return np.asarray(self.devices, dtype=np.int64), start, end, np.asarray(self.keys, dtype=np.int64)


def _read_device_plane(plane: Any, device: int, ops: _Ops) -> None:
    for line in plane.lines:
        if line.name == "XLA Ops":
            for e in line.events:
                ops.devices.append(device)
                ops.starts.append(e.start_ns)
                ops.durations.append(e.duration_ns)
                ops.keys.append(ops.key(e.name, ""))


def _read_host_plane(plane: Any, ops: _Ops, compiles: list[tuple[int, int]], windows: list[tuple[int, int]]) -> bool:
    """Read one host plane; whether it ran device ops (XLA:CPU)."""
    ran = False
    for line in plane.lines:
        if line.name.startswith(_CPU_OP_LINES):
            ran = _read_op_line(line, ops) or ran
        elif not line.name.startswith(_RUNTIME_LINES):
            # A Python thread: where the capture's annotation and JAX's compiles are.
            for e in line.events:
                name = e.name
                if name == COMPILE_EVENT:
                    start = int(e.start_ns)
                    compiles.append((start, start + int(e.duration_ns)))
                elif name.startswith(WINDOW_PREFIX):
                    start = int(e.start_ns)
                    windows.append((start, start + int(e.duration_ns)))
    return ran


def _read_op_line(line: Any, ops: _Ops) -> bool:
    devices, starts, durations, keys = ops.devices, ops.starts, ops.durations, ops.keys
    before = len(keys)
    for e in line.events:
        if e.name.startswith(_NOT_OPS):
            continue
        # An op event has 9 stats; the 4 we need come first, and converting
        # the rest of every op's stats would be half the time of the summary.
        op = module = device = program = None
        for stat, value in e.stats:
            if stat == "hlo_op":
                op = value
            elif stat == "hlo_module":
                module = value
            elif stat == "program_id":
                program = value
            elif stat == "device_ordinal":
                device = value
                break
        if op is not None and device is not None:
            devices.append(int(device))
            starts.append(e.start_ns)
            durations.append(e.duration_ns)
            keys.append(ops.key(str(op), str(module or ""), -1 if program is None else int(program)))
    return len(keys) > before


# -- the HLO the profiler keeps: JAX's names of the ops ------------------------
# jaxlib has no Python classes for XSpace or HloProto, and ProfileData does not
# expose a plane's event metadata, where the profiler puts each program's HLO.
# The few fields read here are stable parts of tsl/profiler/protobuf/xplane.proto
# and xla/service/hlo.proto (numbers below).
_METADATA_PLANE = b"/host:metadata"


def op_names(xspace: bytes) -> dict[tuple[int, str], str]:
    """(program id, HLO instruction) -> the JAX op it came from (the instruction's ``op_name``
    metadata, e.g. ``jit(train_step)/dot_general``), from the HLO in the XSpace's metadata plane."""
    data = memoryview(xspace)
    names: dict[tuple[int, str], str] = {}
    for field, plane in _fields(data):
        if field != 1:  # XSpace.planes
            continue
        events: list[memoryview] = []
        stat_names: dict[int, bytes] = {}
        for number, value in _fields(plane):
            if number == 2 and bytes(value) != _METADATA_PLANE:  # XPlane.name
                break
            if number == 4:  # XPlane.event_metadata: map entry, value = 2
                events += [v for n, v in _fields(value) if n == 2]
            elif number == 5:  # XPlane.stat_metadata: map entry of XStatMetadata(id = 1, name = 2)
                for n, v in _fields(value):
                    if n == 2:
                        meta = dict(_fields(v))
                        stat_names[int(meta.get(1, 0))] = bytes(meta.get(2, b""))
        for event in events:
            program, hlo = None, None
            for n, stat in _fields(event):
                if n != 5:  # XEventMetadata.stats: XStat(metadata_id = 1, uint64 = 3, int64 = 4, bytes = 6)
                    continue
                values = dict(_fields(stat))
                kind = stat_names.get(int(values.get(1, 0)))
                if kind == b"program_id":
                    program = values.get(3, values.get(4))
                elif kind == b"Hlo Proto":
                    hlo = values.get(6)
            if isinstance(program, int) and hlo is not None:
                names.update(((program, op), jax_name) for op, jax_name in _hlo_op_names(hlo))
    return names


def _hlo_op_names(hlo: memoryview) -> Iterator[tuple[str, str]]:
    """(instruction, op_name) of every instruction of an HloProto that has an op_name."""
    for n, module in _fields(hlo):
        if n != 1:  # HloProto.hlo_module
            continue
        for c, computation in _fields(module):
            if c != 3:  # HloModuleProto.computations
                continue
            for i, instruction in _fields(computation):
                if i != 2:  # HloComputationProto.instructions
                    continue
                name = op_name = None
                for f, value in _fields(instruction):
                    if f == 1:  # HloInstructionProto.name
                        name = bytes(value).decode()
                    elif f == 7:  # HloInstructionProto.metadata: OpMetadata, op_name = 2
                        op_name = next((bytes(v).decode() for k, v in _fields(value) if k == 2), None)
                if name and op_name:
                    yield name, op_name


def _fields(data: memoryview) -> Iterator[tuple[int, Any]]:
    """(field number, value) of one protobuf message: an int for varint and fixed-width
    fields, a memoryview of the bytes of length-delimited ones."""
    i, end = 0, len(data)
    while i < end:
        tag, i = read_varint(data, i)
        wire = tag & 7
        value: Any
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            length, i = read_varint(data, i)
            value, i = data[i : i + length], i + length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, i = int.from_bytes(data[i : i + width], "little"), i + width
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        yield tag >> 3, value


def _union_ns(starts: np.ndarray, ends: np.ndarray, start: int, end: int) -> tuple[int, np.ndarray]:
    """Covered time of the intervals clipped to [start, end], and the lengths of the uncovered stretches."""
    if not len(starts):
        return 0, np.array([end - start] if end > start else [], dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    s = np.clip(starts[order], start, end)
    e = np.clip(ends[order], start, end)
    reach = np.maximum.accumulate(e)
    covered_to = np.maximum(np.concatenate(([start], reach[:-1])), start)  # before each interval
    hole = s > covered_to
    holes = s[hole] - covered_to[hole]
    if reach[-1] < end:
        holes = np.append(holes, end - max(int(reach[-1]), start))
    return end - start - int(holes.sum()), holes


def _self_ns(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Self time of each op of one device (sorted by start, longest first): its duration
    less that of the ops nested in it."""
    self_ns: np.ndarray = end - start
    # An op that starts after every earlier op ended nests in none and has none
    # nested in it yet: only runs of overlapping ops (rare on XLA:CPU) go
    # through the stack of enclosing ops.
    free = np.concatenate(([True], start[1:] >= np.maximum.accumulate(end)[:-1]))
    run = np.cumsum(free)
    for r in np.flatnonzero(np.bincount(run) > 1):
        members = np.flatnonzero(run == r).tolist()
        nested = dict.fromkeys(members, 0)
        stack: list[int] = []  # the ops enclosing the current one
        for i in members:
            while stack and end[stack[-1]] <= start[i]:
                stack.pop()
            if stack:
                nested[stack[-1]] += int(end[i] - start[i])
            stack.append(i)
        for i, ns in nested.items():
            self_ns[i] = max(0, int(self_ns[i]) - ns)
    return self_ns


def _summary(
    name: str,
    start: int,
    end: int,
    device: np.ndarray,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    key: np.ndarray,
    names: Sequence[tuple[str, str, str]],
    compiles: list[tuple[int, int]],
    slice_of: Mapping[int, int],
) -> Summary:
    order = np.lexsort((-end_ns, start_ns, device))  # by device, then start, longest first
    device, start_ns, end_ns, key = device[order], start_ns[order], end_ns[order], key[order]
    busy: dict[int, int] = {}
    self_ns = np.empty_like(start_ns)
    bounds = [0, *(np.flatnonzero(np.diff(device)) + 1).tolist(), len(device)]
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            busy[int(device[lo])] = _union_ns(start_ns[lo:hi], end_ns[lo:hi], start, end)[0]
            self_ns[lo:hi] = _self_ns(start_ns[lo:hi], end_ns[lo:hi])
    slices = []
    for index in sorted(set(slice_of.values())):
        members = sorted(d for d, si in slice_of.items() if si == index)
        seen = tuple(d for d in members if busy.get(d))
        mean = sum(busy.get(d, 0) for d in members) // max(1, len(members))
        slices.append(SliceBusy(index, seen, mean, tuple((d, busy.get(d, 0)) for d in members)))
    # Programs whose op has the same JAX name, XLA op and module read as one row.
    shown = list(dict.fromkeys(names))
    row = np.array([shown.index(n) for n in names], dtype=np.int64)[key] if len(key) else key
    counts = np.bincount(row, minlength=len(shown))
    totals = np.bincount(row, weights=self_ns, minlength=len(shown)).astype(np.int64)
    stride = int(device.max()) + 1 if len(device) else 1
    ran_on = np.bincount(np.unique(row * stride + device) // stride, minlength=len(shown))
    ran = np.flatnonzero(counts)
    top = ran[np.argsort(-totals[ran], kind="stable")][:TOP_OPS]
    _, holes = _union_ns(start_ns, end_ns, start, end)
    gaps = holes[holes >= GAP_MIN_NS]
    compile_spans = np.array(compiles, dtype=np.int64).reshape(-1, 2)
    compile_ns, _ = _union_ns(compile_spans[:, 0], compile_spans[:, 1], start, end)
    return Summary(
        name=name,
        wall_ns=end - start,
        slices=tuple(slices),
        top_ops=tuple(
            OpStat(shown[k][0], shown[k][1], shown[k][2], int(counts[k]), int(totals[k]), int(ran_on[k])) for k in top
        ),
        device_ns=int(self_ns.sum()),
        busy_devices=len(busy),
        compile_ns=compile_ns,
        compiles=len(compiles),
        gaps_ns=int(gaps.sum()),
        gaps=len(gaps),
        longest_gap_ns=int(gaps.max(initial=0)),
    )
