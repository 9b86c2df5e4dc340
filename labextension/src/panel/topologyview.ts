/**
 * The topology canvas: one block per slice, one cell per chip coloured by
 * utilization; lost slices hatched in the theme's error colour with "DOWN".
 *
 * Chip cells are written straight into an ImageData (one pass over the
 * chips, no path per chip), labels and DOWN marks are drawn on top. A
 * tooltip follows the mouse with the chip's id, coords, utilization and
 * memory (or the slice's aggregates when slices are aggregated).
 *
 * The canvas is focusable: arrow keys move a focused chip (left/right along
 * chip order, up/down a grid row within its slice; Home/End the first and
 * last chip), drawn with a ring, and a live text readout names it: slice,
 * chip id, slice-local coordinates and the global chip index.
 */
import { packRGBA, toCss } from '../common/colors';
import { formatBytes, formatPercent } from '../common/format';
import { sliceName } from '../model/dashboardmodel';
import { Block, Layout, hitTest, layoutTopology } from '../model/layout';
import { MonitorModel } from '../model/monitormodel';
import { Palette, palette } from '../common/theme';

export class TopologyView {
  readonly node: HTMLDivElement;
  private _canvas: HTMLCanvasElement;
  private _tooltip: HTMLDivElement;
  private _layout: Layout | null = null;
  private _hover: { x: number; y: number } | null = null;
  /** Reused between frames: a 1,000 x 500 frame is 2 MB not to allocate twice a second. */
  private _image: ImageData | null = null;
  /** Position of the chip focused with the keyboard; -1 before any. */
  private _focus = -1;
  private _readout: HTMLDivElement;

  constructor(private _model: MonitorModel) {
    this.node = document.createElement('div');
    this.node.className = 'jp-PathwaysPanel-topology';
    this._canvas = document.createElement('canvas');
    this._canvas.className = 'jp-PathwaysPanel-canvas';
    // "application": a screen reader hands arrow keys to the grid; the readout speaks the chip.
    this._canvas.setAttribute('role', 'application');
    this._canvas.setAttribute('aria-roledescription', 'chip grid');
    this._canvas.tabIndex = 0;
    this._tooltip = document.createElement('div');
    this._tooltip.className = 'jp-PathwaysPanel-tooltip';
    this._tooltip.hidden = true;
    this._readout = document.createElement('div');
    this._readout.className = 'jp-PathwaysPanel-chipReadout';
    this._readout.setAttribute('aria-live', 'polite');
    this._readout.textContent = 'Focus the grid and use the arrow keys to read chips.';
    this.node.append(this._canvas, this._tooltip, this._readout);
    this._canvas.addEventListener('keydown', e => this._key(e));
    this._canvas.addEventListener('blur', () => this.render());
    this._canvas.addEventListener('focus', () => {
      if (this._focus < 0 && this._model.topology?.chips) {
        this._moveTo(0);
      }
    });
    this._canvas.addEventListener('mousemove', e => {
      this._hover = { x: e.offsetX, y: e.offsetY };
      this._updateTooltip();
    });
    this._canvas.addEventListener('mouseleave', () => {
      this._hover = null;
      this._tooltip.hidden = true;
    });
  }

  /** CSS width available to the canvas; read it before the frame's DOM writes. */
  measure(): number {
    return this.node.clientWidth;
  }

