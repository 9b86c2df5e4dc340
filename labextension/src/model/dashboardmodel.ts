/**
 * What the dashboard charts, kept apart from drawing: per-slice utilization
 * and memory over the last 15 minutes, per-chip utilization of one slice,
 * step time and throughput of running loops (from `steps` events), memory
 * capacity per slice, and events as time-axis markers with a kind filter.
 *
 * Fed the same decoded protocol messages as the panel's model; produces
 * uPlot-shaped columns (`[times, ...series]`). Pure: no DOM, unit-tested.
 */
import { MetricsMessage, MonitorEvent, TopologyMessage, TopologySlice } from '../protocol/messages';

/** Seconds of per-slice history shown (what the kernel keeps per slice). */
export const SLICE_WINDOW_S = 15 * 60;
/** Seconds of per-chip history shown (what the kernel keeps per chip). */
export const CHIP_WINDOW_S = 5 * 60;
/** Up to this many slices get a line each; beyond, the charts show min / mean / max across slices. */
export const MAX_SLICE_LINES = 16;
/** Up to this many chips of the chosen slice get a line each; beyond, min / mean / max across its chips. */
export const MAX_CHIP_LINES = 32;
/** Events kept as markers (newest). */
export const MAX_MARKERS = 500;
/** The event kind that carries step time and throughput (training/step_rate.py). */
export const STEPS_KIND = 'steps';
/** Kinds offered in the marker filter even before one happened. */
export const MARKER_KINDS = [
  'slice_down',
  'slice_up',
  'reshard',
  'snapshot',
  'restore',
  'checkpoint',
  'compile',
  'profile',
  'goodput'
];

/** Kinds that happen every few steps (a comb of markers): off until asked for. */
export const ROUTINE_KINDS = ['snapshot', 'compile', 'checkpoint', 'goodput', STEPS_KIND];

/**
 * HBM per chip (GiB) by JAX `device_kind`, from Google Cloud's TPU pages
 * (v4 32, v5e 16, v5p 95, v6e 32, TPU7x 192; checked 2026-12).
 */
export const HBM_GIB: Record<string, number> = {
  'TPU v4': 32,
  'TPU v5 lite': 16,
  'TPU v5e': 16,
  'TPU v5': 95,
  'TPU v5p': 95,
  'TPU v6 lite': 32,
  'TPU v6e': 32,
  TPU7x: 192
};

const GIB = 1024 ** 3;

/** One slice's kept series (the monitor model's): utilization in [0, 1], bytes, up per point. */
export interface SliceHistory {
  times: number[];
  values: number[];
  memory: number[];
  up: boolean[];
}

/** One chart's data: x (kernel time, s) then one column per series, with its label. */
export interface Columns {
  labels: string[];
  data: (number | null)[][];
}

export interface Capacity {
  /** Bytes a slice holds, or null when nothing says. */
  bytes: number | null;
  /** Where the figure comes from, shown next to it. */
  source: 'reported' | 'tpu' | 'emulated' | 'unknown';
}

/**
 * A slice's name in labels: `slice 0`, with its kind of chip where the backend says one
 * (`slice 0 · TPU v5p`; slices of several TPU generations, e.g. `local:v5p:2x2x1,v6e:2x2`).
 */
export function sliceName(slice: { index: number; kind: string }): string {
  return slice.kind && slice.kind !== 'cpu'
    ? `slice ${slice.index} · ${slice.kind}`
    : `slice ${slice.index}`;
}

/**
 * Whether CPU devices stand in for the chips: the local Pathways server (`local:`, also spelled
 * `local-server:`) and the in-process emulator (`embedded:`).
 */
export function isEmulated(topology: TopologyMessage): boolean {
  return /^(local|local-server|embedded):/.test(topology.backend) || topology.target === 'embedded';
}

/**
 * A slice's memory capacity: what the backend reports (`memory_limit_bytes`),
 * else the HBM of its TPU type, else on the embedded backend `emulatedChipGiB`
 * per chip (a figure the user sets, labelled as such).
 */
export function sliceCapacity(
  topology: TopologyMessage,
  slice: TopologySlice,
  reported: number | null,
  emulatedChipGiB: number
): Capacity {
  if (reported !== null) {
    return { bytes: reported, source: 'reported' };
  }
  const hbm = HBM_GIB[slice.kind];
  if (hbm !== undefined) {
    return { bytes: hbm * GIB * slice.chip_count, source: 'tpu' };
  }
  if (isEmulated(topology)) {
    return { bytes: emulatedChipGiB * GIB * slice.chip_count, source: 'emulated' };
  }
  return { bytes: null, source: 'unknown' };
}

