/**
 * One dashboard chart in its own main-area tab (jupyterlab-nvdashboard
 * style): the chart's figure moves into the tab, and a note takes its place
 * in the dashboard until the tab closes, when the figure goes back. The
 * dashboard keeps drawing it (at the tab's size) from the same kernel data,
 * so it is live while cells run; the dashboard closes its tabs when the
 * kernel goes.
 */
import { Widget } from '@lumino/widgets';

import { CHART_HEIGHT } from './plotchart';

/** CSS px a chart's title, legend and readout take around its plot in a tab. */
const CHROME_PX = 110;

export class ChartTab extends Widget {
  private _note: HTMLDivElement;

  /**
   * @param chartId the chart's id in its dashboard (`data-chart` on its figure).
   * @param chartTitle what the chart shows, for the tab title.
   * @param figure the chart's figure, moved here from the dashboard.
   * @param changed asks the dashboard for a frame (the tab was shown or resized).
   */
  constructor(
    readonly chartId: string,
    readonly chartTitle: string,
    private _figure: HTMLElement,
    private _changed: () => void
  ) {
    super();
    this.id = `pathways-chart-${chartId.replace(/[^A-Za-z0-9_-]/g, '_')}`;
    // The dashboard's class too: the figure keeps its styles (theme colours, markers) here.
    this.addClass('jp-PathwaysDashboard');
    this.addClass('jp-PathwaysChartTab');
    this.title.label = `${chartTitle} · Pathways`;
    this.title.caption = `${chartTitle}, from the Pathways dashboard: live while the kernel runs`;
    this.title.closable = true;
    this._note = document.createElement('div');
    this._note.className = 'jp-PathwaysDashboard-tabNote';
    this._note.dataset.chart = chartId;
    this._note.textContent = `${chartTitle} is open in its own tab.`;
    _figure.replaceWith(this._note);
    this.node.append(_figure);
  }

  /** The plot's size in this tab: its width, and its height less the chart's title, legend and readout. */
  plotSize(): [number, number] {
    const width = Math.max(240, Math.floor(this.node.clientWidth) - 26);
    const height = Math.max(CHART_HEIGHT, Math.floor(this.node.clientHeight) - CHROME_PX);
    return [width, height];
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    // Back where it was in the dashboard.
    if (this._note.isConnected) {
      this._note.replaceWith(this._figure);
    }
    super.dispose();
    this._changed();
  }

  protected onAfterShow(): void {
    this._changed();
  }

  protected onResize(): void {
    this._changed();
  }
}
