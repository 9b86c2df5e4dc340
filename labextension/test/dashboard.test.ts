import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  DashboardModel,
  MAX_SLICE_LINES,
  SLICE_WINDOW_S,
  clock,
  isEmulated,
  sliceCapacity,
  sliceName,
  stepPoint
} from '../src/model/dashboardmodel';
import {
  MetricsMessage,
  MonitorEvent,
  TopologyMessage,
  decodeMessage
} from '../src/protocol/messages';
import { event, metrics, topology } from './fixtures';

const GIB = 1024 ** 3;

function decoded<T>(built: { data: Record<string, unknown>; buffers: unknown[] }): T {
  return decodeMessage(built.data, built.buffers as DataView[]) as T;
}

function ev(seq: number, kind: string, extra: Record<string, unknown> = {}): MonitorEvent {
  return decoded<{ event: MonitorEvent }>(event(seq, kind, extra)).event;
}

function withDown(m: MetricsMessage, slice: number): MetricsMessage {
  m.slices[slice] = { ...m.slices[slice], state: 'down', utilization: 0, memory_bytes: 1 << 20 };
  return m;
}

test('a slice that goes down leaves a gap from then on; its history before the loss keeps its values', () => {
  const d = new DashboardModel();
  d.setTopology(decoded<TopologyMessage>(topology(2, 2, 2)));
  d.addMetrics(decoded(metrics(2, 4, [0.5, 1], { time: 100 })));
  d.addMetrics(withDown(decoded(metrics(2, 4, [0.5, 1], { time: 101 })), 1));
  const u = d.utilization();
  assert.deepEqual(u.labels, ['slice 0', 'slice 1']);
  assert.deepEqual(u.data[0], [100, 101]);
  assert.deepEqual(u.data[1], [50, 50]);
  assert.deepEqual(u.data[2], [100, null], 'down: a gap, not 0% and not a red history');
  // Memory of a lost slice is not drawn as if it were usable.
  const m = d.memory();
  assert.equal(m.data[2][1], null);
});

test('slices of two TPU generations are labelled with their kind of chip; CPU slices by index only', () => {
  const d = new DashboardModel();
  const t = decoded<TopologyMessage>(topology(2, 2, 2));
  t.slices = [
    { ...t.slices[0], kind: 'TPU v5p' },
    { ...t.slices[1], kind: 'TPU v6 lite' }
  ];
  d.setTopology(t);
  d.addMetrics(decoded(metrics(2, 4, [0.5, 1], { time: 100 })));
  assert.deepEqual(d.utilization().labels, ['slice 0 · TPU v5p', 'slice 1 · TPU v6 lite']);
  assert.deepEqual(d.memory().labels.slice(0, 2), ['slice 0 · TPU v5p', 'slice 1 · TPU v6 lite']);
  assert.equal(sliceName({ index: 3, kind: 'cpu' }), 'slice 3');
});

test('memory capacity: reported limit, else the TPU type, else the emulated figure (labelled), else unknown', () => {
  const emulated = decoded<TopologyMessage>(topology(2, 2, 2));
  const slice = emulated.slices[0];
  assert.deepEqual(sliceCapacity(emulated, slice, 123, 16), { bytes: 123, source: 'reported' });
  assert.deepEqual(sliceCapacity(emulated, slice, null, 16), {
    bytes: 64 * GIB,
    source: 'emulated'
  });
  const tpu = { ...emulated, backend: 'proxy', target: 'grpc://h:1' };
  assert.deepEqual(sliceCapacity(tpu, { ...slice, kind: 'TPU v5 lite' }, null, 16), {
    bytes: 4 * 16 * GIB,
    source: 'tpu'
  });
  assert.deepEqual(sliceCapacity(tpu, { ...slice, kind: 'TPU v5' }, null, 16).bytes, 4 * 95 * GIB);
  assert.deepEqual(sliceCapacity(tpu, slice, null, 16), { bytes: null, source: 'unknown' });
  // Both local backends emulate chips with CPU devices: the server (local:) and the in-process one.
  for (const backend of ['local:2x4', 'local-server:2x4', 'embedded:2x4']) {
    assert.equal(
      isEmulated({ ...emulated, backend, target: 'grpc://unix:/tmp/x/s.sock' }),
      true,
      backend
    );
  }
  assert.equal(isEmulated(tpu), false);

  const d = new DashboardModel();
  d.setTopology(emulated);
  d.addMetrics(decoded(metrics(2, 4, [0, 0], { time: 1 })));
  const m = d.memory();
  assert.match(m.labels[m.labels.length - 1], /emulated 16 GiB\/chip/);
  assert.equal(m.data[m.data.length - 1][0], 64 * GIB);
  // Changing the setting rescales the capacity already drawn.
  d.setEmulatedChipGiB(8);
  assert.equal(d.memory().data[m.data.length - 1][0], 32 * GIB);
  assert.match(d.memory().labels[m.labels.length - 1], /emulated 8 GiB\/chip/);
});

