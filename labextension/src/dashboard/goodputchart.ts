/**
 * A finished run's goodput over time, charted (uPlot) against seconds since
 * the run started: each interval's time by category stacked to 100 %
 * (productive at the bottom), or the mean step time per interval with a
 * one-standard-deviation band. Colours are JupyterLab theme variables,
 * resolved again when the theme changes. Focusable: the arrow keys move the
 * readout from interval to interval (Home/End: first/last), as on the other charts.
 */
import uPlot from 'uplot';

import { CHART_HEIGHT, PlotChart, chartStyle, formatSeconds, themeKey } from './plotchart';
import { parseColor } from '../common/colors';
import { GoodputColumns, StepTimeColumns } from '../model/goodputseries';

/** Colour per category: productive in the theme's success colour, badput in the others. */
const CATEGORY_VARS: Record<string, string> = {
  productive: '--jp-success-color1',
  compile: '--jp-warn-color1',
  data_wait: '--jp-brand-color3',
  snapshot_stall: '--jp-brand-color1',
  checkpoint_save: '--jp-brand-color0',
  recovery: '--jp-error-color1',
  redone: '--jp-error-color3',
  slice_wait: '--jp-warn-color3',
  scale_up: '--jp-brand-color2',
  other: '--jp-layout-color4'
};

/** What an interval chart draws. */
export type IntervalData =
  { kind: 'stacked'; columns: GoodputColumns } | { kind: 'band'; columns: StepTimeColumns };

export class IntervalChart extends PlotChart {
  private _data: IntervalData | null = null;

  constructor(
    readonly title: string,
    description: string
  ) {
    super({
      caption: title,
      label: `${title}: ${description}`,
      steps: 'from interval to interval'
    });
  }

  /** Draw `data` at `width` x `height` CSS px; rebuilt when its series, the run or the theme change. */
  render(data: IntervalData, width: number, height = CHART_HEIGHT): void {
    const labels = data.kind === 'stacked' ? data.columns.categories : ['band'];
    const key = `${data.kind}|${labels.join(',')}|${themeKey()}`;
    const changed = data !== this._data;
    this._data = data;
    if (!this.layout(key, width, height, () => this._build(data, width)) && changed) {
      this.resetReadout();
      this.plot!.setData(aligned(data));
    }
    this.node.dataset.intervals = String(data.columns.x.length);
  }

  private _build(data: IntervalData, width: number): uPlot {
    const { color, text, axis } = chartStyle(this.node);
    const ctx = document.createElement('canvas').getContext('2d');
    // A theme colour, made translucent for a fill (canvas normalises any CSS colour to #rrggbb).
    const translucent = (css: string, alpha: number) => {
      if (ctx) {
        ctx.fillStyle = '#000000';
        ctx.fillStyle = css;
      }
      const normal = ctx && typeof ctx.fillStyle === 'string' ? ctx.fillStyle : css;
      const rgb = parseColor(normal) ?? [128, 128, 128];
      return `rgba(${rgb.join(', ')}, ${alpha})`;
    };
    const seconds = (v: number | null) => (v === null ? '–' : formatSeconds(v));
    const xSeries: uPlot.Series = { label: 'since start', value: (_u, v) => seconds(v) };
    let series: uPlot.Series[];
    let bands: uPlot.Band[];
    let yAxis: uPlot.Axis;
    if (data.kind === 'stacked') {
      const shares = () => (this._data as { columns: GoodputColumns }).columns.shares;
      series = data.columns.categories.map((category, k): uPlot.Series => {
        const stroke = color(CATEGORY_VARS[category] ?? '--jp-layout-color4', text);
        return {
          label: category,
          stroke,
          fill: translucent(stroke, 0.55),
          width: 1,
          points: { show: false },
          // The legend reads each category's own share, not the running sum the stack draws.
          value: (_u, _v, _s, i) => percent(i === null ? null : (shares()[k]?.[i] ?? null))
        };
      });
      // Each category fills down to the one below it; the first down to zero.
      bands = series.slice(1).map((s, k) => ({ series: [k + 2, k + 1], fill: s.fill }));
      yAxis = {
        ...axis,
        label: 'time in interval (%)',
        size: 56,
        values: (_u, v) => v.map(percent)
      };
    } else {
      const stroke = color('--jp-brand-color1', text);
      const ms = (v: number | null) => (v === null ? '–' : `${v.toPrecision(3)} ms`);
      series = [
        {
          label: 'mean step time',
          stroke,
          width: 1.5,
          points: { show: true, size: 4 },
          value: (_u, v) => ms(v)
        },
        {
          label: '+1 std',
          stroke: translucent(stroke, 0.5),
          width: 1,
          dash: [4, 3],
          value: (_u, v) => ms(v)
        },
        {
          label: '−1 std',
          stroke: translucent(stroke, 0.5),
          width: 1,
          dash: [4, 3],
          value: (_u, v) => ms(v)
        }
      ];
      bands = [{ series: [2, 3], fill: translucent(stroke, 0.18) }];
      yAxis = {
        ...axis,
        label: 'step time (ms)',
        size: 64,
        values: (_u, v) => v.map(x => `${x} ms`)
      };
    }
    return new uPlot(
      {
        width,
        height: this.height,
        series: [xSeries, ...series],
        bands,
        scales: {
          x: { time: false },
          y: {
            range:
              data.kind === 'stacked' ? [0, 100] : (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1]
          }
        },
        axes: [{ ...axis, label: 'seconds since the run started' }, yAxis],
        legend: { show: true, live: true },
        cursor: { drag: { x: false, y: false } },
        hooks: { setCursor: [u => this._read(u)] }
      },
      aligned(data),
      this.plotNode
    );
  }

  /** The line under the chart: which interval, and what it holds. */
  private _read(u: uPlot): void {
    const i = u.cursor.idx;
    const data = this._data;
    if (i === null || i === undefined || !data) {
      this.readout.textContent = '';
      return;
    }
    const c = data.columns;
    if (data.kind === 'stacked') {
      const g = data.columns;
      const span = `${g.start[i].toFixed(1)}–${g.end[i].toFixed(1)} s`;
      const parts = g.categories.map((cat, k) => `${cat} ${percent(g.shares[k][i])}`);
      this.readout.textContent = [span, ...parts].join(' · ');
    } else {
      const s = data.columns;
      const mean = s.mean[i];
      const std = mean === null || s.upper[i] === null ? null : s.upper[i] - mean;
      this.readout.textContent = [
        `${c.x[i].toFixed(1)} s`,
        `${s.steps[i]} steps`,
        mean === null
          ? 'no step started'
          : `mean ${mean.toPrecision(3)} ms ± ${(std ?? 0).toPrecision(2)} ms`
      ].join(' · ');
    }
  }
}

function percent(v: number | null): string {
  return v === null ? '–' : `${Math.round(v)}%`;
}

/** uPlot's data: x, then the stack's running sums (or mean, upper, lower). */
function aligned(data: IntervalData): uPlot.AlignedData {
  const c = data.columns;
  const ys =
    data.kind === 'stacked'
      ? data.columns.stacked
      : [data.columns.mean, data.columns.upper, data.columns.lower];
  return [c.x, ...ys] as uPlot.AlignedData;
}
