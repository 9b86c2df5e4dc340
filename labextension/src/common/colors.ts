/**
 * Colour ramps for canvas drawing, built from the theme's colours.
 *
 * Canvas cannot read CSS variables, so the view resolves the JupyterLab
 * theme variables to RGB once per theme change and builds lookup tables
 * here. Pure: no DOM.
 */

export type RGB = [number, number, number];

/** Parse `#rgb`, `#rrggbb`, `#rrggbbaa`, `rgb(r, g, b)` or `rgba(r, g, b, a)`; null otherwise. */
export function parseColor(text: string): RGB | null {
  const s = text.trim().toLowerCase();
  let m = /^#([0-9a-f]{3})$/.exec(s);
  if (m) {
    return [0, 1, 2].map(i => parseInt(m![1][i] + m![1][i], 16)) as RGB;
  }
  m = /^#([0-9a-f]{6})([0-9a-f]{2})?$/.exec(s);
  if (m) {
    return [0, 2, 4].map(i => parseInt(m![1].slice(i, i + 2), 16)) as RGB;
  }
  m = /^rgba?\(\s*([\d.]+)[\s,]+([\d.]+)[\s,]+([\d.]+)/.exec(s);
  if (m) {
    return [1, 2, 3].map(i => Math.round(Math.min(255, parseFloat(m[i])))) as RGB;
  }
  return null;
}

/** `a` blended toward `b` by `t` in [0, 1]. */
export function mix(a: RGB, b: RGB, t: number): RGB {
  return [0, 1, 2].map(i => Math.round(a[i] + (b[i] - a[i]) * t)) as RGB;
}

export function toCss([r, g, b]: RGB): string {
  return `rgb(${r}, ${g}, ${b})`;
}

/** Pack an opaque colour as the little-endian RGBA word an ImageData Uint32Array view expects. */
export function packRGBA([r, g, b]: RGB): number {
  return ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;
}

/**
 * A 256-entry ramp: entry i is the packed colour of utilization i/255,
 * from `idle` through `mid` to `busy`.
 */
export function utilizationRamp(idle: RGB, mid: RGB, busy: RGB): Uint32Array {
  const lut = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    const t = i / 255;
    lut[i] = packRGBA(t < 0.5 ? mix(idle, mid, t * 2) : mix(mid, busy, (t - 0.5) * 2));
  }
  return lut;
}
