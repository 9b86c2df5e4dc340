/**
 * "Open in XProf": the XProf UI in a main-area tab, opened at a capture's run.
 *
 * jupyter-server-proxy serves XProf at `/xprof/` under the Jupyter server's
 * base URL and auth, starting it on the first request (on 127.0.0.1; the
 * kernel opens no port). A capture's inline summary carries its run in
 * `data-pathways-xprof-run`; a click on it opens the run here instead of
 * following the link to a new browser tab. Without a run, the command opens
 * the newest capture.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, IFrame, MainAreaWidget, showErrorMessage } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';

export const XPROF_COMMAND = 'pathways:open-xprof';

/** XProf's page; it computes its own base URL from the "/data/plugin/profile" in its path. */
const XPROF_PAGE = 'xprof/data/plugin/profile/';
const RUN_ATTRIBUTE = 'data-pathways-xprof-run';
const INSTALL =
  "pip install 'pathways-kernel[profile]' (xprof and jupyter-server-proxy), then restart JupyterLab";

/** The XProf page for `run` (its trace viewer), or XProf's start page. */
export function xprofUrl(baseUrl: string, run: string | null): string {
  const query = run ? `?${new URLSearchParams({ run, tag: 'trace_viewer' }).toString()}` : '';
  return `${baseUrl}${XPROF_PAGE}${query}`;
}

/** The newest of XProf's runs: a capture's run ends in "YYYYmmdd-HHMMSS-name". */
export function latestRun(runs: readonly string[]): string | null {
  const stamp = (run: string) => run.slice(run.lastIndexOf('/') + 1);
  let newest: string | null = null;
  for (const run of runs) {
    if (newest === null || stamp(run) > stamp(newest)) {
      newest = run;
    }
  }
  return newest;
}

class XprofOpener {
  private _tab: MainAreaWidget<IFrame> | null = null;

  constructor(private _app: JupyterFrontEnd) {}

  async open(run: string | null): Promise<void> {
    const settings = ServerConnection.makeSettings();
    // Also what starts XProf: the proxy launches it on the first request.
    let runs: string[];
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
      runs = (await response.json()) as string[];
    } catch (reason) {
      await showErrorMessage(
        'Open in XProf',
        reason instanceof Error ? reason.message : String(reason)
      );
      return;
    }
    const chosen = run ?? latestRun(runs);
    if (this._tab === null || this._tab.isDisposed) {
      const frame = new IFrame({
        sandbox: [
          'allow-scripts',
          'allow-same-origin',
          'allow-popups',
          'allow-downloads',
          'allow-forms'
        ]
      });
      this._tab = new MainAreaWidget({ content: frame });
      this._tab.id = 'pathways-xprof';
      this._tab.title.label = 'XProf';
      this._tab.title.closable = true;
      this._app.shell.add(this._tab, 'main');
    }
    this._tab.content.url = xprofUrl(settings.baseUrl, chosen);
    this._tab.title.caption = chosen ? `XProf: ${chosen}` : 'XProf';
    this._app.shell.activateById(this._tab.id);
  }
}

/** Register the command, its palette entry, the panel's button and the inline buttons' clicks. */
export function activateXprof(
  app: JupyterFrontEnd,
  palette: ICommandPalette | null,
  panelNode: HTMLElement
): void {
  const opener = new XprofOpener(app);
  app.commands.addCommand(XPROF_COMMAND, {
    label: 'Pathways: Open in XProf',
    caption: 'Open a profile capture (default: the newest) in XProf, in a JupyterLab tab',
    execute: args => opener.open(typeof args.run === 'string' ? args.run : null)
  });
  palette?.addItem({ command: XPROF_COMMAND, category: 'Pathways' });

  const button = document.createElement('button');
  button.className = 'jp-Button jp-mod-styled jp-mod-small jp-PathwaysPanel-xprof';
  button.textContent = 'Latest profile in XProf';
  button.title = 'Open the newest %%pathways profile capture in XProf';
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
