import { test } from 'node:test';
import assert from 'node:assert/strict';

import { downRuns, sparklinePoints } from '../src/model/sparkline';

test('a sparkline keeps one point per pixel column, the bucket peak, inside the window', () => {
  const times: number[] = [];
  const values: number[] = [];
  for (let i = 0; i < 600; i++) {
    times.push(1000 + i * 0.5);
    values.push(i === 300 ? 1 : 0.25);
  }
  const now = times[times.length - 1];
  const points = sparklinePoints({ times, values }, now, 300, 100, 20);
  assert.ok(points.length / 2 <= 100);
  const ys = points.filter((_, i) => i % 2 === 1);
  assert.equal(Math.min(...ys), 0, 'the one busy sample survives downsampling');
  assert.equal(Math.max(...ys), 15);
  // Samples older than the window are not drawn.
  assert.equal(sparklinePoints({ times, values }, now + 301, 300, 100, 20).length, 0);
  const half = sparklinePoints({ times, values }, now + 150, 300, 100, 20).length / 2;
  assert.ok(half >= 49 && half <= 51, `${half} columns for half a window`);
});

test('a lost slice is marked down from its loss on, not over its whole history', () => {
  const times: number[] = [];
  const up: boolean[] = [];
  for (let i = 0; i <= 300; i++) {
    times.push(1000 + i);
    up.push(i < 200 || i >= 250);
  }
  const series = { times, values: times.map(() => 0.5), memory: times.map(() => 0), up };
  assert.deepEqual(downRuns(series, 1300, 300, 300), [[200, 250]]);
  up.fill(false, 280);
  assert.deepEqual(downRuns(series, 1300, 300, 300), [
    [200, 250],
    [280, 300]
  ]);
  assert.deepEqual(downRuns({ ...series, up: times.map(() => true) }, 1300, 300, 300), []);
});