/** "HH:MM:SS.s" in local time: events a fraction of a second apart stay apart. */
export function clock(epochSeconds: number): string {
  const d = new Date(epochSeconds * 1000);
  const hm = [d.getHours(), d.getMinutes()].map(v => String(v).padStart(2, '0')).join(':');
  const s = Math.floor((d.getSeconds() * 1000 + d.getMilliseconds()) / 100) / 10;
  return `${hm}:${s.toFixed(1).padStart(4, '0')}`;
}

/** One `steps` event, read: which run, how far, how fast. */
export interface StepPoint {
  run: string;
  time: number;
  step: number;
  stepTimeS: number;
  stepsPerS: number;
}

const STEPS_DETAIL = /^(.*): ([0-9.eE+-]+) steps\/s$/;

/** Read a `steps` event (see training/step_rate.py); null for any other event or a detail it cannot read. */
export function stepPoint(e: MonitorEvent): StepPoint | null {
  if (e.kind !== STEPS_KIND || e.step === null || e.duration_s === null) {
    return null;
  }
  const m = STEPS_DETAIL.exec(e.detail);
  const rate = m ? Number(m[2]) : NaN;
  if (!m || !Number.isFinite(rate)) {
    return null;
  }
  return { run: m[1], time: e.time, step: e.step, stepTimeS: e.duration_s, stepsPerS: rate };
}

/** A growing, time-ordered table: `times` plus equal-length numeric columns; old rows trimmed. */
class Table {
  times: number[] = [];
  columns: (number | null)[][];

  constructor(width: number) {
    this.columns = Array.from({ length: width }, () => []);
  }

  push(time: number, values: (number | null)[]): void {
    const last = this.times.length ? this.times[this.times.length - 1] : -Infinity;
    if (time < last) {
      // The kernel clock went back (a new kernel, a clock step): start over.
      this.clear();
    }
    this.times.push(time);
    values.forEach((v, i) => this.columns[i].push(v));
  }

  /** Drop rows older than `horizon`, in batches so trimming stays amortized O(1) per row. */
  trim(horizon: number): void {
    let old = 0;
    while (old < this.times.length && this.times[old] < horizon) {
      old++;
    }
    if (old && (old >= 64 || old * 8 >= this.times.length)) {
      this.times.splice(0, old);
      for (const c of this.columns) {
        c.splice(0, old);
      }
    }
  }

  clear(): void {
    this.times.length = 0;
    for (const c of this.columns) {
      c.length = 0;
    }
  }
}

export class DashboardModel {
  topology: TopologyMessage | null = null;
  /** Latest capacity per slice position. */
  capacities: Capacity[] = [];
  /** Events newest first, `steps` events excluded (they are the step charts). */
  events: MonitorEvent[] = [];
  /** Kinds whose markers are hidden: the routine ones until the user shows them. */
  readonly hiddenKinds = new Set<string>(ROUTINE_KINDS);
  /** Slice whose chips get their own chart, or null. */
  chipSlice: number | null = null;
  /** Memory per emulated chip (GiB), the setting `emulatedChipMemoryGiB`. */
  emulatedChipGiB = 16;

  private _slices = new Table(0);
  private _memory = new Table(0);
  private _chips = new Table(0);
  private _steps = new Map<string, StepPoint[]>();
  private _seen = new Set<number>();
  private _layout = '';

  /** Take a topology; a different layout (slice count or chip counts) starts new series. */
  setTopology(topology: TopologyMessage): void {
    const layout = `${topology.backend}|${topology.slices.map(s => s.chip_count).join(',')}`;
    this.topology = topology;
    if (layout !== this._layout) {
      this._layout = layout;
      const lines = this._sliceLines();
      this._slices = new Table(lines);
      this._memory = new Table(lines + 1);
      this.capacities = topology.slices.map(s =>
        sliceCapacity(topology, s, null, this.emulatedChipGiB)
      );
      this._resetChips();
    }
  }

