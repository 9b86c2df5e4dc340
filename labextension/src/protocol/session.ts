/**
 * One monitor session: a view's `pathways.monitor` comm on the kernel of the
 * notebook or console it follows, through the lifecycle of docs/protocol.md.
 * The panel and the dashboard each hold one and only render its state.
 *
 * It attaches when the followed view has a kernel, detaches when the view
 * follows another kernel, starts over after a kernel restart, reconnects after
 * a `stale` close, and, when the kernel has no `pathways.monitor` target (a
 * stock kernel), tries again after a cell that names pathways_kernel ran.
 *
 * Exactly one comm per followed kernel: `sessionContext.ready`,
 * `kernelChanged` and `follow()` all lead to `_sync()`, which does nothing
 * when it already talks to that kernel (docs/architecture.md: attach fires
 * from several signals).
 */
import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { MonitorModel } from '../model/monitormodel';
import { MonitorConnection } from './connection';
import { ChipHistory, CloseReason, ReplyMessage, RequestBody, StartingMessage } from './messages';

/** What a session can follow: a notebook or a console, anything with a kernel session and a title. */
export interface KernelView {
  readonly sessionContext: ISessionContext;
  readonly title: { readonly label: string };
}

/** `widget` if it has a kernel session (a notebook, a console), else null. */
export function asKernelView(widget: unknown): KernelView | null {
  const w = widget as Partial<KernelView> | null;
  return w && w.sessionContext && w.title ? (w as KernelView) : null;
}

/** Where a session stands; views say it in their own words. */
export type SessionState =
  /** No notebook or console is followed. */
  | { readonly kind: 'no-view' }
  /** The followed view has no kernel (yet). */
  | { readonly kind: 'no-kernel' }
  /** The view does not monitor this kind of kernel (`SessionOptions.accepts`). */
  | { readonly kind: 'not-accepted' }
  /** The kernel has no `pathways.monitor` target; retried after a cell naming pathways_kernel. */
  | { readonly kind: 'no-monitor' }
  /** The comm is opening (or the kernel is back from a restart). */
  | { readonly kind: 'connecting' }
  /** The comm is open. */
  | { readonly kind: 'live' }
  /** The kernel's backend is starting (its local Pathways server): how far, from the kernel. */
  | { readonly kind: 'starting'; readonly progress: StartingMessage }
  /** The kernel has no backend (`error`: why); the comm stays open for when one connects. */
  | { readonly kind: 'no-backend'; readonly error: string }
  /** Opening the comm failed. */
  | { readonly kind: 'unreachable'; readonly error: string }
  /** The kernel closed the comm for good (`evicted`, `shutdown`). */
  | { readonly kind: 'closed'; readonly reason: CloseReason }
  | { readonly kind: 'restarting' }
  | { readonly kind: 'dead' };

/** What a view says in `state` where it has nothing of its own to say. */
export function stateMessage(state: SessionState): string {
  switch (state.kind) {
    case 'connecting':
      return 'Connecting to the kernel’s monitor…';
    case 'unreachable':
      return `Could not reach the kernel’s monitor: ${state.error}`;
    case 'restarting':
      return 'Kernel restarting…';
    case 'starting':
      return startLine(state.progress);
    case 'dead':
      return 'The kernel died.';
    default:
      return '';
  }
}

/**
 * "Starting the local Pathways server (2 slices x 4 chips)… devices (2/4), 12 s", as the
 * kernel says it (`starting`); the last step done, or `launching` before the first.
 */
export function startLine(progress: StartingMessage): string {
  const what = progress.what.charAt(0).toUpperCase() + progress.what.slice(1);
  const seconds = `${Math.round(progress.elapsed_s)} s`;
  if (progress.state === 'failed') {
    return `${what} failed after ${seconds}: ${progress.error ?? 'no reason given'}`;
  }
  if (progress.state === 'ready') {
    return `${what}: ready after ${seconds}; connecting the monitor…`;
  }
  const step = progress.done > 0 ? progress.steps[progress.done - 1] : 'launching';
  return `${what}… ${step} (${progress.done}/${progress.steps.length}), ${seconds}`;
}

