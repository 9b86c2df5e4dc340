/**
 * One row per slice: state, utilization over the last five minutes
 * (sparkline), current utilization and memory, and the fail/restore button
 * when the backend supports fault injection.
 */
import { toCss } from './colors';
import { formatBytes, formatPercent } from './format';
import { MonitorModel } from './model';
import { sparklinePoints } from './sparkline';
import { palette } from './theme';

export type SliceAction = 'fail_slice' | 'restore_slice';

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
      ? `${topology.topology_seq}|${topology.supports_fault_injection}|` + topology.slices.map(s => `${s.index}:${s.state}`).join(',')
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
      const label = document.createElement('span');
      label.className = 'jp-PathwaysPanel-sliceLabel';
      label.textContent = `slice ${slice.index}`;
      label.title = `${slice.chip_count} chips${slice.kind ? ` · ${slice.kind}` : ''} · grid ${slice.shape.join('x')}`;
      const state = document.createElement('span');
      state.className = `jp-PathwaysPanel-state jp-mod-${slice.state}`;
      state.textContent = slice.state === 'down' ? 'DOWN' : 'up';
      const spark = document.createElement('canvas');
      spark.className = 'jp-PathwaysPanel-spark';
      spark.title = `slice ${slice.index} utilization, last ${SPARK_WINDOW_S / 60} minutes`;
      const utilization = document.createElement('span');
      utilization.className = 'jp-PathwaysPanel-sliceUtil';
      const memory = document.createElement('span');
      memory.className = 'jp-PathwaysPanel-sliceMemory';
      let button: HTMLButtonElement | null = null;
      if (topology.supports_fault_injection) {
        const action: SliceAction = slice.state === 'down' ? 'restore_slice' : 'fail_slice';
        const verb = action === 'fail_slice' ? 'fail' : 'restore';
        button = document.createElement('button');
        button.className = 'jp-Button jp-mod-styled jp-mod-small jp-PathwaysPanel-sliceButton';
        button.textContent = verb;
        button.setAttribute('aria-label', `${verb} slice ${slice.index}`);
        button.title = `${verb} slice ${slice.index} (local backend fault injection)`;
        const b = button;
        button.addEventListener('click', () => this._onAction(action, slice.index, b));
      }
      // Every row fills all grid columns, with or without a button.
      node.append(label, state, spark, utilization, memory, button ?? document.createElement('span'));
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
      setText(row.utilization, slice.state === 'down' ? '–' : formatPercent(agg ? agg.utilization : null));
      setText(row.memory, agg ? formatBytes(agg.memory_bytes) : '–');
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
      const points = sparklinePoints(model.history(slice.index), now, SPARK_WINDOW_S, columns, height - scale);
      if (points.length >= 2) {
        ctx.beginPath();
        ctx.moveTo(points[0] * stretch, height);
        for (let i = 0; i < points.length; i += 2) {
          ctx.lineTo(points[i] * stretch, points[i + 1]);
        }
        ctx.lineTo(points[points.length - 2] * stretch, height);
        ctx.closePath();
        ctx.fillStyle = toCss(slice.state === 'down' ? colors.down : colors.accent);
        ctx.fill();
      }
    });
  }
}

/** Write only what changed: an unchanged text node costs nothing to lay out again. */
function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}
