/**
 * Where each slice block and chip cell of the topology canvas goes.
 *
 * Pure geometry (device pixels), no DOM: the canvas view draws what this
 * computes and asks it which chip sits under the mouse. When a chip cell
 * would be smaller than `minCell` pixels the layout switches to one block
 * per slice ("aggregated"), which is what keeps 65,536 chips readable.
 */

/** One slice's chips on a 2-D grid: cell (col, row) holds chip `cells[row * cols + col]` (-1: empty). */
export interface SliceGrid {
  index: number;
  cols: number;
  rows: number;
  cells: Int32Array;
}

export interface Block {
  /** Position of the slice in the topology's slice list. */
  position: number;
  x: number;
  y: number;
  width: number;
  height: number;
  /** Top-left of the chip cells (below the label). */
  cellsX: number;
  cellsY: number;
}

export interface Layout {
  width: number;
  height: number;
  /** Edge of one chip cell; 0 when aggregated. */
  cell: number;
  /** Pixels left blank between neighbouring cells. */
  gap: number;
  aggregated: boolean;
  /** Height of the label strip above a block's cells. */
  label: number;
  blocks: Block[];
}

export interface LayoutOptions {
  /** Device pixels per CSS pixel. */
  scale?: number;
  /** Below this cell edge (CSS px) slices are drawn as one block each. */
  minCell?: number;
  /** The layout grows no taller than this (CSS px) unless aggregated blocks need it. */
  maxHeight?: number;
}

const BLOCK_GAP = 6;
const PAD = 2;
const LABEL = 13;

/**
 * Lay out `grids` in a canvas `width` device pixels wide.
 *
 * Picks the number of blocks per row that gives the largest chip cells
 * within `maxHeight`; falls back to aggregated blocks when that cell is
 * below `minCell`.
 */
export function layoutTopology(
  grids: SliceGrid[],
  width: number,
  options: LayoutOptions = {}
): Layout {
  const scale = options.scale ?? 1;
  const minCell = Math.max(1, Math.round((options.minCell ?? 2) * scale));
  const maxHeight = (options.maxHeight ?? 360) * scale;
  const gap = Math.round(BLOCK_GAP * scale);
  const pad = Math.round(PAD * scale);
  const label = Math.round(LABEL * scale);
  const n = grids.length;
  if (n === 0 || width <= 0) {
    return { width, height: 0, cell: 0, gap: 0, aggregated: false, label, blocks: [] };
  }
  const cols = Math.max(...grids.map(g => g.cols));
  const rows = Math.max(...grids.map(g => g.rows));

  let best: { perRow: number; cell: number } | null = null;
  for (let perRow = 1; perRow <= n; perRow++) {
    const blockWidth = Math.floor((width - (perRow - 1) * gap) / perRow);
    const cell = Math.min(Math.floor((blockWidth - 2 * pad) / cols), Math.round(24 * scale));
    if (cell < minCell) {
      break;
    }
    const blockRows = Math.ceil(n / perRow);
    const height = blockRows * (label + rows * cell + 2 * pad) + (blockRows - 1) * gap;
    // Ties go to more blocks per row: the same cells in less height.
    if (height <= maxHeight && (best === null || cell >= best.cell)) {
      best = { perRow, cell };
    }
  }

  if (best === null) {
    return aggregatedLayout(n, width, scale, maxHeight, label);
  }
  const { perRow, cell } = best;
  const cellGap = cell >= 4 * scale ? Math.max(1, Math.round(scale)) : 0;
  const blockWidth = cols * cell + 2 * pad;
  const blockHeight = label + rows * cell + 2 * pad;
  const blocks: Block[] = [];
  for (let i = 0; i < n; i++) {
    const x = (i % perRow) * (blockWidth + gap);
    const y = Math.floor(i / perRow) * (blockHeight + gap);
    blocks.push({
      position: i,
      x,
      y,
      width: blockWidth,
      height: blockHeight,
      cellsX: x + pad,
      cellsY: y + label + pad
    });
  }
  const height = Math.ceil(n / perRow) * (blockHeight + gap) - gap;
  return { width, height, cell, gap: cellGap, aggregated: false, label, blocks };
}

