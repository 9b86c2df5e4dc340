/**
 * The metric charts' run picker: a checkbox per run of the session (a colour
 * swatch as its line's, "earlier kernel" on runs read back after a restart),
 * and the way back to the default (the newest runs). Native checkboxes, so
 * Tab and Space pick runs as anywhere in JupyterLab.
 */
import { SERIES_VARS } from './plotchart';
import { RunInfo } from '../model/metricseries';
import { DEFAULT_RUNS, RunSelection } from '../model/runselection';

export class RunPicker {
  readonly node: HTMLFieldSetElement;
  private _legend: HTMLLegendElement;
  private _list: HTMLUListElement;
  private _reset: HTMLButtonElement;
  private _runsKey = '';

  /** `changed`: a pick was made (the charts redraw). */
  constructor(
    private _selection: RunSelection,
    private _changed: () => void
  ) {
    this.node = document.createElement('fieldset');
    this.node.className = 'jp-PathwaysDashboard-runs';
    this._legend = document.createElement('legend');
    this._reset = document.createElement('button');
    this._reset.type = 'button';
    this._reset.className = 'jp-PathwaysDashboard-runsReset';
    this._reset.textContent = `Newest ${DEFAULT_RUNS}`;
    this._reset.title = `Show the newest ${DEFAULT_RUNS} runs and the run in progress again`;
    this._reset.addEventListener('click', () => {
      this._selection.reset();
      this._changed();
    });
    this._list = document.createElement('ul');
    this._list.className = 'jp-PathwaysDashboard-runList';
    this._list.addEventListener('change', event => {
      const input = event.target as HTMLInputElement;
      if (input.dataset.run !== undefined) {
        this._selection.pick(input.dataset.run, input.checked);
        this._changed();
      }
    });
    this.node.append(this._legend, this._list);
  }

  /** List `runs` (in the order they started), those in `shown` checked. */
  render(runs: readonly RunInfo[], shown: ReadonlySet<string>): void {
    const key = runs.map(r => `${r.run}\u0001${r.title}\u0001${r.earlier}`).join('\u0000');
    if (key !== this._runsKey) {
      this._runsKey = key;
      this._rebuild(runs);
    }
    // A shown run's swatch is its line's colour (by its place among the runs shown); a hidden one's grey.
    let place = 0;
    for (const input of Array.from(
      this._list.querySelectorAll<HTMLInputElement>('input[data-run]')
    )) {
      input.checked = shown.has(input.dataset.run!);
      const swatch = input.nextElementSibling as HTMLElement;
      swatch.style.background = input.checked
        ? `var(${SERIES_VARS[place++ % SERIES_VARS.length]})`
        : 'var(--jp-border-color1)';
    }
    this._legend.textContent = `Runs (${shown.size} of ${runs.length} shown) `;
    this._reset.hidden = !this._selection.picked;
    this._legend.append(this._reset);
  }

  private _rebuild(runs: readonly RunInfo[]): void {
    // A new run arrived: keep the keyboard focus on the checkbox it was on.
    const focused = (document.activeElement as HTMLElement | null)?.dataset?.run;
    const items = runs.map(r => {
      const item = document.createElement('li');
      const label = document.createElement('label');
      const input = document.createElement('input');
      input.type = 'checkbox';
      input.dataset.run = r.run;
      const swatch = document.createElement('span');
      swatch.className = 'jp-PathwaysDashboard-runSwatch';
      const title = document.createElement('span');
      title.textContent = r.title;
      label.append(input, swatch, title);
      if (r.earlier) {
        const tag = document.createElement('span');
        tag.className = 'jp-PathwaysDashboard-runTag';
        tag.textContent = 'earlier kernel';
        label.append(tag);
        item.dataset.earlier = 'true';
      }
      label.title = `${r.title}${r.earlier ? ', logged before the kernel restarted' : ''}, started ${new Date(r.started * 1000).toLocaleTimeString()}`;
      item.append(label);
      return item;
    });
    this._list.replaceChildren(...items);
    if (focused !== undefined) {
      Array.from(this._list.querySelectorAll<HTMLInputElement>('input[data-run]'))
        .find(input => input.dataset.run === focused)
        ?.focus();
    }
  }
}
