/**
 * Sparkline geometry: a slice's utilization series reduced to at most one
 * point per pixel column over a fixed time window. Pure, unit-tested.
 */
import { Series } from './monitormodel';

/**
 * Points (x, y) in a `width` x `height` box for `series` over the
 * `windowS` seconds ending at `now`; each pixel column keeps its bucket's
 * maximum so short bursts stay visible. Returns a flat [x0, y0, x1, y1, ...].
 */
export function sparklinePoints(
  series: Pick<Series, 'times' | 'values'>,
  now: number,
  windowS: number,
  width: number,
  height: number
): number[] {
  const points: number[] = [];
  const start = now - windowS;
  let column = -1;
  let peak = 0;
  const flush = () => {
    if (column >= 0) {
      points.push(column, height - peak * height);
    }
  };
  for (let i = 0; i < series.times.length; i++) {
    const t = series.times[i];
    if (t < start) {
      continue;
    }
    const x = Math.min(width - 1, Math.floor(((t - start) / windowS) * width));
    if (x !== column) {
      flush();
      column = x;
      peak = 0;
    }
    peak = Math.max(peak, Math.min(1, Math.max(0, series.values[i])));
  }
  flush();
  return points;
}

/**
 * The pixel-column runs `[from, to)` of the same window in which the slice
 * was down (`series.up` false), so a lost slice is marked from its loss on,
 * not over its whole history.
 */
export function downRuns(
  series: Series,
  now: number,
  windowS: number,
  width: number
): [number, number][] {
  const runs: [number, number][] = [];
  const start = now - windowS;
  const column = (t: number) =>
    Math.min(width, Math.max(0, Math.floor(((t - start) / windowS) * width)));
  let from = -1;
  for (let i = 0; i < series.times.length; i++) {
    const t = series.times[i];
    if (t < start) {
      continue;
    }
    if (!series.up[i] && from < 0) {
      from = column(t);
    } else if (series.up[i] && from >= 0) {
      runs.push([from, Math.max(from + 1, column(t))]);
      from = -1;
    }
  }
  if (from >= 0) {
    runs.push([from, Math.max(from + 1, column(now))]);
  }
  return runs;
}
