/**
 * Kernel messages built the way docs/protocol.md lays them out, for tests:
 * JSON `data` plus little-endian buffers handed over as DataViews at an
 * offset, like JupyterLab's deserializer does.
 */
import { Buffer } from '../src/protocol/messages';

/** Copy `array`'s bytes into a larger buffer at `offset` and view them, as the websocket decoder does. */
export function frame(array: ArrayBufferView, offset = 3): DataView {
  const backing = new Uint8Array(array.byteLength + offset + 5);
  backing.set(new Uint8Array(array.buffer, array.byteOffset, array.byteLength), offset);
  return new DataView(backing.buffer, offset, array.byteLength);
}

export interface Built {
  data: Record<string, unknown>;
  buffers: Buffer[];
}

/** A `topology` of `slices` slices of an x by y grid of chips each. */
export function topology(
  slices: number,
  x: number,
  y: number,
  options: { seq?: number; down?: number[]; backend?: string } = {}
): Built {
  const per = x * y;
  const n = slices * per;
  const ids = new Int32Array(n);
  const sliceOf = new Uint16Array(n);
  const coords = new Uint16Array(3 * n);
  for (let p = 0; p < n; p++) {
    ids[p] = p;
    sliceOf[p] = Math.floor(p / per);
    coords[3 * p] = (p % per) % x;
    coords[3 * p + 1] = Math.floor((p % per) / x);
  }
  return {
    data: {
      v: 1,
      type: 'topology',
      topology_seq: options.seq ?? 1,
      backend: options.backend ?? `local:${slices}x${per}`,
      target: 'embedded',
      platform: 'cpu',
      supports_fault_injection: true,
      chips: n,
      slices: Array.from({ length: slices }, (_, i) => ({
        index: i,
        state: options.down?.includes(i) ? 'down' : 'up',
        kind: 'cpu',
        shape: [x, y, 1],
        chip_offset: i * per,
        chip_count: per
      }))
    },
    buffers: [frame(ids), frame(sliceOf, 1), frame(coords, 2)]
  };
}

/** A `metrics` frame where every chip of slice i runs at `util[i]` and holds `memory[i]` units. */
export function metrics(
  slices: number,
  per: number,
  util: number[],
  options: {
    seq?: number;
    time?: number;
    topologySeq?: number;
    memory?: number[];
    unit?: number;
  } = {}
): Built {
  const n = slices * per;
  const u = new Uint8Array(n);
  const m = new Uint8Array(n);
  for (let p = 0; p < n; p++) {
    u[p] = Math.round(util[Math.floor(p / per)] * 255);
    m[p] = options.memory?.[Math.floor(p / per)] ?? 0;
  }
  const unit = options.unit ?? 1024;
  const mean = util.reduce((a, b) => a + b, 0) / util.length;
  return {
    data: {
      v: 1,
      type: 'metrics',
      seq: options.seq ?? 1,
      time: options.time ?? 1_700_000_000,
      topology_seq: options.topologySeq ?? 1,
      chips: n,
      source: 'client',
      window_s: 1,
      memory_unit: unit,
      slices: util.map((value, i) => ({
        index: i,
        state: 'up',
        utilization: value,
        memory_bytes: (options.memory?.[i] ?? 0) * unit * per,
        memory_limit_bytes: null
      })),
      utilization: mean,
      memory_bytes: 0
    },
    buffers: [frame(u), frame(m, 1)]
  };
}

export function event(seq: number, kind: string, extra: Record<string, unknown> = {}): Built {
  return {
    data: {
      v: 1,
      type: 'event',
      event: {
        seq,
        time: 1_700_000_000 + seq,
        kind,
        slices_before: null,
        slices_after: null,
        bytes: null,
        duration_s: null,
        step: null,
        detail: '',
        ...extra
      }
    },
    buffers: []
  };
}

/** A `history` of `slices` columns: `util[t][k]`, `up[t][k]`; every slice holds 2 KiB. */
export function history(
  slices: number[],
  times: number[],
  util: number[][],
  up: boolean[][]
): Built {
  const s = slices.length;
  const u = new Float32Array(times.length * s);
  const m = new Float64Array(times.length * s).fill(2048);
  const a = new Uint8Array(times.length * s);
  times.forEach((_, t) =>
    slices.forEach((__, k) => {
      u[t * s + k] = util[t][k];
      a[t * s + k] = up[t][k] ? 1 : 0;
    })
  );
  return {
    data: { v: 1, type: 'history', topology_seq: 1, window_s: 900, points: times.length, slices },
    buffers: [frame(new Float64Array(times), 0), frame(u, 4), frame(m, 8), frame(a, 1)]
  };
}
