/**
 * The Pathways panel: a Lumino widget that follows one notebook at a time.
 */
import { NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { isPathwaysKernel } from './kernels';


export class PathwaysPanel extends Widget {
  private _notebook: NotebookPanel | null = null;

  constructor() {
    super();
    this.id = 'pathways-monitor';
    this.addClass('jp-PathwaysPanel');
    this.title.caption = 'Pathways';
    this.title.label = 'Pathways';
    this._render();
  }

  /** Follow the given notebook (or none) and its kernel changes. */
  follow(notebook: NotebookPanel | null): void {
    if (notebook === this._notebook) {
      return;
    }
    this._notebook?.sessionContext.kernelChanged.disconnect(this._render, this);
    this._notebook = notebook;
    notebook?.sessionContext.kernelChanged.connect(this._render, this);
    void notebook?.sessionContext.ready.then(() => this._render());
    this._render();
  }

  private _render(): void {
    const session = this._notebook?.sessionContext;
    const spec = session?.session?.kernel?.name;
    this.node.textContent = '';
    const header = document.createElement('div');
    header.className = 'jp-PathwaysPanel-header';
    header.textContent = 'Pathways';
    const body = document.createElement('div');
    body.className = 'jp-PathwaysPanel-body';
    if (!this._notebook) {
      body.textContent = 'Open a notebook on a Pathways kernel to see its slices.';
    } else if (!isPathwaysKernel(spec)) {
      body.textContent = `This notebook's kernel (${spec ?? 'none'}) is not a Pathways kernel. Switch to "Pathways (JAX)" to monitor slices.`;
    } else {
      body.textContent = `Connected to kernel ${spec}.`;
    }
    this.node.append(header, body);
  }
}