  /** Set the emulated chip memory (GiB); capacity lines already drawn from the old figure scale with it. */
  setEmulatedChipGiB(gib: number): void {
    if (!(gib > 0) || gib === this.emulatedChipGiB) {
      return;
    }
    const scale = gib / this.emulatedChipGiB;
    this.emulatedChipGiB = gib;
    if (this.capacities.some(c => c.source === 'emulated')) {
      const column = this._memory.columns[this._memory.columns.length - 1];
      column?.forEach((v, i) => (column[i] = v === null ? null : v * scale));
      this.capacities = this.capacities.map(c =>
        c.source === 'emulated' && c.bytes !== null ? { ...c, bytes: c.bytes * scale } : c
      );
    }
  }

  /** Add one metrics frame (it must belong to the current topology: the caller's model checks). */
  addMetrics(m: MetricsMessage): void {
    const t = this.topology;
    if (!t || m.slices.length !== t.slices.length) {
      return;
    }
    const util = m.slices.map(s => (s.state === 'up' ? 100 * s.utilization : null));
    const used = m.slices.map(s => (s.state === 'up' ? s.memory_bytes : null));
    this.capacities = t.slices.map((s, i) =>
      sliceCapacity(t, s, m.slices[i].memory_limit_bytes, this.emulatedChipGiB)
    );
    this.addSlicePoint(m.time, util, used);
    this._addChipPoint(m);
  }

  /**
   * Add one per-slice point: utilization in percent and bytes in use per
   * slice position, null where the slice was down (a gap, so the history
   * before a loss keeps its values).
   */
  addSlicePoint(time: number, util: (number | null)[], used: (number | null)[]): void {
    const rows = this._sliceRows(util, used);
    if (!rows) {
      return;
    }
    this._slices.push(time, rows[0]);
    this._memory.push(time, rows[1]);
    const horizon = time - SLICE_WINDOW_S;
    this._slices.trim(horizon);
    this._memory.trim(horizon);
  }

  /**
   * Seed the per-slice series from the kernel's history (one series per
   * slice position, aligned in time, as the monitor model keeps them):
   * its points, then ours newer than its last.
   */
  loadSliceHistory(series: SliceHistory[]): void {
    const t = this.topology;
    if (!t || series.length !== t.slices.length) {
      return;
    }
    const points = Math.min(...series.map(s => s.times.length));
    const last = points ? series[0].times[points - 1] : -Infinity;
    const ours = { slices: this._slices, memory: this._memory };
    this._slices = new Table(ours.slices.columns.length);
    this._memory = new Table(ours.memory.columns.length);
    // One pair of row buffers for every point: Table.push copies the values out.
    const util = new Array<number | null>(series.length);
    const used = new Array<number | null>(series.length);
    for (let i = 0; i < points; i++) {
      for (let k = 0; k < series.length; k++) {
        const s = series[k];
        util[k] = s.up[i] ? 100 * s.values[i] : null;
        used[k] = s.up[i] ? s.memory[i] : null;
      }
      const rows = this._sliceRows(util, used);
      if (rows) {
        this._slices.push(series[0].times[i], rows[0]);
        this._memory.push(series[0].times[i], rows[1]);
      }
    }
    ours.slices.times.forEach((time, i) => {
      if (time > last) {
        this._slices.push(
          time,
          ours.slices.columns.map(c => c[i])
        );
        this._memory.push(
          time,
          ours.memory.columns.map(c => c[i])
        );
      }
    });
    const horizon = (this._slices.times[this._slices.times.length - 1] ?? 0) - SLICE_WINDOW_S;
    this._slices.trim(horizon);
    this._memory.trim(horizon);
  }

  /** One point's utilization row and memory row (aggregated beyond MAX_SLICE_LINES), or null for another layout. */
  private _sliceRows(
    util: (number | null)[],
    used: (number | null)[]
  ): [(number | null)[], (number | null)[]] | null {
    if (this._aggregated()) {
      let total: number | null = null;
      let capacity: number | null = 0;
      used.forEach((bytes, i) => {
        if (bytes !== null) {
          total = (total ?? 0) + bytes;
          const c = this.capacities[i]?.bytes ?? null;
          capacity = capacity === null || c === null ? null : capacity + c;
        }
      });
      return [spread(util), [total, total === null ? null : capacity]];
    }
    if (util.length !== this._slices.columns.length) {
      return null;
    }
    return [util, [...used, this._capacityLine()]];
  }

