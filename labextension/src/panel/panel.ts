/**
 * The Pathways panel: follows the kernel of the active notebook or console
 * and shows its slices live (header, topology canvas, per-slice rows with
 * sparklines and fail/repair, "Snapshot now", event timeline), and says
 * which one it follows. When the active tab has no kernel (the Launcher, a
 * text file) it keeps the last one and says so.
 *
 * Any kernel may serve the monitor: a Pathways kernel always does, a stock
 * one after `%load_ext pathways_kernel`. The comm's whole lifecycle (attach,
 * restart, reconnect, a kernel without the monitor) is the `MonitorSession`'s;
 * the panel says where it stands.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { formatBytes, formatPercent } from '../common/format';
import { isPathwaysKernel, startingMessage } from '../common/kernels';
import { UTILIZATION_HELP } from '../common/help';
import { Change, MonitorModel } from '../model/monitormodel';
import { LatestProfile, decodeLatestProfile } from '../protocol/messages';
import {
  KernelView,
  MonitorSession,
  SessionState,
  asKernelView,
  stateMessage
} from '../protocol/session';
import { SliceAction, SliceList } from './slicelist';
import { Timeline } from './timeline';
import { TopologyView } from './topologyview';

export class PathwaysPanel extends Widget {
  readonly model = new MonitorModel();
  readonly session = new MonitorSession(this.model);
  /** Label of the active main-area tab when it has no kernel (we keep following the last view). */
  private _otherActive: string | null = null;
  private _confirmFail = true;
  private _frame = 0;
  private _stateChanged = new Signal<this, void>(this);

  private _following: HTMLDivElement;
  private _header: HTMLDivElement;
  private _headerValues = new Map<string, HTMLSpanElement>();
  private _status: HTMLDivElement;
  private _body: HTMLDivElement;
  private _topology: TopologyView;
  private _slices: SliceList;
  private _timeline: Timeline;
  private _actionResult: HTMLDivElement;
  private _snapshotButton: HTMLButtonElement;

  constructor() {
    super();
    this.id = 'pathways-monitor';
    this.addClass('jp-PathwaysPanel');
    this.title.caption = 'Pathways monitor';
    this.title.label = 'Pathways';

    const title = document.createElement('div');
    title.className = 'jp-PathwaysPanel-title';
    title.textContent = 'Pathways';
    this._following = document.createElement('div');
    this._following.className = 'jp-PathwaysPanel-following';
    this._header = document.createElement('div');
    this._header.className = 'jp-PathwaysPanel-header';
    this._status = document.createElement('div');
    this._status.className = 'jp-PathwaysPanel-message';
    this._status.setAttribute('role', 'status');

    this._body = document.createElement('div');
    this._body.className = 'jp-PathwaysPanel-body';
    this._topology = new TopologyView(this.model);
    this._slices = new SliceList(
      this.model,
      (action, slice, button) => void this._sliceAction(action, slice, button)
    );
    this._timeline = new Timeline(this.model);
    const actions = document.createElement('div');
    actions.className = 'jp-PathwaysPanel-actions';
    this._snapshotButton = document.createElement('button');
    this._snapshotButton.className = 'jp-Button jp-mod-styled jp-mod-accept jp-mod-small';
    this._snapshotButton.textContent = 'Snapshot now';
    this._snapshotButton.title = "Snapshot the notebook's JAX arrays to host memory now";
    this._snapshotButton.addEventListener('click', () => void this._snapshot());
    this._actionResult = document.createElement('div');
    this._actionResult.className = 'jp-PathwaysPanel-actionResult';
    this._actionResult.setAttribute('role', 'status');
    actions.append(this._snapshotButton, this._actionResult);
    const slicesTitle = section('Slices · utilization, last 5 min', this._slices.node);
    slicesTitle.querySelector('h3')!.title = UTILIZATION_HELP;
    this._body.append(
      section('Topology', this._topology.node),
      slicesTitle,
      actions,
      section('Events · newest first', this._timeline.node, this._timeline.filter)
    );
    this.node.append(title, this._following, this._header, this._status, this._body);

    this.model.subscribe(change => this._changed(change));
    this.session.stateChanged.connect(() => {
      this._renderChrome();
      this._stateChanged.emit(); // the status bar shows the kernel's start too
    });
    this._renderChrome();
  }

  /** Emitted when what the status bar shows may have changed (the summary, the kernel's start). */
  get stateChanged(): ISignal<this, void> {
    return this._stateChanged;
  }

  /**
   * Follow the active main-area widget: a notebook or console and its kernel
   * changes; anything else keeps the last one followed (and says so); null
   * (no tab at all) follows nothing.
   */
  /** The view whose kernel status the panel listens to (its kernel starting). */
  private _statusView: KernelView | null = null;
  private _onStatus = (): void => this._renderChrome();

  follow(widget: Widget | KernelView | null): void {
    const view = asKernelView(widget);
    if (widget !== null && view === null) {
      this._otherActive = (widget as Widget).title.label || 'this tab';
      this._renderChrome();
      return;
    }
    this._otherActive = null;
    if (view !== this._statusView) {
      // While its kernel starts the session has no kernel, or one still unknown: say so as it goes.
      this._statusView?.sessionContext.statusChanged.disconnect(this._onStatus);
      this._statusView = view;
      view?.sessionContext.statusChanged.connect(this._onStatus);
    }
    this.session.follow(view);
    this._renderChrome();
  }

  /** Whether "fail" asks for confirmation first (setting `confirmFail`). */
  setConfirmFail(confirm: boolean): void {
    this._confirmFail = confirm;
  }

  /** Metrics rate asked of the kernel (Hz), from the user's settings. */
  setRate(rate: number): void {
    this.session.setRate(rate);
  }

  dispose(): void {
    this.session.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    this._schedule();
  }

  protected onResize(): void {
    this._schedule();
  }

  private async _sliceAction(
    action: SliceAction,
    slice: number,
    button: HTMLButtonElement
  ): Promise<void> {
    const verb = action === 'fail_slice' ? 'fail' : 'repair';
    if (action === 'fail_slice' && this._confirmFail && !(await this._confirm(slice))) {
      button.focus();
      return;
    }
    button.disabled = true;
    this._report(`${verb} slice ${slice}…`);
    try {
      const reply = await this.session.request({ type: action, slice });
      this._report(reply.ok ? '' : `${verb} slice ${slice}: ${reply.error}`, !reply.ok);
    } catch (error) {
      this._report(`${verb} slice ${slice}: ${(error as Error).message}`, true);
    } finally {
      button.disabled = false;
    }
  }

  /** Ask before losing a slice: its arrays become errors. Cancel is the default, so Enter never fails one. */
  private async _confirm(slice: number): Promise<boolean> {
    const chips = this.model.slice(
      this.model.topology?.slices.findIndex(s => s.index === slice) ?? -1
    )?.chip_count;
    const result = await showDialog({
      title: `Fail slice ${slice}?`,
      body:
        `Every array with a shard on slice ${slice}${chips ? ` (${chips} chips)` : ''} is lost: ` +
        'reading it raises DATA_LOSS, as when Pathways loses a slice. Repair brings the slice back empty. ' +
        'Turn this question off with the setting “Confirm before fail”.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: `Fail slice ${slice}` })],
      defaultButton: 0
    });
    return result.button.accept;
  }

  private async _snapshot(): Promise<void> {
    this._snapshotButton.disabled = true;
    this._report('Snapshotting…');
    try {
      const reply = await this.session.request({ type: 'snapshot' });
      if (reply.ok && reply.result) {
        const r = reply.result as { name?: string; leaves?: number; nbytes?: number };
        this._report(`Snapshot “${r.name}”: ${r.leaves} arrays, ${formatBytes(r.nbytes ?? 0)}`);
      } else {
        this._report(`Snapshot failed: ${reply.error}`, true);
      }
    } catch (error) {
      this._report(`Snapshot failed: ${(error as Error).message}`, true);
    } finally {
      this._snapshotButton.disabled = false;
    }
  }

  /** The followed kernel's newest profile capture (rejects when no kernel is followed). */
  async latestProfile(): Promise<LatestProfile> {
    const reply = await this.session.request({ type: 'latest_profile' });
    if (!reply.ok) {
      throw new Error(reply.error ?? 'latest_profile failed');
    }
    return decodeLatestProfile(reply);
  }

  private _report(text: string, error = false): void {
    this._actionResult.textContent = text;
    this._actionResult.classList.toggle('jp-mod-error', error);
  }

  private _changed(change: Change): void {
    if (change === 'points') {
      return; // training metrics are the dashboard's
    }
    if (change !== 'metrics') {
      this._renderChrome();
    }
    this._schedule();
    this._stateChanged.emit();
  }

  /** Coalesce redraws to one per animation frame. */
  private _schedule(): void {
    if (this._frame) {
      return;
    }
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      if (!this.isVisible) {
        return;
      }
      this._draw();
    });
  }

  /** Draw one frame: all layout reads first, then writes (one reflow per frame, not one per row). */
  private _draw(): void {
    const topologyWidth = this._topology.measure();
    const sparkWidth = this._slices.measure();
    this._topology.render(topologyWidth);
    this._slices.render(sparkWidth);
    this._timeline.render();
    this._renderHeader();
  }

  /** "Following: train.ipynb · python3", and what the active tab is when it has no kernel. */
  private _renderFollowing(): void {
    const target = this.session.view;
    const node = this._following;
    if (!target) {
      node.hidden = true;
      return;
    }
    node.hidden = false;
    const kind = 'console' in target ? 'console' : 'notebook';
    const name = target.title.label || target.sessionContext.name || kind;
    const kernel = this.session.kernel ? ` · ${target.sessionContext.kernelDisplayName}` : '';
    const text = this._otherActive
      ? `Following ${kind} ${name}${kernel} (the active tab, ${this._otherActive}, has no kernel)`
      : `Following ${kind} ${name}${kernel}`;
    if (node.textContent !== text) {
      node.textContent = text;
      node.title = text;
    }
    node.dataset.kind = kind;
    node.classList.toggle('jp-mod-other', this._otherActive !== null);
  }

  /** Header figures that move with every metrics frame; nodes are built once and only their text changes. */
  private _renderHeader(): void {
    const t = this.model.topology;
    const summary = this.model.summary();
    if (!t || !summary) {
      this._header.textContent = '';
      this._headerValues.clear();
      return;
    }
    const items: [string, string][] = [
      ['backend', t.backend],
      ['target', t.target],
      ['platform', t.platform],
      ['slices', `${summary.slicesUp}/${summary.slicesTotal} up`],
      ['chips', String(summary.chips)],
      ['utilization', formatPercent(summary.utilization)],
      ['memory', this.model.metrics ? formatBytes(this.model.metrics.memory_bytes) : '–'],
      // What measured the figures, with its resolution ("Cloud Monitoring, 60 s").
      ['measured by', this.model.metrics?.source ?? '–']
    ];
    for (const [name, value] of items) {
      let text = this._headerValues.get(name);
      if (!text) {
        const item = document.createElement('span');
        item.className = 'jp-PathwaysPanel-headerItem';
        item.dataset.field = name;
        const label = document.createElement('span');
        label.className = 'jp-PathwaysPanel-headerLabel';
        label.textContent = name;
        text = document.createElement('span');
        text.className = 'jp-PathwaysPanel-headerValue';
        item.append(label, text);
        this._header.append(item);
        this._headerValues.set(name, text);
      }
      if (text.textContent !== value) {
        text.textContent = value;
      }
    }
    this._header.classList.toggle('jp-mod-degraded', summary.slicesUp < summary.slicesTotal);
  }

  /** The friendly states: no notebook, not a Pathways kernel, connecting, disconnected. */
  private _renderChrome(): void {
    const state = this.session.state;
    const kernel = this.session.kernel;
    const context = this._statusView?.sessionContext;
    const starting =
      (state.kind === 'no-kernel' || state.kind === 'connecting') && context
        ? startingMessage(
            kernel?.name ?? context.kernelPreference.name ?? null,
            context.kernelDisplayStatus,
            context.isReady
          )
        : null;
    const message = starting ?? panelMessage(state, kernel?.name ?? '');
    this._status.textContent = message;
    this._status.hidden = !message;
    this._renderFollowing();
    const live = !!this.model.topology;
    this._body.hidden = !live;
    this.node.dataset.state =
      state.kind === 'no-view'
        ? 'no-notebook'
        : state.kind === 'no-kernel'
          ? 'no-kernel'
          : state.kind === 'no-monitor'
            ? 'not-pathways'
            : state.kind === 'no-backend'
              ? 'no-backend'
              : live
                ? 'live'
                : state.kind === 'starting'
                  ? 'starting'
                  : 'connecting';
    this._renderHeader();
  }
}

