/**
 * One row per slice, two lines so it fits a 250 px sidebar: name and state,
 * current utilization and live memory (a lost slice's memory reads "lost");
 * then utilization over the last five minutes (sparkline, red from the
 * slice's loss on) and the fail/repair button when the backend supports
 * fault injection.
 */
import { toCss } from '../common/colors';
import { formatBytes, formatPercent } from '../common/format';
import { MonitorModel } from '../model/monitormodel';
import { UTILIZATION_HELP } from '../common/help';
import { downRuns, sparklinePoints } from '../model/sparkline';
import { palette } from '../common/theme';

export type SliceAction = 'fail_slice' | 'repair_slice';

interface Row {
  node: HTMLDivElement;
  state: HTMLSpanElement;
  spark: HTMLCanvasElement;
  utilization: HTMLSpanElement;
  memory: HTMLSpanElement;
  button: HTMLButtonElement | null;
}

/** Seconds a sparkline spans (the model keeps more: HISTORY_S). */
export const SPARK_WINDOW_S = 300;
const SPARK_WIDTH = 120;
const SPARK_HEIGHT = 18;
const SPARK_COLUMNS = 200;

export class SliceList {
  readonly node: HTMLDivElement;
  private _rows: Row[] = [];
  private _shape = '';

  constructor(
    private _model: MonitorModel,
    private _onAction: (action: SliceAction, slice: number, button: HTMLButtonElement) => void
  ) {
    this.node = document.createElement('div');
    this.node.className = 'jp-PathwaysPanel-slices';
  }

  /**
   * Redraw. `sparkWidth` is the sparklines' CSS width, measured by the caller
   * before any DOM write of this frame (reading layout between writes would
   * force a reflow per row); null to measure here.
   */
  render(sparkWidth: number | null = null): void {
    const topology = this._model.topology;
    const shape = topology
      ? `${topology.topology_seq}|${topology.supports_fault_injection}|` +
        topology.slices.map(s => `${s.index}:${s.state}`).join(',')
      : '';
    if (shape !== this._shape) {
      this._shape = shape;
      this._build();
      sparkWidth = null;
    }
    this._update(sparkWidth ?? this.measure());
  }

  /** CSS width of the sparklines (0 before the first build). */
  measure(): number {
    return this._rows.length ? this._rows[0].spark.clientWidth : 0;
  }

  private _build(): void {
    this.node.textContent = '';
    this._rows = [];
    const topology = this._model.topology;
    if (!topology) {
      return;
    }
    for (const slice of topology.slices) {
      const node = document.createElement('div');
      node.className = 'jp-PathwaysPanel-slice';
      node.dataset.slice = String(slice.index);
      node.dataset.state = slice.state;
      const name = document.createElement('span');
      name.className = 'jp-PathwaysPanel-sliceName';
      const label = document.createElement('span');
      label.className = 'jp-PathwaysPanel-sliceLabel';
      label.textContent = `slice ${slice.index}`;
      label.title = `${slice.chip_count} chips${slice.kind ? ` · ${slice.kind}` : ''} · grid ${slice.shape.join('x')}`;
      const state = document.createElement('span');
      state.className = `jp-PathwaysPanel-state jp-mod-${slice.state}`;
      state.textContent = slice.state === 'down' ? 'DOWN' : 'up';
      name.append(label, state);
      const spark = document.createElement('canvas');
      spark.className = 'jp-PathwaysPanel-spark';
      spark.setAttribute('role', 'img');
      spark.title = `slice ${slice.index} ${UTILIZATION_HELP.charAt(0).toLowerCase()}${UTILIZATION_HELP.slice(1)}; last ${SPARK_WINDOW_S / 60} minutes`;
      const utilization = document.createElement('span');
      utilization.className = 'jp-PathwaysPanel-sliceUtil';
      utilization.title = UTILIZATION_HELP;
      const memory = document.createElement('span');
      memory.className = 'jp-PathwaysPanel-sliceMemory';
      let button: HTMLButtonElement | null = null;
      if (topology.supports_fault_injection) {
        const action: SliceAction = slice.state === 'down' ? 'repair_slice' : 'fail_slice';
        const verb = action === 'fail_slice' ? 'fail' : 'repair';
        button = document.createElement('button');
        button.className = 'jp-Button jp-mod-styled jp-mod-small jp-PathwaysPanel-sliceButton';
        button.textContent = verb;
        button.setAttribute('aria-label', `${verb} slice ${slice.index}`);
        button.title = `${verb} slice ${slice.index} (local backend fault injection)`;
        const b = button;
        button.addEventListener('click', () => this._onAction(action, slice.index, b));
      }
      // Every row fills all grid areas, with or without a button.
      const placeholder = document.createElement('span');
      placeholder.className = 'jp-PathwaysPanel-sliceButton';
      node.append(name, utilization, memory, spark, button ?? placeholder);
      this.node.append(node);
      this._rows.push({ node, state, spark, utilization, memory, button });
    }
  }

