/**
 * Monitor protocol v1, the TypeScript side (comm target `pathways.monitor`).
 *
 * Mirrors docs/protocol.md (the contract) and
 * pathways_kernel/monitoring/protocol.py field for field: the same names, the
 * same limits, the same validation rules (test/crosslang.test.ts checks the
 * constants below against Python's). Pure: no JupyterLab imports, unit-tested.
 * Kernel messages are decoded into typed objects with per-chip buffers as
 * typed arrays; anything that breaks the contract throws `ProtocolError`
 * and the caller drops the message.
 */

export const VERSION = 1;
export const TARGET = 'pathways.monitor';
/** Kernel -> frontend message types. */
export const KERNEL_TYPES = [
  'topology',
  'history',
  'metrics',
  'event',
  'reply',
  'no_backend',
  'metric_points',
  'goodput_intervals',
  'phases',
  'starting'
] as const;
/** States of a `starting` message. */
export const START_STATES = ['starting', 'ready', 'failed'] as const;
/** Frontend -> kernel request types and their own fields. */
export const REQUEST_FIELDS = {
  subscribe: ['rate'],
  ping: [],
  fail_slice: ['slice'],
  repair_slice: ['slice'],
  snapshot: [],
  chip_history: ['start', 'stop'],
  latest_profile: []
} as const;
/** Highest metrics rate a frontend may ask for (Hz). */
export const MAX_RATE_HZ = 10;
/** Longest `request_id` the kernel accepts (characters). */
export const MAX_REQUEST_ID = 128;
/** How often a frontend must say it is there (a `comm_info_request`, or `ping`) so the kernel keeps its comm (s). */
export const PING_INTERVAL_S = 15;
/** Silence after which the kernel closes a comm (s). */
export const STALE_AFTER_S = 60;
/** Most chips one `chip_history` request may ask for. */
export const MAX_CHIP_HISTORY = 4096;
/** Why the kernel closed a comm (`closed` in its `comm_close`). */
export const CLOSE_REASONS = ['stale', 'evicted', 'shutdown'] as const;

export type SliceState = 'up' | 'down';

export class ProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ProtocolError';
  }
}

// ---- kernel -> frontend -------------------------------------------------

export interface TopologySlice {
  index: number;
  state: SliceState;
  kind: string;
  shape: number[];
  chip_offset: number;
  chip_count: number;
}

export interface TopologyMessage {
  v: 1;
  type: 'topology';
  topology_seq: number;
  backend: string;
  target: string;
  platform: string;
  supports_fault_injection: boolean;
  chips: number;
  slices: TopologySlice[];
  /** Buffer 0: JAX device id of chip p. */
  chip_id: Int32Array;
  /** Buffer 1: slice index of chip p. */
  chip_slice: Uint16Array;
  /** Buffer 2: (x, y, z) of chip p at [3p, 3p + 3). */
  chip_coords: Uint16Array;
}

export interface SliceMetrics {
  index: number;
  state: SliceState;
  utilization: number;
  memory_bytes: number;
  memory_limit_bytes: number | null;
}

export interface MetricsMessage {
  v: 1;
  type: 'metrics';
  seq: number;
  time: number;
  topology_seq: number;
  chips: number;
  source: string;
  window_s: number;
  memory_unit: number;
  slices: SliceMetrics[];
  utilization: number;
  memory_bytes: number;
  /** Buffer 0: chip utilization, value / 255. */
  utilization_buffer: Uint8Array;
  /** Buffer 1: chip memory in `memory_unit`s; MEMORY_SATURATED = at least that. */
  memory_buffer: Uint8Array;
}

export const MEMORY_SATURATED = 255;

/**
 * The per-slice series the kernel kept, sent once per subscription right
 * after `topology`: T points (oldest first) by S slice columns, row-major
 * (slice `slices[k]` at point `t` is element `t * S + k`).
 */