  /** Add events (any order), ignoring ones already seen. */
  addEvents(events: MonitorEvent[]): void {
    let markers = false;
    for (const e of events) {
      if (this._seen.has(e.seq)) {
        continue;
      }
      this._seen.add(e.seq);
      const point = stepPoint(e);
      if (point) {
        let series = this._steps.get(point.run);
        if (!series) {
          series = [];
          this._steps.set(point.run, series);
        }
        series.push(point);
        series.sort((a, b) => a.time - b.time);
        const horizon = series[series.length - 1].time - SLICE_WINDOW_S;
        while (series[0].time < horizon) {
          series.shift();
        }
        continue;
      }
      if (e.kind !== STEPS_KIND) {
        this.events.push(e);
        markers = true;
      }
    }
    if (markers) {
      this.events.sort((a, b) => b.seq - a.seq);
      this.events.length = Math.min(this.events.length, MAX_MARKERS);
    }
  }

  /** Choose the slice whose chips get a chart (null: none); its chip series start over. */
  setChipSlice(index: number | null): void {
    if (index !== this.chipSlice) {
      this.chipSlice = index;
      this._resetChips();
    }
  }

  /** Load per-chip history of the chosen slice: `util[t][c]` bytes (value / 255) at `times[t]`. */
  loadChipHistory(
    slice: number,
    times: ArrayLike<number>,
    util: ArrayLike<number>,
    chips: number
  ): void {
    if (slice !== this.chipSlice || !this._chips.columns.length) {
      return;
    }
    const live = { times: [...this._chips.times], columns: this._chips.columns.map(c => [...c]) };
    this._chips.clear();
    for (let t = 0; t < times.length; t++) {
      if (live.times.length && times[t] >= live.times[0]) {
        break;
      }
      const row: number[] = [];
      for (let c = 0; c < chips; c++) {
        row.push((100 * util[t * chips + c]) / 255);
      }
      this._chips.push(times[t], this._chipRow(row));
    }
    live.times.forEach((time, i) =>
      this._chips.push(
        time,
        live.columns.map(c => c[i])
      )
    );
  }

  /** Forget everything (another kernel, or the kernel restarted). */
  reset(): void {
    this.topology = null;
    this.capacities = [];
    this.events = [];
    this._seen.clear();
    this._steps.clear();
    this._layout = '';
    this._slices = new Table(0);
    this._memory = new Table(0);
    this._resetChips();
  }

  // ---- what the charts draw ---------------------------------------------

  utilization(): Columns {
    return {
      labels: this._sliceLabels(),
      data: [this._slices.times, ...this._slices.columns]
    };
  }

  memory(): Columns {
    const t = this.topology;
    const capacity = this._capacityLabel();
    const labels = this._aggregated()
      ? ['used, all slices', `capacity, up slices${capacity}`]
      : [...(t?.slices.map(sliceName) ?? []), `capacity per slice${capacity}`];
    return { labels, data: [this._memory.times, ...this._memory.columns] };
  }

  /** Memory in use as a percentage of the capacity line at each point (no capacity there: a gap). */
  memoryPercent(): Columns {
    const { labels, data } = this.memory();
    const capacity = data[data.length - 1] ?? [];
    const percent = data.slice(1, -1).map(column =>
      column.map((v, i) => {
        const c = capacity[i];
        return v === null || c === null || c === undefined || !(c > 0) ? null : (100 * v) / c;
      })
    );
    return { labels: labels.slice(0, -1), data: [data[0], ...percent] };
  }

  chips(): Columns {
    const t = this.topology;
    const slice = t?.slices.find(s => s.index === this.chipSlice);
    if (!slice) {
      return { labels: [], data: [[]] };
    }
    const labels =
      slice.chip_count > MAX_CHIP_LINES
        ? ['min', 'mean', 'max'].map(k => `${k} of slice ${slice.index}'s chips`)
        : Array.from({ length: slice.chip_count }, (_, c) => `chip ${slice.chip_offset + c}`);
    return { labels, data: [this._chips.times, ...this._chips.columns] };
  }

  /** Step time (ms) per run, on the union of the runs' event times. */
  stepTime(): Columns {
    return this._stepColumns(p => 1000 * p.stepTimeS);
  }

  /** Throughput (steps/s) per run. */
  throughput(): Columns {
    return this._stepColumns(p => p.stepsPerS);
  }

