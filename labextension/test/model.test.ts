import { test } from 'node:test';
import assert from 'node:assert/strict';

import { HISTORY_S, MonitorModel } from '../src/model/monitormodel';
import { decodeMessage } from '../src/protocol/messages';
import { Built, event, history, metrics, topology } from './fixtures';

const feed = (model: MonitorModel, built: Built) =>
  model.handle(decodeMessage(built.data, built.buffers));

test('a 2x4 topology gives two slice grids of 2x2 chips and a summary', () => {
  const model = new MonitorModel();
  const changes: string[] = [];
  model.subscribe(c => changes.push(c));
  feed(model, topology(2, 2, 2));
  assert.deepEqual(changes, ['topology']);
  assert.equal(model.grids.length, 2);
  assert.deepEqual([model.grids[1].cols, model.grids[1].rows], [2, 2]);
  assert.deepEqual([...model.grids[1].cells], [4, 5, 6, 7]);
  assert.deepEqual(model.summary(), { slicesUp: 2, slicesTotal: 2, chips: 8, utilization: null });
  feed(model, metrics(2, 4, [0.25, 0.75]));
  assert.equal(model.summary()?.utilization, 0.5);
});

test('chip info for the tooltip: id, slice, coords, utilization, memory', () => {
  const model = new MonitorModel();
  feed(model, topology(2, 2, 2, { down: [1] }));
  assert.equal(model.chip(5)?.utilization, null);
  feed(model, metrics(2, 4, [1, 0], { memory: [2, 255], unit: 4096 }));
  const chip = model.chip(5)!;
  assert.deepEqual(chip.coords, [1, 0, 0]);
  assert.equal(chip.slice, 1);
  assert.equal(chip.state, 'down');
  assert.equal(chip.memoryBytes, 255 * 4096);
  assert.equal(chip.memoryAtLeast, true);
  assert.equal(model.chip(0)!.utilization, 1);
  assert.equal(model.chip(0)!.memoryBytes, 8192);
  assert.equal(model.chip(8), null);
});

test('metrics of another topology or chip count are dropped', () => {
  const model = new MonitorModel();
  assert.equal(
    model.addMetrics(
      decodeMessage(metrics(2, 4, [1, 1]).data, metrics(2, 4, [1, 1]).buffers) as never
    ),
    false
  );
  feed(model, topology(2, 2, 2, { seq: 3 }));
  feed(model, metrics(2, 4, [1, 1], { topologySeq: 2 }));
  feed(model, metrics(1, 4, [1], { topologySeq: 3 }));
  assert.equal(model.metrics, null);
  assert.equal(model.dropped, 3);
  feed(model, metrics(2, 4, [1, 1], { topologySeq: 3 }));
  assert.notEqual(model.metrics, null);
  // A slice going down keeps the last frame on show for the healthy slices (no blanking)...
  feed(model, topology(2, 2, 2, { seq: 4, down: [1] }));
  assert.equal(model.summary()?.utilization, 1);
  // ...but frames still stamped with the old topology are not taken.
  assert.equal(
    model.addMetrics(
      decodeMessage(
        metrics(2, 4, [0, 0], { topologySeq: 3 }).data,
        metrics(2, 4, [0, 0], { topologySeq: 3 }).buffers
      ) as never
    ),
    false
  );
  // Another chip count does invalidate them.
  feed(model, topology(1, 2, 2, { seq: 5 }));
  assert.equal(model.metrics, null);
});

test('per-slice history keeps the last fifteen minutes', () => {
  const model = new MonitorModel();
  feed(model, topology(2, 2, 2));
  const t0 = 1_700_000_000;
  for (let i = 0; i <= 2000; i++) {
    feed(model, metrics(2, 4, [i / 2000, 0.5], { seq: i + 1, time: t0 + i * 0.5 }));
  }
  assert.equal(HISTORY_S, 900);
  const h = model.history(0);
  const last = t0 + 1000;
  assert.equal(h.times[h.times.length - 1], last);
  assert.ok(h.times[0] >= last - HISTORY_S && h.times[0] <= last - HISTORY_S + 0.5);
  assert.equal(h.times.length, h.values.length);
  assert.equal(h.times.length, 1801);
  assert.equal(h.values[h.values.length - 1], 1);
  assert.deepEqual(model.history(9), { times: [], values: [], memory: [], up: [] });
});

test('the kernel history seeds every slice at once, with when each slice was down', () => {
  const model = new MonitorModel();
  const changes: string[] = [];
  model.subscribe(c => changes.push(c));
  feed(model, topology(2, 2, 2));
  const t0 = 1_700_000_000;
  // A frame that arrived before the history is kept after it.
  feed(model, metrics(2, 4, [0.5, 0.5], { time: t0 + 10 }));
  feed(
    model,
    history(
      [0, 1],
      [t0, t0 + 1, t0 + 2],
      [
        [1, 0.5],
        [1, 0],
        [0.25, 0]
      ],
      [
        [true, true],
        [true, false],
        [true, false]
      ]
    )
  );
  assert.deepEqual(changes, ['topology', 'metrics', 'history']);
  const h0 = model.history(0);
  assert.deepEqual(h0.times, [t0, t0 + 1, t0 + 2, t0 + 10]);
  assert.deepEqual(h0.values, [1, 1, 0.25, 0.5]);
  assert.deepEqual(model.history(1).up, [true, false, false, true]);
  assert.deepEqual(model.history(1).memory.slice(0, 3), [2048, 2048, 2048]);
  // A frame the history already holds is not counted twice.
  feed(model, metrics(2, 4, [0.5, 0.5], { seq: 2, time: t0 + 10 }));
  assert.equal(model.history(0).times.length, 4);
});

test('events: newest first, deduplicated by seq, reset forgets all', () => {
  const model = new MonitorModel();
  for (const seq of [1, 3, 2, 3]) {
    feed(model, event(seq, seq === 3 ? 'slice_down' : 'connect'));
  }
  assert.deepEqual(
    model.events.map(e => e.seq),
    [3, 2, 1]
  );
  assert.equal(model.events[0].kind, 'slice_down');
  model.reset();
  assert.equal(model.events.length, 0);
  assert.equal(model.topology, null);
  assert.equal(model.summary(), null);
});