export interface HistoryMessage {
  v: 1;
  type: 'history';
  topology_seq: number;
  /** Seconds of history the kernel keeps per slice (900). */
  window_s: number;
  /** T. */
  points: number;
  /** Slice index of each column (S = its length). */
  slices: number[];
  /** Buffer 0: kernel wall clock of each point (s since the epoch), ascending. */
  time: Float64Array;
  /** Buffer 1: slice utilization in [0, 1] (0 while down). */
  utilization: Float32Array;
  /** Buffer 2: bytes in use on the slice. */
  memory_bytes: Float64Array;
  /** Buffer 3: 1 while the slice was up, 0 while down. */
  up: Uint8Array;
}

/**
 * The per-chip series of chip positions [start, stop) (the reply to
 * `chip_history`): T points by C = stop - start chips, row-major (chip
 * position `start + c` at point `t` is element `t * C + c`).
 */
export interface ChipHistory {
  topology_seq: number;
  start: number;
  stop: number;
  points: number;
  /** Bytes per unit of `memory`, one for the whole history. */
  memory_unit: number;
  /** Kernel wall clock of each point, ascending (one a second, last 5 minutes). */
  time: Float64Array;
  /** Chip utilization, value / 255. */
  utilization: Uint8Array;
  /** Chip memory in `memory_unit`s; MEMORY_SATURATED = at least that. */
  memory: Uint8Array;
}

export interface MonitorEvent {
  seq: number;
  time: number;
  kind: string;
  slices_before: number[] | null;
  slices_after: number[] | null;
  bytes: number | null;
  duration_s: number | null;
  step: number | null;
  detail: string;
}

export interface EventMessage {
  v: 1;
  type: 'event';
  event: MonitorEvent;
}

export interface ReplyMessage {
  v: 1;
  type: 'reply';
  request_id: string | null;
  ok: boolean;
  error: string | null;
  result: Record<string, unknown> | null;
  /** Binary buffers: only the reply to `chip_history` has them (decode with `decodeChipHistory`). */
  buffers: readonly Buffer[];
}

/** The kernel has no backend; `error` says why in one line. Topology follows once one connects. */
export interface NoBackendMessage {
  v: 1;
  type: 'no_backend';
  error: string;
}

/**
 * The kernel's backend is starting (a fresh kernel's local Pathways server): what,
 * its steps, how many are done and the seconds so far. Topology follows `ready`.
 */
export interface StartingMessage {
  v: 1;
  type: 'starting';
  /** "starting the local Pathways server (2 slices x 4 chips)" */
  what: string;
  steps: string[];
  done: number;
  state: (typeof START_STATES)[number];
  error: string | null;
  elapsed_s: number;
}

/** One training metric value (`pw.log`, an elastic run's loss): a row of `pw.metrics()`. */
export interface MetricPoint {
  seq: number;
  /** The run's name and its number among the session's runs of that name: "train #2". */
  run: string;
  step: number;
  time: number;
  elapsed_s: number;
  name: string;
  /** Null when not finite. */
  value: number | null;
  /** The notebook cell (`In [n]`) the run started in; null outside a cell. */
  cell: number | null;
  /** Logged by an earlier kernel of this session, read back after a restart. */
  earlier: boolean;
}

/** Training metric points, oldest first; `replay`: the session's so far, replacing what was held. */
export interface MetricPointsMessage {
  v: 1;
  type: 'metric_points';
  replay: boolean;
  points: MetricPoint[];
}

/** One phase a loop marked with `pw.phase` (training/phases.py): a span of one role's time on one mesh. */
export interface PhaseSpan {
  seq: number;
  /** The run it belongs to; "" outside one. */
  run: string;
  phase: string;
  /** Whose time it is: "trainer", "rollout", ... */
  role: string;
  /** "slice 1 · TPU v6 lite"; "" when not given. */
  mesh: string;
  slices: number[];
  /** Kernel wall clock (s since the epoch). */
  start: number;
  end: number;
  step: number | null;
}