test('many slices: min / mean / max across up slices instead of a line each; total memory vs capacity', () => {
  const slices = MAX_SLICE_LINES + 1;
  const d = new DashboardModel();
  d.setTopology(decoded<TopologyMessage>(topology(slices, 2, 1)));
  const util = Array.from({ length: slices }, (_, i) => i / (slices - 1));
  d.addMetrics(
    withDown(decoded(metrics(slices, 2, util, { time: 5, memory: util.map(() => 1) })), 0)
  );
  const u = d.utilization();
  assert.deepEqual(u.labels, ['min of up slices', 'mean of up slices', 'max of up slices']);
  const [min, , max] = u.data.slice(1).map(c => c[0] as number);
  assert.ok(Math.abs(min - 100 / (slices - 1)) < 1e-9, 'the down slice (0%) is not the minimum');
  assert.equal(max, 100);
  const m = d.memory();
  assert.equal(m.data[1][0], (slices - 1) * 2 * 1024, 'bytes of up slices only');
  assert.equal(m.data[2][0], (slices - 1) * 2 * 16 * GIB, 'capacity of up slices');
});

test('series keep the last 15 minutes of kernel time, and start over when the clock goes back', () => {
  const d = new DashboardModel();
  d.setTopology(decoded<TopologyMessage>(topology(1, 2, 1)));
  for (let t = 0; t <= SLICE_WINDOW_S + 200; t += 1) {
    d.addSlicePoint(t, [10], [0]);
  }
  const times = d.utilization().data[0] as number[];
  assert.ok(times[0] >= 200 - 64 && times[0] <= 200, `oldest ${times[0]}`);
  d.addSlicePoint(3, [10], [0]);
  assert.deepEqual(d.utilization().data[0], [3]);
});

test('steps events become step time (ms) and throughput per run; they are not markers', () => {
  const e = ev(1, 'steps', {
    step: 40,
    duration_s: 0.0125,
    detail: "elastic 'train': 61.5 steps/s"
  });
  assert.deepEqual(stepPoint(e), {
    run: "elastic 'train'",
    time: e.time,
    step: 40,
    stepTimeS: 0.0125,
    stepsPerS: 61.5
  });
  assert.equal(stepPoint(ev(2, 'steps', { step: 1, duration_s: 1, detail: 'garbled' })), null);
  const d = new DashboardModel();
  d.addEvents([
    e,
    ev(3, 'steps', { step: 90, duration_s: 0.01, detail: "elastic 'train': 50 steps/s" }),
    ev(4, 'steps', { step: 5, duration_s: 0.2, detail: "steps 'eval': 5 steps/s" }),
    ev(5, 'slice_down', { slices_before: [0, 1], slices_after: [0] })
  ]);
  const st = d.stepTime();
  assert.deepEqual(st.labels, ["elastic 'train'", "steps 'eval'"]);
  assert.deepEqual(st.data[0], [e.time, e.time + 2, e.time + 3]);
  assert.deepEqual(st.data[1], [12.5, 10, null]);
  assert.deepEqual(st.data[2], [null, null, 200]);
  assert.deepEqual(d.throughput().data[1], [61.5, 50, null]);
  assert.deepEqual(
    d.markers().map(m => m.kind),
    ['slice_down']
  );
});

