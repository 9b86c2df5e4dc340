/**
 * The status-bar item: "Pathways 2/2 slices · 47%"; a click opens the panel.
 */
import { Widget } from '@lumino/widgets';

import { statusLabel } from './format';
import { PathwaysPanel } from './panel';

export class PathwaysStatus extends Widget {
  constructor(
    private _panel: PathwaysPanel,
    onClick: () => void
  ) {
    super();
    this.addClass('jp-PathwaysStatus');
    this.node.title = 'Pathways monitor: open the panel';
    this.node.addEventListener('click', onClick);
    _panel.stateChanged.connect(this._update, this);
    this._update();
  }

  private _update(): void {
    const summary = this._panel.model.summary();
    this.node.textContent = statusLabel(summary);
    this.node.classList.toggle(
      'jp-mod-degraded',
      !!summary && summary.slicesUp < summary.slicesTotal
    );
  }
}