/** Phase spans, oldest first; `replay`: the session's so far, replacing what was held. */
export interface PhasesMessage {
  v: 1;
  type: 'phases';
  replay: boolean;
  spans: PhaseSpan[];
}

/** A finished run's goodput over time (`pw.goodput_over_time`): one value per interval in each array. */
export interface GoodputIntervalsMessage {
  v: 1;
  type: 'goodput_intervals';
  run: string;
  kind: string;
  header: string;
  started: number;
  wall_s: number;
  /** Stacking order: productive, then the badput categories. */
  categories: string[];
  start_s: (number | null)[];
  end_s: (number | null)[];
  goodput: (number | null)[];
  /** Category -> seconds per interval. */
  seconds: Record<string, (number | null)[]>;
  steps: number[];
  step_time_mean_s: (number | null)[];
  step_time_std_s: (number | null)[];
  step_time: StepTimeStats;
}

/** The run's step-time figures (`goodput_timeline.step_time_stats`); null where it had no steps. */
export interface StepTimeStats {
  steps: number;
  median_s: number | null;
  mean_s: number | null;
  std_s: number | null;
  /** The slowest steps, slowest first. */
  slowest: { step: number; seconds: number }[];
}

export type KernelMessage =
  | GoodputIntervalsMessage
  | PhasesMessage
  | MetricPointsMessage
  | TopologyMessage
  | HistoryMessage
  | MetricsMessage
  | EventMessage
  | ReplyMessage
  | NoBackendMessage
  | StartingMessage;

/** A close reason the kernel sent, or `unknown` when it sent none (the comm target is missing, ...). */
export type CloseReason = (typeof CLOSE_REASONS)[number] | 'unknown';

/** What a comm message's buffers may arrive as (JupyterLab hands DataViews). */
export type Buffer = ArrayBuffer | ArrayBufferView;

/**
 * Decode and validate one kernel -> frontend message.
 *
 * @param data the comm message's `data`.
 * @param buffers the comm message's binary buffers, in order.
 * @throws ProtocolError when the message breaks the contract.
 */
export function decodeMessage(data: unknown, buffers: readonly Buffer[] = []): KernelMessage {
  const msg = object(data, 'message');
  if (msg.v !== VERSION) {
    throw new ProtocolError(
      `unsupported protocol version ${JSON.stringify(msg.v)}; expected ${VERSION}`
    );
  }
  switch (msg.type) {
    case 'topology':
      return decodeTopology(msg, buffers);
    case 'history':
      return decodeHistory(msg, buffers);
    case 'metrics':
      return decodeMetrics(msg, buffers);
    case 'event':
      noBuffers('event', buffers);
      return { v: 1, type: 'event', event: decodeEvent(object(msg.event, 'event.event')) };
    case 'reply':
      return decodeReply(msg, buffers);
    case 'metric_points':
      noBuffers('metric_points', buffers);
      return {
        v: 1,
        type: 'metric_points',
        replay: boolean(msg.replay, 'metric_points.replay'),
        points: array(msg.points, 'metric_points.points').map((p, i) => {
          const o = object(p, `metric_points.points[${i}]`);
          const at = `metric_points.points[${i}]`;
          return {
            seq: integer(o.seq, `${at}.seq`, 1),
            run: string(o.run, `${at}.run`),
            step: integer(o.step, `${at}.step`, -Infinity),
            time: number(o.time, `${at}.time`),
            elapsed_s: number(o.elapsed_s, `${at}.elapsed_s`),
            name: string(o.name, `${at}.name`),
            value: nullable(o.value, v => number(v, `${at}.value`)),
            cell: nullable(o.cell, v => integer(v, `${at}.cell`, -Infinity)),
            earlier: boolean(o.earlier, `${at}.earlier`)
          };
        })
      };
    case 'phases':
      noBuffers('phases', buffers);
      return decodePhases(msg);
    case 'goodput_intervals':
      noBuffers('goodput_intervals', buffers);
      return decodeGoodputIntervals(msg);
    case 'starting': {
      noBuffers('starting', buffers);
      const state = string(msg.state, 'starting.state');
      if (!(START_STATES as readonly string[]).includes(state)) {
        throw new ProtocolError(`starting.state must be one of ${START_STATES.join(', ')}`);
      }
      const elapsed = number(msg.elapsed_s, 'starting.elapsed_s');
      if (elapsed < 0) {
        throw new ProtocolError('starting.elapsed_s must be >= 0');
      }
      return {
        v: 1,
        type: 'starting',
        what: string(msg.what, 'starting.what'),
        steps: array(msg.steps, 'starting.steps').map((s, i) => string(s, `starting.steps[${i}]`)),
        done: integer(msg.done, 'starting.done', 0),
        state: state as StartingMessage['state'],
        error: nullable(msg.error, v => string(v, 'starting.error')),
        elapsed_s: elapsed
      };
    }
    case 'no_backend':
      noBuffers('no_backend', buffers);
      return { v: 1, type: 'no_backend', error: string(msg.error, 'no_backend.error') };
    default:
      throw new ProtocolError(
        `unknown message type ${JSON.stringify(msg.type)}; expected one of ${KERNEL_TYPES.join(', ')}`
      );
  }
}