  /** Redraw for the model's current state, `cssWidth` wide (null: measure now). */
  render(cssWidth: number | null = null): void {
    const model = this._model;
    const topology = model.topology;
    const canvas = this._canvas;
    if (!topology) {
      canvas.width = canvas.height = 0;
      canvas.style.height = '0px';
      this._layout = null;
      return;
    }
    const scale = window.devicePixelRatio || 1;
    const width = Math.floor(Math.max(120, (cssWidth ?? this.measure()) || 280) * scale);
    const layout = layoutTopology(model.grids, width, { scale, minCell: 2, maxHeight: 480 });
    this._layout = layout;
    const height = Math.max(1, layout.height);
    if (canvas.width !== width || canvas.height !== height) {
      canvas.width = width;
      canvas.height = height;
      canvas.style.width = `${width / scale}px`;
      canvas.style.height = `${height / scale}px`;
    }
    const colors = palette(this.node);
    const ctx = canvas.getContext('2d')!;
    if (!this._image || this._image.width !== width || this._image.height !== height) {
      this._image = ctx.createImageData(width, height);
    }
    const image = this._image;
    const pixels = new Uint32Array(image.data.buffer);
    pixels.fill(packRGBA(colors.background));
    this._drawCells(pixels, width, layout, colors);
    ctx.putImageData(image, 0, 0);
    this._drawLabels(ctx, layout, colors, scale);
    if (this._focus >= topology.chips) {
      this._focus = -1;
    }
    this._drawFocus(ctx, layout, colors, scale);

    const down = topology.slices.filter(s => s.state === 'down').map(s => s.index);
    const perSlice = topology.slices.length ? topology.slices[0].chip_count : 0;
    canvas.dataset.slices = String(topology.slices.length);
    canvas.dataset.chips = String(topology.chips);
    canvas.dataset.down = down.join(',');
    canvas.dataset.aggregated = String(layout.aggregated);
    canvas.setAttribute(
      'aria-label',
      `${topology.slices.length} slices × ${perSlice} chips` +
        (down.length ? `; down: ${down.join(', ')}` : '')
    );
    this._updateTooltip();
    this._updateReadout();
  }

  /** Arrow keys move the focused chip; the readout and ring follow. */
  private _key(e: KeyboardEvent): void {
    const topology = this._model.topology;
    if (!topology || !topology.chips) {
      return;
    }
    const at = Math.max(0, this._focus);
    let next = at;
    switch (e.key) {
      case 'ArrowRight':
        next = Math.min(topology.chips - 1, at + 1);
        break;
      case 'ArrowLeft':
        next = Math.max(0, at - 1);
        break;
      case 'ArrowDown':
      case 'ArrowUp':
        next = this._vertical(at, e.key === 'ArrowDown' ? 1 : -1);
        break;
      case 'Home':
        next = 0;
        break;
      case 'End':
        next = topology.chips - 1;
        break;
      default:
        return;
    }
    e.preventDefault();
    e.stopPropagation();
    this._moveTo(next);
  }

  /** The chip one grid row down (+1) or up (-1) in the same slice; at its edge, the next slice's. */
  private _vertical(position: number, step: 1 | -1): number {
    const model = this._model;
    const topology = model.topology!;
    const s = topology.slices.findIndex(
      sl => position >= sl.chip_offset && position < sl.chip_offset + sl.chip_count
    );
    const grid = model.grids[s];
    const cell = grid ? Array.prototype.indexOf.call(grid.cells, position) : -1;
    if (cell >= 0) {
      const row = Math.floor(cell / grid.cols) + step;
      const target =
        row >= 0 && row < grid.rows ? grid.cells[row * grid.cols + (cell % grid.cols)] : -1;
      if (target >= 0) {
        return target;
      }
    }
    const other = topology.slices[s + step];
    return other && other.chip_count ? other.chip_offset : position;
  }

  private _moveTo(position: number): void {
    this._focus = position;
    this.render();
  }

  private _updateReadout(): void {
    const topology = this._model.topology;
    const chip = this._focus >= 0 ? this._model.chip(this._focus) : null;
    if (!topology || !chip) {
      return;
    }
    const down = chip.state === 'down';
    const text =
      `Slice ${chip.slice}${down ? ' (DOWN)' : ''}, chip id ${chip.id}, ` +
      `coordinates (${chip.coords.join(', ')}) within slice ${chip.slice}, ` +
      `global chip ${chip.position} of ${topology.chips}; ` +
      `utilization ${formatPercent(down ? null : chip.utilization)}, ` +
      `memory ${down ? 'lost' : chip.memoryBytes === null ? '–' : (chip.memoryAtLeast ? '≥ ' : '') + formatBytes(chip.memoryBytes)}`;
    if (this._readout.textContent !== text) {
      this._readout.textContent = text;
    }
    this._canvas.dataset.focus = String(chip.position);
  }

