/**
 * One time-series chart of the dashboard, drawn by uPlot: time axis, a
 * value axis with its unit, a live legend as the hover readout (plus the
 * event under the cursor), events as markers on the time axis, drag to zoom
 * and double-click to go back to the live window (both applied to every
 * chart through `TimeWindow`).
 *
 * Colours come from JupyterLab's CSS variables (resolved to strings for the
 * canvas, again when the theme changes); markers are DOM elements styled in
 * dashboard.css, so they follow the theme by themselves.
 */
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

import { Columns, clock } from '../model/dashboardmodel';
import { eventDetails } from '../common/format';
import { MonitorEvent } from '../protocol/messages';
import {
  CHART_HEIGHT,
  PlotChart,
  SERIES_VARS,
  chartStyle,
  markerRank as rank,
  themeKey
} from './plotchart';

/** The time range every chart shows: the live window, or a zoomed range the user dragged. */
export class TimeWindow {
  zoomed: [number, number] | null = null;

  constructor(private _changed: () => void) {}

  zoom(min: number, max: number): void {
    if (max > min) {
      this.zoomed = [min, max];
      this._changed();
    }
  }

  reset(): void {
    this.zoomed = null;
    this._changed();
  }

  /** A chart's uPlot cursor and hooks on this window: drag to zoom, double-click to go back to
   * the live window; ``read`` follows the cursor. Every time chart shares them. */
  interaction(read: (u: uPlot) => void): Pick<uPlot.Options, 'cursor' | 'hooks'> {
    return {
      cursor: {
        drag: { x: true, y: false, setScale: false },
        bind: {
          dblclick: () => () => {
            this.reset();
            return null;
          }
        }
      },
      hooks: {
        setSelect: [
          u => {
            if (u.select.width > 2) {
              this.zoom(
                u.posToVal(u.select.left, 'x'),
                u.posToVal(u.select.left + u.select.width, 'x')
              );
            }
            u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          }
        ],
        setCursor: [read]
      }
    };
  }
}

export interface ChartOptions {
  /** Short title shown above the chart; with `description` it is the chart's accessible name. */
  title: string;
  description: string;
  /** Value-axis label, unit included, e.g. "utilization (%)". */
  axis: string;
  /** Readout and axis text for a value. */
  format: (value: number) => string;
  /** Axis text for a value, when it reads shorter than the readout's. */
  tick?: (value: number) => string;
  /** Fixed value range; otherwise from 0 to the largest value shown. */
  range?: [number, number];
  /** Draw the last series dashed (a capacity line). */
  lastDashed?: boolean;
  /** Scale the value axis to every series but the last (a capacity line, drawn only when in range). */
  rangeOmitsLast?: boolean;
  /** The top of the value axis while nothing is drawn yet (default 1), so its ticks read as the unit does. */
  emptyTop?: number;
  /** Tick spacings the value axis may use (uPlot's default: decimal); bytes tick in powers of two. */
  incrs?: number[];
}

/** Pixels within which the readout names the event under the cursor. */
const MARKER_HOVER_PX = 4;

export class TimeChart extends PlotChart {
  private _markers: MonitorEvent[] = [];
  private _markerNodes: HTMLDivElement[] = [];

  constructor(
    private _options: ChartOptions,
    private _window: TimeWindow
  ) {
    super({
      caption: _options.title,
      label: `${_options.title}: ${_options.description}`,
      steps: ''
    });
  }

  /**
   * Draw `columns` over `range` (kernel seconds) at `width` x `height` CSS px, with
   * `markers`. The plot is rebuilt only when its series or the theme
   * change; otherwise uPlot redraws in place, synchronously (batch).
   */
  render(
    columns: Columns,
    markers: MonitorEvent[],
    range: [number, number],
    width: number,
    height = CHART_HEIGHT
  ): void {
    const key = `${columns.labels.join('\u0000')}|${themeKey()}`;
    if (this.layout(key, width, height, () => this._build(columns, width))) {
      this._markerNodes = [];
    }
    const plot = this.plot!;
    plot.batch(() => {
      plot.setData(columns.data as uPlot.AlignedData, false);
      plot.setScale('x', { min: range[0], max: range[1] });
    });
    this._placeMarkers(markers, range);
  }

  /** Change how values read and scale (the memory chart's bytes / % of capacity); the next render rebuilds. */
  setOptions(options: Partial<ChartOptions>): void {
    this._options = { ...this._options, ...options };
    this.invalidate();
  }

  /** The value axis' current range, for tests: [min, max]. */
  get yRange(): [number, number] | null {
    const y = this.plot?.scales.y;
    return y && y.min !== undefined && y.max !== undefined ? [y.min, y.max] : null;
  }

