/**
 * The TypeScript side of protocol v1 against the protocol's schema
 * (pathways_kernel/monitoring/protocol.schema.json), which the kernel's encoders
 * and the Python test frontend are checked against too (tests/monitoring/test_protocol.py):
 * every message type decodes, the decoded message names every field and buffer
 * of the schema and no other, a message without any field, or with a value of
 * another type, is refused; requests carry exactly the schema's fields.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';

import * as protocol from '../src/protocol/messages';
import {
  ProtocolError,
  ReplyMessage,
  RequestBody,
  decodeChipHistory,
  decodeLatestProfile,
  decodeMessage,
  encodeRequest
} from '../src/protocol/messages';

interface FieldSpec {
  type: string;
  nullable?: boolean;
  fields?: Record<string, FieldSpec>;
  items?: FieldSpec;
}
interface BufferSpec {
  name: string;
  dtype: string;
  shape: (string | number)[];
  typescript?: string;
}
interface MessageSpec {
  fields: Record<string, FieldSpec>;
  buffers: BufferSpec[];
  example: { data: Record<string, unknown>; buffers: number[][] };
}
interface Schema {
  version: number;
  target: string;
  constants: Record<string, number>;
  close_reasons: string[];
  kernel: Record<string, MessageSpec>;
  results: Record<string, MessageSpec>;
  requests: { types: Record<string, { fields: Record<string, FieldSpec>; example: object }> };
}

const SCHEMA = JSON.parse(
  readFileSync(resolve('pathways_kernel/monitoring/protocol.schema.json'), 'utf-8')
) as Schema;

const ARRAYS: Record<string, { new (values: number[]): ArrayBufferView }> = {
  int32: Int32Array,
  uint16: Uint16Array,
  uint8: Uint8Array,
  float32: Float32Array,
  float64: Float64Array
};

/** A value of another JSON type than the field's. */
const WRONG: Record<string, unknown> = {
  integer: '1',
  number: 'x',
  string: 1,
  boolean: 1,
  object: [],
  map: [],
  array: {},
  enum: '?'
};

function buffersOf(spec: MessageSpec): ArrayBufferView[] {
  return spec.buffers.map((b, i) => new ARRAYS[b.dtype](spec.example.buffers[i]));
}

function message(kind: string, data: Record<string, unknown>): Record<string, unknown> {
  return { v: SCHEMA.version, type: kind, ...data };
}

/** Each field's path (nested objects, and an array's first object, included) with its spec. */
function fieldPaths(
  fields: Record<string, FieldSpec>,
  data: Record<string, unknown>,
  at: (string | number)[] = []
): [(string | number)[], FieldSpec][] {
  const out: [(string | number)[], FieldSpec][] = [];
  for (const [key, spec] of Object.entries(fields)) {
    out.push([[...at, key], spec]);
    const value = data[key];
    if (spec.type === 'object' && spec.fields && value && typeof value === 'object') {
      out.push(...fieldPaths(spec.fields, value as Record<string, unknown>, [...at, key]));
    }
    if (spec.type === 'array' && spec.items?.fields && Array.isArray(value) && value.length) {
      out.push(
        ...fieldPaths(spec.items.fields, value[0] as Record<string, unknown>, [...at, key, 0])
      );
    }
  }
  return out;
}

/** A copy of `data` with the field at `path` removed (no `value`) or set to `value`. */
function mutated(
  data: Record<string, unknown>,
  path: (string | number)[],
  ...value: unknown[]
): Record<string, unknown> {
  const out = structuredClone(data);
  let parent = out as Record<string | number, unknown>;
  for (const step of path.slice(0, -1)) {
    parent = parent[step] as Record<string | number, unknown>;
  }
  const last = path[path.length - 1];
  if (value.length) {
    parent[last] = value[0];
  } else {
    delete parent[last];
  }
  return out;
}

