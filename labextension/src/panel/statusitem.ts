/**
 * The status-bar item: "Pathways 2/2 slices · 47%"; a click, or Enter/Space
 * when it has focus (it is in the tab order), opens the panel.
 */
import { Widget } from '@lumino/widgets';

import { statusLabel } from '../common/format';
import { PathwaysPanel } from './panel';

export class PathwaysStatus extends Widget {
  constructor(
    private _panel: PathwaysPanel,
    onClick: () => void
  ) {
    super();
    this.addClass('jp-PathwaysStatus');
    this.node.title = 'Pathways monitor: open the panel';
    this.node.tabIndex = 0;
    this.node.setAttribute('role', 'button');
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', e => {
      if (e.key === 'Enter' || e.key === ' ') {
        e.preventDefault();
        onClick();
      }
    });
    _panel.stateChanged.connect(() => this._update());
    this._update();
  }

  private _update(): void {
    const summary = this._panel.model.summary();
    this.node.textContent = statusLabel(summary);
    this.node.setAttribute('aria-label', `${statusLabel(summary)}: open the Pathways monitor`);
    this.node.classList.toggle(
      'jp-mod-degraded',
      !!summary && summary.slicesUp < summary.slicesTotal
    );
  }
}