  private _build(columns: Columns, width: number): uPlot {
    const { color, text, axis } = chartStyle(this.node);
    const o = this._options;
    const n = columns.labels.length;
    const series: uPlot.Series[] = [
      { label: 'time', value: (_u, v) => (v === null ? '–' : clock(v)) },
      ...columns.labels.map((label, i): uPlot.Series => ({
        label,
        stroke: color(SERIES_VARS[i % SERIES_VARS.length], text),
        width: 1.5,
        dash: o.lastDashed && i === n - 1 ? [6, 4] : undefined,
        spanGaps: false,
        points: { show: false },
        value: (_u, v) => (v === null ? '–' : o.format(v))
      }))
    ];
    const opts: uPlot.Options = {
      width,
      height: this.height,
      series,
      scales: {
        x: { time: true },
        y: {
          range:
            o.range ??
            ((u, _min, max) => {
              const top = o.rangeOmitsLast ? largest(u.data.slice(1, -1)) : max;
              return [0, top > 0 ? top * 1.1 : (o.emptyTop ?? 1)];
            })
        }
      },
      axes: [
        // Clock time of day, not uPlot's dates ("12/4/26 8:43pm"): the window is minutes long.
        { ...axis, space: 80, values: (_u, splits) => clockTicks(splits) },
        {
          ...axis,
          label: o.axis,
          size: 72,
          incrs: o.incrs,
          values: (_u, splits) => splits.map(v => (o.tick ?? o.format)(v))
        }
      ],
      legend: { show: true, live: true },
      ...this._window.interaction(u => this._readEvent(u))
    };
    return new uPlot(opts, columns.data as uPlot.AlignedData, this.plotNode);
  }

  /** Markers are thin DOM lines over the plot area, one per event in range, reused between frames. */
  private _placeMarkers(markers: MonitorEvent[], range: [number, number]): void {
    const plot = this.plot!;
    const over = plot.over;
    // The most telling kinds last, so they are drawn on top (a loss over the snapshots around it).
    const shown = markers
      .filter(e => e.time >= range[0] && e.time <= range[1])
      .sort((a, b) => rank(b.kind) - rank(a.kind));
    this._markers = shown;
    while (this._markerNodes.length < shown.length) {
      const node = document.createElement('div');
      node.className = 'jp-PathwaysDashboard-marker';
      over.append(node);
      this._markerNodes.push(node);
    }
    this._markerNodes.forEach((node, i) => {
      const e = shown[i];
      if (!e) {
        node.hidden = true;
        return;
      }
      node.hidden = false;
      node.dataset.kind = e.kind;
      node.dataset.seq = String(e.seq);
      node.style.left = `${plot.valToPos(e.time, 'x')}px`;
      node.setAttribute('aria-label', `${e.kind} at ${clock(e.time)}`);
    });
  }

  /**
   * The readout under the chart names the event under the cursor (within a
   * few pixels): the most telling kind first (a slice loss before the
   * snapshots around it), then the nearest, and how many others are there.
   */
  private _readEvent(u: uPlot): void {
    const left = u.cursor.left ?? -1;
    const near =
      left < 0
        ? []
        : this._markers
            .map(e => ({ e, d: Math.abs(u.valToPos(e.time, 'x') - left) }))
            .filter(m => m.d <= MARKER_HOVER_PX)
            .sort((a, b) => rank(a.e.kind) - rank(b.e.kind) || a.d - b.d);
    const first = near[0]?.e;
    const more = near.length > 1 ? ` (+${near.length - 1} more here)` : '';
    this.readout.textContent = first
      ? `${clock(first.time)} ${first.kind} · ${eventDetails(first)}${more}`
      : '';
  }
}

/** Time-axis ticks as clock time: "20:43" when every tick is on a whole minute, else "20:43:10". */
export function clockTicks(splits: readonly number[]): string[] {
  const parts = splits.map(v => {
    const d = new Date(v * 1000);
    return [d.getHours(), d.getMinutes(), d.getSeconds()].map(n => String(n).padStart(2, '0'));
  });
  const minutes = parts.every(p => p[2] === '00');
  return parts.map(p => (minutes ? p.slice(0, 2) : p).join(':'));
}

/** Byte ticks on a chart axis: powers of two, read without a needless ".0" ("256 MiB", "1 GiB"). */
export const BYTE_INCRS = Array.from({ length: 51 }, (_, k) => 2 ** k);

/** The largest value in `columns` (nulls skipped), or 0. */
function largest(columns: readonly ArrayLike<number | null | undefined>[]): number {
  let top = 0;
  for (const column of columns) {
    for (let i = 0; i < column.length; i++) {
      const v = column[i];
      if (v !== null && v !== undefined && v > top) {
        top = v;
      }
    }
  }
  return top;
}