export interface SessionOptions {
  /** Whether to monitor this kernel at all (default: any kernel). */
  accepts?: (kernel: Kernel.IKernelConnection) => boolean;
}

export class MonitorSession {
  private _view: KernelView | null = null;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _connection: MonitorConnection | null = null;
  private _state: SessionState = { kind: 'no-view' };
  private _rate = 2;
  /** The execute_request after whose reply a kernel without the monitor is tried again. */
  private _retryAfter: string | null = null;
  /** Connections seen that handle comms, by kernel id: what a console sharing that kernel uses. */
  private _commKernels = new Map<string, Kernel.IKernelConnection>();
  private _accepts: (kernel: Kernel.IKernelConnection) => boolean;
  private _stateChanged = new Signal<this, SessionState>(this);
  private _ended = new Signal<this, void>(this);
  private _unsubscribe: () => void;
  private _disposed = false;

  /** @param model receives every decoded kernel message; reset whenever the session starts over. */
  constructor(
    readonly model: MonitorModel,
    options: SessionOptions = {}
  ) {
    this._accepts = options.accepts ?? (() => true);
    // A topology means the comm works: a backend connected, or it came before our subscribe's reply.
    this._unsubscribe = model.subscribe(change => {
      const kind = this._state.kind;
      if (
        change === 'topology' &&
        (kind === 'connecting' || kind === 'no-backend' || kind === 'starting')
      ) {
        this._setState({ kind: 'live' });
      }
    });
  }

  /** The notebook or console followed. */
  get view(): KernelView | null {
    return this._view;
  }

  /** The kernel connection the comm is (or would be) on. */
  get kernel(): Kernel.IKernelConnection | null {
    return this._kernel;
  }

  get state(): SessionState {
    return this._state;
  }

  /** Emitted on every change of `state`. */
  get stateChanged(): ISignal<this, SessionState> {
    return this._stateChanged;
  }

