/**
 * The dashboard's series colours stay apart and readable in JupyterLab's light
 * and dark themes: each theme variable is resolved through the theme's own CSS
 * (the venv's JupyterLab; skipped without it).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { resolve } from 'node:path';

import { SERIES_VARS } from '../src/dashboard/plotchart';

const THEMES = resolve(
  process.env.PATHWAYS_PREFIX ?? '.venv',
  'share/jupyter/lab/themes/@jupyterlab'
);
const skip = existsSync(THEMES) ? false : `no JupyterLab themes at ${THEMES} (set PATHWAYS_PREFIX)`;
/** CIE76 distance under which two line colours read as one. */
const MIN_DELTA_E = 20;
/** Contrast against the background under which a line fades into it. */
const MIN_CONTRAST = 2.5;
const NAMED: Record<string, string> = {
  white: '#ffffff',
  black: '#000000',
  green: '#008000',
  red: '#ff0000'
};

function variables(theme: string): Map<string, string> {
  const css = readFileSync(resolve(THEMES, `theme-${theme}-extension/index.css`), 'utf-8');
  return new Map([...css.matchAll(/(--[\w-]+)\s*:\s*([^;}]+)/g)].map(m => [m[1], m[2].trim()]));
}

/** A value as #rrggbb, following var(--name, fallback) through the theme's variables. */
function colour(vars: Map<string, string>, value: string): string {
  const ref = /^var\((--[\w-]+)\s*(?:,\s*(.+))?\)$/.exec(value.trim());
  if (ref) {
    const next = vars.get(ref[1]) ?? ref[2];
    assert.ok(next !== undefined, `${ref[1]} is not set`);
    return colour(vars, next);
  }
  const hex = (NAMED[value] ?? value).toLowerCase();
  assert.match(hex, /^#([0-9a-f]{3}|[0-9a-f]{6})$/, `not a colour: ${value}`);
  return hex.length === 4 ? '#' + [...hex.slice(1)].map(c => c + c).join('') : hex;
}

function linear(hex: string): number[] {
  return [1, 3, 5].map(i => {
    const c = parseInt(hex.slice(i, i + 2), 16) / 255;
    return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  });
}

function luminance(hex: string): number {
  const [r, g, b] = linear(hex);
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}

function contrast(a: string, b: string): number {
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}

function lab(hex: string): number[] {
  const [r, g, b] = linear(hex);
  const f = (t: number): number => (t > 0.008856 ? Math.cbrt(t) : 7.787 * t + 16 / 116);
  const x = f((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047);
  const y = f(0.2126 * r + 0.7152 * g + 0.0722 * b);
  const z = f((0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883);
  return [116 * y - 16, 500 * (x - y), 200 * (y - z)];
}

function deltaE(a: string, b: string): number {
  const [p, q] = [lab(a), lab(b)];
  return Math.hypot(p[0] - q[0], p[1] - q[1], p[2] - q[2]);
}

for (const theme of ['light', 'dark']) {
  test(`series colours stay apart and readable in the ${theme} theme`, { skip }, () => {
    const vars = variables(theme);
    const background = colour(vars, 'var(--jp-layout-color0)');
    const colours = SERIES_VARS.map(name => colour(vars, `var(${name})`));
    for (const [i, c] of colours.entries()) {
      const ratio = contrast(c, background);
      assert.ok(
        ratio >= MIN_CONTRAST,
        `${SERIES_VARS[i]} (${c}) on ${background}: contrast ${ratio.toFixed(2)}`
      );
      for (let j = i + 1; j < colours.length; j++) {
        const d = deltaE(c, colours[j]);
        assert.ok(
          d >= MIN_DELTA_E,
          `${SERIES_VARS[i]} and ${SERIES_VARS[j]} read as one colour (${c}, ${colours[j]}: delta E ${d.toFixed(1)})`
        );
      }
    }
  });
}
