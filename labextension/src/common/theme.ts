/**
 * The JupyterLab theme's colours, resolved for canvas drawing.
 *
 * Canvas needs concrete colours, so the CSS variables are read from the
 * panel's computed style and normalised by a canvas context (which turns
 * `white` or `var(...)` results into `#rrggbb`). Re-resolved when the
 * theme changes (JupyterLab marks it on <body>).
 */
import { RGB, mix, parseColor, utilizationRamp } from './colors';

export interface Palette {
  background: RGB;
  block: RGB;
  text: RGB;
  textMuted: RGB;
  down: RGB;
  downText: RGB;
  accent: RGB;
  font: string;
  /** Packed RGBA per utilization byte (0..255). */
  ramp: Uint32Array;
}

let cached: { key: string; palette: Palette } | null = null;

/** The current theme's palette, read from `node`'s computed style. */
export function palette(node: HTMLElement): Palette {
  const key = `${document.body.dataset.jpThemeName ?? ''}|${document.body.dataset.jpThemeLight ?? ''}`;
  if (cached && cached.key === key) {
    return cached.palette;
  }
  const style = getComputedStyle(node);
  const ctx = document.createElement('canvas').getContext('2d')!;
  const read = (name: string, fallback: RGB): RGB => {
    const value = style.getPropertyValue(name).trim();
    if (!value) {
      return fallback;
    }
    ctx.fillStyle = '#000000';
    ctx.fillStyle = value;
    return parseColor(String(ctx.fillStyle)) ?? fallback;
  };
  const idle = read('--jp-layout-color3', [189, 189, 189]);
  const busy = read('--jp-brand-color1', [25, 118, 210]);
  const result: Palette = {
    background: read('--jp-layout-color1', [255, 255, 255]),
    block: read('--jp-layout-color2', [238, 238, 238]),
    text: read('--jp-ui-font-color1', [33, 33, 33]),
    textMuted: read('--jp-ui-font-color2', [117, 117, 117]),
    down: read('--jp-error-color1', [211, 47, 47]),
    downText: read('--jp-ui-inverse-font-color0', [255, 255, 255]),
    accent: busy,
    font: style.getPropertyValue('--jp-ui-font-family').trim() || 'sans-serif',
    ramp: utilizationRamp(idle, mix(idle, busy, 0.5), busy)
  };
  cached = { key, palette: result };
  return result;
}