function decodePhases(msg: Record<string, unknown>): PhasesMessage {
  return {
    v: 1,
    type: 'phases',
    replay: boolean(msg.replay, 'phases.replay'),
    spans: array(msg.spans, 'phases.spans').map((p, i) => {
      const at = `phases.spans[${i}]`;
      const o = object(p, at);
      return {
        seq: integer(o.seq, `${at}.seq`, 1),
        run: string(o.run, `${at}.run`),
        phase: string(o.phase, `${at}.phase`),
        role: string(o.role, `${at}.role`),
        mesh: string(o.mesh, `${at}.mesh`),
        slices: array(o.slices, `${at}.slices`).map((x, k) =>
          integer(x, `${at}.slices[${k}]`, -Infinity)
        ),
        start: number(o.start, `${at}.start`),
        end: number(o.end, `${at}.end`),
        step: nullable(o.step, v => integer(v, `${at}.step`, -Infinity))
      };
    })
  };
}

function decodeGoodputIntervals(msg: Record<string, unknown>): GoodputIntervalsMessage {
  const at = 'goodput_intervals';
  const numbers = (v: unknown, name: string) =>
    array(v, `${at}.${name}`).map((x, i) => nullable(x, y => number(y, `${at}.${name}[${i}]`)));
  const categories = array(msg.categories, `${at}.categories`).map((c, i) =>
    string(c, `${at}.categories[${i}]`)
  );
  const seconds = object(msg.seconds, `${at}.seconds`);
  return {
    v: 1,
    type: 'goodput_intervals',
    run: string(msg.run, `${at}.run`),
    kind: string(msg.kind, `${at}.kind`),
    header: string(msg.header, `${at}.header`),
    started: number(msg.started, `${at}.started`),
    wall_s: number(msg.wall_s, `${at}.wall_s`),
    categories,
    start_s: numbers(msg.start_s, 'start_s'),
    end_s: numbers(msg.end_s, 'end_s'),
    goodput: numbers(msg.goodput, 'goodput'),
    seconds: Object.fromEntries(categories.map(c => [c, numbers(seconds[c], `seconds.${c}`)])),
    steps: array(msg.steps, `${at}.steps`).map((x, i) => integer(x, `${at}.steps[${i}]`)),
    step_time_mean_s: numbers(msg.step_time_mean_s, 'step_time_mean_s'),
    step_time_std_s: numbers(msg.step_time_std_s, 'step_time_std_s'),
    step_time: decodeStepTime(object(msg.step_time, `${at}.step_time`))
  };
}

