/**
 * The monitor's state for one kernel: topology, the latest metrics, each
 * slice's utilization, memory and up/down state over the last 15 minutes,
 * and the event log.
 *
 * Fed decoded protocol messages; views read it and redraw on `subscribe`.
 * The kernel's `history` message (sent on every subscribe) seeds the series,
 * so a view that opens, or comes back to a kernel, shows the past at once.
 * A topology change of slice states keeps the latest metrics on show until
 * the next frame (no blanking of healthy slices).
 * Pure: no JupyterLab imports, unit-tested.
 */
import { SliceGrid, sliceGrid } from './layout';
import {
  MEMORY_SATURATED,
  GoodputIntervalsMessage,
  HistoryMessage,
  KernelMessage,
  MetricPointsMessage,
  PhasesMessage,
  MetricsMessage,
  MonitorEvent,
  TopologyMessage,
  TopologySlice
} from '../protocol/messages';

/** Seconds of per-slice history kept: what the kernel keeps (docs/protocol.md, `history`). */
export const HISTORY_S = 900;
/** Events kept (newest first). */
export const MAX_EVENTS = 500;

export type Change =
  'topology' | 'history' | 'metrics' | 'events' | 'reset' | 'points' | 'goodput' | 'phases';

/** A slice's history: parallel arrays, one entry per point. */
export interface Series {
  /** Kernel wall clock (s since the epoch), ascending. */
  times: number[];
  /** Utilization in [0, 1] (0 while down). */
  values: number[];
  /** Bytes in use. */
  memory: number[];
  /** Whether the slice was up at that point: a lost slice reads down from its loss on only. */
  up: boolean[];
}

export interface ChipInfo {
  position: number;
  id: number;
  slice: number;
  coords: [number, number, number];
  /** In [0, 1]; null before the first metrics. */
  utilization: number | null;
  /** Bytes; null before the first metrics. */
  memoryBytes: number | null;
  /** True when the memory counter saturated: the chip holds at least memoryBytes. */
  memoryAtLeast: boolean;
  state: 'up' | 'down';
}

export interface Summary {
  slicesUp: number;
  slicesTotal: number;
  chips: number;
  /** Mean utilization over up chips; null before the first metrics. */
  utilization: number | null;
}

export class MonitorModel {
  topology: TopologyMessage | null = null;
  /** The latest metrics that belong to `topology`. */
  metrics: MetricsMessage | null = null;
  /** One chip grid per slice, in topology order. */
  grids: SliceGrid[] = [];
  /** Newest first. */
  events: MonitorEvent[] = [];
  /** The newest batch of training metric points (views that chart them take each one on 'points'). */
  points: MetricPointsMessage | null = null;
  /** The newest batch of phase spans (`pw.phase`; the dashboard's lane takes each one on 'phases'). */
  phases: PhasesMessage | null = null;
  /** The newest finished run's goodput over time (`goodput_intervals`), once one ended. */
  goodput: GoodputIntervalsMessage | null = null;
  /** Metrics frames dropped because they did not match the topology. */
  dropped = 0;

  private _history = new Map<number, Series>();
  private _listeners = new Set<(change: Change) => void>();

  /** Call `listener` after every change; returns a function that stops it. */
  subscribe(listener: (change: Change) => void): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  /** Apply one decoded kernel message. Replies are the connection's business and ignored here. */
  handle(message: KernelMessage): void {
    switch (message.type) {
      case 'topology':
        this.setTopology(message);
        break;
      case 'history':
        this.setHistory(message);
        break;
      case 'metrics':
        this.addMetrics(message);
        break;
      case 'event':
        this.addEvents([message.event]);
        break;
      case 'phases':
        this.phases = message;
        this._emit('phases');
        break;
      case 'metric_points':
        this.points = message;
        this._emit('points');
        break;
      case 'goodput_intervals':
        this.goodput = message;
        this._emit('goodput');
        break;
    }
  }

  setTopology(topology: TopologyMessage): void {
    const previous = this.topology;
    if (previous && previous.backend !== topology.backend) {
      this._history.clear();
    }
    this.topology = topology;
    this.grids = topology.slices.map(s =>
      sliceGrid(s.index, range(s.chip_offset, s.chip_count), topology.chip_coords, 3)
    );
    if (this.metrics && !this._sameLayout(this.metrics)) {
      this.metrics = null;
    }
    this._emit('topology');
  }

  /**
   * Seed the series from the kernel's history: its points, then any of ours
   * newer than its last (frames that arrived first). Columns name slices by index.
   */
  setHistory(history: HistoryMessage): void {
    const columns = history.slices.length;
    const last = history.points ? history.time[history.points - 1] : -Infinity;
    const times = Array.from(history.time);
    history.slices.forEach((index, k) => {
      // Filled in place: a new dashboard takes 64 slices x 1,800 points at once.
      const n = history.points;
      const series: Series = {
        times: times.slice(),
        values: new Array<number>(n),
        memory: new Array<number>(n),
        up: new Array<boolean>(n)
      };
      for (let t = 0, at = k; t < n; t++, at += columns) {
        series.values[t] = history.utilization[at];
        series.memory[t] = history.memory_bytes[at];
        series.up[t] = history.up[at] === 1;
      }
      const ours = this._history.get(index);
      if (ours) {
        for (let i = 0; i < ours.times.length; i++) {
          if (ours.times[i] > last) {
            series.times.push(ours.times[i]);
            series.values.push(ours.values[i]);
            series.memory.push(ours.memory[i]);
            series.up.push(ours.up[i]);
          }
        }
      }
      this._history.set(index, series);
      trim(series, (series.times[series.times.length - 1] ?? 0) - HISTORY_S);
    });
    this._emit('history');
  }

