"""The slice health check: which slices answer a computation right now.

It is pathwaysutils' own check (``elastic.get_active_slice_indices``: a tiny
``pmap`` dispatched on each slice, errors classified by
``is_error_due_to_slice_down``), given the session's slice map because CPU
devices carry no ``slice_index``. On the embedded backend a slice lost with
``fail_slice`` fails it exactly as a lost Pathways slice does, until
``repair_slice``.
"""

from __future__ import annotations

import dataclasses
import html
import time

from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.sessions import session


@dataclasses.dataclass(frozen=True)
class Health(TextDisplay):
    """The check's answer per slice, beside the state the session records."""

    healthy: tuple[int, ...]
    states: tuple[tuple[int, str], ...]  # (slice index, session state)
    duration_s: float

    @property
    def unhealthy(self) -> tuple[int, ...]:
        return tuple(i for i, _ in self.states if i not in self.healthy)

    def rows(self) -> list[tuple[int, str, str]]:
        out = []
        for index, state in self.states:
            reported = "up" if index in self.healthy else "down"
            note = "" if reported == state else f"session marks it {state}"
            out.append((index, reported, note))
        return out

    def to_text(self) -> str:
        lines = [f"slice {i}: {reported}" + (f"  ({note})" if note else "") for i, reported, note in self.rows()]
        lines.append(
            f"{len(self.healthy)}/{len(self.states)} slices healthy (checked in {self.duration_s * 1000:.0f} ms)"
        )
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{i}</td><td>{reported}</td><td>{html.escape(note)}</td></tr>" for i, reported, note in self.rows()
        )
        return (
            '<table class="pathways-health"><thead><tr><th>slice</th><th>health</th><th></th></tr></thead>'
            f"<tbody>{rows}</tbody></table><div>{len(self.healthy)}/{len(self.states)} slices healthy "
            f"(checked in {self.duration_s * 1000:.0f} ms)</div>"
        )


def health() -> Health:
    """Run the health check on every slice of the session (any backend)."""
    from pathwaysutils.elastic import elastic

    topology = session().topology
    start = time.perf_counter()
    healthy = elastic.get_active_slice_indices({s.index: s.devices for s in topology.slices})
    return Health(
        tuple(sorted(healthy)), tuple((s.index, s.state) for s in topology.slices), time.perf_counter() - start
    )
