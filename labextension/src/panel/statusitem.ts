/**
 * The status-bar item: "Pathways 2/2 slices · 47%", or while the kernel starts its
 * local Pathways server, "Pathways: starting server · devices (2/4) · 12 s" (the kernel's
 * `starting` messages); a click, or Enter/Space when it has focus (it is in the tab
 * order), opens the panel.
 */
import { Widget } from '@lumino/widgets';

import { statusLabel } from '../common/format';
import { StartingMessage } from '../protocol/messages';
import { startLine } from '../protocol/session';
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
    const state = this._panel.session.state;
    const starting = state.kind === 'starting' && !summary ? state.progress : null;
    const label = starting ? startingLabel(starting) : statusLabel(summary);
    this.node.textContent = label;
    this.node.title = starting ? startLine(starting) : 'Pathways monitor: open the panel';
    this.node.dataset.state = starting ? 'starting' : summary ? 'live' : '';
    this.node.setAttribute('aria-label', `${label}: open the Pathways monitor`);
    this.node.classList.toggle(
      'jp-mod-degraded',
      !!summary && summary.slicesUp < summary.slicesTotal
    );
  }
}

/** "Pathways: starting server · devices (2/4) · 12 s": the status bar's short form of the kernel's start. */
function startingLabel(progress: StartingMessage): string {
  const seconds = `${Math.round(progress.elapsed_s)} s`;
  if (progress.state !== 'starting') {
    return `Pathways: server ${progress.state} · ${seconds}`;
  }
  const step = progress.done > 0 ? progress.steps[progress.done - 1] : 'launching';
  return `Pathways: starting server · ${step} (${progress.done}/${progress.steps.length}) · ${seconds}`;
}
