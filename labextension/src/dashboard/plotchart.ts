/**
 * What every dashboard chart shares: a labelled figure around a uPlot plot
 * and the readout line under it, the plot rebuilt only when its series or the
 * theme change (else resized in place), and the keyboard readout: the plot
 * takes the focus (Tab), the arrow keys move the cursor, and so the legend and
 * the readout, point by point, Home/End to the first/last, as the panel's
 * chip grid does. `TimeChart`, `StepChart` and `IntervalChart` draw their own
 * series on it; `chartStyle` gives them the theme's colours and axis style.
 */
import uPlot from 'uplot';

import { MARKER_KINDS } from '../model/dashboardmodel';

/** CSS px of a chart's plot in the dashboard (a chart in its own tab takes the tab's height). */
export const CHART_HEIGHT = 170;

/**
 * Series colours: JupyterLab theme variables only, cycled. Seven hues that stay
 * apart and readable on the background in the light and dark themes
 * (test/palette.test.ts): not the accent colours (the success colours' greens)
 * nor the pale *-color3 ones (nearly white lines in the light theme); purple
 * and olive are the editor's themed syntax colours, which every theme sets.
 */
export const SERIES_VARS = [
  '--jp-brand-color1',
  '--jp-warn-color1',
  '--jp-success-color1',
  '--jp-mirror-editor-operator-color',
  '--jp-error-color1',
  '--jp-info-color1',
  '--jp-mirror-editor-bracket-color'
];

/** How a chart names itself to assistive technology. */
export interface ChartLabel {
  /** The caption above the plot. */
  caption: string;
  /** The figure's accessible name. */
  label: string;
  /** What the arrow keys move the readout by, e.g. "from point to point"; "" says nothing more. */
  steps: string;
}

export abstract class PlotChart {
  readonly node: HTMLElement;
  protected readonly plotNode: HTMLDivElement;
  protected readonly readout: HTMLDivElement;
  protected plot: uPlot | null = null;
  protected height = CHART_HEIGHT;
  private _key = '';
  private _width = 0;
  /** The point the keyboard readout is on (null: none yet). */
  private _index: number | null = null;

  constructor({ caption, label, steps }: ChartLabel) {
    this.node = document.createElement('figure');
    this.node.className = 'jp-PathwaysDashboard-chart';
    this.node.setAttribute('role', 'group');
    this.node.setAttribute('aria-label', label);
    const title = document.createElement('figcaption');
    title.className = 'jp-PathwaysDashboard-chartTitle';
    title.textContent = caption;
    this.plotNode = document.createElement('div');
    this.plotNode.className = 'jp-PathwaysDashboard-plot';
    this.plotNode.setAttribute('role', 'img');
    this.plotNode.tabIndex = 0;
    this.plotNode.setAttribute(
      'aria-label',
      `${label}; arrow keys move the readout${steps ? ` ${steps}` : ''}`
    );
    this.plotNode.addEventListener('keydown', event => this._onKey(event));
    this.readout = document.createElement('div');
    this.readout.className = 'jp-PathwaysDashboard-readout';
    this.readout.setAttribute('aria-live', 'polite');
    this.node.append(title, this.plotNode, this.readout);
  }

  dispose(): void {
    this.plot?.destroy();
    this.plot = null;
  }

  /**
   * Make the plot for `key` (its series and the theme) at `width` x `height`:
   * built anew by `build` when the key changed (true), else resized in place (false).
   */
  protected layout(key: string, width: number, height: number, build: () => uPlot): boolean {
    const rebuild = !this.plot || key !== this._key;
    if (rebuild) {
      this.plot?.destroy();
      this._key = key;
      this._width = width;
      this.height = height;
      this._index = null;
      this.plot = build();
    } else if (width !== this._width || height !== this.height) {
      this._width = width;
      this.height = height;
      this.plot!.setSize({ width, height });
    }
    return rebuild;
  }

  /** The next `layout` builds the plot anew (its options changed). */
  protected invalidate(): void {
    this._key = '';
  }

  /** The keyboard readout starts again from the last point (the data were replaced). */
  protected resetReadout(): void {
    this._index = null;
  }

  /** Arrow keys move the cursor, and so the legend's readout, one point at a time; Home/End: first/last. */
  private _onKey(event: KeyboardEvent): void {
    const plot = this.plot;
    const xs = plot?.data[0] ?? [];
    if (!plot || !xs.length) {
      return;
    }
    const next = arrowIndex(event.key, this._index, xs.length - 1);
    if (next === null) {
      return;
    }
    event.preventDefault();
    this._index = next;
    plot.setCursor({ left: plot.valToPos(xs[next], 'x'), top: this.height / 3 });
  }
}

/**
 * The point index the arrow keys move a chart's readout to from `current`
 * (null: none yet, the last): one point left or right, Home/End to the
 * first/last; null for any other key.
 */
export function arrowIndex(key: string, current: number | null, last: number): number | null {
  const i = current === null || current > last ? last : current;
  const moves: Record<string, number> = {
    ArrowLeft: Math.max(0, i - 1),
    ArrowRight: Math.min(last, i + 1),
    Home: 0,
    End: last
  };
  return key in moves ? moves[key] : null;
}

/** A chart's theme colours (CSS variables resolved on `node`) and the axis style they make. */
export function chartStyle(node: HTMLElement): {
  color: (name: string, fallback: string) => string;
  text: string;
  axis: uPlot.Axis;
} {
  const style = getComputedStyle(node);
  const color = (name: string, fallback: string) => style.getPropertyValue(name).trim() || fallback;
  const text = color('--jp-ui-font-color2', '#757575');
  const grid = color('--jp-border-color2', '#e0e0e0');
  // uPlot scales the font's pixel size for the device, so it must be in px (theme sizes are em).
  const font = `${Math.round(0.85 * parseFloat(style.fontSize) || 11)}px ${color('--jp-ui-font-family', 'sans-serif')}`;
  return {
    color,
    text,
    axis: {
      stroke: text,
      font,
      labelFont: font,
      grid: { stroke: grid, width: 1 },
      ticks: { stroke: grid }
    }
  };
}

/** Changes with the JupyterLab theme: charts resolve their canvas colours again when it does. */
export function themeKey(): string {
  return `${document.body.dataset.jpThemeName ?? ''}|${document.body.dataset.jpThemeLight ?? ''}`;
}

/** Kinds in MARKER_KINDS order (slice_down first), any other after them. */
export function markerRank(kind: string): number {
  const i = MARKER_KINDS.indexOf(kind);
  return i < 0 ? MARKER_KINDS.length : i;
}

/** Seconds since a run started as an axis or readout reads them: "2.50 s", "12.3 s". */
export function formatSeconds(x: number): string {
  return `${x.toFixed(x < 10 ? 2 : 1)} s`;
}
