/**
 * pathways-kernel JupyterLab extension: the "Pathways" panel in the right
 * sidebar, following the active notebook's kernel, its status-bar item,
 * the "Pathways: Open Monitor" command and the update-rate setting.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { PathwaysPanel } from './panel';
import { PathwaysStatus } from './statusitem';
import { activateXprof } from './xprof';

const PLUGIN_ID = 'pathways-kernel:plugin';
const OPEN_COMMAND = 'pathways:open-monitor';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Live monitor for multi-slice JAX sessions (Pathways).',
  autoStart: true,
  requires: [ILabShell, INotebookTracker],
  optional: [ICommandPalette, ISettingRegistry, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    settings: ISettingRegistry | null,
    statusBar: IStatusBar | null
  ) => {
    const panel = new PathwaysPanel();
    labShell.add(panel, 'right', { rank: 600 });
    const follow = () => panel.follow(notebooks.currentWidget);
    notebooks.currentChanged.connect(follow);
    follow();

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Pathways: Open Monitor',
      caption: 'Show slices, utilization and elastic events of the active notebook’s Pathways kernel',
      execute: () => labShell.activateById(panel.id)
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'Pathways' });
    activateXprof(app, palette, panel.node);

    if (statusBar) {
      const item = new PathwaysStatus(panel, () => void app.commands.execute(OPEN_COMMAND));
      statusBar.registerStatusItem(`${PLUGIN_ID}:status`, {
        item,
        align: 'left',
        rank: 4,
        isActive: () => panel.model.topology !== null,
        activeStateChanged: panel.stateChanged
      });
    }

    if (settings) {
      void settings.load(PLUGIN_ID).then(
        loaded => {
          const apply = () => panel.setRate(loaded.get('updateRate').composite as number);
          loaded.changed.connect(apply);
          apply();
        },
        reason => console.warn('pathways: settings not loaded', reason)
      );
    }
  }
};

export default plugin;
