import { test } from 'node:test';
import assert from 'node:assert/strict';

import { hitTest, layoutTopology, sliceGrid } from '../src/model/layout';
import { MonitorModel } from '../src/model/monitormodel';
import { decodeMessage } from '../src/protocol/messages';
import { topology } from './fixtures';

function grids(slices: number, x: number, y: number) {
  const model = new MonitorModel();
  const t = topology(slices, x, y);
  model.handle(decodeMessage(t.data, t.buffers));
  return model.grids;
}

test('2 slices of 2x2 chips get large cells, and hit testing finds each chip', () => {
  const g = grids(2, 2, 2);
  const layout = layoutTopology(g, 300);
  assert.equal(layout.aggregated, false);
  assert.ok(layout.cell >= 16, `cell ${layout.cell}`);
  assert.equal(layout.blocks.length, 2);
  const b = layout.blocks[1];
  const hit = hitTest(layout, g, b.cellsX + layout.cell + 1, b.cellsY + 1);
  assert.deepEqual(hit, { position: 1, chip: 5 });
  assert.equal(hitTest(layout, g, -1, -1), null);
});

test('64 slices of 1024 chips in a narrow panel aggregate to one block per slice', () => {
  const g = grids(64, 32, 32);
  const narrow = layoutTopology(g, 300, { minCell: 2, maxHeight: 360 });
  assert.equal(narrow.aggregated, true);
  assert.equal(narrow.blocks.length, 64);
  assert.ok(narrow.height <= 360, `height ${narrow.height}`);
  const last = narrow.blocks[63];
  assert.deepEqual(hitTest(narrow, g, last.x + 1, last.y + 1), { position: 63, chip: -1 });
  // A wide, tall canvas has room for 2 px cells: chips are drawn again.
  const wide = layoutTopology(g, 2400, { minCell: 2, maxHeight: 2000 });
  assert.equal(wide.aggregated, false);
  assert.ok(wide.cell >= 2);
});

test('device pixel ratio scales the geometry', () => {
  const g = grids(2, 2, 2);
  const one = layoutTopology(g, 300, { scale: 1 });
  const two = layoutTopology(g, 600, { scale: 2 });
  assert.equal(two.cell, one.cell * 2);
});

test('chips are placed by coords; z repeats x; bad coords fall back to order', () => {
  const coords = new Uint16Array([0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 1]);
  const g = sliceGrid(0, [0, 1, 2, 3], coords, 3);
  assert.deepEqual([g.cols, g.rows], [4, 1]);
  assert.deepEqual([...g.cells], [0, 1, 2, 3]);
  const clash = sliceGrid(0, [0, 1], new Uint16Array([0, 0, 0, 0, 0, 0]), 3);
  assert.deepEqual([clash.cols, clash.rows, ...clash.cells], [2, 1, 0, 1]);
});
