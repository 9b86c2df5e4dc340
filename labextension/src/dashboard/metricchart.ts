/**
 * One training metric against step or wall time since the run started
 * (uPlot): each run a line (the session's runs overlaid), the events of the
 * time they ran (slice loss, reshard, restore) as markers on the same axis,
 * a live legend as the readout. Focusable: the arrow keys move the readout
 * from point to point (Home/End: first/last), as the panel's chip grid does.
 */
import uPlot from 'uplot';

import { CHART_HEIGHT, SERIES_VARS, arrowIndex, chartStyle, themeKey } from './charts';
import { MARKER_KINDS, clock } from '../model/dashboardmodel';
import { MonitorEvent } from '../protocol/messages';
import { StepColumns, XAxis } from '../model/metricseries';

/** An event placed on the x-axis (`step`: its position there, a step or seconds since the run started). */
export interface StepMarker {
  step: number;
  event: MonitorEvent;
}

/** How an x value reads: "step 12", or "12.3 s" since the run started. */
function xText(axis: XAxis, x: number): string {
  return axis === 'step' ? `step ${x}` : `${x.toFixed(x < 10 ? 2 : 1)} s`;
}

export class StepChart {
  readonly node: HTMLElement;
  private _plotNode: HTMLDivElement;
  private _readout: HTMLDivElement;
  private _plot: uPlot | null = null;
  private _key = '';
  private _width = 0;
  private _markerNodes: HTMLDivElement[] = [];
  private _markers: StepMarker[] = [];
  private _index: number | null = null;
  private _height = CHART_HEIGHT;
  private _axis: XAxis = 'step';

  constructor(readonly name: string) {
    this.node = document.createElement('figure');
    this.node.className = 'jp-PathwaysDashboard-chart jp-PathwaysDashboard-metric';
    this.node.dataset.metric = name;
    this.node.setAttribute('role', 'group');
    const label = `${name} per step or wall time, each run a line`;
    this.node.setAttribute('aria-label', label);
    const caption = document.createElement('figcaption');
    caption.className = 'jp-PathwaysDashboard-chartTitle';
    caption.textContent = name;
    this._plotNode = document.createElement('div');
    this._plotNode.className = 'jp-PathwaysDashboard-plot';
    this._plotNode.setAttribute('role', 'img');
    this._plotNode.tabIndex = 0;
    this._plotNode.setAttribute(
      'aria-label',
      `${label}; arrow keys move the readout from point to point`
    );
    this._plotNode.addEventListener('keydown', event => this._onKey(event));
    this._readout = document.createElement('div');
    this._readout.className = 'jp-PathwaysDashboard-readout';
    this._readout.setAttribute('aria-live', 'polite');
    this.node.append(caption, this._plotNode, this._readout);
  }

  /** The drawn (smoothed) values of each run, for tests and the readout: uPlot's data. */
  get data(): uPlot.AlignedData | null {
    return this._plot?.data ?? null;
  }

  /** Draw `columns` (x: `axis`) with `markers` placed on that axis, at `width` x `height` CSS px. */
  render(
    columns: StepColumns,
    markers: StepMarker[],
    width: number,
    axis: XAxis = 'step',
    height = CHART_HEIGHT
  ): void {
    const key = `${columns.labels.join('\u0000')}|${axis}|${themeKey()}`;
    if (!this._plot || key !== this._key) {
      this._plot?.destroy();
      this._key = key;
      this._width = width;
      this._height = height;
      this._axis = axis;
      this._index = null;
      this._plot = this._build(columns, width);
      this._markerNodes = [];
    } else {
      if (width !== this._width || height !== this._height) {
        this._width = width;
        this._height = height;
        this._plot.setSize({ width, height });
      }
      this._plot.setData(columns.data as uPlot.AlignedData);
    }
    this.node.dataset.axis = axis;
    this.node.dataset.runs = String(columns.labels.length);
    this.node.dataset.points = String(columns.data[0].length);
    this._placeMarkers(markers);
  }

