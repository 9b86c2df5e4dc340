import { test } from 'node:test';
import assert from 'node:assert/strict';

import { goodputColumns, stepTimeColumns } from '../src/model/goodputseries';
import { GoodputIntervalsMessage } from '../src/protocol/messages';

function intervals(): GoodputIntervalsMessage {
  return {
    v: 1,
    type: 'goodput_intervals',
    run: 'train',
    kind: 'elastic',
    header: "run 'train'",
    started: 100,
    wall_s: 4,
    categories: ['productive', 'compile', 'recovery', 'other'],
    start_s: [0, 2],
    end_s: [2, 4],
    goodput: [0.25, 0.75],
    seconds: {
      productive: [0.5, 1.5],
      compile: [1.5, 0],
      recovery: [0, 0.5],
      other: [0, 0]
    },
    steps: [2, 6],
    step_time_mean_s: [0.25, 0.2],
    step_time_std_s: [0.3, null],
    step_time: { steps: 8, median_s: 0.2, mean_s: 0.21, std_s: 0.05, slowest: [] }
  };
}

test('goodput stacks each interval by category in percent, categories that took no time left out', () => {
  const g = goodputColumns(intervals());
  assert.deepEqual(g.categories, ['productive', 'compile', 'recovery']);
  assert.deepEqual(g.x, [1, 3]);
  assert.deepEqual(g.shares, [
    [25, 75],
    [75, 0],
    [0, 25]
  ]);
  // Each interval's stack tops out at 100 %.
  assert.deepEqual(g.stacked[2], [100, 100]);
  assert.deepEqual(g.stacked[0], [25, 75]);
});

test('step time per interval: mean in ms with a one-deviation band, never below zero', () => {
  const s = stepTimeColumns(intervals());
  assert.deepEqual(s.mean, [250, 200]);
  assert.deepEqual(s.upper, [550, 200]);
  assert.deepEqual(s.lower, [0, 200]);
  assert.deepEqual(s.steps, [2, 6]);
});
