import { test } from 'node:test';
import assert from 'node:assert/strict';

import { parseColor, utilizationRamp, packRGBA } from '../src/common/colors';
import { eventDetails, formatBytes, formatClock, statusLabel } from '../src/common/format';

test('status label reads like "Pathways 2/2 slices · 47%"', () => {
  assert.equal(
    statusLabel({ slicesUp: 2, slicesTotal: 2, chips: 8, utilization: 0.466 }),
    'Pathways 2/2 slices · 47%'
  );
  assert.equal(
    statusLabel({ slicesUp: 1, slicesTotal: 2, chips: 8, utilization: null }),
    'Pathways 1/2 slices'
  );
  assert.equal(statusLabel(null), 'Pathways');
});

test('a reshard event shows slices before -> after, bytes and duration', () => {
  const text = eventDetails({
    seq: 1,
    time: 0,
    kind: 'reshard',
    slices_before: [0, 1],
    slices_after: [0],
    bytes: 3 * 1024 * 1024,
    duration_s: 0.34,
    step: null,
    detail: ''
  });
  assert.equal(text, 'slices [0,1] → [0] · 3.0 MiB · 340 ms');
  assert.equal(formatBytes(512), '512 B');
});

test('theme colours parse and ramp from idle to busy', () => {
  assert.deepEqual(parseColor('#fff'), [255, 255, 255]);
  assert.deepEqual(parseColor(' #1976d2 '), [25, 118, 210]);
  assert.deepEqual(parseColor('rgba(1, 2, 3, 0.5)'), [1, 2, 3]);
  assert.equal(parseColor('var(--x)'), null);
  const lut = utilizationRamp([0, 0, 0], [100, 100, 100], [200, 0, 0]);
  assert.equal(lut[0], packRGBA([0, 0, 0]));
  assert.equal(lut[255], packRGBA([200, 0, 0]));
});

test('event times read to the millisecond: events of one elastic run fall within a second', () => {
  const a = formatClock(1_700_000_000.25);
  const b = formatClock(1_700_000_000.6);
  assert.match(a, /^\d\d:\d\d:\d\d\.250$/);
  assert.notEqual(a, b);
});
