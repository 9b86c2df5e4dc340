import { test } from 'node:test';
import assert from 'node:assert/strict';

import { isPathwaysKernel } from '../src/common/kernels';

test('pathways kernelspecs are recognised, others are not', () => {
  assert.equal(isPathwaysKernel('pathways'), true);
  assert.equal(isPathwaysKernel('pathways-4x2'), true);
  assert.equal(isPathwaysKernel('python3'), false);
  assert.equal(isPathwaysKernel('pathwaysish'), false);
  assert.equal(isPathwaysKernel(undefined), false);
});