function decodeStepTime(o: Record<string, unknown>): StepTimeStats {
  const at = 'goodput_intervals.step_time';
  const seconds = (name: string) => nullable(o[name], v => number(v, `${at}.${name}`));
  return {
    steps: integer(o.steps, `${at}.steps`),
    median_s: seconds('median_s'),
    mean_s: seconds('mean_s'),
    std_s: seconds('std_s'),
    slowest: array(o.slowest, `${at}.slowest`).map((s, i) => {
      const slow = object(s, `${at}.slowest[${i}]`);
      return {
        step: integer(slow.step, `${at}.slowest[${i}].step`, -Infinity),
        seconds: number(slow.seconds, `${at}.slowest[${i}].seconds`)
      };
    })
  };
}

function decodeTopology(msg: Record<string, unknown>, buffers: readonly Buffer[]): TopologyMessage {
  const chips = integer(msg.chips, 'topology.chips');
  const slicesRaw = array(msg.slices, 'topology.slices');
  const slices = slicesRaw.map((s, i): TopologySlice => {
    const o = object(s, `topology.slices[${i}]`);
    const at = `topology.slices[${i}]`;
    return {
      index: integer(o.index, `${at}.index`),
      state: sliceState(o.state, `${at}.state`),
      kind: string(o.kind, `${at}.kind`),
      shape: array(o.shape, `${at}.shape`).map((d, k) => integer(d, `${at}.shape[${k}]`)),
      chip_offset: integer(o.chip_offset, `${at}.chip_offset`),
      chip_count: integer(o.chip_count, `${at}.chip_count`)
    };
  });
  let expected = 0;
  slices.forEach((s, i) => {
    if (i > 0 && s.index <= slices[i - 1].index) {
      throw new ProtocolError('topology.slices must be in ascending index order');
    }
    if (s.chip_offset !== expected) {
      throw new ProtocolError(
        `topology.slices[${i}].chip_offset is ${s.chip_offset}, expected ${expected}`
      );
    }
    expected += s.chip_count;
  });
  if (expected !== chips) {
    throw new ProtocolError(`topology slices hold ${expected} chips but chips is ${chips}`);
  }
  if (buffers.length !== 3) {
    throw new ProtocolError(`topology carries ${buffers.length} buffers, expected 3`);
  }
  return {
    v: 1,
    type: 'topology',
    topology_seq: integer(msg.topology_seq, 'topology.topology_seq', 1),
    backend: string(msg.backend, 'topology.backend'),
    target: string(msg.target, 'topology.target'),
    platform: string(msg.platform, 'topology.platform'),
    supports_fault_injection: boolean(
      msg.supports_fault_injection,
      'topology.supports_fault_injection'
    ),
    chips,
    slices,
    chip_id: typed(buffers[0], Int32Array, chips, 'chip_id'),
    chip_slice: typed(buffers[1], Uint16Array, chips, 'chip_slice'),
    chip_coords: typed(buffers[2], Uint16Array, 3 * chips, 'chip_coords')
  };
}

function decodeHistory(msg: Record<string, unknown>, buffers: readonly Buffer[]): HistoryMessage {
  const points = integer(msg.points, 'history.points');
  const slices = array(msg.slices, 'history.slices').map((s, k) =>
    integer(s, `history.slices[${k}]`)
  );
  const windowS = number(msg.window_s, 'history.window_s');
  if (windowS <= 0) {
    throw new ProtocolError('history.window_s must be > 0');
  }
  if (buffers.length !== 4) {
    throw new ProtocolError(`history carries ${buffers.length} buffers, expected 4`);
  }
  const cells = points * slices.length;
  const time = typed(buffers[0], Float64Array, points, 'time');
  for (let t = 1; t < points; t++) {
    if (time[t] < time[t - 1]) {
      throw new ProtocolError('history.time must be ascending');
    }
  }
  return {
    v: 1,
    type: 'history',
    topology_seq: integer(msg.topology_seq, 'history.topology_seq', 1),
    window_s: windowS,
    points,
    slices,
    time,
    utilization: typed(buffers[1], Float32Array, cells, 'utilization'),
    memory_bytes: typed(buffers[2], Float64Array, cells, 'memory_bytes'),
    up: typed(buffers[3], Uint8Array, cells, 'up')
  };
}