function aggregatedLayout(
  n: number,
  width: number,
  scale: number,
  maxHeight: number,
  label: number
): Layout {
  const gap = Math.max(1, Math.round(3 * scale));
  let size = Math.round(48 * scale);
  const smallest = Math.round(10 * scale);
  while (size > smallest) {
    const perRow = Math.max(1, Math.floor((width + gap) / (size + gap)));
    if (Math.ceil(n / perRow) * (size + gap) - gap <= maxHeight) {
      break;
    }
    size -= Math.max(1, Math.round(scale));
  }
  const perRow = Math.max(1, Math.floor((width + gap) / (size + gap)));
  const blocks: Block[] = [];
  for (let i = 0; i < n; i++) {
    const x = (i % perRow) * (size + gap);
    const y = Math.floor(i / perRow) * (size + gap);
    blocks.push({ position: i, x, y, width: size, height: size, cellsX: x, cellsY: y });
  }
  const height = Math.ceil(n / perRow) * (size + gap) - gap;
  return { width, height, cell: 0, gap: 0, aggregated: true, label, blocks };
}

/** What lies under a point: a slice (by position) and, when cells are drawn, a chip (-1: none). */
export interface Hit {
  position: number;
  chip: number;
}

/** The slice block and chip at device-pixel point (x, y), or null over empty canvas. */
export function hitTest(layout: Layout, grids: SliceGrid[], x: number, y: number): Hit | null {
  for (const block of layout.blocks) {
    if (x < block.x || y < block.y || x >= block.x + block.width || y >= block.y + block.height) {
      continue;
    }
    if (layout.aggregated) {
      return { position: block.position, chip: -1 };
    }
    const grid = grids[block.position];
    const col = Math.floor((x - block.cellsX) / layout.cell);
    const row = Math.floor((y - block.cellsY) / layout.cell);
    const inside = col >= 0 && row >= 0 && col < grid.cols && row < grid.rows;
    return { position: block.position, chip: inside ? grid.cells[row * grid.cols + col] : -1 };
  }
  return null;
}

/**
 * Arrange a slice's chips on a grid from their coordinates.
 *
 * `chips` are indices into the topology's chip arrays; `coords` holds
 * `dims` values per chip. x runs along columns, y along rows, and further
 * axes (z) repeat the x extent to the right, so a 4x4x4 slice is 16 x 4.
 * Chips without usable coordinates fill a near-square grid in order.
 */
export function sliceGrid(
  index: number,
  chips: ArrayLike<number>,
  coords: ArrayLike<number>,
  dims: number
): SliceGrid {
  const n = chips.length;
  const extent = [1, 1, 1];
  for (let i = 0; i < n && dims > 0; i++) {
    for (let d = 0; d < Math.min(dims, 3); d++) {
      extent[d] = Math.max(extent[d], coords[chips[i] * dims + d] + 1);
    }
  }
  const cols = extent[0] * extent[2];
  const rows = extent[1];
  const cells = new Int32Array(cols * rows).fill(-1);
  let placed = dims > 0 && cols * rows >= n;
  if (placed) {
    for (let i = 0; i < n; i++) {
      const base = chips[i] * dims;
      const x = coords[base];
      const y = dims > 1 ? coords[base + 1] : 0;
      const z = dims > 2 ? coords[base + 2] : 0;
      const at = y * cols + z * extent[0] + x;
      if (x < 0 || y < 0 || z < 0 || cells[at] !== -1) {
        placed = false;
        break;
      }
      cells[at] = chips[i];
    }
  }
  if (placed) {
    return { index, cols, rows, cells };
  }
  const side = Math.max(1, Math.ceil(Math.sqrt(n)));
  const sequential = new Int32Array(side * Math.ceil(n / side)).fill(-1);
  for (let i = 0; i < n; i++) {
    sequential[i] = chips[i];
  }
  return { index, cols: side, rows: Math.ceil(n / side), cells: sequential };
}