  dispose(): void {
    this._plot?.destroy();
    this._plot = null;
  }

  private _build(columns: StepColumns, width: number): uPlot {
    const { color, text, axis } = chartStyle(this.node);
    const format = (v: number | null) => (v === null ? '–' : v.toPrecision(4));
    const xAxis = this._axis;
    return new uPlot(
      {
        width,
        height: this._height,
        series: [
          {
            label: xAxis === 'step' ? 'step' : 'since start',
            value: (_u, v) => (v === null ? '–' : xText(xAxis, v))
          },
          ...columns.labels.map((label, i): uPlot.Series => ({
            label,
            stroke: color(SERIES_VARS[i % SERIES_VARS.length], text),
            width: 1.5,
            spanGaps: true,
            points: { show: false },
            value: (_u, v) => format(v)
          }))
        ],
        scales: { x: { time: false } },
        axes: [
          { ...axis, label: xAxis === 'step' ? 'step' : 'seconds since the run started' },
          { ...axis, label: this.name, size: 64, values: (_u, s) => s.map(v => format(v)) }
        ],
        legend: { show: true, live: true },
        cursor: { drag: { x: false, y: false } },
        hooks: { setCursor: [u => this._readEvent(u)] }
      },
      columns.data as uPlot.AlignedData,
      this._plotNode
    );
  }

  private _placeMarkers(markers: StepMarker[]): void {
    const plot = this._plot!;
    const steps = plot.data[0];
    const [lo, hi] = [steps[0] ?? 0, steps[steps.length - 1] ?? 0];
    const shown = markers.filter(m => m.step >= lo && m.step <= hi);
    this._markers = shown;
    while (this._markerNodes.length < shown.length) {
      const node = document.createElement('div');
      node.className = 'jp-PathwaysDashboard-marker';
      plot.over.append(node);
      this._markerNodes.push(node);
    }
    this._markerNodes.forEach((node, i) => {
      const m = shown[i];
      node.hidden = !m;
      if (m) {
        node.dataset.kind = m.event.kind;
        node.dataset.step = String(m.step);
        node.style.left = `${plot.valToPos(m.step, 'x')}px`;
        node.setAttribute('aria-label', `${m.event.kind} at step ${m.step}`);
      }
    });
  }

  /** Arrow keys move the cursor, and so the legend's readout, one point at a time. */
  private _onKey(event: KeyboardEvent): void {
    const plot = this._plot;
    const n = plot?.data[0].length ?? 0;
    if (!plot || !n) {
      return;
    }
    const next = arrowIndex(event.key, this._index, n - 1);
    if (next === null) {
      return;
    }
    event.preventDefault();
    this._index = next;
    const left = plot.valToPos(plot.data[0][next] as number, 'x');
    plot.setCursor({ left, top: this._height / 3 });
  }

  private _readEvent(u: uPlot): void {
    const idx = u.cursor.idx;
    if (idx === null || idx === undefined) {
      this._readout.textContent = '';
      return;
    }
    const x = u.data[0][idx] as number;
    const values = u.series
      .slice(1)
      .map((s, k) => {
        const v = u.data[k + 1][idx];
        return v === null || v === undefined ? null : `${s.label} ${(v as number).toPrecision(4)}`;
      })
      .filter(Boolean);
    const events = this._markers
      // Events since the point before, so wall-time positions (not on a point) are read too.
      .filter(m => m.step <= x && (idx === 0 || m.step > (u.data[0][idx - 1] as number)))
      .sort((a, b) => rank(a.event.kind) - rank(b.event.kind))
      .map(m => `${m.event.kind} at ${clock(m.event.time)}`);
    this._readout.textContent = [xText(this._axis, x), ...values, ...events].join(' · ');
  }
}

function rank(kind: string): number {
  const i = MARKER_KINDS.indexOf(kind);
  return i < 0 ? MARKER_KINDS.length : i;
}
