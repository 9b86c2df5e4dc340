/**
 * Training metrics (`metric_points`) for the dashboard's metric charts: per
 * metric name, per run, values against step or wall time since the run
 * started; TensorBoard's smoothing; and where an event falls on that axis.
 * Pure, unit-tested.
 */
import { MetricPoint, MetricPointsMessage, MonitorEvent } from '../protocol/messages';

/** Points kept per run and metric (the oldest drop off); the kernel keeps them all for pw.metrics(). */
export const MAX_RUN_POINTS = 20_000;
/** TensorBoard's default smoothing weight. */
export const DEFAULT_SMOOTHING = 0.6;

interface RunSeries {
  /** The notebook cell the run started in (null: outside a cell). */
  cell: number | null;
  /** Logged by an earlier kernel of this session (read back after a restart). */
  earlier: boolean;
  steps: number[];
  times: number[];
  elapsed: number[];
  values: (number | null)[];
}

/** What a metric chart's x-axis counts: the run's step, or seconds since the run started. */
export type XAxis = 'step' | 'wall';

/** uPlot's aligned data: steps (or seconds since each run started), then one column per run. */
export interface StepColumns {
  labels: string[];
  data: (number | null)[][];
  /** Each column's run's place among the session's runs shown (the run picker's swatches read the same). */
  colors?: number[];
}

/** One run of the session, whatever metrics it logged: what the run picker lists. */
export interface RunInfo {
  /** The kernel's key, "train #2". */
  run: string;
  /** How it reads: "run 'train' (cell 4)", "#2" added when another run of that name started in that cell. */
  title: string;
  cell: number | null;
  earlier: boolean;
  /** Wall time of its first point. */
  started: number;
}

export class MetricSeries {
  /** Bumped on every change, so views rebuild their columns only when needed. */
  version = 0;
  private _byName = new Map<string, Map<string, RunSeries>>();
  /** Every run in the order first seen, whatever its metric. */
  private _runs = new Map<string, { cell: number | null; earlier: boolean; started: number }>();
  private _lastSeq = 0;

  /** Apply one `metric_points` message: a replay replaces everything, live points append. */
  add(message: MetricPointsMessage): void {
    if (message.replay) {
      this._byName.clear();
      this._runs.clear();
      this._lastSeq = 0;
    }
    for (const p of message.points) {
      if (p.seq <= this._lastSeq) {
        continue; // already in the replay
      }
      this._lastSeq = p.seq;
      this._push(p);
    }
    this.version++;
  }

  clear(): void {
    this._byName.clear();
    this._runs.clear();
    this._lastSeq = 0;
    this.version++;
  }

  /** Metric names in the order first logged. */
  names(): string[] {
    return [...this._byName.keys()];
  }

  /** Runs that logged `name`, in the order first seen. */
  runs(name: string): string[] {
    return [...(this._byName.get(name)?.keys() ?? [])];
  }

  /** Every run of the session in the order first seen (the order they started), whatever it logged. */
  allRuns(): RunInfo[] {
    const all = [...this._runs.entries()];
    return all.map(([run, r]) => {
      const { base, number } = splitRun(run);
      const twins = all.filter(([key, o]) => splitRun(key).base === base && o.cell === r.cell);
      const where = r.cell === null ? '' : ` (cell ${r.cell})`;
      const which = number && (r.cell === null || twins.length > 1) ? ` #${number}` : '';
      return { run, title: `run '${base}'${where}${which}`, ...r };
    });
  }

  /**
   * `name` per run against step (or, `axis` 'wall', seconds since each run
   * started, so runs overlay from their starts), each run's values smoothed
   * with `weight` (TensorBoard's debiased EMA; 0: raw), on the union of the
   * runs' x values; only the runs `shown` keeps (all: none given).
   */
  columns(
    name: string,
    weight: number,
    axis: XAxis = 'step',
    shown?: (run: string) => boolean
  ): StepColumns {
    // Colours by place among the runs shown, so the (strongest) first ones go to what is drawn.
    const order = [...this._runs.keys()].filter(run => !shown || shown(run));
    const runs = new Map(
      [...(this._byName.get(name) ?? new Map<string, RunSeries>())].filter(
        ([run]) => !shown || shown(run)
      )
    );
    const labels = [...runs.keys()].map(run => this.label(name, run));
    const colors = [...runs.keys()].map(run => order.indexOf(run));
    const xs = (r: RunSeries) => (axis === 'step' ? r.steps : r.elapsed);
    const x = [...new Set([...runs.values()].flatMap(xs))].sort((a, b) => a - b);
    const at = new Map(x.map((s, i) => [s, i]));
    const data: (number | null)[][] = [x];
    for (const run of runs.values()) {
      const column = new Array<number | null>(x.length).fill(null);
      const smoothed = ema(run.values, weight);
      xs(run).forEach((s, i) => {
        column[at.get(s)!] = smoothed[i];
      });
      data.push(column);
    }
    return { labels, data, colors };
  }