/**
 * The chip series a successful `chip_history` reply carries.
 *
 * @throws ProtocolError when the reply failed or its buffers do not match its result.
 */
export function decodeChipHistory(reply: ReplyMessage): ChipHistory {
  if (!reply.ok || !reply.result) {
    throw new ProtocolError(String(reply.error));
  }
  const r = reply.result;
  const start = integer(r.start, 'chip_history.start');
  const stop = integer(r.stop, 'chip_history.stop', start + 1);
  const points = integer(r.points, 'chip_history.points');
  const memoryUnit = integer(r.memory_unit, 'chip_history.memory_unit', 1);
  if (reply.buffers.length !== 3) {
    throw new ProtocolError(`chip_history carries ${reply.buffers.length} buffers, expected 3`);
  }
  const cells = points * (stop - start);
  return {
    topology_seq: integer(r.topology_seq, 'chip_history.topology_seq', 1),
    start,
    stop,
    points,
    memory_unit: memoryUnit,
    time: typed(reply.buffers[0], Float64Array, points, 'time'),
    utilization: typed(reply.buffers[1], Uint8Array, cells, 'utilization'),
    memory: typed(reply.buffers[2], Uint8Array, cells, 'memory')
  };
}

function decodeMetrics(msg: Record<string, unknown>, buffers: readonly Buffer[]): MetricsMessage {
  const chips = integer(msg.chips, 'metrics.chips');
  const memoryUnit = integer(msg.memory_unit, 'metrics.memory_unit', 1);
  if (!Number.isInteger(Math.log2(memoryUnit))) {
    throw new ProtocolError(`metrics.memory_unit ${memoryUnit} is not a power of two`);
  }
  const windowS = number(msg.window_s, 'metrics.window_s');
  if (windowS <= 0) {
    throw new ProtocolError('metrics.window_s must be > 0');
  }
  const slices = array(msg.slices, 'metrics.slices').map((s, i): SliceMetrics => {
    const o = object(s, `metrics.slices[${i}]`);
    const at = `metrics.slices[${i}]`;
    return {
      index: integer(o.index, `${at}.index`),
      state: sliceState(o.state, `${at}.state`),
      utilization: fraction(o.utilization, `${at}.utilization`),
      memory_bytes: integer(o.memory_bytes, `${at}.memory_bytes`),
      memory_limit_bytes: nullable(o.memory_limit_bytes, v =>
        integer(v, `${at}.memory_limit_bytes`)
      )
    };
  });
  if (buffers.length !== 2) {
    throw new ProtocolError(`metrics carries ${buffers.length} buffers, expected 2`);
  }
  return {
    v: 1,
    type: 'metrics',
    seq: integer(msg.seq, 'metrics.seq', 1),
    time: number(msg.time, 'metrics.time'),
    topology_seq: integer(msg.topology_seq, 'metrics.topology_seq', 1),
    chips,
    source: string(msg.source, 'metrics.source'),
    window_s: windowS,
    memory_unit: memoryUnit,
    slices,
    utilization: fraction(msg.utilization, 'metrics.utilization'),
    memory_bytes: integer(msg.memory_bytes, 'metrics.memory_bytes'),
    utilization_buffer: typed(buffers[0], Uint8Array, chips, 'utilization'),
    memory_buffer: typed(buffers[1], Uint8Array, chips, 'memory')
  };
}

/** Decode one event-log entry (the `event` field of an `event` message). */
export function decodeEvent(o: Record<string, unknown>): MonitorEvent {
  const ints = (v: unknown, at: string) =>
    nullable(v, x => array(x, at).map((i, k) => integer(i, `${at}[${k}]`)));
  return {
    seq: integer(o.seq, 'event.seq', 1),
    time: number(o.time, 'event.time'),
    kind: string(o.kind, 'event.kind'),
    slices_before: ints(o.slices_before, 'event.slices_before'),
    slices_after: ints(o.slices_after, 'event.slices_after'),
    bytes: nullable(o.bytes, v => integer(v, 'event.bytes')),
    duration_s: nullable(o.duration_s, v => number(v, 'event.duration_s')),
    step: nullable(o.step, v => integer(v, 'event.step', -Infinity)),
    detail: string(o.detail, 'event.detail')
  };
}