test('the schema holds the types, requests and limits this side holds', () => {
  assert.equal(protocol.VERSION, SCHEMA.version);
  assert.equal(protocol.TARGET, SCHEMA.target);
  assert.deepEqual([...protocol.KERNEL_TYPES].sort(), Object.keys(SCHEMA.kernel).sort());
  assert.deepEqual(
    protocol.REQUEST_FIELDS,
    Object.fromEntries(
      Object.entries(SCHEMA.requests.types).map(([k, v]) => [k, Object.keys(v.fields)])
    )
  );
  assert.deepEqual(protocol.CLOSE_REASONS, SCHEMA.close_reasons);
  const constants = protocol as unknown as Record<string, unknown>;
  for (const [name, value] of Object.entries(SCHEMA.constants)) {
    assert.equal(constants[name], value, name);
  }
});

for (const [kind, spec] of Object.entries(SCHEMA.kernel)) {
  test(`${kind}: decoded with every field and buffer of the schema, refused without any`, () => {
    const data = message(kind, spec.example.data);
    const buffers = buffersOf(spec);
    const decoded = decodeMessage(data, buffers) as unknown as Record<string, unknown>;
    const names = [
      'v',
      'type',
      ...Object.keys(spec.fields),
      ...spec.buffers.map(b => b.typescript ?? b.name),
      // A reply keeps its buffers for the result's decoder (decodeChipHistory).
      ...(kind === 'reply' ? ['buffers'] : [])
    ];
    assert.deepEqual(Object.keys(decoded).sort(), names.sort());
    for (const [path, field] of fieldPaths(spec.fields, data)) {
      const sub = path.reduce<unknown>(
        (o, k) => (o as Record<string | number, unknown>)[k],
        decoded
      );
      if (field.type === 'object' && field.fields) {
        assert.deepEqual(
          Object.keys(sub as object).sort(),
          Object.keys(field.fields).sort(),
          path.join('.')
        );
      }
      if (!field.nullable) {
        assert.throws(
          () => decodeMessage(mutated(data, path), buffers),
          ProtocolError,
          `${path.join('.')} missing`
        );
      }
      assert.throws(
        () => decodeMessage(mutated(data, path, WRONG[field.type]), buffers),
        ProtocolError,
        `${path.join('.')} of another type`
      );
    }
  });
}

test('the results the panel and dashboard read are decoded as the schema says', () => {
  const replies: Record<string, (reply: ReplyMessage) => object> = {
    chip_history: decodeChipHistory,
    latest_profile: decodeLatestProfile
  };
  assert.deepEqual(Object.keys(replies).sort(), Object.keys(SCHEMA.results).sort());
  for (const [kind, spec] of Object.entries(SCHEMA.results)) {
    const reply = (result: Record<string, unknown>) =>
      decodeMessage(
        message('reply', { request_id: 'r', ok: true, error: null, result }),
        buffersOf(spec)
      ) as ReplyMessage;
    const decoded = replies[kind](reply(spec.example.data));
    const names = [...Object.keys(spec.fields), ...spec.buffers.map(b => b.name)];
    assert.deepEqual(Object.keys(decoded).sort(), names.sort(), kind);
    for (const [key, field] of Object.entries(spec.fields)) {
      if (!field.nullable) {
        assert.throws(() => replies[kind](reply(mutated(spec.example.data, [key]))), ProtocolError);
      }
      assert.throws(
        () => replies[kind](reply(mutated(spec.example.data, [key], WRONG[field.type]))),
        ProtocolError,
        `${kind}.${key}`
      );
    }
  }
});

test('requests carry exactly the fields of the schema', () => {
  for (const [kind, spec] of Object.entries(SCHEMA.requests.types)) {
    const body = { type: kind, ...spec.example } as RequestBody;
    const request = encodeRequest(body, 'r') as unknown as Record<string, unknown>;
    assert.deepEqual(
      Object.keys(request).sort(),
      ['v', 'type', 'request_id', ...Object.keys(spec.fields)].sort(),
      kind
    );
  }
});
