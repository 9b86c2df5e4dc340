/**
 * A finished run's goodput over time (`goodput_intervals`) as chart columns:
 * each interval's time by category as a stack of percentages (productive at
 * the bottom), and the mean step time per interval with its standard
 * deviation as a band. Pure, unit-tested.
 */
import { GoodputIntervalsMessage } from '../protocol/messages';

export interface GoodputColumns {
  /** What the run is (`header`), for the section title. */
  header: string;
  /** Categories drawn: the ones that took time in the run, in stacking order. */
  categories: string[];
  /** x: each interval's middle, seconds from the run's start. */
  x: number[];
  /** Interval bounds, seconds from the run's start, for the readout. */
  start: number[];
  end: number[];
  /** Percent of each interval spent in each drawn category. */
  shares: (number | null)[][];
  /** The shares summed bottom-up (what the stacked chart draws). */
  stacked: (number | null)[][];
}

export interface StepTimeColumns {
  x: number[];
  /** Steps that started in each interval. */
  steps: number[];
  /** Mean step time (ms), and mean + / - one standard deviation (ms); null without steps. */
  mean: (number | null)[];
  upper: (number | null)[];
  lower: (number | null)[];
}

/** Percent of each interval by category, and their running sums bottom-up. */
export function goodputColumns(m: GoodputIntervalsMessage): GoodputColumns {
  const n = m.start_s.length;
  const start = m.start_s.map(v => v ?? 0);
  const end = m.end_s.map((v, i) => v ?? start[i]);
  const x = start.map((s, i) => (s + end[i]) / 2);
  const categories = m.categories.filter(c => (m.seconds[c] ?? []).some(v => (v ?? 0) > 0));
  const shares = categories.map(c =>
    Array.from({ length: n }, (_, i) => {
      const width = end[i] - start[i];
      const v = m.seconds[c]?.[i] ?? null;
      return v === null || !(width > 0) ? null : (100 * v) / width;
    })
  );
  const stacked: (number | null)[][] = [];
  shares.forEach((column, k) =>
    stacked.push(
      column.map((v, i) => {
        const below = k ? stacked[k - 1][i] : 0;
        return v === null || below === null ? null : below + v;
      })
    )
  );
  return { header: m.header, categories, x, start, end, shares, stacked };
}

/** Mean step time per interval with a one-standard-deviation band, in ms. */
export function stepTimeColumns(m: GoodputIntervalsMessage): StepTimeColumns {
  const { x } = goodputColumns(m);
  const ms = (v: number | null) => (v === null ? null : 1000 * v);
  const mean = m.step_time_mean_s.map(ms);
  const std = m.step_time_std_s.map(v => ms(v) ?? 0);
  return {
    x,
    steps: m.steps,
    mean,
    upper: mean.map((v, i) => (v === null ? null : v + std[i])),
    lower: mean.map((v, i) => (v === null ? null : Math.max(0, v - std[i])))
  };
}
