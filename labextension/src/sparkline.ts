/**
 * Sparkline geometry: a slice's utilization series reduced to at most one
 * point per pixel column over a fixed time window. Pure, unit-tested.
 */
import { Series } from './model';

/**
 * Points (x, y) in a `width` x `height` box for `series` over the
 * `windowS` seconds ending at `now`; each pixel column keeps its bucket's
 * maximum so short bursts stay visible. Returns a flat [x0, y0, x1, y1, ...].
 */
export function sparklinePoints(series: Series, now: number, windowS: number, width: number, height: number): number[] {
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
