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
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pathways_kernel.core.display import TextDisplay

#: The TraceAnnotation a capture wraps its body in; its span is the window.
WINDOW_PREFIX = "pathways.profile:"
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
    name: str
    module: str
    occurrences: int
    self_ns: int


@dataclasses.dataclass(frozen=True)
class SliceBusy:
    index: int
    devices: tuple[int, ...]  # device ids seen busy in the trace
    busy_ns: int  # mean over the slice's devices

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
        if self.top_ops:
            lines.append("  top ops by self time:")
            for op in self.top_ops:
                lines.append(
                    f"    {_ms(op.self_ns):>10}  {_share(op.self_ns, self.device_ns):>4}  {op.occurrences:>6}x  "
                    f"{op.name}  ({op.module})"
                )
        else:
            lines.append("  no device ops ran inside the capture")
        return "\n".join(lines)

    def html_rows(self) -> str:
        """The summary's tables, for a capture's HTML view."""
        head = (
            f"wall <b>{_ms(self.wall_ns)}</b> · compile <b>{_ms(self.compile_ns)}</b> ({self.compiles}×) · "
            f"host gaps <b>{_ms(self.gaps_ns)}</b> ({self.gaps}, longest {_ms(self.longest_gap_ns)})"
        )
        slices = "".join(
            f"<tr><td>slice {s.index}</td><td>{_ms(s.busy_ns)}</td><td>{s.fraction(self.wall_ns):.0%}</td>"
            f"<td>{html.escape(_ids(s.devices))}</td></tr>"
            for s in self.slices
        )
        ops = "".join(
            f"<tr><td>{html.escape(op.name)}</td><td>{html.escape(op.module)}</td><td>{op.occurrences}</td>"
            f"<td>{_ms(op.self_ns)}</td><td>{_share(op.self_ns, self.device_ns)}</td></tr>"
            for op in self.top_ops
        )
        return (
            f"<div>{head}</div>"
            "<table class='pathways-profile-slices'><thead><tr><th>slice</th><th>busy per device</th><th>of wall</th>"
            f"<th>devices</th></tr></thead><tbody>{slices}</tbody></table>"
            "<table class='pathways-profile-ops'><thead><tr><th>op</th><th>module</th><th>count</th><th>self time</th>"
            f"<th>share</th></tr></thead><tbody>{ops or '<tr><td colspan=5>no device ops</td></tr>'}</tbody></table>"
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
    for data in xspaces:
        for plane in ProfileData.from_serialized_xspace(data).planes:
            match = _DEVICE_PLANE.match(plane.name)
            if match:
                _read_device_plane(plane, int(match.group(1)), ops)
            elif plane.name.startswith("/host:"):
                _read_host_plane(plane, ops, compiles, windows)
    device, start_ns, end_ns, key = ops.arrays()
    if windows:
        start, end = min(w[0] for w in windows), max(w[1] for w in windows)
    elif len(device):
        start, end = int(start_ns.min()), int(end_ns.max())
    else:
        start = end = 0
    inside = (end_ns > start) & (start_ns < end)
    in_window = [c for c in compiles if c[0] < end and c[1] > start]
    return _summary(
        name, start, end, device[inside], start_ns[inside], end_ns[inside], key[inside], ops.names, in_window, slice_of
    )


class _Ops:
    """Ops as columns, their (op, module) names interned, for numpy: a 10 s capture on the
    emulated devices holds 50,000-100,000 ops, whose sums in Python took half the summary's time."""

    def __init__(self) -> None:
        self.devices: list[int] = []
        self.starts: list[float] = []
        self.durations: list[float] = []
        self.keys: list[int] = []
        self.key_of: dict[tuple[str, str], int] = {}

    def key(self, name: str, module: str) -> int:
        key = self.key_of.get((name, module))
        if key is None:
            key = self.key_of[name, module] = len(self.key_of)
        return key

    @property
    def names(self) -> list[tuple[str, str]]:
        return list(self.key_of)

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


def _read_host_plane(plane: Any, ops: _Ops, compiles: list[tuple[int, int]], windows: list[tuple[int, int]]) -> None:
    for line in plane.lines:
        if line.name.startswith(_CPU_OP_LINES):
            _read_op_line(line, ops)
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


def _read_op_line(line: Any, ops: _Ops) -> None:
    devices, starts, durations, keys = ops.devices, ops.starts, ops.durations, ops.keys
    for e in line.events:
        if e.name.startswith(_NOT_OPS):
            continue
        # An op event has 9 stats; the 3 we need come first, and converting
        # the rest of every op's stats would be half the time of the summary.
        op = module = device = None
        for stat, value in e.stats:
            if stat == "hlo_op":
                op = value
            elif stat == "hlo_module":
                module = value
            elif stat == "device_ordinal":
                device = value
            if op is not None and module is not None and device is not None:
                break
        if op is not None and device is not None:
            devices.append(int(device))
            starts.append(e.start_ns)
            durations.append(e.duration_ns)
            keys.append(ops.key(str(op), str(module or "")))


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
    names: Sequence[tuple[str, str]],
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
        members = [d for d, si in slice_of.items() if si == index]
        seen = tuple(sorted(d for d in members if busy.get(d)))
        mean = sum(busy.get(d, 0) for d in members) // max(1, len(members))
        slices.append(SliceBusy(index, seen, mean))
    counts = np.bincount(key, minlength=len(names))
    totals = np.bincount(key, weights=self_ns, minlength=len(names)).astype(np.int64)
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
        top_ops=tuple(OpStat(names[k][0], names[k][1], int(counts[k]), int(totals[k])) for k in top),
        device_ns=int(self_ns.sum()),
        compile_ns=compile_ns,
        compiles=len(compiles),
        gaps_ns=int(gaps.sum()),
        gaps=len(gaps),
        longest_gap_ns=int(gaps.max(initial=0)),
    )