/** What the panel says in `state` about kernel `name`. */
function panelMessage(state: SessionState, name: string): string {
  switch (state.kind) {
    case 'no-view':
      return 'Open a notebook or console on a Pathways kernel to see its slices here.';
    case 'no-kernel':
      return 'This notebook has no kernel yet. Start the “Pathways (JAX)” kernel to see its slices.';
    case 'no-monitor':
      return isPathwaysKernel(name)
        ? `This kernel (“${name}”) has no Pathways monitor. Restart it to get one.`
        : `This notebook runs “${name}”, which has no Pathways monitor yet. Run %load_ext pathways_kernel in it, or switch it to “Pathways (JAX)” (Kernel › Change Kernel…).`;
    case 'no-backend':
      return `No backend: ${state.error}. Run %pathways connect local:2x4 in a cell, or fix the target and restart the kernel.`;
    case 'closed':
      return state.reason === 'evicted'
        ? 'Disconnected: too many monitor views on this kernel. Close other views, then reopen this notebook.'
        : 'The kernel’s monitor shut down.';
    default:
      return stateMessage(state);
  }
}

function section(
  title: string,
  content: HTMLElement,
  tool: HTMLElement | null = null
): HTMLElement {
  const node = document.createElement('section');
  node.className = 'jp-PathwaysPanel-section';
  const heading = document.createElement('h3');
  heading.className = 'jp-PathwaysPanel-sectionTitle';
  heading.textContent = title;
  if (tool) {
    const bar = document.createElement('div');
    bar.className = 'jp-PathwaysPanel-sectionBar';
    bar.append(heading, tool);
    node.append(bar, content);
  } else {
    node.append(heading, content);
  }
  return node;
}
