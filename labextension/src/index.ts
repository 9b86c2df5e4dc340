/**
 * pathways-kernel JupyterLab extension: the "Pathways" panel in the right
 * sidebar, following the active notebook's kernel.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';

import { PathwaysPanel } from './panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'pathways-kernel:plugin',
  description: 'Live monitor for multi-slice JAX sessions (Pathways).',
  autoStart: true,
  requires: [ILabShell, INotebookTracker],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell,
    notebooks: INotebookTracker
  ) => {
    const panel = new PathwaysPanel();
    labShell.add(panel, 'right', { rank: 600 });
    const follow = () => panel.follow(notebooks.currentWidget);
    notebooks.currentChanged.connect(follow);
    follow();
  }
};

export default plugin;
