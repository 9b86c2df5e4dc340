import { test } from 'node:test';
import assert from 'node:assert/strict';

import { sparklinePoints } from '../src/sparkline';

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