  /**
   * The live time range ending at `now`: the whole kept window once the
   * series fill it, from their first point (or event) before (at least `minimumS`), so
   * a young kernel's minute is not squeezed into a 15-minute axis.
   */
  liveRange(now: number, windowS: number, minimumS = 60): [number, number] {
    const first = Math.min(
      this._slices.times[0] ?? now,
      ...[...this._steps.values()].map(points => points[0]?.time ?? now),
      ...this.events.filter(e => e.time >= now - windowS).map(e => e.time)
    );
    return [Math.max(now - windowS, Math.min(first, now - minimumS)), now];
  }

  /** Events drawn as markers: not hidden by the filter, newest first. */
  markers(): MonitorEvent[] {
    return this.events.filter(e => !this.hiddenKinds.has(e.kind));
  }

  /** Kinds the filter offers: the usual ones and any other seen, in that order. */
  kinds(): string[] {
    const seen = new Set(this.events.map(e => e.kind));
    return [...MARKER_KINDS, ...[...seen].filter(k => !MARKER_KINDS.includes(k)).sort()];
  }

  // ---- inside -------------------------------------------------------------

  private _aggregated(): boolean {
    return (this.topology?.slices.length ?? 0) > MAX_SLICE_LINES;
  }

  private _sliceLines(): number {
    return this._aggregated() ? 3 : (this.topology?.slices.length ?? 0);
  }

  private _sliceLabels(): string[] {
    const t = this.topology;
    if (!t) {
      return [];
    }
    return this._aggregated()
      ? ['min', 'mean', 'max'].map(k => `${k} of up slices`)
      : t.slices.map(sliceName);
  }

  /** One capacity line when every slice holds the same; null (no line) when they differ or nothing says. */
  private _capacityLine(): number | null {
    const known = this.capacities.map(c => c.bytes);
    return known.length && known.every(b => b !== null && b === known[0]) ? known[0] : null;
  }

  private _capacityLabel(): string {
    const sources = new Set(this.capacities.map(c => c.source));
    if (sources.has('emulated')) {
      return ` (emulated ${this.emulatedChipGiB} GiB/chip)`;
    }
    if (sources.has('tpu')) {
      return ' (TPU HBM)';
    }
    return sources.has('unknown') ? ' (not reported)' : '';
  }

  private _resetChips(): void {
    const slice = this.topology?.slices.find(s => s.index === this.chipSlice);
    const lines = !slice ? 0 : slice.chip_count > MAX_CHIP_LINES ? 3 : slice.chip_count;
    this._chips = new Table(lines);
  }

  private _addChipPoint(m: MetricsMessage): void {
    const slice = this.topology?.slices.find(s => s.index === this.chipSlice);
    if (!slice || !this._chips.columns.length) {
      return;
    }
    const row: (number | null)[] = [];
    for (let c = 0; c < slice.chip_count; c++) {
      row.push(
        slice.state === 'up' ? (100 * m.utilization_buffer[slice.chip_offset + c]) / 255 : null
      );
    }
    this._chips.push(m.time, this._chipRow(row));
    this._chips.trim(m.time - CHIP_WINDOW_S);
  }

  private _chipRow(row: (number | null)[]): (number | null)[] {
    return row.length > MAX_CHIP_LINES ? spread(row) : row;
  }

  private _stepColumns(value: (p: StepPoint) => number): Columns {
    const runs = [...this._steps.keys()];
    const times = [...new Set(runs.flatMap(r => this._steps.get(r)!.map(p => p.time)))].sort(
      (a, b) => a - b
    );
    const index = new Map(times.map((t, i) => [t, i]));
    const columns = runs.map(r => {
      const column = new Array<number | null>(times.length).fill(null);
      for (const p of this._steps.get(r)!) {
        column[index.get(p.time)!] = value(p);
      }
      return column;
    });
    return { labels: runs, data: [times, ...columns] };
  }
}

/** [min, mean, max] of the non-null values, or nulls when there are none. */
function spread(values: (number | null)[]): (number | null)[] {
  let min = Infinity;
  let max = -Infinity;
  let sum = 0;
  let n = 0;
  for (const v of values) {
    if (v !== null) {
      min = Math.min(min, v);
      max = Math.max(max, v);
      sum += v;
      n++;
    }
  }
  return n ? [min, sum / n, max] : [null, null, null];
}
