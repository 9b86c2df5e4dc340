import { test } from 'node:test';
import assert from 'node:assert/strict';

import { MetricSeries, ema } from '../src/model/metricseries';
import { MetricPoint, MetricPointsMessage, MonitorEvent } from '../src/protocol/messages';

let seq = 0;
function point(
  run: string,
  step: number,
  value: number | null,
  name = 'loss',
  cell: number | null = null,
  earlier = false
): MetricPoint {
  seq++;
  return { seq, run, step, time: 1000 + step, elapsed_s: step, name, value, cell, earlier };
}
function message(points: MetricPoint[], replay = false): MetricPointsMessage {
  return { v: 1, type: 'metric_points', replay, points };
}
function event(time: number, step: number | null, kind = 'slice_down'): MonitorEvent {
  return {
    seq: 1,
    time,
    kind,
    slices_before: null,
    slices_after: null,
    bytes: null,
    duration_s: null,
    step,
    detail: ''
  };
}

test('runs overlay on the union of their steps, one column each', () => {
  const m = new MetricSeries();
  m.add(
    message([point('a #1', 0, 4), point('a #1', 1, 2), point('b #1', 1, 8), point('b #1', 2, 6)])
  );
  m.add(message([point('a #1', 2, 1, 'acc')]));
  assert.deepEqual(m.names(), ['loss', 'acc']);
  assert.deepEqual(m.columns('loss', 0), {
    labels: ["run 'a' #1 · loss", "run 'b' #1 · loss"],
    data: [
      [0, 1, 2],
      [4, 2, null],
      [null, 8, 6]
    ],
    colors: [0, 1]
  });
});

test('a run reads by its name, cell and metric; the run number only tells apart runs of one cell', () => {
  const m = new MetricSeries();
  m.add(
    message([
      point('params #1', 0, 4, 'loss', 4),
      point('params #2', 0, 3, 'loss', 5),
      point('sweep #1', 0, 2, 'loss', 6),
      point('sweep #2', 0, 1, 'loss', 6)
    ])
  );
  assert.deepEqual(m.columns('loss', 0).labels, [
    "run 'params' (cell 4) · loss",
    "run 'params' (cell 5) · loss",
    "run 'sweep' (cell 6) #1 · loss",
    "run 'sweep' (cell 6) #2 · loss"
  ]);
});

test('a replay replaces what was held; live points already replayed are dropped', () => {
  const m = new MetricSeries();
  const first = point('a #1', 0, 4);
  m.add(message([first]));
  const replayed = [first, point('a #1', 1, 3)];
  m.add(message(replayed, true));
  m.add(message([replayed[1]]));
  assert.deepEqual(m.columns('loss', 0).data, [
    [0, 1],
    [4, 3]
  ]);
  m.add(message([], true));
  assert.deepEqual(m.names(), []);
});

test('smoothing is TensorBoard’s debiased EMA: the first point is itself, later ones lag', () => {
  assert.deepEqual(ema([10, null, 0], 0), [10, null, 0]);
  const s = ema([10, 0], 0.5);
  assert.equal(s[0], 10);
  // (0.5 * 5 + 0.5 * 0) / (1 - 0.25) = 2.5 / 0.75
  assert.ok(Math.abs((s[1] as number) - 2.5 / 0.75) < 1e-12);
  const m = new MetricSeries();
  m.add(message([point('r #1', 0, 10), point('r #1', 1, 0)]));
  assert.notDeepEqual(m.columns('loss', 0.6).data[1], m.columns('loss', 0).data[1]);
});

test('an event lands on the step a run had logged by then, or its own step', () => {
  const m = new MetricSeries();
  m.add(message([point('r #1', 0, 1), point('r #1', 5, 1), point('r #1', 9, 1)]));
  assert.equal(m.stepOf('loss', event(1006.5, null)), 5);
  assert.equal(m.stepOf('loss', event(1003, 7)), 7);
  assert.equal(m.stepOf('loss', event(900, null)), null);
  assert.equal(m.stepOf('acc', event(1006, null)), null);
});

test('against wall time, runs overlay from their own starts', () => {
  const m = new MetricSeries();
  // Run b started 500 s after run a, and logs every 2 s.
  const late = (step: number, value: number): MetricPoint => ({
    ...point('b #1', step, value),
    time: 1500 + 2 * step,
    elapsed_s: 2 * step
  });
  m.add(message([point('a #1', 0, 4), point('a #1', 1, 3), late(0, 8), late(1, 6)]));
  assert.deepEqual(m.columns('loss', 0, 'wall').data, [
    [0, 1, 2],
    [4, 3, null],
    [8, null, 6]
  ]);
  // An event 1.5 s into run b is 1.5 s on the wall axis, at step 0 on the step axis.
  assert.equal(m.wallOf('loss', event(1501.5, null)), 1.5);
  assert.equal(m.stepOf('loss', event(1501.5, null)), 0);
  assert.equal(m.wallOf('loss', event(900, null)), null);
});

test('runs read back from an earlier kernel are listed and labelled as such; only the runs shown are drawn', () => {
  const m = new MetricSeries();
  m.add(
    message(
      [
        point('train #1', 0, 3, 'loss', 4, true),
        point('train #2', 0, 2, 'loss', 4),
        point('eval #1', 0, 1, 'acc', 5)
      ],
      true
    )
  );
  assert.deepEqual(
    m.allRuns().map(r => [r.run, r.title, r.earlier]),
    [
      ['train #1', "run 'train' (cell 4) #1", true],
      ['train #2', "run 'train' (cell 4) #2", false],
      ['eval #1', "run 'eval' (cell 5)", false]
    ]
  );
  assert.deepEqual(m.columns('loss', 0).labels, [
    "run 'train' (cell 4) #1 · earlier kernel · loss",
    "run 'train' (cell 4) #2 · loss"
  ]);
  const only = m.columns('loss', 0, 'step', run => run === 'train #2');
  assert.deepEqual(only.labels, ["run 'train' (cell 4) #2 · loss"]);
  assert.deepEqual(only.data, [[0], [2]]);
  assert.deepEqual(only.colors, [0]);
});
