import { test } from 'node:test';
import assert from 'node:assert/strict';

import { RunInfo } from '../src/model/metricseries';
import { DEFAULT_RUNS, RunSelection } from '../src/model/runselection';

function runs(n: number, earlier = 0): RunInfo[] {
  return Array.from({ length: n }, (_, i) => ({
    run: `r #${i + 1}`,
    title: `run 'r' #${i + 1}`,
    cell: null,
    earlier: i < earlier,
    started: i
  }));
}

test('by default the newest runs are shown', () => {
  const s = new RunSelection();
  assert.equal(DEFAULT_RUNS, 3);
  assert.deepEqual([...s.shown(runs(5))], ['r #3', 'r #4', 'r #5']);
  assert.deepEqual([...s.shown(runs(2))], ['r #1', 'r #2']);
  assert.equal(s.picked, false);
});

test('picks stay while runs start, and the run in progress shows unless hidden itself', () => {
  const s = new RunSelection();
  s.pick('r #1', true);
  s.pick('r #4', false);
  assert.deepEqual([...s.shown(runs(4))], ['r #1', 'r #2', 'r #3']);
  // Two more runs start: the old picks hold; the newest come in by default.
  assert.deepEqual([...s.shown(runs(6))], ['r #1', 'r #5', 'r #6']);
  s.pick('r #6', false);
  assert.deepEqual([...s.shown(runs(6))], ['r #1', 'r #5']);
  s.reset();
  assert.deepEqual([...s.shown(runs(6))], ['r #4', 'r #5', 'r #6']);
});

test("this kernel's newest run shows even behind newer-listed earlier runs", () => {
  const s = new RunSelection();
  const list = runs(5, 0).map((r, i) => ({ ...r, earlier: i !== 0 }));
  assert.deepEqual([...s.shown(list)], ['r #1', 'r #3', 'r #4', 'r #5']);
});
