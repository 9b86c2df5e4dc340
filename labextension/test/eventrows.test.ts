import { test } from 'node:test';
import assert from 'node:assert/strict';

import { foldEvents, rowDetails } from '../src/model/eventrows';
import { MonitorEvent } from '../src/protocol/messages';

let seq = 0;
function event(kind: string, fields: Partial<MonitorEvent> = {}): MonitorEvent {
  seq++;
  return {
    seq,
    time: 1000 + seq,
    kind,
    slices_before: null,
    slices_after: null,
    bytes: null,
    duration_s: null,
    step: null,
    detail: '',
    ...fields
  };
}

test('a snapshot every 10 steps is one row with its count and step range, split by a slice loss', () => {
  seq = 0;
  const oldestFirst = [
    event('connection_update', { detail: 'Connecting' }),
    event('connection_update', { detail: 'Connected' }),
    event('connect', { detail: 'local:2x4' }),
    ...[0, 10, 20, 30].flatMap(step => [
      event('snapshot', { step, bytes: 4096 }),
      event('steps', { step: step + 5 })
    ]),
    event('slice_down', { slices_before: [0, 1], slices_after: [0], detail: 'slice 1 lost' }),
    event('snapshot', { step: 40, bytes: 4096 }),
    event('snapshot', { step: 50, bytes: 4096 })
  ];
  const rows = foldEvents([...oldestFirst].reverse());
  const read = rows.map(r => `${r.events[r.events.length - 1].kind} ×${r.events.length}`);
  assert.deepEqual(read, [
    'snapshot ×2',
    'slice_down ×1',
    'steps ×4',
    'snapshot ×4',
    'connect ×1',
    'connection_update ×2'
  ]);
  assert.equal(rowDetails(rows[3]), 'step 0–30 · 4.0 KiB');
  assert.equal(rowDetails(rows[5]), 'newest: Connected');
  assert.equal(rowDetails(rows[1]), 'slices [0,1] → [0] · slice 1 lost');
});
