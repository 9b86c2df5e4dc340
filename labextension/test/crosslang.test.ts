/**
 * The TypeScript and Python sides of protocol v1 agree: messages encoded by
 * pathways_kernel.monitoring.protocol decode here, and requests encoded here
 * pass the kernel's validation. Runs the venv's Python (skipped without it).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';

import * as protocol from '../src/protocol/messages';
import {
  HistoryMessage,
  MetricsMessage,
  ReplyMessage,
  RequestBody,
  TopologyMessage,
  decodeChipHistory,
  decodeClose,
  decodeMessage,
  encodeRequest
} from '../src/protocol/messages';

const PYTHON = process.env.PATHWAYS_PYTHON ?? resolve('.venv/bin/python');
const skip = existsSync(PYTHON) ? false : `no Python at ${PYTHON} (set PATHWAYS_PYTHON)`;

function python(script: string, input = ''): string {
  return execFileSync(PYTHON, ['-c', script], {
    input,
    encoding: 'utf-8',
    env: { ...process.env, JAX_PLATFORMS: 'cpu' }
  });
}

const KERNEL_MESSAGES = `
import base64, json
import numpy as np
from pathways_kernel.monitoring import protocol as p
from pathways_kernel.monitoring.telemetry import SliceMetrics

topology = p.TopologyMessage(
    topology_seq=3, backend="local:2x4", target="embedded", platform="cpu", supports_fault_injection=True,
    slices=(p.SliceInfo(0, "up", "cpu", (2, 2, 1), 0, 4), p.SliceInfo(1, "down", "cpu", (2, 2, 1), 4, 4)),
    chip_id=np.arange(8, dtype=np.int32) + 100,
    chip_slice=np.repeat(np.arange(2, dtype=np.uint16), 4),
    chip_coords=np.array([[i % 2, (i % 4) // 2, 0] for i in range(8)], np.uint16),
)
nbytes = np.array([0, 1, 2, 3, 4, 5, 6, 200 * 4096], np.int64)
unit = p.memory_unit_for(int(nbytes.max()))
metrics = p.MetricsMessage(
    seq=9, time=1700000000.5, topology_seq=3, source="client", window_s=2.0, memory_unit=unit,
    slices=(SliceMetrics(0, "up", 0.5, 6, None), SliceMetrics(1, "down", 0.0, 0, None)),
    utilization=0.5, memory_bytes=6 + 200 * 4096,
    chip_utilization=p.quantize_utilization(np.array([0, 0.25, 0.5, 1, 0, 0, 0, 0])),
    chip_memory=p.quantize_memory(nbytes, unit),
)
event = {"seq": 4, "time": 1700000000.0, "kind": "reshard", "slices_before": (0, 1), "slices_after": (0,),
         "bytes": 1 << 20, "duration_s": 0.25, "step": 7, "detail": "x"}
out = []
up = np.ones((3, 2), bool)
up[2, 1] = False
history = p.HistoryMessage(
    topology_seq=3, slices=(0, 1), window_s=900.0, time=np.array([1700000000.0, 1700000000.5, 1700000001.0]),
    utilization=np.array([[0.5, 0.25], [1.0, 0.75], [0.0, 0.0]], np.float32),
    memory_bytes=np.array([[1, 2], [3, 4], [2**40, 0]], np.float64), up=up,
)
chips = p.ChipHistory(3, 4, 8, 4096, np.array([1.0, 2.0]), np.arange(8, dtype=np.uint8).reshape(2, 4),
                      np.full((2, 4), 255, np.uint8))
for data, buffers in (p.encode_topology(topology), p.encode_metrics(metrics), p.encode_event(event),
                      p.encode_reply("r1", True, result={"rate": 2.0}), p.encode_no_backend("proxy unreachable"),
                      p.encode_history(history), p.encode_chip_history_reply("c1", chips)):
    out.append({"data": data, "buffers": [base64.b64encode(b).decode() for b in buffers]})
print(json.dumps(out))
`;

test('messages from the Python encoder decode in TypeScript', { skip }, () => {
  const messages = JSON.parse(python(KERNEL_MESSAGES)) as { data: unknown; buffers: string[] }[];
  const decoded = messages.map(m =>
    decodeMessage(
      m.data,
      m.buffers.map(b => {
        const bytes = Buffer.from(b, 'base64');
        return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      })
    )
  );
  const topology = decoded[0] as TopologyMessage;
  assert.equal(topology.chips, 8);
  assert.deepEqual([...topology.chip_id], [100, 101, 102, 103, 104, 105, 106, 107]);
  assert.deepEqual([...topology.chip_coords.slice(9, 12)], [1, 1, 0]);
  assert.equal(topology.slices[1].state, 'down');
  const metrics = decoded[1] as MetricsMessage;
  assert.deepEqual([...metrics.utilization_buffer.slice(0, 4)], [0, 64, 128, 255]);
  assert.equal(metrics.memory_buffer[7] * metrics.memory_unit, 200 * 4096);
  assert.equal(metrics.memory_unit, 4096, 'smallest power of two that fits 819,200 B in 254 units');
  const event = decoded[2];
  assert.equal(event.type, 'event');
  if (event.type === 'event') {
    assert.deepEqual(
      [event.event.slices_before, event.event.slices_after, event.event.step],
      [[0, 1], [0], 7]
    );
  }
  assert.deepEqual(decoded[3], {
    v: 1,
    type: 'reply',
    request_id: 'r1',
    ok: true,
    error: null,
    result: { rate: 2 },
    buffers: []
  });
  assert.deepEqual(decoded[4], { v: 1, type: 'no_backend', error: 'proxy unreachable' });
  const history = decoded[5] as HistoryMessage;
  assert.deepEqual([history.points, history.slices, history.window_s], [3, [0, 1], 900]);
  assert.deepEqual([...history.utilization], [0.5, 0.25, 1, 0.75, 0, 0]);
  assert.equal(history.memory_bytes[4], 2 ** 40);
  assert.deepEqual([...history.up], [1, 1, 1, 1, 1, 0], 'slice 1 down at its last point only');
  const chips = decodeChipHistory(decoded[6] as ReplyMessage);
  assert.deepEqual([chips.start, chips.stop, chips.points, chips.memory_unit], [4, 8, 2, 4096]);
  assert.deepEqual([...chips.utilization], [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.equal(chips.memory[7], protocol.MEMORY_SATURATED);
});

const CONSTANTS = `
import json
from pathways_kernel.monitoring import protocol as p
print(json.dumps({
    "VERSION": p.VERSION, "TARGET": p.TARGET, "KERNEL_TYPES": p.KERNEL_TYPES,
    "REQUEST_FIELDS": p.REQUEST_FIELDS, "MAX_RATE_HZ": p.MAX_RATE_HZ, "MAX_REQUEST_ID": p.MAX_REQUEST_ID,
    "PING_INTERVAL_S": p.PING_INTERVAL_S, "STALE_AFTER_S": p.STALE_AFTER_S, "CLOSE_REASONS": p.CLOSE_REASONS,
    "MAX_CHIP_HISTORY": p.MAX_CHIP_HISTORY,
    "MEMORY_SATURATED": p.MEMORY_SATURATED,
    "closed": [p.close_data(r) for r in p.CLOSE_REASONS],
}))
`;

test('both sides hold the same protocol constants and close reasons', { skip }, () => {
  const py = JSON.parse(python(CONSTANTS)) as Record<string, unknown>;
  const ts: Record<string, unknown> = {
    VERSION: protocol.VERSION,
    TARGET: protocol.TARGET,
    KERNEL_TYPES: protocol.KERNEL_TYPES,
    REQUEST_FIELDS: protocol.REQUEST_FIELDS,
    MAX_RATE_HZ: protocol.MAX_RATE_HZ,
    MAX_REQUEST_ID: protocol.MAX_REQUEST_ID,
    PING_INTERVAL_S: protocol.PING_INTERVAL_S,
    STALE_AFTER_S: protocol.STALE_AFTER_S,
    CLOSE_REASONS: protocol.CLOSE_REASONS,
    MEMORY_SATURATED: protocol.MEMORY_SATURATED,
    MAX_CHIP_HISTORY: protocol.MAX_CHIP_HISTORY
  };
  for (const name of Object.keys(ts)) {
    assert.deepEqual(ts[name], py[name], name);
  }
  assert.deepEqual((py.closed as unknown[]).map(decodeClose), protocol.CLOSE_REASONS);
  assert.equal(decodeClose(undefined), 'unknown');
  assert.equal(decodeClose({ v: 1, type: 'closed', reason: 'bored' }), 'unknown');
});

const DECODE_REQUESTS = `
import json, sys
from pathways_kernel.monitoring import protocol as p
out = []
for data in json.load(sys.stdin):
    try:
        r = p.decode_request(data)
        out.append({"ok": True, "type": r.type, "request_id": r.request_id, "rate": r.rate, "slice": r.slice,
                    "start": r.start, "stop": r.stop})
    except p.ProtocolError as e:
        out.append({"ok": False, "error": str(e)})
print(json.dumps(out))
`;

test('requests encoded in TypeScript pass the kernel validation', { skip }, () => {
  const bodies: RequestBody[] = [
    { type: 'subscribe', rate: 0.5 },
    { type: 'ping' },
    { type: 'fail_slice', slice: 1 },
    { type: 'repair_slice', slice: 0 },
    { type: 'snapshot' },
    { type: 'chip_history', start: 4, stop: 8 }
  ];
  const requests = bodies.map((b, i) => encodeRequest(b, `req-${i}`));
  const replies = JSON.parse(python(DECODE_REQUESTS, JSON.stringify(requests))) as Record<
    string,
    unknown
  >[];
  replies.forEach((r, i) => {
    assert.equal(r.ok, true, JSON.stringify(r));
    assert.equal(r.type, bodies[i].type);
    assert.equal(r.request_id, `req-${i}`);
  });
  assert.equal(replies[0].rate, 0.5);
  assert.equal(replies[2].slice, 1);
  assert.deepEqual([replies[5].start, replies[5].stop], [4, 8]);
  assert.throws(() =>
    encodeRequest({ type: 'chip_history', start: 0, stop: protocol.MAX_CHIP_HISTORY + 1 }, 'r')
  );
  // The longest request_id one side allows, the other accepts; one more, both refuse.
  const longest = JSON.parse(
    python(
      DECODE_REQUESTS,
      JSON.stringify([encodeRequest({ type: 'ping' }, 'x'.repeat(protocol.MAX_REQUEST_ID))])
    )
  ) as Record<string, unknown>[];
  assert.equal(longest[0].ok, true, JSON.stringify(longest[0]));
  assert.throws(() => encodeRequest({ type: 'ping' }, 'x'.repeat(protocol.MAX_REQUEST_ID + 1)));
  const tooLong = JSON.parse(
    python(
      DECODE_REQUESTS,
      JSON.stringify([{ v: 1, type: 'ping', request_id: 'x'.repeat(protocol.MAX_REQUEST_ID + 1) }])
    )
  ) as Record<string, unknown>[];
  assert.equal(tooLong[0].ok, false);
});
