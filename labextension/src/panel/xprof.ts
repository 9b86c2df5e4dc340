/**
 * "Open in XProf": the XProf UI in a main-area tab, opened at a capture's run.
 *
 * jupyter-server-proxy serves XProf at `/xprof/` under the Jupyter server's
 * base URL and auth, starting it on the first request (on a Unix socket in a
 * 0700 directory, so only the Jupyter server reaches it; the kernel opens no
 * port). The tab frames XProf's host page (`xprof/pathways-xprof`, from
 * pathways_kernel/profiling/xprof_host.html), which frames XProf's UI: XProf
 * reads and rewrites its parent's address, and that parent is the host page,
 * never the lab. Until the host page says the run's trace is on screen, the
 * tab shows what it waits for and for how long.
 *
 * A capture's inline summary carries its run in `data-pathways-xprof-run`; a
 * click on it opens the run here instead of following the link to a new
 * browser tab. Without a run, the command asks the followed kernel for its
 * newest capture (`latest_profile`) and, when it has none, says so and opens
 * nothing: never another notebook's capture.
 */
import { JupyterFrontEnd, LabShell } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, Notification } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { LatestProfile } from '../protocol/messages';

export const XPROF_COMMAND = 'pathways:open-xprof';

/** XProf's own pages; it computes its base URL from the "/data/plugin/profile" in their path. */
const XPROF_PAGE = 'xprof/data/plugin/profile/';
/** The page that frames XProf for the tab (xprof_server.HOST_PATH). */
const XPROF_HOST = 'xprof/pathways-xprof';
const RUN_ATTRIBUTE = 'data-pathways-xprof-run';
const INSTALL =
  "pip install 'pathways-kernel[profile]' (xprof and jupyter-server-proxy), then restart JupyterLab";
/** How long the tab waits for the trace before it says so (XProf took ~40 s on a loaded 2-core machine). */
export const XPROF_BOUND_S = 120;
/** Below this main-area width the trace viewer's tracks are cut: the file browser is folded away. */
const TRACE_WIDTH_PX = 1000;

/** The tab's page for `run` (its trace viewer), or XProf's start page. */
export function xprofUrl(baseUrl: string, run: string | null): string {
  const query = run ? `?${new URLSearchParams({ run, tag: 'trace_viewer' }).toString()}` : '';
  return `${baseUrl}${XPROF_HOST}${query}`;
}

/** The tab's content: XProf's frame, under a status line until XProf has drawn the run. */
export class XprofView extends Widget {
  constructor() {
    super();
    this.addClass('jp-PathwaysXprof');
    this._status.className = 'jp-PathwaysXprof-status';
    this._status.setAttribute('role', 'status');
    this._frame.className = 'jp-PathwaysXprof-frame';
    this._frame.title = 'XProf';
    // Scripts and same-origin: XProf calls its data API under the Jupyter server's auth.
    this._frame.setAttribute(
      'sandbox',
      'allow-scripts allow-same-origin allow-popups allow-downloads allow-forms'
    );
    this.node.append(this._status, this._frame);
    window.addEventListener('message', this._onMessage);
  }

  /** Say what the tab waits for, counting seconds until `show`, `fail` or the bound. */
  wait(run: string, what: string): void {
    this._run = run;
    this._started = Date.now();
    this._what = what;
    this.node.dataset.state = 'loading';
    this._frame.removeAttribute('src'); // an earlier run's page, until this one's is known
    this._tick();
    window.clearInterval(this._timer);
    this._timer = window.setInterval(() => this._tick(), 1000);
  }

  /** Load `url` into the frame; its host page reports when XProf has drawn. */
  load(url: string): void {
    this._what = 'Loading XProf';
    this._tick();
    this._frame.src = url;
  }

  /** Replace the progress by a one-line message. */
  fail(message: string): void {
    window.clearInterval(this._timer);
    this.node.dataset.state = 'failed';
    this._status.textContent = message;
  }

  dispose(): void {
    window.clearInterval(this._timer);
    window.removeEventListener('message', this._onMessage);
    super.dispose();
  }

  private _tick(): void {
    const seconds = Math.round((Date.now() - this._started) / 1000);
    if (seconds > XPROF_BOUND_S) {
      window.clearInterval(this._timer);
      if (!this._frame.src) {
        this.fail(
          `${this._what} took over ${XPROF_BOUND_S} s for run ${this._run}: see the Jupyter server's log, then close this tab and open it again.`
        );
        return;
      }
      // Shown as it is, under one line: XProf may have drawn in a way this tab does not recognise.
      this.node.dataset.state = 'late';
      this._status.textContent = `XProf has not reported run ${this._run} drawn after ${XPROF_BOUND_S} s: shown as it is; if it stays blank, close this tab and open it again.`;
      return;
    }
    this._status.textContent = `${this._what} (run ${this._run})… ${seconds} s`;
  }

  private _onMessage = (event: MessageEvent): void => {
    const data: unknown = event.data;
    if (
      event.source !== this._frame.contentWindow ||
      typeof data !== 'object' ||
      data === null ||
      !('pathwaysXprof' in data)
    ) {
      return;
    }
    const { pathwaysXprof: state, message } = data as { pathwaysXprof: string; message?: string };
    if (state === 'shown') {
      window.clearInterval(this._timer);
      this.node.dataset.state = 'shown';
      this._status.textContent = '';
    } else if (state === 'failed') {
      this.fail(`XProf could not show run ${this._run}: ${message ?? 'no reason given'}`);
    }
  };