  /** Emitted when the followed kernel is gone for this session: another is followed, it shut down or died. */
  get ended(): ISignal<this, void> {
    return this._ended;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Follow `view` (null: nothing) and its kernel changes and restarts. */
  follow(view: KernelView | null): void {
    if (view !== this._view) {
      const old = this._view?.sessionContext;
      old?.kernelChanged.disconnect(this._sync);
      old?.statusChanged.disconnect(this._kernelStatus);
      this._view = view;
      const context = view?.sessionContext;
      context?.kernelChanged.connect(this._sync);
      context?.statusChanged.connect(this._kernelStatus);
      // A view closed before its session was ready rejects: nothing to follow then.
      void context?.ready.then(() => this._sync()).catch(() => undefined);
    }
    this._sync();
  }

  /** Metrics rate asked of the kernel (Hz). */
  setRate(rate: number): void {
    this._rate = rate;
    void this._connection?.setRate(rate).catch(() => undefined);
  }

  /** Send a request on the comm; rejects when not connected. */
  request(body: RequestBody): Promise<ReplyMessage> {
    if (!this._connection) {
      return Promise.reject(new Error('not connected to a Pathways kernel'));
    }
    return this._connection.request(body);
  }

  /** The kernel's per-chip series of chip positions [start, stop); rejects when not connected. */
  chipHistory(start: number, stop: number): Promise<ChipHistory> {
    if (!this._connection) {
      return Promise.reject(new Error('not connected to a Pathways kernel'));
    }
    return this._connection.chipHistory(start, stop);
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this.follow(null);
    this._disposed = true;
    this._unsubscribe();
    Signal.clearData(this);
  }

  /** Attach to the followed view's kernel unless already attached to it (a signal's slot). */
  private readonly _sync = (): void => {
    let kernel = this._view?.sessionContext?.session?.kernel ?? null;
    if (kernel?.handleComms) {
      this._commKernels.set(kernel.id, kernel);
    } else if (kernel) {
      // A console on a notebook's kernel: its own connection handles no comms; the notebook's does.
      const shared = this._commKernels.get(kernel.id);
      kernel = shared && !shared.isDisposed ? shared : kernel;
    }
    const kind = this._state.kind;
    if (
      kernel === this._kernel &&
      (this._connection !== null ||
        kernel === null ||
        kind === 'no-monitor' ||
        kind === 'not-accepted')
    ) {
      const idle = this._view ? 'no-kernel' : 'no-view';
      if (kernel === null && kind !== idle) {
        this._setState({ kind: idle });
      }
      return;
    }
    const hadKernel = this._kernel !== null;
    this._detach();
    if (hadKernel) {
      this._ended.emit();
    }
    this._kernel = kernel;
    if (!this._view) {
      this._setState({ kind: 'no-view' });
    } else if (!kernel) {
      this._setState({ kind: 'no-kernel' });
    } else if (!this._accepts(kernel)) {
      this._setState({ kind: 'not-accepted' });
    } else {
      kernel.anyMessage.connect(this._retryAfterExecution);
      this._attach(kernel);
    }
  };

  private _attach(kernel: Kernel.IKernelConnection): void {
    const connection = new MonitorConnection(kernel, this.model, {
      closed: reason => this._closed(connection, reason),
      noBackend: error => {
        if (this._connection === connection) {
          this.model.reset();
          this._setState({ kind: 'no-backend', error });
        }
      },
      starting: progress => {
        // Said until the topology comes (a `failed` start is followed by `no_backend`).
        if (this._connection === connection && !this.model.topology) {
          this._setState({ kind: 'starting', progress });
        }
      }
    });
    this._connection = connection;
    this._setState({ kind: 'connecting' });
    connection.open(this._rate).then(
      () => {
        if (this._connection === connection && this._state.kind === 'connecting') {
          this._setState({ kind: 'live' });
        }
      },
      (error: Error) => {
        if (this._connection === connection) {
          this._setState({ kind: 'unreachable', error: error.message });
        }
      }
    );
  }

  private _detach(): void {
    this._kernel?.anyMessage.disconnect(this._retryAfterExecution);
    this._retryAfter = null;
    this._connection?.dispose();
    this._connection = null;
    this._kernel = null;
    this.model.reset();
  }

  private _closed(connection: MonitorConnection, reason: CloseReason): void {
    if (this._connection !== connection) {
      return;
    }
    this._connection = null;
    const kernel = this._kernel;
    if (reason === 'stale' && kernel) {
      // Our heartbeats stopped (a sleeping laptop): just reconnect.
      this.model.reset();
      this._attach(kernel);
    } else if (reason === 'unknown') {
      this.model.reset();
      this._setState({ kind: 'no-monitor' });
    } else {
      this._setState({ kind: 'closed', reason });
      if (reason === 'shutdown') {
        this._ended.emit();
      }
    }
  }

  /** A kernel restart drops its comms: start over once it is back (a signal's slot). */
  private readonly _kernelStatus = (_context: ISessionContext, status: Kernel.Status): void => {
    const kernel = this._kernel;
    if (!kernel) {
      return;
    }
    const kind = this._state.kind;
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      if (kind === 'not-accepted') {
        return;
      }
      this._connection?.dispose();
      this._connection = null;
      this.model.reset();
      this._setState({ kind: status === 'dead' ? 'dead' : 'restarting' });
      if (status === 'dead') {
        this._ended.emit();
      }
    } else if (
      (status === 'idle' || status === 'busy') &&
      this._connection === null &&
      kind !== 'no-monitor' &&
      kind !== 'not-accepted'
    ) {
      this._attach(kernel);
    }
  };

  /**
   * A cell that names pathways_kernel (`%load_ext pathways_kernel`, an import) ran on a kernel
   * without the monitor: try again once it is done. Other cells open nothing.
   */
  private readonly _retryAfterExecution = (
    kernel: Kernel.IKernelConnection,
    args: Kernel.IAnyMessageArgs
  ): void => {
    if (this._state.kind !== 'no-monitor' || kernel !== this._kernel) {
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
      this._attach(kernel);
    }
  };

  private _setState(state: SessionState): void {
    this._state = state;
    this._stateChanged.emit(state);
  }
}
