"""The notebook dashboard of ``%pathways monitor`` / ``pw.monitor()`` (ipywidgets).

Per-slice utilization and memory, slice states and the last events, fed by the
session's telemetry hub: the hub thread updates the widgets, so the dashboard
keeps moving while later cells run. Showing a new dashboard closes the oldest
once ``MAX_DASHBOARDS`` are live, so re-running the cell does not pile up
subscriptions.

After a kernel restart JupyterLab keeps the views of a dead kernel's widgets
(it drops their comms on its side first, so nothing the kernel sends at
shutdown reaches them) and ipywidgets marks each one broken. The dashboard's
root carries the class ``pathways-monitor``: the extension's stylesheet then
shows one line saying the monitor stopped instead of frozen numbers. The
output also carries a static HTML snapshot (``text/html``) for what renders
the saved notebook without a kernel (nbconvert, GitHub).
"""

from __future__ import annotations

import collections
import html
import threading
import time
from typing import Any

from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.core.eventlog import Event, EventTable, format_bytes, row_text
from pathways_kernel.core.slices import Topology
from pathways_kernel.core.text import count
from pathways_kernel.monitoring import telemetry

MAX_DASHBOARDS = 4
#: Slices drawn one row each; beyond this the dashboard shows totals only.
MAX_SLICE_ROWS = 64

_live: collections.deque[Dashboard] = collections.deque()
_live_lock = threading.Lock()


#: Newest events the widget folds its rows from.
FOLD_WINDOW = 500