  private _status = document.createElement('div');
  private _frame = document.createElement('iframe');
  private _run = '';
  private _what = '';
  private _started = 0;
  private _timer = 0;
}

class XprofOpener {
  private _tab: MainAreaWidget<XprofView> | null = null;

  constructor(
    private _app: JupyterFrontEnd,
    private _beside: () => string | null
  ) {}

  async open(run: string): Promise<void> {
    const settings = ServerConnection.makeSettings();
    const view = this._show(run);
    view.wait(run, 'Starting XProf');
    // Also what starts XProf: the proxy launches it on the first request.
    try {
      const response = await ServerConnection.makeRequest(
        `${settings.baseUrl}${XPROF_PAGE}runs`,
        {},
        settings
      );
      if (!response.ok) {
        // 404: no /xprof/ route (no jupyter-server-proxy); otherwise the proxy could not start or reach XProf.
        throw new Error(
          response.status === 404
            ? `XProf is not available on this Jupyter server: ${INSTALL}.`
            : `XProf did not start or answer (HTTP ${response.status}). If it is not installed: ${INSTALL}.`
        );
      }
    } catch (reason) {
      view.fail(reason instanceof Error ? reason.message : String(reason));
      return;
    }
    if (!view.isDisposed) {
      view.load(xprofUrl(settings.baseUrl, run));
    }
  }

  /** The XProf tab, opened as a document opens (a tab beside the notebook) and activated. */
  private _show(run: string): XprofView {
    const ref = this._beside();
    this._makeRoom(ref);
    if (this._tab === null || this._tab.isDisposed) {
      this._tab = new MainAreaWidget({ content: new XprofView() });
      this._tab.id = 'pathways-xprof';
      this._tab.title.label = 'XProf';
      this._tab.title.closable = true;
      this._app.shell.add(this._tab, 'main', ref ? { mode: 'tab-after', ref } : {});
    }
    this._tab.title.caption = `XProf: ${run}`;
    this._app.shell.activateById(this._tab.id);
    return this._tab.content;
  }

  /**
   * Fold the sidebars away (left first) while the tab's area is narrower than the trace's
   * tracks need; each reopens from its icon. The area is the notebook's, which the tab joins.
   */
  private _makeRoom(ref: string | null): void {
    const shell = this._app.shell;
    if (!(shell instanceof LabShell)) {
      return;
    }
    const area =
      (ref ? document.getElementById(ref) : null) ?? document.getElementById('jp-main-dock-panel');
    let width = area?.getBoundingClientRect().width ?? TRACE_WIDTH_PX;
    if (width < TRACE_WIDTH_PX && !shell.leftCollapsed) {
      width += document.getElementById('jp-left-stack')?.getBoundingClientRect().width ?? 0;
      shell.collapseLeft();
    }
    if (width < TRACE_WIDTH_PX && !shell.rightCollapsed) {
      shell.collapseRight();
    }
  }
}

/** Open the followed kernel's newest capture, or say why there is none. */
async function openLatest(
  opener: XprofOpener,
  latestProfile: () => Promise<LatestProfile>
): Promise<void> {
  let latest: LatestProfile;
  try {
    latest = await latestProfile();
  } catch (reason) {
    Notification.warning(
      `Latest profile in XProf: ${reason instanceof Error ? reason.message : String(reason)}`,
      { autoClose: 8000 }
    );
    return;
  }
  if (latest.run === null) {
    Notification.info(`Latest profile in XProf: ${latest.message}`, { autoClose: 8000 });
    return;
  }
  await opener.open(latest.run);
}
/** Register the command, its palette entry, the panel's button and the inline buttons' clicks. */
export function activateXprof(
  app: JupyterFrontEnd,
  palette: ICommandPalette | null,
  panelNode: HTMLElement,
  latestProfile: () => Promise<LatestProfile>,
  beside: () => string | null
): void {
  const opener = new XprofOpener(app, beside);
  app.commands.addCommand(XPROF_COMMAND, {
    label: 'Pathways: Open in XProf',
    caption:
      'Open a profile capture (default: the followed kernel’s newest) in XProf, in a JupyterLab tab',
    execute: args =>
      typeof args.run === 'string' && args.run
        ? opener.open(args.run)
        : openLatest(opener, latestProfile)
  });
  palette?.addItem({ command: XPROF_COMMAND, category: 'Pathways' });

  const button = document.createElement('button');
  button.className = 'jp-Button jp-mod-styled jp-mod-small jp-PathwaysPanel-xprof';
  button.textContent = 'Latest profile in XProf';
  button.title = 'Open the followed kernel’s newest %%pathways profile capture in XProf';
  button.addEventListener('click', () => void app.commands.execute(XPROF_COMMAND));
  panelNode.querySelector('.jp-PathwaysPanel-actions')?.prepend(button);

  // Capture phase: before JupyterLab's own handling of links in outputs.
  document.addEventListener(
    'click',
    event => {
      const link =
        event.target instanceof Element ? event.target.closest(`[${RUN_ATTRIBUTE}]`) : null;
      if (link === null) {
        return;
      }
      event.preventDefault();
      event.stopPropagation();
      void app.commands.execute(XPROF_COMMAND, { run: link.getAttribute(RUN_ATTRIBUTE) ?? '' });
    },
    true
  );
}