  private _update(sparkWidth: number): void {
    const model = this._model;
    const topology = model.topology;
    if (!topology) {
      return;
    }
    const metrics = model.metrics;
    const colors = palette(this.node);
    const scale = window.devicePixelRatio || 1;
    const now = metrics?.time ?? Date.now() / 1000;
    topology.slices.forEach((slice, position) => {
      const row = this._rows[position];
      const agg = metrics?.slices[position];
      const down = slice.state === 'down';
      const percent = down ? '–' : formatPercent(agg ? agg.utilization : null);
      setText(row.utilization, percent);
      // A lost slice's arrays hold nothing usable: its memory is lost, not in use.
      setText(row.memory, down ? 'lost' : agg ? formatBytes(agg.memory_bytes) : '–');
      row.memory.title = down
        ? `slice ${slice.index} is down: the arrays it held are lost (reads raise DATA_LOSS)`
        : 'live memory in use (arrays lost with a slice do not count)';
      const label = `slice ${slice.index} utilization, last ${SPARK_WINDOW_S / 60} minutes: now ${down ? 'down' : percent}`;
      if (row.spark.getAttribute('aria-label') !== label) {
        row.spark.setAttribute('aria-label', label);
      }
      const canvas = row.spark;
      const width = Math.round((sparkWidth || SPARK_WIDTH) * scale);
      const height = Math.round(SPARK_HEIGHT * scale);
      if (canvas.width !== width || canvas.height !== height) {
        canvas.width = width;
        canvas.height = height;
      }
      const ctx = canvas.getContext('2d')!;
      ctx.fillStyle = toCss(colors.block);
      ctx.fillRect(0, 0, width, height);
      // At most SPARK_COLUMNS points per row, stretched to the width: 64 wide rows stay cheap.
      const columns = Math.min(width, SPARK_COLUMNS);
      const stretch = width / columns;
      const series = model.history(slice.index);
      const points = sparklinePoints(series, now, SPARK_WINDOW_S, columns, height - scale);
      if (points.length >= 2) {
        ctx.beginPath();
        ctx.moveTo(points[0] * stretch, height);
        for (let i = 0; i < points.length; i += 2) {
          ctx.lineTo(points[i] * stretch, points[i + 1]);
        }
        ctx.lineTo(points[points.length - 2] * stretch, height);
        ctx.closePath();
        ctx.fillStyle = toCss(colors.accent);
        ctx.fill();
      }
      // Red only where the slice was down: from its loss on, not over the history before it.
      ctx.fillStyle = toCss(colors.down);
      const runs = downRuns(series, now, SPARK_WINDOW_S, columns);
      for (const [from, to] of runs) {
        ctx.fillRect(Math.floor(from * stretch), 0, Math.ceil((to - from) * stretch), height);
      }
      // What is drawn, in columns of `data-columns`: tests and tools read it, a canvas cannot be.
      canvas.dataset.columns = String(columns);
      canvas.dataset.first = points.length ? String(points[0]) : '';
      canvas.dataset.down = runs.map(([from, to]) => `${from}-${to}`).join(',');
    });
  }
}

/** Write only what changed: an unchanged text node costs nothing to lay out again. */
function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}