class Dashboard:
    """A live ipywidgets view of the telemetry hub; display it, ``close()`` it when done."""

    def __init__(self, hub: telemetry.TelemetryHub, rate: float | None = None, events: int = 8):
        import ipywidgets as w

        self.hub = hub
        self._w = w
        self._lock = threading.Lock()
        # Rows shown; events kept to fold from (a snapshot every few steps is one row with its count).
        self._shown = max(1, events)
        self._events: collections.deque[Event] = collections.deque(
            hub.session.events.last(FOLD_WINDOW), maxlen=FOLD_WINDOW
        )
        self.header = w.HTML()
        self.rows = w.VBox()
        self.event_list = w.HTML()
        self.widget = w.VBox(
            [self.header, self.rows, w.HTML("<b>Last events</b>"), self.event_list],
            layout=w.Layout(border="1px solid var(--jp-border-color2, #ccc)", padding="6px"),
        )
        self.widget.add_class("pathways-monitor")
        self._bars: dict[int, tuple[Any, Any, Any]] = {}
        self._topology = hub.layout.topology
        self._build_rows(self._topology)
        self._render_events()
        self._render_header(None)
        self.updates = 0
        self._sub = hub.subscribe(self._on_metrics, self._on_event, self._on_topology, self._on_hub_close, rate=rate)

    # -- rendering ------------------------------------------------------------------
    def _build_rows(self, topology: Topology) -> None:
        w = self._w
        rows, self._bars = [], {}
        for s in topology.slices[:MAX_SLICE_ROWS]:
            state = w.HTML(_state_html(s.up))
            bar = w.FloatProgress(
                value=0.0,
                min=0.0,
                max=1.0,
                description=f"slice {s.index}",
                bar_style="" if s.up else "danger",
                layout=w.Layout(width="320px"),
            )
            label = w.Label("-")
            self._bars[s.index] = (state, bar, label)
            rows.append(w.HBox([bar, state, label]))
        if len(topology.slices) > MAX_SLICE_ROWS:
            rows.append(w.HTML(f"<i>{len(topology.slices) - MAX_SLICE_ROWS} more slices (totals in the header)</i>"))
        self.rows.children = rows

    def _render_header(self, m: telemetry.Metrics | None) -> None:
        t = self._topology
        session = self.hub.session
        parts = [
            f"<b>Pathways</b> {html.escape(session.backend.spec)}",
            f"{len(t.up_slices)}/{len(t.slices)} slices up",
            count(len(t.chips), "chip"),
        ]
        if m is not None:
            parts.append(f"utilization {m.total_utilization:.0%}")
            parts.append(f"memory {format_bytes(m.memory_bytes)}")
            parts.append(f"measured by {html.escape(m.source)}")  # with its resolution: "Cloud Monitoring, 60 s"
            parts.append(f"<span style='opacity:.6'>{time.strftime('%H:%M:%S', time.localtime(m.time))}</span>")
        self.header.value = " · ".join(parts)

    def _render_events(self) -> None:
        with self._lock:
            events = list(self._events)
        if not events:
            self.event_list.value = "<i>no events yet</i>"
            return
        rows = EventTable(events, last=self._shown).rows
        lines = "".join(f"<div>{html.escape(row_text(r))}</div>" for r in reversed(rows))
        self.event_list.value = (
            f"<div style='font-family:var(--jp-code-font-family,monospace);font-size:11px'>{lines}</div>"
        )

    # -- hub callbacks (hub thread) ------------------------------------------------
    def _on_metrics(self, m: telemetry.Metrics) -> None:
        for s in m.slices:
            row = self._bars.get(s.index)
            if row is None:
                continue
            _, bar, label = row
            value = round(s.utilization, 3)
            if bar.value != value:
                bar.value = value
            limit = f" / {format_bytes(s.memory_limit_bytes)}" if s.memory_limit_bytes else ""
            text = f"{s.utilization:4.0%}  {format_bytes(s.memory_bytes)}{limit}"
            if label.value != text:
                label.value = text
        self._render_header(m)
        self.updates += 1

    def _on_event(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
        self._render_events()

    def _on_topology(self, topology: Topology, seq: int) -> None:
        self._topology = topology
        for s in topology.slices[:MAX_SLICE_ROWS]:
            row = self._bars.get(s.index)
            if row is None:
                continue
            state, bar, _ = row
            state.value = _state_html(s.up)
            bar.bar_style = "" if s.up else "danger"
        self._render_header(self.hub.latest())

    def _on_hub_close(self) -> None:
        self.header.value += " · <b>session replaced: run %pathways monitor again</b>"

    # -- lifecycle ------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._sub.closed

    def close(self) -> None:
        """Stop updating and close the widgets."""
        self._sub.close()
        _close_tree(self.widget)
        with _live_lock:
            if self in _live:
                _live.remove(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):
            bundle = {**bundle, "text/html": self.snapshot_html()}
        return bundle

    def snapshot_html(self) -> str:
        """The dashboard as it reads now, as static HTML (what the saved notebook shows without a kernel)."""
        rows = "".join(
            f"<tr><td>slice {s.index}</td><td>{_state_html(s.up)}</td>"
            f"<td>{html.escape(self._bars[s.index][2].value) if s.index in self._bars else ''}</td></tr>"
            for s in self._topology.slices[:MAX_SLICE_ROWS]
        )
        return (
            "<div class='pathways-monitor-snapshot'>"
            f"<div>{self.header.value}</div>"
            f"<table>{rows}</table>"
            f"<div><b>Last events</b></div>{self.event_list.value}"
            "<div style='opacity:.6'><i>Snapshot when shown; the live monitor needs its kernel.</i></div>"
            "</div>"
        )


def _close_tree(widget: Any) -> None:
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


def _state_html(up: bool) -> str:
    if up:
        return "<span style='color:var(--jp-success-color1,#388e3c)'>up</span>"
    return "<b style='color:var(--jp-error-color1,#d32f2f)'>DOWN</b>"


def monitor(rate: float | None = None, events: int = 8, sample_hz: float | None = None) -> Dashboard:
    """A live dashboard of the session: per-slice utilization and memory, slice states, last events.

    Args:
      rate: updates per second (default: the hub's publish rate, 2 Hz).
      events: how many recent events to list.
      sample_hz: also set the hub's sampling rate (default 4 Hz).

    Raises:
      PathwaysError: bad rates, or ipywidgets is missing.
    """
    if rate is not None and not 0 < rate <= 10:
        raise PathwaysError(f"rate must be within (0, 10] updates per second, got {rate}")
    if events < 1:
        raise PathwaysError(f"events must be >= 1, got {events}")
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        raise PathwaysError("the notebook monitor needs ipywidgets: pip install ipywidgets") from None
    hub = telemetry.hub()
    if sample_hz is not None:
        hub.configure(sample_hz=sample_hz)
    dashboard = Dashboard(hub, rate, events)
    with _live_lock:
        _live.append(dashboard)
        excess = list(_live)[: max(0, len(_live) - MAX_DASHBOARDS)]
    for old in excess:
        old.close()
    return dashboard


def live_dashboards() -> int:
    with _live_lock:
        return len(_live)
