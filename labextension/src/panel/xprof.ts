/**
 * "Open in XProf": the XProf UI in a main-area tab, opened at a capture's run.
 *
 * jupyter-server-proxy serves XProf at `/xprof/` under the Jupyter server's
 * base URL and auth, starting it on the first request (on a Unix socket in a
 * 0700 directory, so only the Jupyter server reaches it; the kernel opens no
 * port). A capture's inline summary carries its run in
 * `data-pathways-xprof-run`; a click on it opens the run here instead of
 * following the link to a new browser tab. Without a run, the command asks
 * the followed kernel for its newest capture (`latest_profile`) and, when it
 * has none, says so and opens nothing: never another notebook's capture.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  ICommandPalette,
  IFrame,
  MainAreaWidget,
  Notification,
  showErrorMessage
} from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';

import { LatestProfile } from '../protocol/messages';

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

class XprofOpener {
  private _tab: MainAreaWidget<IFrame> | null = null;

  constructor(
    private _app: JupyterFrontEnd,
    private _beside: () => string | null
  ) {}

  async open(run: string): Promise<void> {
    const settings = ServerConnection.makeSettings();
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
      await showErrorMessage(
        'Open in XProf',
        reason instanceof Error ? reason.message : String(reason)
      );
      return;
    }
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
      // Split right of the notebook, so it gets half the main area rather than the narrowest slot (beside a docked dashboard).
      const ref = this._beside();
      this._app.shell.add(this._tab, 'main', ref ? { mode: 'split-right', ref } : {});
    }
    this._tab.content.url = xprofUrl(settings.baseUrl, run);
    this._tab.title.caption = `XProf: ${run}`;
    this._app.shell.activateById(this._tab.id);
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
