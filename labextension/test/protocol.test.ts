import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  ProtocolError,
  TopologyMessage,
  MetricsMessage,
  ReplyMessage,
  decodeLatestProfile,
  decodeMessage,
  encodeRequest
} from '../src/protocol/messages';
import { event, frame, metrics, topology } from './fixtures';

test('topology decodes with per-chip buffers as typed arrays, aligned or not', () => {
  const t = topology(2, 2, 2);
  const m = decodeMessage(t.data, t.buffers) as TopologyMessage;
  assert.equal(m.type, 'topology');
  assert.equal(m.chips, 8);
  assert.equal(m.slices.length, 2);
  assert.deepEqual(m.slices[1], {
    index: 1,
    state: 'up',
    kind: 'cpu',
    shape: [2, 2, 1],
    chip_offset: 4,
    chip_count: 4
  });
  assert.ok(m.chip_id instanceof Int32Array);
  assert.deepEqual([...m.chip_id], [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual([...m.chip_slice], [0, 0, 0, 0, 1, 1, 1, 1]);
  assert.deepEqual([...m.chip_coords.slice(9, 12)], [1, 1, 0]);
  assert.equal(m.supports_fault_injection, true);
});

test('metrics decode: 2 bytes per chip, utilization and memory as uint8', () => {
  const t = metrics(2, 4, [0.5, 1], { memory: [3, 255] });
  const m = decodeMessage(t.data, t.buffers) as MetricsMessage;
  assert.equal(m.utilization_buffer.byteLength + m.memory_buffer.byteLength, 2 * 8);
  assert.equal(m.utilization_buffer[0], 128);
  assert.equal(m.utilization_buffer[7], 255);
  assert.equal(m.memory_buffer[0], 3);
  assert.equal(m.memory_buffer[7], 255);
  assert.equal(m.slices[0].utilization, 0.5);
  assert.equal(m.slices[0].memory_limit_bytes, null);
});

test('events and replies decode; unknown kinds are an open set', () => {
  const e = event(7, 'reshard', {
    slices_before: [0, 1],
    slices_after: [0],
    bytes: 1024,
    duration_s: 0.25,
    step: 12
  });
  const m = decodeMessage(e.data);
  assert.equal(m.type, 'event');
  if (m.type === 'event') {
    assert.deepEqual(m.event.slices_after, [0]);
    assert.equal(m.event.duration_s, 0.25);
  }
  assert.equal(decodeMessage(event(8, 'something_new').data).type, 'event');
  const r = decodeMessage({
    v: 1,
    type: 'reply',
    request_id: 'r1',
    ok: false,
    error: 'no',
    result: null
  });
  assert.deepEqual(r, {
    v: 1,
    type: 'reply',
    request_id: 'r1',
    ok: false,
    error: 'no',
    result: null,
    buffers: []
  });
});

test('no_backend decodes with its one-line error', () => {
  assert.deepEqual(decodeMessage({ v: 1, type: 'no_backend', error: 'ConnectError: refused' }), {
    v: 1,
    type: 'no_backend',
    error: 'ConnectError: refused'
  });
});

test('messages that break the contract are rejected', () => {
  const t = topology(2, 2, 2);
  const bad: [unknown, ArrayBufferView[]][] = [
    ['not an object', []],
    [[1, 2], []],
    [{ ...t.data, v: 2 }, t.buffers as ArrayBufferView[]],
    [{ ...t.data, v: '1' }, t.buffers as ArrayBufferView[]],
    [{ v: 1, type: 'gossip' }, []],
    [t.data, (t.buffers as ArrayBufferView[]).slice(0, 2)],
    [
      t.data,
      [frame(new Int32Array(7)), t.buffers[1] as ArrayBufferView, t.buffers[2] as ArrayBufferView]
    ],
    [{ ...t.data, chips: 9 }, t.buffers as ArrayBufferView[]],
    [{ ...t.data, supports_fault_injection: 1 }, t.buffers as ArrayBufferView[]],
    [
      { ...t.data, slices: [(t.data.slices as object[])[1], (t.data.slices as object[])[0]] },
      t.buffers as ArrayBufferView[]
    ]
  ];
  const m = metrics(2, 4, [0.5, 0.5]);
  const mb = m.buffers as ArrayBufferView[];
  bad.push(
    [{ ...m.data, utilization: 1.5 }, mb],
    [{ ...m.data, utilization: NaN }, mb],
    [{ ...m.data, memory_unit: 3 }, mb],
    [{ ...m.data, seq: true }, mb],
    [{ ...m.data, chips: 1.5 }, mb],
    [{ ...m.data, window_s: 0 }, mb],
    [m.data, [mb[0], frame(new Uint8Array(4))]],
    [{ ...m.data, topology_seq: 0 }, mb],
    [event(1, 'x').data, [frame(new Uint8Array(1))]],
    [{ ...event(1, 'x').data, event: { seq: 0, time: 1, kind: 'x' } }, []],
    // detail is always sent (docs/protocol.md), as the kernel's decoder requires.
    [{ ...event(1, 'x').data, event: { seq: 1, time: 1, kind: 'x' } }, []],
    [{ v: 1, type: 'no_backend' }, []],
    [{ v: 1, type: 'no_backend', error: 'x' }, [frame(new Uint8Array(1))]]
  );
  for (const [data, buffers] of bad) {
    assert.throws(
      () => decodeMessage(data, buffers),
      ProtocolError,
      JSON.stringify(data)?.slice(0, 80)
    );
  }
});

test('requests encode with v, type, request_id and only their fields', () => {
  assert.deepEqual(encodeRequest({ type: 'subscribe', rate: 2 }, 'a'), {
    v: 1,
    type: 'subscribe',
    request_id: 'a',
    rate: 2
  });
  assert.deepEqual(encodeRequest({ type: 'fail_slice', slice: 1 }, 'b'), {
    v: 1,
    type: 'fail_slice',
    request_id: 'b',
    slice: 1
  });
  assert.deepEqual(encodeRequest({ type: 'snapshot' }, 'c'), {
    v: 1,
    type: 'snapshot',
    request_id: 'c'
  });
  assert.deepEqual(encodeRequest({ type: 'ping' }, 'd'), { v: 1, type: 'ping', request_id: 'd' });
  assert.throws(() => encodeRequest({ type: 'subscribe', rate: 11 }, 'a'), ProtocolError);
  assert.throws(() => encodeRequest({ type: 'subscribe', rate: NaN }, 'a'), ProtocolError);
  assert.throws(() => encodeRequest({ type: 'repair_slice', slice: 1.5 }, 'a'), ProtocolError);
  assert.throws(() => encodeRequest({ type: 'repair_slice', slice: -1 }, 'a'), ProtocolError);
  assert.throws(() => encodeRequest({ type: 'ping' }, ''), ProtocolError);
  assert.throws(() => encodeRequest({ type: 'ping' }, 'x'.repeat(129)), ProtocolError);
});

test('latest_profile encodes without fields; its result decodes with run null when none', () => {
  assert.deepEqual(encodeRequest({ type: 'latest_profile' }, 'p'), {
    v: 1,
    type: 'latest_profile',
    request_id: 'p'
  });
  const reply = (result: Record<string, unknown>) =>
    decodeMessage({
      v: 1,
      type: 'reply',
      request_id: 'p',
      ok: true,
      error: null,
      result
    }) as ReplyMessage;
  const none = decodeLatestProfile(
    reply({
      run: null,
      name: null,
      where: null,
      time: null,
      message: 'no capture in this kernel yet'
    })
  );
  assert.equal(none.run, null);
  assert.equal(none.message, 'no capture in this kernel yet');
  const some = decodeLatestProfile(
    reply({
      run: 'k/20260101-000000-loop',
      name: 'loop',
      where: '/p',
      time: 1.5,
      message: 'profile loop'
    })
  );
  assert.equal(some.run, 'k/20260101-000000-loop');
  assert.throws(() => decodeLatestProfile(reply({ run: 3, message: '' })), ProtocolError);
});

test('goodput_intervals decodes its per-interval columns; nulls stay null', () => {
  const message = decodeMessage({
    v: 1,
    type: 'goodput_intervals',
    run: 'train',
    kind: 'elastic',
    header: "run 'train'",
    started: 1.5,
    wall_s: 2,
    categories: ['productive', 'compile'],
    start_s: [0, 1],
    end_s: [1, 2],
    goodput: [0.25, 1],
    seconds: { productive: [0.25, 1], compile: [0.75, 0] },
    steps: [1, 4],
    step_time_mean_s: [null, 0.25],
    step_time_std_s: [null, 0],
    step_time: { steps: 4, median_s: 0.25, mean_s: 0.25, std_s: 0, slowest: [] }
  });
  assert.equal(message.type, 'goodput_intervals');
  if (message.type === 'goodput_intervals') {
    assert.deepEqual(message.seconds.compile, [0.75, 0]);
    assert.deepEqual(message.step_time_mean_s, [null, 0.25]);
  }
  assert.throws(() => decodeMessage({ v: 1, type: 'goodput_intervals', run: 'x' }), ProtocolError);
});