  /**
   * How a run's line of `name` reads in a legend: "run 'train' (cell 4) · loss",
   * the kernel's run number added only when another run of that name started in the same cell.
   */
  label(name: string, run: string): string {
    const runs = this._byName.get(name);
    const cell = runs?.get(run)?.cell ?? null;
    const { base, number } = splitRun(run);
    const twins = [...(runs?.entries() ?? [])].filter(
      ([key, r]) => splitRun(key).base === base && r.cell === cell
    );
    const where = cell === null ? '' : ` (cell ${cell})`;
    const which = number && (cell === null || twins.length > 1) ? ` #${number}` : '';
    const before = runs?.get(run)?.earlier ? ' · earlier kernel' : '';
    return `run '${base}'${where}${which}${before} · ${name}`;
  }

  /**
   * Where `event` falls on the step axis of `name`: its own step when it has
   * one, else the step of the run's point logged nearest before it in time;
   * null when no run of `name` was logging then.
   */
  stepOf(name: string, event: MonitorEvent): number | null {
    const found = this._runAt(name, event);
    if (!found) {
      return null;
    }
    return event.step ?? found.run.steps[found.index];
  }

  /**
   * Where `event` falls on the wall-time axis of `name`: seconds from the
   * start of the run logging then to the event; null when none was.
   */
  wallOf(name: string, event: MonitorEvent): number | null {
    const found = this._runAt(name, event);
    if (!found) {
      return null;
    }
    const { run, index } = found;
    return event.time - (run.times[index] - run.elapsed[index]);
  }

  /** The run of `name` logging at the event's time (the one whose point is nearest before it), and that point. */
  private _runAt(name: string, event: MonitorEvent): { run: RunSeries; index: number } | null {
    let best: { run: RunSeries; index: number } | null = null;
    let bestTime = -Infinity;
    for (const run of this._byName.get(name)?.values() ?? []) {
      const n = run.times.length;
      if (!n || event.time < run.times[0] || event.time > run.times[n - 1] + 60) {
        continue;
      }
      const i = Math.max(0, lastAtOrBefore(run.times, event.time));
      if (run.times[i] > bestTime) {
        bestTime = run.times[i];
        best = { run, index: i };
      }
    }
    return best;
  }

  private _push(p: MetricPoint): void {
    let runs = this._byName.get(p.name);
    if (!runs) {
      runs = new Map();
      this._byName.set(p.name, runs);
    }
    let run = runs.get(p.run);
    if (!run) {
      run = { cell: p.cell, earlier: p.earlier, steps: [], times: [], elapsed: [], values: [] };
      runs.set(p.run, run);
    }
    if (!this._runs.has(p.run)) {
      this._runs.set(p.run, { cell: p.cell, earlier: p.earlier, started: p.time });
    }
    run.steps.push(p.step);
    run.times.push(p.time);
    run.elapsed.push(p.elapsed_s);
    run.values.push(p.value);
    if (run.steps.length > MAX_RUN_POINTS) {
      const drop = run.steps.length - MAX_RUN_POINTS;
      run.steps.splice(0, drop);
      run.times.splice(0, drop);
      run.elapsed.splice(0, drop);
      run.values.splice(0, drop);
    }
  }
}

/**
 * TensorBoard's scalar smoothing: an exponential moving average debiased
 * for its zero start (so the first point is the value itself). Nulls stay
 * null and do not advance the average.
 */
export function ema(values: readonly (number | null)[], weight: number): (number | null)[] {
  if (weight <= 0) {
    return [...values];
  }
  let last = 0;
  let count = 0;
  return values.map(v => {
    if (v === null || !Number.isFinite(v)) {
      return null;
    }
    last = last * weight + (1 - weight) * v;
    count++;
    return last / (1 - Math.pow(weight, count));
  });
}

/** The kernel's run key "train #2": its name and its number among the session's runs of that name. */
function splitRun(run: string): { base: string; number: string } {
  const m = /^(.*) #(\d+)$/.exec(run);
  return m ? { base: m[1], number: m[2] } : { base: run, number: '' };
}

function lastAtOrBefore(sorted: readonly number[], x: number): number {
  let lo = 0;
  let hi = sorted.length - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (sorted[mid] <= x) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found;
}