/**
 * The result of `latest_profile`: this kernel's newest capture as an XProf
 * run, or `run` null and `message` saying why (never another kernel's).
 */
export interface LatestProfile {
  run: string | null;
  name: string | null;
  where: string | null;
  time: number | null;
  message: string;
}

/** Decode a successful `latest_profile` reply's result. */
export function decodeLatestProfile(reply: ReplyMessage): LatestProfile {
  const r = object(reply.result, 'latest_profile.result');
  return {
    run: nullable(r.run, v => string(v, 'latest_profile.run')),
    name: nullable(r.name, v => string(v, 'latest_profile.name')),
    where: nullable(r.where, v => string(v, 'latest_profile.where')),
    time: nullable(r.time, v => number(v, 'latest_profile.time')),
    message: string(r.message, 'latest_profile.message')
  };
}

/**
 * The reason in the `data` of a kernel's `comm_close`: `{"v": 1, "type": "closed", "reason": ...}`.
 * Anything else (no data: the kernel has no such comm target) is `unknown`.
 */
export function decodeClose(data: unknown): CloseReason {
  const msg = typeof data === 'object' && data !== null ? (data as Record<string, unknown>) : {};
  const reason = msg.type === 'closed' ? msg.reason : undefined;
  return (CLOSE_REASONS as readonly unknown[]).includes(reason)
    ? (reason as CloseReason)
    : 'unknown';
}

function decodeReply(msg: Record<string, unknown>, buffers: readonly Buffer[]): ReplyMessage {
  return {
    v: 1,
    type: 'reply',
    request_id: nullable(msg.request_id, v => string(v, 'reply.request_id')),
    ok: boolean(msg.ok, 'reply.ok'),
    error: nullable(msg.error, v => string(v, 'reply.error')),
    result: nullable(msg.result, v => object(v, 'reply.result')),
    buffers
  };
}

// ---- frontend -> kernel -------------------------------------------------

export type Request =
  | { v: 1; type: 'subscribe'; request_id: string; rate: number }
  | { v: 1; type: 'ping'; request_id: string }
  | { v: 1; type: 'fail_slice'; request_id: string; slice: number }
  | { v: 1; type: 'repair_slice'; request_id: string; slice: number }
  | { v: 1; type: 'snapshot'; request_id: string }
  | { v: 1; type: 'chip_history'; request_id: string; start: number; stop: number }
  | { v: 1; type: 'latest_profile'; request_id: string };

export type RequestType = Request['type'];

/** The request body (without `v` and `request_id`) a caller asks to send. */
export type RequestBody =
  | { type: 'subscribe'; rate: number }
  | { type: 'ping' }
  | { type: 'fail_slice'; slice: number }
  | { type: 'repair_slice'; slice: number }
  | { type: 'snapshot' }
  | { type: 'chip_history'; start: number; stop: number }
  | { type: 'latest_profile' };

/**
 * The comm `data` for a request, validated by the kernel's rules so that a
 * bad value fails here, loudly, rather than as an error reply.
 */
