/**
 * One training metric against step (uPlot): each run a line (the session's
 * runs overlaid), the events of the time they ran (slice loss, reshard,
 * restore) as markers on the same step axis, a live legend as the readout.
 * Focusable: the arrow keys move the readout from step to step (Home/End:
 * first/last), as the panel's chip grid does.
 */
import uPlot from 'uplot';

import { MARKER_KINDS, clock } from './dashboardmodel';
import { MonitorEvent } from './protocol';
import { StepColumns } from './metricseries';

const SERIES_VARS = [
  '--jp-brand-color1',
  '--jp-warn-color1',
  '--jp-success-color1',
  '--jp-accent-color1',
  '--jp-brand-color3',
  '--jp-warn-color3'
];

/** An event placed on the step axis. */
export interface StepMarker {
  step: number;
  event: MonitorEvent;
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

  constructor(
    readonly name: string,
    private _height = 170
  ) {
    this.node = document.createElement('figure');
    this.node.className = 'jp-PathwaysDashboard-chart jp-PathwaysDashboard-metric';
    this.node.dataset.metric = name;
    this.node.setAttribute('role', 'group');
    const label = `${name} per step, each run a line`;
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
      `${label}; arrow keys move the readout from step to step`
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

  render(columns: StepColumns, markers: StepMarker[], width: number): void {
    const key = `${columns.labels.join('\u0000')}|${document.body.dataset.jpThemeName ?? ''}`;
    if (!this._plot || key !== this._key) {
      this._plot?.destroy();
      this._key = key;
      this._width = width;
      this._plot = this._build(columns, width);
      this._markerNodes = [];
    } else {
      if (width !== this._width) {
        this._width = width;
        this._plot.setSize({ width, height: this._height });
      }
      this._plot.setData(columns.data as uPlot.AlignedData);
    }
    this.node.dataset.runs = String(columns.labels.length);
    this.node.dataset.points = String(columns.data[0].length);
    this._placeMarkers(markers);
  }

  dispose(): void {
    this._plot?.destroy();
    this._plot = null;
  }

  private _build(columns: StepColumns, width: number): uPlot {
    const style = getComputedStyle(this.node);
    const color = (name: string, fallback: string) =>
      style.getPropertyValue(name).trim() || fallback;
    const text = color('--jp-ui-font-color2', '#757575');
    const grid = color('--jp-border-color2', '#e0e0e0');
    const font = `${Math.round(0.85 * parseFloat(style.fontSize) || 11)}px ${color('--jp-ui-font-family', 'sans-serif')}`;
    const format = (v: number | null) => (v === null ? '–' : v.toPrecision(4));
    const axis = {
      stroke: text,
      font,
      labelFont: font,
      grid: { stroke: grid, width: 1 },
      ticks: { stroke: grid }
    };
    return new uPlot(
      {
        width,
        height: this._height,
        series: [
          { label: 'step', value: (_u, v) => (v === null ? '–' : String(v)) },
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
          { ...axis, label: 'step' },
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

  /** Arrow keys move the cursor, and so the legend's readout, one step at a time. */
  private _onKey(event: KeyboardEvent): void {
    const plot = this._plot;
    const n = plot?.data[0].length ?? 0;
    if (!plot || !n) {
      return;
    }
    const last = n - 1;
    const i = this._index ?? last;
    const next =
      event.key === 'ArrowLeft'
        ? Math.max(0, i - 1)
        : event.key === 'ArrowRight'
          ? Math.min(last, i + 1)
          : event.key === 'Home'
            ? 0
            : event.key === 'End'
              ? last
              : null;
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
    const step = u.data[0][idx] as number;
    const values = u.series
      .slice(1)
      .map((s, k) => {
        const v = u.data[k + 1][idx];
        return v === null || v === undefined ? null : `${s.label} ${(v as number).toPrecision(4)}`;
      })
      .filter(Boolean);
    const events = this._markers
      .filter(m => m.step === step)
      .sort((a, b) => rank(a.event.kind) - rank(b.event.kind))
      .map(m => `${m.event.kind} at ${clock(m.event.time)}`);
    this._readout.textContent = [`step ${step}`, ...values, ...events].join(' · ');
  }
}

function rank(kind: string): number {
  const i = MARKER_KINDS.indexOf(kind);
  return i < 0 ? MARKER_KINDS.length : i;
}
