/**
 * The Pathways panel: follows the kernel of the active notebook or console
 * and shows its slices live (header, topology canvas, per-slice rows with
 * sparklines and fail/repair, "Snapshot now", event timeline), and says
 * which one it follows. When the active tab has no kernel (the Launcher, a
 * text file) it keeps the last one and says so.
 *
 * Any kernel may serve the monitor: a Pathways kernel always does, a stock
 * one after `%load_ext pathways_kernel`. One that has no comm target closes
 * the comm; the panel tries again after the kernel's next execution.
 *
 * Exactly one comm per followed kernel: `sessionContext.ready`,
 * `kernelChanged` and the shell's `currentChanged` all lead to `_sync()`,
 * which does nothing when it already talks to that kernel.
 */
import { Dialog, ISessionContext, showDialog } from '@jupyterlab/apputils';
import { Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';
import { Title, Widget } from '@lumino/widgets';

import { MonitorConnection } from '../protocol/connection';
import { formatBytes, formatPercent } from '../common/format';
import { isPathwaysKernel } from '../common/kernels';
import { UTILIZATION_HELP } from '../common/help';
import { Change, MonitorModel } from '../model/monitormodel';
import { CloseReason, LatestProfile, decodeLatestProfile } from '../protocol/messages';
import { SliceAction, SliceList } from './slicelist';
import { Timeline } from './timeline';
import { TopologyView } from './topologyview';

/** A notebook or console: a main-area widget with a kernel session. */
export interface KernelWidget {
  readonly sessionContext: ISessionContext;
  readonly title: Title<Widget>;
}

export function isKernelWidget(widget: unknown): widget is KernelWidget {
  return !!widget && typeof widget === 'object' && 'sessionContext' in widget && 'title' in widget;
}

export class PathwaysPanel extends Widget {
  readonly model = new MonitorModel();
  private _notebook: KernelWidget | null = null;
  /** Label of the active main-area tab when it has no kernel (we keep following `_notebook`). */
  private _otherActive: string | null = null;
  /** The followed kernel has no `pathways.monitor` target (yet): retried after its next execution. */
  private _noMonitor = false;
  /** The execute_request after whose reply the monitor is tried again. */
  private _retryAfter: string | null = null;
  private _confirmFail = true;
  /** Connections seen that handle comms, by kernel id: what a console sharing that kernel uses. */
  private _commKernels = new Map<string, Kernel.IKernelConnection>();
  private _kernel: Kernel.IKernelConnection | null = null;
  private _connection: MonitorConnection | null = null;
  private _rate = 2;
  private _frame = 0;
  private _message = '';
  /** Why the followed kernel has no backend, while it has none. */
  private _noBackend: string | null = null;
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
    this._sync();
  }

  /** Emitted when the summary the status bar shows may have changed. */
  get stateChanged(): ISignal<this, void> {
    return this._stateChanged;
  }

  /**
   * Follow the active main-area widget: a notebook or console and its kernel
   * changes; anything else keeps the last one followed (and says so); null
   * (no tab at all) follows nothing.
   */
  follow(widget: Widget | KernelWidget | null): void {
    if (widget !== null && !isKernelWidget(widget)) {
      this._otherActive = widget.title.label || 'this tab';
      this._renderChrome();
      return;
    }
    this._otherActive = null;
    const notebook = widget;
    if (notebook !== this._notebook) {
      const old = this._notebook?.sessionContext;
      old?.kernelChanged.disconnect(this._sync, this);
      old?.statusChanged.disconnect(this._kernelStatus, this);
      this._notebook = notebook;
      const context = notebook?.sessionContext;
      context?.kernelChanged.connect(this._sync, this);
      context?.statusChanged.connect(this._kernelStatus, this);
      // A notebook closed before its session was ready rejects: nothing to follow then.
      void context?.ready.then(() => this._sync()).catch(() => undefined);
    }
    this._sync();
  }

  /** Whether "fail" asks for confirmation first (setting `confirmFail`). */
  setConfirmFail(confirm: boolean): void {
    this._confirmFail = confirm;
  }

  /** Metrics rate asked of the kernel (Hz), from the user's settings. */
  setRate(rate: number): void {
    this._rate = rate;
    void this._connection?.setRate(rate).catch(() => undefined);
  }

  dispose(): void {
    this._detach();
    super.dispose();
  }

  protected onAfterShow(): void {
    this._schedule();
  }

  protected onResize(): void {
    this._schedule();
  }

  /** Attach to the followed notebook's kernel unless already attached to it. */
  private _sync(): void {
    const context: ISessionContext | undefined = this._notebook?.sessionContext;
    let kernel = context?.session?.kernel ?? null;
    if (kernel?.handleComms) {
      this._commKernels.set(kernel.id, kernel);
    } else if (kernel) {
      // A console on a notebook's kernel: its own connection handles no comms; the notebook's does.
      const shared = this._commKernels.get(kernel.id);
      kernel = shared && !shared.isDisposed ? shared : kernel;
    }
    if (
      kernel === this._kernel &&
      (this._connection !== null || kernel === null || this._noMonitor)
    ) {
      this._renderChrome();
      return;
    }
    this._detach();
    this._kernel = kernel;
    if (kernel) {
      kernel.anyMessage.connect(this._retryAfterExecution, this);
      this._attach(kernel);
    }
    this._renderChrome();
  }

  /**
   * A cell that names pathways_kernel (`%load_ext pathways_kernel`, an import) ran on a kernel
   * without the monitor: try again once it is done. Other cells open nothing.
   */
  private _retryAfterExecution(
    kernel: Kernel.IKernelConnection,
    args: Kernel.IAnyMessageArgs
  ): void {
    if (!this._noMonitor || kernel !== this._kernel || this._connection !== null) {
      return;
    }
    const msg = args.msg;
    if (args.direction === 'send' && msg.header.msg_type === 'execute_request') {
      const code = (msg.content as { code?: string }).code ?? '';
      if (code.includes('pathways_kernel')) {
        this._retryAfter = msg.header.msg_id;
      }
    } else if (
      args.direction === 'recv' &&
      msg.header.msg_type === 'execute_reply' &&
      (msg.parent_header as { msg_id?: string }).msg_id === this._retryAfter
    ) {
      this._retryAfter = null;
      this._noMonitor = false;
      this._attach(kernel);
      this._renderChrome();
    }
  }

  private _attach(kernel: Kernel.IKernelConnection): void {
    const connection = new MonitorConnection(kernel, this.model, {
      closed: reason => this._closed(connection, reason),
      noBackend: error => this._noBackendFor(connection, error)
    });
    this._connection = connection;
    this._message = 'Connecting to the kernel’s monitor…';
    connection.open(this._rate).then(
      () => {
        if (this._connection === connection && this._message.startsWith('Connecting')) {
          this._message = '';
          this._renderChrome();
        }
      },
      (error: Error) => {
        if (this._connection === connection) {
          this._message = `Could not reach the kernel’s monitor: ${error.message}`;
          this._renderChrome();
        }
      }
    );
  }

  private _detach(): void {
    this._kernel?.anyMessage.disconnect(this._retryAfterExecution, this);
    this._noMonitor = false;
    this._connection?.dispose();
    this._connection = null;
    this._kernel = null;
    this._message = '';
    this._noBackend = null;
    this.model.reset();
  }

  /** The kernel started without a backend: say why and what to do; the comm stays open for when one connects. */
  private _noBackendFor(connection: MonitorConnection, error: string): void {
    if (this._connection !== connection) {
      return;
    }
    this.model.reset();
    this._noBackend = error;
    this._message = `No backend: ${error}. Run %pathways connect local:2x4 in a cell, or fix the target and restart the kernel.`;
    this._renderChrome();
  }

  private _closed(connection: MonitorConnection, reason: CloseReason): void {
    if (this._connection !== connection) {
      return;
    }
    this._connection = null;
    this._noBackend = null;
    const kernel = this._kernel;
    if (reason === 'stale' && kernel) {
      // Our pings stopped (a sleeping laptop): just reconnect.
      this.model.reset();
      this._attach(kernel);
    } else if (reason === 'unknown') {
      this.model.reset();
      this._noMonitor = true;
      this._message = '';
    } else {
      this._message =
        reason === 'evicted'
          ? 'Disconnected: too many monitor views on this kernel. Close other views, then reopen this notebook.'
          : 'The kernel’s monitor shut down.';
    }
    this._renderChrome();
  }

  /** A kernel restart drops its comms: start over once it is back. */
  private _kernelStatus(context: ISessionContext, status: Kernel.Status): void {
    const kernel = this._kernel;
    if (!kernel) {
      return;
    }
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._connection?.dispose();
      this._connection = null;
      this._noBackend = null;
      this.model.reset();
      this._message = status === 'dead' ? 'The kernel died.' : 'Kernel restarting…';
      this._renderChrome();
    } else if (
      (status === 'idle' || status === 'busy') &&
      this._connection === null &&
      !this._noMonitor
    ) {
      this._attach(kernel);
      this._renderChrome();
    }
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
      const reply = await this._request({ type: action, slice });
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
      const reply = await this._request({ type: 'snapshot' });
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
    const reply = await this._request({ type: 'latest_profile' });
    if (!reply.ok) {
      throw new Error(reply.error ?? 'latest_profile failed');
    }
    return decodeLatestProfile(reply);
  }

  private _request(body: Parameters<MonitorConnection['request']>[0]) {
    if (!this._connection) {
      return Promise.reject(new Error('not connected to a Pathways kernel'));
    }
    return this._connection.request(body);
  }

  private _report(text: string, error = false): void {
    this._actionResult.textContent = text;
    this._actionResult.classList.toggle('jp-mod-error', error);
  }

  private _changed(change: Change): void {
    if (change === 'points') {
      return; // training metrics are the dashboard's
    }
    if (
      change === 'topology' &&
      (this._noBackend !== null || this._message.startsWith('Connecting'))
    ) {
      // A backend connected, or its topology came before the reply to our subscribe.
      this._noBackend = null;
      this._message = '';
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
    const target = this._notebook;
    const node = this._following;
    if (!target) {
      node.hidden = true;
      return;
    }
    node.hidden = false;
    const kind = 'console' in target ? 'console' : 'notebook';
    const name = target.title.label || target.sessionContext.name || kind;
    const kernel = this._kernel ? ` · ${target.sessionContext.kernelDisplayName}` : '';
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
      ['memory', this.model.metrics ? formatBytes(this.model.metrics.memory_bytes) : '–']
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
    const kernel = this._kernel;
    let message = this._message;
    if (!this._notebook) {
      message = 'Open a notebook or console on a Pathways kernel to see its slices here.';
    } else if (!kernel) {
      message =
        'This notebook has no kernel yet. Start the “Pathways (JAX)” kernel to see its slices.';
    } else if (this._noMonitor) {
      message = isPathwaysKernel(kernel.name)
        ? `This kernel (“${kernel.name}”) has no Pathways monitor. Restart it to get one.`
        : `This notebook runs “${kernel.name}”, which has no Pathways monitor yet. Run %load_ext pathways_kernel in it, or switch it to “Pathways (JAX)” (Kernel › Change Kernel…).`;
    }
    this._status.textContent = message;
    this._status.hidden = !message;
    this._renderFollowing();
    const live = !!this.model.topology;
    this._body.hidden = !live;
    this.node.dataset.state = !this._notebook
      ? 'no-notebook'
      : !kernel
        ? 'no-kernel'
        : this._noMonitor
          ? 'not-pathways'
          : this._noBackend !== null
            ? 'no-backend'
            : live
              ? 'live'
              : 'connecting';
    this._renderHeader();
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