  /** A ring around the focused chip (or its slice block when slices are aggregated). */
  private _drawFocus(
    ctx: CanvasRenderingContext2D,
    layout: Layout,
    colors: Palette,
    scale: number
  ): void {
    if (this._focus < 0 || document.activeElement !== this._canvas) {
      return;
    }
    const model = this._model;
    const slice = model.topology!.chip_slice[this._focus];
    const b = layout.blocks.find(block => model.topology!.slices[block.position].index === slice);
    if (!b) {
      return;
    }
    let x = b.x;
    let y = b.y;
    let w = b.width;
    let h = b.height;
    const grid = model.grids[b.position];
    const cell = layout.aggregated ? -1 : Array.prototype.indexOf.call(grid.cells, this._focus);
    if (cell >= 0) {
      x = b.cellsX + (cell % grid.cols) * layout.cell;
      y = b.cellsY + Math.floor(cell / grid.cols) * layout.cell;
      w = h = layout.cell - layout.gap;
    }
    const ring = Math.max(1, Math.round(scale * 1.5));
    ctx.strokeStyle = toCss(colors.text);
    ctx.lineWidth = ring;
    ctx.strokeRect(x - ring, y - ring, w + 2 * ring, h + 2 * ring);
  }

  private _drawCells(pixels: Uint32Array, stride: number, layout: Layout, colors: Palette): void {
    const model = this._model;
    const topology = model.topology!;
    const metrics = model.metrics;
    const util = metrics?.utilization_buffer ?? null;
    const block = packRGBA(colors.block);
    const down = packRGBA(colors.down);
    const idle = colors.ramp[0];
    for (const b of layout.blocks) {
      const slice = topology.slices[b.position];
      if (slice.state === 'down') {
        const strip =
          b.cellsY - b.y - (layout.aggregated ? 0 : Math.round(2 * (window.devicePixelRatio || 1)));
        fill(pixels, stride, b.x, b.y, b.width, Math.max(0, strip), block);
        hatch(
          pixels,
          stride,
          b.x,
          b.y + Math.max(0, strip),
          b.width,
          b.height - Math.max(0, strip),
          down,
          block
        );
        continue;
      }
      if (layout.aggregated) {
        const aggregate = metrics?.slices[b.position]?.utilization;
        const color = aggregate === undefined ? idle : colors.ramp[Math.round(aggregate * 255)];
        fill(pixels, stride, b.x, b.y, b.width, b.height, color);
        continue;
      }
      fill(pixels, stride, b.x, b.y, b.width, b.height, block);
      const grid = model.grids[b.position];
      const size = layout.cell - layout.gap;
      for (let row = 0; row < grid.rows; row++) {
        for (let col = 0; col < grid.cols; col++) {
          const chip = grid.cells[row * grid.cols + col];
          if (chip < 0) {
            continue;
          }
          const color = util ? colors.ramp[util[chip]] : idle;
          const at = (b.cellsY + row * layout.cell) * stride + b.cellsX + col * layout.cell;
          if (size === 2) {
            // The common case at tens of thousands of chips: four stores beat two fill() calls.
            pixels[at] = pixels[at + 1] = pixels[at + stride] = pixels[at + stride + 1] = color;
          } else {
            for (let y = 0; y < size; y++) {
              pixels.fill(color, at + y * stride, at + y * stride + size);
            }
          }
        }
      }
    }
  }

  private _drawLabels(
    ctx: CanvasRenderingContext2D,
    layout: Layout,
    colors: Palette,
    scale: number
  ): void {
    const topology = this._model.topology!;
    const font = colors.font;
    ctx.textBaseline = 'middle';
    let labelled = false;
    for (const b of layout.blocks) {
      const slice = topology.slices[b.position];
      const isDown = slice.state === 'down';
      if (layout.aggregated) {
        if (b.width >= 16 * scale) {
          ctx.font = `${Math.round(Math.min(11, b.width / 3.2) * scale)}px ${font}`;
          ctx.textAlign = 'center';
          ctx.fillStyle = toCss(isDown ? colors.downText : colors.text);
          ctx.fillText(
            isDown ? 'DOWN' : String(slice.index),
            b.x + b.width / 2,
            b.y + b.height / 2
          );
        }
        continue;
      }
      ctx.font = `${Math.round(10 * scale)}px ${font}`;
      ctx.textAlign = 'left';
      ctx.fillStyle = toCss(isDown ? colors.down : colors.textMuted);
      ctx.fillText(sliceName(slice), b.x + 3 * scale, b.y + layout.label / 2);
      if (!isDown) {
        labelled = this._drawChipIds(ctx, layout, b, colors, scale) || labelled;
      }
      if (isDown) {
        ctx.font = `bold ${Math.round(Math.min(14, b.width / 5 / scale) * scale)}px ${font}`;
        ctx.textAlign = 'center';
        const x = b.x + b.width / 2;
        const y = b.y + (layout.label + b.height) / 2;
        const text = 'DOWN';
        const w = ctx.measureText(text).width + 8 * scale;
        const h = 16 * scale;
        ctx.fillStyle = toCss(colors.down);
        ctx.fillRect(x - w / 2, y - h / 2, w, h);
        ctx.fillStyle = toCss(colors.downText);
        ctx.fillText(text, x, y);
      }
    }
    // Tests and assistive tools read whether the cells carry their chip ids (the canvas has no text).
    this._canvas.dataset.chipLabels = String(labelled);
  }