  /** Take a metrics frame; frames for another topology or chip count are dropped (returns false). */
  addMetrics(metrics: MetricsMessage): boolean {
    if (!this._matches(metrics)) {
      this.dropped++;
      return false;
    }
    this.metrics = metrics;
    const horizon = metrics.time - HISTORY_S;
    for (const s of metrics.slices) {
      let series = this._history.get(s.index);
      if (!series) {
        series = emptySeries();
        this._history.set(s.index, series);
      }
      const last = series.times.length ? series.times[series.times.length - 1] : -Infinity;
      if (metrics.time < last) {
        // The kernel clock went back (a new kernel, a clock step): start over.
        trim(series, Infinity);
      } else if (metrics.time === last) {
        continue; // the history already holds this frame
      }
      const up = s.state === 'up';
      series.times.push(metrics.time);
      series.values.push(up ? s.utilization : 0);
      series.memory.push(s.memory_bytes);
      series.up.push(up);
      trim(series, horizon);
    }
    this._emit('metrics');
    return true;
  }

  /** Add events (any order), ignoring ones already seen; keeps newest first. */
  addEvents(events: MonitorEvent[]): void {
    const seen = new Set(this.events.map(e => e.seq));
    const fresh = events.filter(e => !seen.has(e.seq));
    if (!fresh.length) {
      return;
    }
    this.events = [...fresh, ...this.events].sort((a, b) => b.seq - a.seq).slice(0, MAX_EVENTS);
    this._emit('events');
  }

  /** Forget everything (the panel follows another kernel, or the kernel restarted). */
  reset(): void {
    this.topology = null;
    this.metrics = null;
    this.grids = [];
    this.events = [];
    this.goodput = null;
    this.dropped = 0;
    this._history.clear();
    this._emit('reset');
  }

  /** Slice `index` over the last HISTORY_S seconds of kernel time (empty arrays when unknown). */
  history(index: number): Series {
    return this._history.get(index) ?? emptySeries();
  }

  slice(position: number): TopologySlice | null {
    return this.topology?.slices[position] ?? null;
  }

  summary(): Summary | null {
    const t = this.topology;
    if (!t) {
      return null;
    }
    return {
      slicesUp: t.slices.filter(s => s.state === 'up').length,
      slicesTotal: t.slices.length,
      chips: t.chips,
      utilization: this.metrics ? this.metrics.utilization : null
    };
  }

  /** What the tooltip shows for chip `position` (index into the per-chip buffers). */
  chip(position: number): ChipInfo | null {
    const t = this.topology;
    if (!t || position < 0 || position >= t.chips) {
      return null;
    }
    const m = this.metrics;
    const slice = t.chip_slice[position];
    const raw = m ? m.memory_buffer[position] : null;
    const state = t.slices.find(s => s.index === slice)?.state ?? 'up';
    return {
      position,
      id: t.chip_id[position],
      slice,
      coords: [
        t.chip_coords[3 * position],
        t.chip_coords[3 * position + 1],
        t.chip_coords[3 * position + 2]
      ],
      utilization: m ? m.utilization_buffer[position] / 255 : null,
      memoryBytes: m && raw !== null ? raw * m.memory_unit : null,
      memoryAtLeast: raw === MEMORY_SATURATED,
      state
    };
  }

  private _matches(metrics: MetricsMessage): boolean {
    const t = this.topology;
    return !!t && metrics.topology_seq === t.topology_seq && metrics.chips === t.chips;
  }

  /** Whether `metrics` still describes the same slices and chips (only states changed since). */
  private _sameLayout(metrics: MetricsMessage): boolean {
    const t = this.topology;
    return (
      !!t &&
      metrics.chips === t.chips &&
      metrics.slices.length === t.slices.length &&
      metrics.slices.every((s, i) => s.index === t.slices[i].index)
    );
  }

  private _emit(change: Change): void {
    for (const listener of [...this._listeners]) {
      listener(change);
    }
  }
}

function emptySeries(): Series {
  return { times: [], values: [], memory: [], up: [] };
}

/** Drop the points of `series` older than `horizon`. */
function trim(series: Series, horizon: number): void {
  let old = 0;
  while (old < series.times.length && series.times[old] < horizon) {
    old++;
  }
  if (old) {
    series.times.splice(0, old);
    series.values.splice(0, old);
    series.memory.splice(0, old);
    series.up.splice(0, old);
  }
}

function range(start: number, count: number): Int32Array {
  const out = new Int32Array(count);
  for (let i = 0; i < count; i++) {
    out[i] = start + i;
  }
  return out;
}