export function encodeRequest(body: RequestBody, requestId: string): Request {
  if (!requestId || requestId.length > MAX_REQUEST_ID) {
    throw new ProtocolError(
      `request_id must be a non-empty string of at most ${MAX_REQUEST_ID} characters`
    );
  }
  switch (body.type) {
    case 'subscribe':
      if (!Number.isFinite(body.rate) || body.rate < 0 || body.rate > MAX_RATE_HZ) {
        throw new ProtocolError(
          `rate must be a number in [0, ${MAX_RATE_HZ}] Hz, got ${body.rate}`
        );
      }
      return { v: 1, type: 'subscribe', request_id: requestId, rate: body.rate };
    case 'fail_slice':
    case 'repair_slice':
      if (!Number.isInteger(body.slice) || body.slice < 0) {
        throw new ProtocolError(`slice must be an integer >= 0, got ${body.slice}`);
      }
      return { v: 1, type: body.type, request_id: requestId, slice: body.slice };
    case 'chip_history':
      if (
        !Number.isInteger(body.start) ||
        !Number.isInteger(body.stop) ||
        body.start < 0 ||
        body.stop <= body.start ||
        body.stop - body.start > MAX_CHIP_HISTORY
      ) {
        throw new ProtocolError(
          `chip_history needs integers 0 <= start < stop, at most ${MAX_CHIP_HISTORY} chips; got ${body.start}:${body.stop}`
        );
      }
      return {
        v: 1,
        type: 'chip_history',
        request_id: requestId,
        start: body.start,
        stop: body.stop
      };
    case 'ping':
    case 'snapshot':
    case 'latest_profile':
      return { v: 1, type: body.type, request_id: requestId };
  }
}

// ---- validation helpers -------------------------------------------------

function object(v: unknown, at: string): Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) {
    throw new ProtocolError(`${at} must be an object`);
  }
  return v as Record<string, unknown>;
}

function array(v: unknown, at: string): unknown[] {
  if (!Array.isArray(v)) {
    throw new ProtocolError(`${at} must be an array`);
  }
  return v;
}

function string(v: unknown, at: string): string {
  if (typeof v !== 'string') {
    throw new ProtocolError(`${at} must be a string`);
  }
  return v;
}

function boolean(v: unknown, at: string): boolean {
  if (typeof v !== 'boolean') {
    throw new ProtocolError(`${at} must be a boolean`);
  }
  return v;
}

function number(v: unknown, at: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) {
    throw new ProtocolError(`${at} must be a finite number`);
  }
  return v;
}

function integer(v: unknown, at: string, min = 0): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) {
    throw new ProtocolError(`${at} must be an integer >= ${min}`);
  }
  return v;
}

function fraction(v: unknown, at: string): number {
  const x = number(v, at);
  if (x < 0 || x > 1) {
    throw new ProtocolError(`${at} must be in [0, 1]`);
  }
  return x;
}

function sliceState(v: unknown, at: string): SliceState {
  if (v !== 'up' && v !== 'down') {
    throw new ProtocolError(`${at} must be "up" or "down"`);
  }
  return v;
}

function nullable<T>(v: unknown, parse: (v: unknown) => T): T | null {
  return v === null || v === undefined ? null : parse(v);
}

function noBuffers(type: string, buffers: readonly Buffer[]): void {
  if (buffers.length) {
    throw new ProtocolError(`${type} carries no buffers, got ${buffers.length}`);
  }
}

type TypedArrayType<T> = {
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): T;
  new (length: number): T;
  BYTES_PER_ELEMENT: number;
};

/**
 * View `buffer` as `count` little-endian elements of `Type`, copying only
 * when the bytes are misaligned for it. Typed arrays use the host's byte
 * order, little-endian in every browser JupyterLab supports.
 */
function typed<T extends ArrayBufferView>(
  buffer: Buffer,
  Type: TypedArrayType<T>,
  count: number,
  name: string
): T {
  const bytes = ArrayBuffer.isView(buffer)
    ? new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength)
    : new Uint8Array(buffer);
  const size = Type.BYTES_PER_ELEMENT;
  if (bytes.byteLength !== count * size) {
    throw new ProtocolError(
      `buffer ${name} has ${bytes.byteLength} bytes, expected ${count * size}`
    );
  }
  if (bytes.byteOffset % size === 0) {
    return new Type(bytes.buffer, bytes.byteOffset, count);
  }
  const copy = new Type(count);
  new Uint8Array(copy.buffer).set(bytes);
  return copy;
}
