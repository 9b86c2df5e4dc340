import { test } from 'node:test';
import assert from 'node:assert/strict';

import { isPathwaysKernel, startingMessage } from '../src/common/kernels';

test('pathways kernelspecs are recognised, others are not', () => {
  assert.equal(isPathwaysKernel('pathways'), true);
  assert.equal(isPathwaysKernel('pathways-4x2'), true);
  assert.equal(isPathwaysKernel('python3'), false);
  assert.equal(isPathwaysKernel('pathwaysish'), false);
  assert.equal(isPathwaysKernel(undefined), false);
});

test('a starting Pathways kernel is said to start its local server; other states and kernels say nothing here', () => {
  assert.match(
    startingMessage('pathways', 'starting') ?? '',
    /^Starting the Pathways kernel and its local Pathways server \(2 slices x 4 chips/
  );
  assert.match(startingMessage('pathways', 'restarting') ?? '', /^Restarting the Pathways kernel/);
  assert.notEqual(startingMessage('pathways', 'initializing'), null);
  assert.equal(startingMessage('pathways', 'idle'), null);
  assert.equal(startingMessage('python3', 'starting'), null);
  // A notebook still opening its session: not "no kernel yet".
  assert.equal(startingMessage(undefined, 'idle', false), 'Starting the notebook’s kernel…');
  assert.match(startingMessage('pathways', 'idle', false) ?? '', /^Starting the Pathways kernel/);
});
