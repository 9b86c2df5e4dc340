/**
 * One training metric against step or wall time since the run started
 * (uPlot): each run picked a line (the session's runs overlaid), the events of the
 * time they ran (slice loss, reshard, restore) as markers on the same axis,
 * a live legend as the readout. Focusable: the arrow keys move the readout
 * from point to point (Home/End: first/last), as the panel's chip grid does.
 */
import uPlot from 'uplot';

import {
  CHART_HEIGHT,
  PlotChart,
  SERIES_VARS,
  chartStyle,
  formatSeconds,
  markerRank as rank,
  themeKey
} from './plotchart';
import { clock } from '../model/dashboardmodel';
import { MonitorEvent } from '../protocol/messages';
import { StepColumns, XAxis } from '../model/metricseries';

/** An event placed on the x-axis (`step`: its position there, a step or seconds since the run started). */
export interface StepMarker {
  step: number;
  event: MonitorEvent;
}

/** Tick spacings of the step axis: 1, 2, 5, 10, 20, 50, ... steps. */
const STEP_INCRS = Array.from({ length: 24 }, (_, k) => [1, 2, 5][k % 3] * 10 ** Math.floor(k / 3));

/** How an x value reads: "step 12", or "12.3 s" since the run started. */
function xText(axis: XAxis, x: number): string {
  return axis === 'step' ? `step ${x}` : formatSeconds(x);
}

export class StepChart extends PlotChart {
  private _markerNodes: HTMLDivElement[] = [];
  private _markers: StepMarker[] = [];
  private _axis: XAxis = 'step';

  constructor(readonly name: string) {
    super({
      caption: name,
      label: `${name} per step or wall time, each run a line`,
      steps: 'from point to point'
    });
    this.node.classList.add('jp-PathwaysDashboard-metric');
    this.node.dataset.metric = name;
  }

  /** The drawn (smoothed) values of each run, for tests and the readout: uPlot's data. */
  get data(): uPlot.AlignedData | null {
    return this.plot?.data ?? null;
  }

  /** Draw `columns` (x: `axis`) with `markers` placed on that axis, at `width` x `height` CSS px. */
  render(
    columns: StepColumns,
    markers: StepMarker[],
    width: number,
    axis: XAxis = 'step',
    height = CHART_HEIGHT
  ): void {
    const key = `${columns.labels.join('\u0000')}|${columns.colors?.join(',')}|${axis}|${themeKey()}`;
    const build = () => {
      this._axis = axis;
      return this._build(columns, width);
    };
    if (this.layout(key, width, height, build)) {
      this._markerNodes = [];
    } else {
      this.plot!.setData(columns.data as uPlot.AlignedData);
    }
    this.node.dataset.axis = axis;
    this.node.dataset.runs = String(columns.labels.length);
    this.node.dataset.points = String(columns.data[0].length);
    this._placeMarkers(markers);
  }

  private _build(columns: StepColumns, width: number): uPlot {
    const { color, text, axis } = chartStyle(this.node);
    const format = (v: number | null) => (v === null ? '–' : v.toPrecision(4));
    const xAxis = this._axis;
    return new uPlot(
      {
        width,
        height: this.height,
        series: [
          {
            label: xAxis === 'step' ? 'step' : 'since start',
            value: (_u, v) => (v === null ? '–' : xText(xAxis, v))
          },
          ...columns.labels.map((label, i): uPlot.Series => ({
            label,
            // The run's colour by its place among the runs shown, as its swatch in the run picker.
            stroke: color(SERIES_VARS[(columns.colors?.[i] ?? i) % SERIES_VARS.length], text),
            width: 1.5,
            spanGaps: true,
            points: { show: false },
            value: (_u, v) => format(v)
          }))
        ],
        scales: { x: { time: false } },
        axes: [
          {
            ...axis,
            label: xAxis === 'step' ? 'step' : 'seconds since the run started',
            // Steps are whole: no "2.5" between step 2 and 3.
            incrs: xAxis === 'step' ? STEP_INCRS : undefined
          },
          { ...axis, label: this.name, size: 64, values: (_u, s) => s.map(v => format(v)) }
        ],
        legend: { show: true, live: true },
        cursor: { drag: { x: false, y: false } },
        hooks: { setCursor: [u => this._readEvent(u)] }
      },
      columns.data as uPlot.AlignedData,
      this.plotNode
    );
  }

  private _placeMarkers(markers: StepMarker[]): void {
    const plot = this.plot!;
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

  private _readEvent(u: uPlot): void {
    const idx = u.cursor.idx;
    if (idx === null || idx === undefined) {
      this.readout.textContent = '';
      return;
    }
    const x = u.data[0][idx];
    const values = u.series
      .slice(1)
      .map((s, k) => {
        const v = u.data[k + 1][idx];
        const label = typeof s.label === 'string' ? s.label : '';
        return v === null || v === undefined ? null : `${label} ${v.toPrecision(4)}`;
      })
      .filter(Boolean);
    const events = this._markers
      // Events since the point before, so wall-time positions (not on a point) are read too.
      .filter(m => m.step <= x && (idx === 0 || m.step > u.data[0][idx - 1]))
      .sort((a, b) => rank(a.event.kind) - rank(b.event.kind))
      .map(m => `${m.event.kind} at ${clock(m.event.time)}`);
    this.readout.textContent = [xText(this._axis, x), ...values, ...events].join(' · ');
  }
}
