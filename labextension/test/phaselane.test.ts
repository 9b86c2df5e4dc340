import { test } from 'node:test';
import assert from 'node:assert/strict';

import { PhaseLanes, shareText } from '../src/model/phaselane';
import { PhaseSpan, PhasesMessage } from '../src/protocol/messages';

let seq = 0;
function span(role: string, phase: string, start: number, end: number, step = 0): PhaseSpan {
  const mesh = role === 'trainer' ? 'slice 0 · TPU v5p' : 'slice 1 · TPU v6 lite';
  seq++;
  return { seq, run: 'grpo', phase, role, mesh, slices: [], start, end, step };
}

function message(replay: boolean, spans: PhaseSpan[]): PhasesMessage {
  return { v: 1, type: 'phases', replay, spans };
}

/** One GRPO step from t: rollout 6 s, reward 1 s, update 2 s, sync 1 s. */
function step(t: number, n: number): PhaseSpan[] {
  return [
    span('rollout', 'rollout', t, t + 6, n),
    span('rollout', 'reward', t + 6, t + 7, n),
    span('trainer', 'update', t + 7, t + 9, n),
    span('trainer', 'sync', t + 9, t + 10, n)
  ];
}

test('each phase is a bar on its role row, the trainer on top, broken between spans', () => {
  const lanes = new PhaseLanes();
  lanes.add(message(true, [...step(100, 0), ...step(110, 1)]));
  const c = lanes.columns(0, 1000);
  assert.deepEqual(c.roles, ['trainer', 'rollout']);
  assert.deepEqual(c.phases, ['rollout', 'reward', 'update', 'sync']);
  const [xs, rollout, , update] = c.data;
  const at = (column: (number | null)[], x: number) => column[xs.indexOf(x)];
  assert.equal(at(update, 107), 1); // trainer: the top row
  assert.equal(at(update, 109), 1);
  assert.equal(at(rollout, 100), 0);
  assert.equal(at(rollout, 106), 0);
  assert.equal(at(rollout, 106.001), null, 'the rollout bar ends with its span');
  assert.equal(at(rollout, 107), null, 'no rollout while the trainer updates');
  assert.equal(at(rollout, 110), 0);
});

test('the split says how long each role waited for the other, over the spans in view', () => {
  const lanes = new PhaseLanes();
  lanes.add(message(true, step(100, 0)));
  lanes.add(message(false, step(110, 1)));
  const split = lanes.split(0, 1000)!;
  assert.deepEqual([split.start, split.end], [100, 120]);
  const [trainer, rollout] = split.roles;
  assert.equal(trainer.busyS, 6);
  assert.deepEqual(trainer.waitedS, { rollout: 14 });
  assert.equal(rollout.busyS, 14);
  assert.equal(shareText(trainer), 'trainer (slice 0 · TPU v5p): busy 30%, waited for rollout 70%');
  assert.equal(
    shareText(rollout),
    'rollout (slice 1 · TPU v6 lite): busy 70%, waited for trainer 30%'
  );
  assert.equal(lanes.split(0, 50), null);
});

test('the readout names what each role runs at a time; a replay replaces, live spans add', () => {
  const lanes = new PhaseLanes();
  const first = step(100, 0);
  lanes.add(message(false, first));
  lanes.add(message(false, first)); // already held: not twice
  assert.deepEqual(
    lanes.at(108).map(s => `${s.role}:${s.phase}`),
    ['trainer:update']
  );
  assert.equal(lanes.within(0, 1000).length, 4);
  lanes.add(message(true, step(200, 5)));
  assert.equal(lanes.within(0, 150).length, 0);
  assert.equal(lanes.at(203)[0].step, 5);
  lanes.clear();
  assert.ok(lanes.empty);
});
