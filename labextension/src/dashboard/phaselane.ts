/**
 * The phase lane: the phases loops mark with `pw.phase` (an RL loop's rollout,
 * reward, update and weight sync) as bars on the dashboard's time axis, a row
 * per role (trainer, rollout), a colour per phase, above the utilization of the
 * slices they run on. The readout names what each role does at the cursor (the
 * arrow keys move it from one phase boundary to the next, as on every chart);
 * the line under it splits each role's time in view into busy and waiting for
 * the other, as `pw.goodput()` does for a run.
 */
import uPlot from 'uplot';

import { clock } from '../model/dashboardmodel';
import { LaneColumns, PhaseLanes, shareText } from '../model/phaselane';
import { PhasesMessage } from '../protocol/messages';
import { clockTicks, TimeWindow } from './charts';
import { PlotChart, chartStyle, themeKey } from './plotchart';

/** CSS px of the lane's plot: axes plus a bar row per role. */
const AXES_PX = 64;
const ROW_PX = 30;
/** Bar thickness (CSS px). */
const BAR_PX = 14;
/** Phase colours, theme variables only: four that stay apart in light and dark (rollout, reward, update, sync). */
const PHASE_VARS = [
  '--jp-brand-color1',
  '--jp-warn-color1',
  '--jp-success-color1',
  '--jp-error-color1',
  '--jp-brand-color3',
  '--jp-warn-color3',
  '--jp-success-color3',
  '--jp-error-color3'
];

export class PhaseLaneChart extends PlotChart {
  readonly lanes = new PhaseLanes();
  private _split: HTMLDivElement;

  constructor(private _window: TimeWindow) {
    super({
      caption: 'Phases by role',
      label:
        'Phases by role: the phases loops mark with pw.phase (rollout, reward, update, sync), a row per role, on the time axis',
      steps: 'from one phase boundary to the next'
    });
    this.node.dataset.chart = 'phases';
    this._split = document.createElement('div');
    this._split.className = 'jp-PathwaysDashboard-phaseSplit';
    this.node.append(this._split);
  }

  add(message: PhasesMessage): void {
    this.lanes.add(message);
  }

  clear(): void {
    this.lanes.clear();
    this.node.hidden = true;
  }

  /** Draw the spans in `range` (kernel seconds) at `width` CSS px; hidden until a loop marks a phase. */
  draw(range: [number, number], width: number): void {
    this.node.hidden = this.lanes.empty;
    if (this.lanes.empty) {
      return;
    }
    const columns = this.lanes.columns(range[0], range[1]);
    const height = AXES_PX + ROW_PX * Math.max(1, columns.roles.length);
    const key = `${columns.roles.join('\u0000')}|${columns.phases.join('\u0000')}|${themeKey()}`;
    this.layout(key, width, height, () => this._build(columns, width, height));
    const plot = this.plot!;
    plot.batch(() => {
      plot.setData(columns.data as uPlot.AlignedData, false);
      plot.setScale('x', { min: range[0], max: range[1] });
    });
    const split = this.lanes.split(range[0], range[1]);
    this._split.textContent = split
      ? `In view (${(split.end - split.start).toFixed(1)} s): ${split.roles.map(shareText).join(' · ')}`
      : '';
  }

  private _build(columns: LaneColumns, width: number, height: number): uPlot {
    const { roles, phases } = columns;
    const { color, text, axis } = chartStyle(this.node);
    const label = (row: number) => roles[roles.length - 1 - Math.round(row)] ?? '';
    const series: uPlot.Series[] = [
      { label: 'time', value: (_u, v) => (v === null ? '–' : clock(v)) },
      ...phases.map((phase, i): uPlot.Series => ({
        label: phase,
        stroke: color(PHASE_VARS[i % PHASE_VARS.length], text),
        width: BAR_PX,
        spanGaps: false,
        points: { show: false },
        value: (_u, v) => (v === null ? '–' : label(v))
      }))
    ];
    const opts: uPlot.Options = {
      width,
      height,
      series,
      scales: { x: { time: true }, y: { range: [-0.6, roles.length - 0.4] } },
      axes: [
        { ...axis, space: 80, values: (_u, splits) => clockTicks(splits) },
        {
          ...axis,
          label: 'role',
          size: 72,
          grid: { show: false },
          splits: () => roles.map((_r, i) => i),
          values: (_u, splits) => splits.map(v => label(v))
        }
      ],
      legend: { show: true, live: true },
      ...this._window.interaction(u => this._read(u))
    };
    return new uPlot(opts, columns.data as uPlot.AlignedData, this.plotNode);
  }

  /** The readout: what each role does at the cursor, its step and how long the phase took. */
  private _read(u: uPlot): void {
    const left = u.cursor.left ?? -1;
    if (left < 0) {
      this.readout.textContent = '';
      return;
    }
    const time = u.posToVal(left, 'x');
    const running = this.lanes.at(time);
    const roles = this.lanes.roles();
    const parts = roles.map(role => {
      const s = running.find(x => x.role === role);
      if (!s) {
        return `${role}: waiting`;
      }
      const step = s.step === null ? '' : `step ${s.step}, `;
      return `${role}: ${s.phase} (${step}${Math.round(1000 * (s.end - s.start))} ms)`;
    });
    this.readout.textContent = `${clock(time)} · ${parts.join(' · ')}`;
  }
}
