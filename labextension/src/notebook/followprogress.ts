/**
 * Run All keeps a live elastic cell's progress in view: JupyterLab moves the
 * active cell to the last one queued and scrolls there, past the cell still
 * running, so its progress bar (cellprogress.py's `pathways-cell-progress`
 * output) is off-screen while it matters. When such a cell shows its progress
 * and the active cell is below it, the notebook scrolls back to it, once per
 * run of the cell; the user may scroll away after that. Works on the
 * notebook's model: a windowed notebook leaves off-screen outputs undrawn.
 */
import type { ICodeCellModel } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';

const PROGRESS_CLASS = 'pathways-cell-progress';

export function followProgress(panel: NotebookPanel): void {
  const notebook = panel.content;
  const scrolled = new Set<string>();
  const watched = new WeakSet<ICodeCellModel>();

  const showsProgress = (cell: ICodeCellModel): boolean => {
    for (let i = 0; i < cell.outputs.length; i++) {
      const html = cell.outputs.get(i).data['text/html'];
      if (typeof html === 'string' && html.includes(PROGRESS_CLASS)) {
        return true;
      }
    }
    return false;
  };

  const onOutputs = (cell: ICodeCellModel) => {
    if (cell.executionState !== 'running') {
      scrolled.delete(cell.id);
      return;
    }
    if (scrolled.has(cell.id) || !showsProgress(cell)) {
      return;
    }
    const index = notebook.widgets.findIndex(w => w.model.id === cell.id);
    if (index < 0 || notebook.activeCellIndex <= index) {
      return; // the user is at this cell or above it: nothing moved past it
    }
    scrolled.add(cell.id);
    void notebook.scrollToItem(index, 'start');
  };

  const watchAll = () => {
    const cells = notebook.model?.cells;
    if (!cells) {
      return;
    }
    for (let i = 0; i < cells.length; i++) {
      const cell = cells.get(i);
      if (cell.type === 'code' && !watched.has(cell as ICodeCellModel)) {
        const code = cell as ICodeCellModel;
        watched.add(code);
        code.outputs.changed.connect(() => onOutputs(code));
      }
    }
  };

  void panel.context.ready.then(() => {
    watchAll();
    notebook.model?.cells.changed.connect(watchAll);
  });
}