  /**
   * Each chip's id in its cell, as the notebook's grid numbers them ("0@(0,0,0)"), where a
   * cell is big enough to read it (at least 14 CSS px); false where it is not.
   */
  private _drawChipIds(
    ctx: CanvasRenderingContext2D,
    layout: Layout,
    b: Block,
    colors: Palette,
    scale: number
  ): boolean {
    const size = layout.cell - layout.gap;
    if (size < 14 * scale) {
      return false;
    }
    const grid = this._model.grids[b.position];
    ctx.font = `${Math.round(Math.min(11, size / scale / 2) * scale)}px ${colors.font}`;
    ctx.textAlign = 'center';
    ctx.fillStyle = toCss(colors.text);
    for (let k = 0; k < grid.cells.length; k++) {
      const position = grid.cells[k];
      if (position < 0) {
        continue;
      }
      const x = b.cellsX + (k % grid.cols) * layout.cell + size / 2;
      const y = b.cellsY + Math.floor(k / grid.cols) * layout.cell + size / 2;
      ctx.fillText(String(this._model.chip(position)?.id ?? position), x, y);
    }
    return true;
  }

  private _updateTooltip(): void {
    const tip = this._tooltip;
    const layout = this._layout;
    const model = this._model;
    if (!this._hover || !layout || !model.topology) {
      tip.hidden = true;
      return;
    }
    const scale = window.devicePixelRatio || 1;
    const hit = hitTest(layout, model.grids, this._hover.x * scale, this._hover.y * scale);
    if (!hit) {
      tip.hidden = true;
      return;
    }
    const slice = model.topology.slices[hit.position];
    const lines: string[] = [];
    const chip = hit.chip >= 0 ? model.chip(hit.chip) : null;
    if (chip) {
      lines.push(`chip ${chip.id} · slice ${chip.slice}${chip.state === 'down' ? ' (DOWN)' : ''}`);
      lines.push(
        `coords (${chip.coords.join(', ')}) in slice ${chip.slice} · global chip ${chip.position}`
      );
      lines.push(`utilization ${formatPercent(chip.state === 'down' ? null : chip.utilization)}`);
      lines.push(
        `memory ${chip.memoryBytes === null ? '–' : (chip.memoryAtLeast ? '≥ ' : '') + formatBytes(chip.memoryBytes)}`
      );
    } else {
      const agg = model.metrics?.slices[hit.position];
      lines.push(
        `slice ${slice.index} · ${slice.state === 'down' ? 'DOWN' : 'up'} · ${slice.chip_count} chips`
      );
      if (slice.kind) {
        lines.push(slice.kind);
      }
      if (agg) {
        lines.push(`utilization ${formatPercent(agg.utilization)}`);
        lines.push(`memory ${formatBytes(agg.memory_bytes)}`);
      }
    }
    tip.textContent = lines.join('\n');
    tip.hidden = false;
    const width = this.node.clientWidth;
    tip.style.left = `${Math.min(this._hover.x + 12, Math.max(0, width - 170))}px`;
    tip.style.top = `${this._hover.y + 14}px`;
  }
}

function fill(
  pixels: Uint32Array,
  stride: number,
  x: number,
  y: number,
  w: number,
  h: number,
  color: number
): void {
  for (let row = y; row < y + h; row++) {
    pixels.fill(color, row * stride + x, row * stride + x + w);
  }
}

/** Diagonal stripes: a lost slice must read as lost in any theme and at any size. */
function hatch(
  pixels: Uint32Array,
  stride: number,
  x: number,
  y: number,
  w: number,
  h: number,
  stripe: number,
  ground: number
): void {
  for (let row = y; row < y + h; row++) {
    const base = row * stride;
    for (let col = x; col < x + w; col++) {
      pixels[base + col] = (col + row) % 8 < 3 ? stripe : ground;
    }
  }
}