test('markers: newest first, deduplicated, filtered by kind; the filter offers the usual kinds and any seen', () => {
  const d = new DashboardModel();
  d.addEvents([ev(1, 'snapshot'), ev(2, 'reshard'), ev(3, 'slice_down'), ev(4, 'my_kind')]);
  d.addEvents([ev(2, 'reshard')]);
  // Routine kinds (a snapshot every few steps) start hidden: no comb of markers until asked for.
  assert.deepEqual(
    d.markers().map(e => e.seq),
    [4, 3, 2]
  );
  d.hiddenKinds.delete('snapshot');
  assert.deepEqual(
    d.markers().map(e => e.seq),
    [4, 3, 2, 1]
  );
  d.hiddenKinds.add('snapshot');
  assert.deepEqual(
    d.markers().map(e => e.kind),
    ['my_kind', 'slice_down', 'reshard']
  );
  const kinds = d.kinds();
  for (const k of [
    'slice_down',
    'slice_up',
    'reshard',
    'snapshot',
    'checkpoint',
    'compile',
    'goodput'
  ]) {
    assert.ok(kinds.includes(k), k);
  }
  assert.equal(kinds[kinds.length - 1], 'my_kind');
  d.reset();
  assert.equal(d.markers().length, 0);
});

test('per-chip utilization of the chosen slice: live frames, with older history loaded in front', () => {
  const d = new DashboardModel();
  d.setTopology(decoded<TopologyMessage>(topology(2, 2, 1)));
  d.addMetrics(decoded(metrics(2, 2, [0.2, 1], { time: 10 })));
  assert.deepEqual(d.chips().labels, [], 'no slice chosen: no chip chart');
  d.setChipSlice(1);
  d.addMetrics(decoded(metrics(2, 2, [0.2, 1], { time: 11 })));
  d.loadChipHistory(1, [8, 9, 11], [0, 255, 51, 51, 255, 255], 2);
  const c = d.chips();
  assert.deepEqual(c.labels, ['chip 2', 'chip 3']);
  assert.deepEqual(c.data[0], [8, 9, 11]);
  assert.deepEqual(c.data[1], [0, 20, 100]);
  assert.deepEqual(c.data[2], [100, 20, 100]);
});

test('the live range grows with the series until it spans the kept window', () => {
  const d = new DashboardModel();
  d.setTopology(decoded<TopologyMessage>(topology(1, 2, 1)));
  assert.deepEqual(d.liveRange(1000, 900), [940, 1000], 'at least a minute');
  d.addSlicePoint(800, [1], [0]);
  assert.deepEqual(d.liveRange(1000, 900), [800, 1000]);
  assert.deepEqual(d.liveRange(2000, 900), [1100, 2000]);
});

test('event times keep tenths of a second', () => {
  const t = new Date(2026, 11, 1, 9, 5, 7, 480).getTime() / 1000;
  assert.equal(clock(t), '09:05:07.4');
});

test('the kernel history seeds the slice series in front of the frames that came first; down points stay gaps', () => {
  const d = new DashboardModel();
  d.setTopology(decoded<TopologyMessage>(topology(2, 2, 2)));
  d.addMetrics(decoded(metrics(2, 4, [0.5, 0.5], { time: 110 })));
  d.loadSliceHistory([
    { times: [100, 101, 110], values: [0.1, 0.2, 0.5], memory: [1, 2, 3], up: [true, true, true] },
    { times: [100, 101, 110], values: [1, 0, 0.5], memory: [4, 5, 6], up: [true, false, true] }
  ]);
  const u = d.utilization();
  assert.deepEqual(u.data[0], [100, 101, 110]);
  assert.deepEqual(u.data[1], [10, 20, 50]);
  assert.deepEqual(u.data[2], [100, null, 50]);
  assert.deepEqual(d.memory().data[2], [4, null, 6]);
});

test('memory as % of capacity: each slice over the capacity at that point, no capacity line', () => {
  const d = new DashboardModel();
  d.setTopology(decoded<TopologyMessage>(topology(2, 2, 2)));
  d.addSlicePoint(100, [50, 50], [32 * 2 ** 20, 0]);
  const bytes = d.memory();
  const percent = d.memoryPercent();
  assert.equal(percent.labels.length, bytes.labels.length - 1);
  const capacity = bytes.data[bytes.data.length - 1][0] as number;
  assert.ok(capacity > 0);
  assert.equal(percent.data[1][0], (100 * 32 * 2 ** 20) / capacity);
  assert.equal(percent.data[2][0], 0);
});
