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

import collections
import dataclasses
import html
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pathways_kernel.core.display import TextDisplay

#: The TraceAnnotation a capture wraps its body in; its span is the window.
WINDOW_PREFIX = "pathways.profile:"
#: JAX's trace event for compiling one computation (any backend).
COMPILE_EVENT = "backend_compile_and_load"
#: A stretch with no device busy shorter than this is dispatch jitter, not a gap.
GAP_MIN_NS = 1_000_000
#: Rows in the top-ops table.
TOP_OPS = 10

#: One op run on one device: (device id, start ns, end ns, op name, module name).
Op = tuple[int, int, int, str, str]

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

    ops: list[Op] = []
    compiles: list[tuple[int, int]] = []
    windows: list[tuple[int, int]] = []
    for data in xspaces:
        for plane in ProfileData.from_serialized_xspace(data).planes:
            match = _DEVICE_PLANE.match(plane.name)
            if match:
                ops.extend(_device_plane_ops(plane, int(match.group(1))))
            elif plane.name.startswith("/host:"):
                _read_host_plane(plane, ops, compiles, windows)
    if windows:
        start, end = min(w[0] for w in windows), max(w[1] for w in windows)
    elif ops:
        start, end = min(o[1] for o in ops), max(o[2] for o in ops)
    else:
        start = end = 0
    ops = [o for o in ops if o[2] > start and o[1] < end]
    return _summary(name, start, end, ops, [c for c in compiles if c[0] < end and c[1] > start], slice_of)


def _device_plane_ops(plane: Any, device: int) -> Iterable[Op]:
    for line in plane.lines:
        if line.name == "XLA Ops":
            for e in line.events:
                start = int(e.start_ns)
                yield device, start, start + int(e.duration_ns), e.name, ""


def _read_host_plane(
    plane: Any, ops: list[Op], compiles: list[tuple[int, int]], windows: list[tuple[int, int]]
) -> None:
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


def _read_op_line(line: Any, ops: list[Op]) -> None:
    for e in line.events:
        if e.name.startswith(_NOT_OPS):
            continue
        stats = dict(e.stats)
        if "device_ordinal" in stats and "hlo_op" in stats:
            start = int(e.start_ns)
            ops.append(
                (
                    int(stats["device_ordinal"]),
                    start,
                    start + int(e.duration_ns),
                    str(stats["hlo_op"]),
                    str(stats.get("hlo_module", "")),
                )
            )


def _union_ns(intervals: Iterable[tuple[int, int]], start: int, end: int) -> tuple[int, list[tuple[int, int]]]:
    """Covered time of ``intervals`` clipped to [start, end], and the uncovered stretches."""
    covered, holes, cursor = 0, [], start
    for s, e in sorted(intervals):
        s, e = max(s, start), min(e, end)
        if e <= cursor:
            continue
        if s > cursor:
            holes.append((cursor, s))
            cursor = s
        covered += e - cursor
        cursor = e
    if cursor < end:
        holes.append((cursor, end))
    return covered, holes


def _self_times(ops: list[Op]) -> dict[tuple[str, str], list[int]]:
    """(op, module) -> [occurrences, self ns]; an op's self time excludes ops nested in it on its device."""
    totals: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    by_device: dict[int, list[Op]] = collections.defaultdict(list)
    for op in ops:
        by_device[op[0]].append(op)
    for device_ops in by_device.values():
        device_ops.sort(key=lambda o: (o[1], -o[2]))
        stack: list[_Frame] = []  # the ops enclosing the current one
        for _, start, end, name, module in device_ops:
            while stack and stack[-1].end <= start:
                _close(stack.pop(), stack, totals)
            stack.append(_Frame(end, (name, module), end - start))
        while stack:
            _close(stack.pop(), stack, totals)
    return totals


@dataclasses.dataclass
class _Frame:
    end: int
    key: tuple[str, str]
    duration: int
    children: int = 0


def _close(frame: _Frame, stack: list[_Frame], totals: dict[tuple[str, str], list[int]]) -> None:
    totals[frame.key][0] += 1
    totals[frame.key][1] += max(0, frame.duration - frame.children)
    if stack:
        stack[-1].children += frame.duration


def _summary(
    name: str, start: int, end: int, ops: list[Op], compiles: list[tuple[int, int]], slice_of: Mapping[int, int]
) -> Summary:
    per_device: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for device, s, e, _, _ in ops:
        per_device[device].append((s, e))
    busy = {d: _union_ns(iv, start, end)[0] for d, iv in per_device.items()}
    slices = []
    for index in sorted(set(slice_of.values())):
        members = [d for d, si in slice_of.items() if si == index]
        seen = tuple(sorted(d for d in members if busy.get(d)))
        mean = sum(busy.get(d, 0) for d in members) // max(1, len(members))
        slices.append(SliceBusy(index, seen, mean))
    totals = _self_times(ops)
    top = sorted(totals.items(), key=lambda kv: -kv[1][1])[:TOP_OPS]
    _, holes = _union_ns([(s, e) for _, s, e, _, _ in ops], start, end)
    gaps = [h[1] - h[0] for h in holes if h[1] - h[0] >= GAP_MIN_NS]
    compile_ns, _ = _union_ns(compiles, start, end)
    return Summary(
        name=name,
        wall_ns=end - start,
        slices=tuple(slices),
        top_ops=tuple(OpStat(n, m, count, self_ns) for (n, m), (count, self_ns) in top),
        device_ns=sum(v[1] for v in totals.values()),
        compile_ns=compile_ns,
        compiles=len(compiles),
        gaps_ns=sum(gaps),
        gaps=len(gaps),
        longest_gap_ns=max(gaps, default=0),
    )
