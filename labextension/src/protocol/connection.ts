/**
 * One `pathways.monitor` comm on a notebook's own kernel connection.
 *
 * Opens the comm on the comm target's subshell when the kernel has them
 * (JupyterLab >= 4.4 commsOverSubshells), so requests are answered while a
 * cell runs: JupyterLab's `open()` does not wait for the subshell, so we do
 * (docs/architecture.md, trap 1). Decodes every kernel message into the model and
 * matches replies to requests; the kernel pushes everything else.
 *
 * Liveness is a `comm_info_request` for our target every 15 s on the comm's
 * subshell, not a request on the comm: JupyterLab and jupyter_server take no
 * status of a `comm_info_request` as the kernel's, so it never shows the
 * kernel Idle while a cell runs, nor counts as activity for the idle culler
 * (docs/protocol.md, Lifecycle 5).
 *
 * Replies come as comm messages, so the futures of what we send on the comm
 * are disposed at once: nothing waits for their idle.
 */
import { Kernel, KernelMessage } from '@jupyterlab/services';

import { MonitorModel } from '../model/monitormodel';
import {
  ChipHistory,
  CloseReason,
  PING_INTERVAL_S,
  ProtocolError,
  ReplyMessage,
  RequestBody,
  StartingMessage,
  TARGET,
  decodeChipHistory,
  decodeClose,
  decodeMessage,
  encodeRequest
} from './messages';

/** What the panel hears from a connection besides the model's messages. */
export interface ConnectionListener {
  /** The kernel closed the comm (once). */
  closed(reason: CloseReason): void;
  /** The kernel has no backend: `error` says why; a topology follows once one connects. */
  noBackend(error: string): void;
  /** The kernel's backend is starting (how far, the seconds so far); a topology follows `ready`. */
  starting(progress: StartingMessage): void;
}

const REQUEST_TIMEOUT_MS = 15_000;

let nextRequest = 0;

export class MonitorConnection {
  private _comm: Kernel.IComm | null = null;
  private _pending = new Map<string, (reply: ReplyMessage) => void>();
  private _ping: ReturnType<typeof setInterval> | null = null;
  private _disposed = false;

  /**
   * @param kernel the notebook's own kernel connection (it handles comms).
   * @param model receives every decoded kernel message.
   * @param listener hears when the kernel closes the comm or has no backend.
   */
  constructor(
    readonly kernel: Kernel.IKernelConnection,
    private _model: MonitorModel,
    private _listener: ConnectionListener
  ) {}

  get isOpen(): boolean {
    return this._comm !== null && !this._disposed;
  }

  /** Open the comm and subscribe at `rate` Hz. Rejects if the kernel has no monitor. */
  async open(rate: number): Promise<void> {
    await this.kernel.info;
    const comm = this.kernel.createComm(TARGET);
    if (this._disposed) {
      comm.dispose();
      return;
    }
    this._comm = comm;
    comm.onMsg = msg => this._handle(msg);
    comm.onClose = msg => this._closed(msg);
    // Not in the services typings: the comm's subshell start (trap 1).
    const overSubshells = (this.kernel as { commsOverSubshells?: string }).commsOverSubshells;
    if (this.kernel.supportsSubshells && overSubshells !== 'disabled') {
      try {
        await (comm as unknown as { subshellStarted: Promise<void> }).subshellStarted;
      } catch (reason) {
        console.warn(
          'pathways: comm subshell did not start; requests will wait for running cells',
          reason
        );
      }
    }
    if (this._disposed) {
      return;
    }
    comm.open({ v: 1 }).dispose();
    this._ping = setInterval(() => this._heartbeat(comm), PING_INTERVAL_S * 1000);
    await this.setRate(rate);
  }

  /** Tell the kernel this connection is still there (docs/protocol.md, Lifecycle 5). */
  private _heartbeat(comm: Kernel.IComm): void {
    if (this._disposed || comm.isDisposed || this.kernel.isDisposed) {
      return;
    }
    const msg = KernelMessage.createMessage({
      msgType: 'comm_info_request',
      channel: 'shell',
      session: this.kernel.clientId,
      username: this.kernel.username,
      // On the comm's subshell, so a running cell does not hold it.
      subshellId: (comm as unknown as { subshellId?: string | null }).subshellId ?? null,
      content: { target_name: TARGET }
    });
    try {
      this.kernel.sendShellMessage(msg, true);
    } catch (reason) {
      console.warn('pathways: monitor heartbeat not sent', reason);
    }
  }

  async setRate(rate: number): Promise<void> {
    const reply = await this.request({ type: 'subscribe', rate });
    if (!reply.ok) {
      console.warn(`pathways: subscribe refused: ${reply.error}`);
    }
  }

  /** Send a request; resolves with its reply (ok or not), rejects on timeout or a closed comm. */
  request(body: RequestBody): Promise<ReplyMessage> {
    const comm = this._comm;
    if (!comm || this._disposed || comm.isDisposed) {
      return Promise.reject(new Error('The Pathways monitor is not connected to this kernel.'));
    }
    const id = `pw-${Date.now().toString(36)}-${++nextRequest}`;
    const data = encodeRequest(body, id);
    return new Promise<ReplyMessage>((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(id);
        reject(
          new Error(
            `The kernel did not answer "${body.type}" within ${REQUEST_TIMEOUT_MS / 1000} s.`
          )
        );
      }, REQUEST_TIMEOUT_MS);
      this._pending.set(id, reply => {
        clearTimeout(timer);
        resolve(reply);
      });
      comm.send(data).dispose();
    });
  }

  /**
   * The kernel's per-chip series of chip positions [start, stop) (at most
   * MAX_CHIP_HISTORY chips). Rejects with the kernel's one-line error.
   */
  async chipHistory(start: number, stop: number): Promise<ChipHistory> {
    const reply = await this.request({ type: 'chip_history', start, stop });
    if (!reply.ok) {
      throw new Error(reply.error ?? 'chip_history failed');
    }
    return decodeChipHistory(reply);
  }

  /** Close the comm (the panel follows another kernel, or goes away). */
  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._stop();
    const comm = this._comm;
    this._comm = null;
    if (comm && !comm.isDisposed && !this.kernel.isDisposed) {
      comm.onClose = () => undefined;
      try {
        comm.close().dispose();
      } catch {
        comm.dispose();
      }
    }
  }

  private _handle(msg: KernelMessage.ICommMsgMsg): void {
    if (this._disposed) {
      return;
    }
    let message;
    try {
      message = decodeMessage(msg.content.data, msg.buffers ?? []);
    } catch (error) {
      if (error instanceof ProtocolError) {
        console.warn(`pathways: dropped a malformed monitor message: ${error.message}`);
        return;
      }
      throw error;
    }
    if (message.type === 'no_backend') {
      this._listener.noBackend(message.error);
      return;
    }
    if (message.type === 'starting') {
      this._listener.starting(message);
      return;
    }
    if (message.type === 'reply') {
      const resolve =
        message.request_id === null ? undefined : this._pending.get(message.request_id);
      if (resolve) {
        this._pending.delete(message.request_id!);
        resolve(message);
      }
      return;
    }
    this._model.handle(message);
  }

  private _closed(msg: KernelMessage.ICommCloseMsg): void {
    this._stop();
    this._comm = null;
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._listener.closed(decodeClose(msg.content.data));
  }

  private _stop(): void {
    if (this._ping !== null) {
      clearInterval(this._ping);
      this._ping = null;
    }
    this._pending.clear();
  }
}
