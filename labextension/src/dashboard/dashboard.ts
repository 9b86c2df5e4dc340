/**
 * The Pathways dashboard: a main-area view of the active notebook's (or console's) kernel
 * to keep open while training runs. Time-series charts (uPlot) of
 * utilization per slice (per chip of one slice on demand), memory used vs
 * capacity, step time and throughput of running loops, with every event as
 * a marker on the time axis and a kind filter; training metrics against step
 * or wall time; the newest finished run's goodput over time. Any chart opens
 * in its own tab (`openChart`), drawn from the same data.
 *
 * It opens its own `pathways.monitor` comm on the notebook's kernel through its
 * own `MonitorSession` (the panel's lifecycle, limited to Pathways kernels) and
 * redraws at most once per animation frame.
 */
import { Widget } from '@lumino/widgets';

import { BYTE_INCRS, TimeChart, TimeWindow } from './charts';
import { CHART_HEIGHT } from './plotchart';
import { ChartTab } from './charttab';
import { CHIP_WINDOW_S, DashboardModel, SLICE_WINDOW_S, isEmulated } from '../model/dashboardmodel';
import { formatBytes } from '../common/format';
import { isPathwaysKernel } from '../common/kernels';
import { UTILIZATION_MEANING } from '../common/help';
import { IntervalChart, IntervalData } from './goodputchart';
import { goodputColumns, stepTimeColumns } from '../model/goodputseries';
import { Change, MonitorModel } from '../model/monitormodel';
import { StepChart } from './metricchart';
import { PhaseLaneChart } from './phaselane';
import { RunPicker } from './runpicker';
import { RunSelection } from '../model/runselection';
import { DEFAULT_SMOOTHING, MetricSeries, StepColumns, XAxis } from '../model/metricseries';
import { GoodputIntervalsMessage, MAX_CHIP_HISTORY, MonitorEvent } from '../protocol/messages';
import { KernelView, MonitorSession, SessionState, stateMessage } from '../protocol/session';

export const DASHBOARD_ID = 'pathways-dashboard';
/** Longest a new subscription's frames wait for its history (ms). */
const HISTORY_WAIT_MS = 1000;

/** The charts every dashboard has (a metric chart's id is `metric:<name>`), each can open in its own tab. */
export const DASHBOARD_CHARTS = [
  { id: 'utilization', title: 'Utilization per slice' },
  { id: 'chips', title: 'Utilization per chip' },
  { id: 'memory', title: 'Memory used vs capacity' },
  { id: 'step-time', title: 'Step time' },
  { id: 'throughput', title: 'Throughput' },
  { id: 'goodput', title: 'Goodput over time' },
  { id: 'goodput-step-time', title: 'Mean step time per interval' }
];

/** The memory chart in bytes: ticks in powers of two, 0 to 1 GiB before any memory is reported. */
const MEMORY_BYTES = {
  axis: 'memory',
  format: formatBytes,
  tick: (v: number) => formatBytes(v).replace('.0 ', ' '),
  incrs: BYTE_INCRS,
  emptyTop: 2 ** 30
};

export class PathwaysDashboard extends Widget {
  readonly model = new MonitorModel();
  readonly session = new MonitorSession(this.model, {
    accepts: kernel => isPathwaysKernel(kernel.name)
  });
  readonly data = new DashboardModel();
  /** Training metrics (pw.log, an elastic run's loss) per name and run, against step. */
  readonly metrics = new MetricSeries();
  /** The runs the metric charts overlay (the user's picks, else the newest). */
  readonly runs = new RunSelection();
  private _runPicker: RunPicker;
  private _smoothing = DEFAULT_SMOOTHING;
  private _xAxis: XAxis = 'step';
  private _metricCharts = new Map<string, StepChart>();
  /** Columns per metric name, rebuilt only when points arrive or the smoothing changes. */
  private _metricColumns = new Map<string, { key: string; columns: StepColumns }>();
  private _metricSection: HTMLElement;
  private _metricGrid: HTMLDivElement;
  private _smoothingInput: HTMLInputElement;
  private _goodputSection: HTMLElement;
  private _goodputTitle: HTMLElement;
  private _goodput: IntervalChart;
  private _intervalStepTime: IntervalChart;
  /** The goodput message the interval charts' data were made from. */
  private _goodputFrom: GoodputIntervalsMessage | null = null;
  private _goodputData: [IntervalData, IntervalData] | null = null;
  /** Charts open in their own tabs, by chart id. */
  private _tabs = new Map<string, ChartTab>();
  /** Puts a chart's tab in the main area (the plugin's; null: charts stay in the dashboard). */
  dock: ((tab: ChartTab) => void) | null = null;
  /** Called with a metric chart's id and title when it is first drawn (the plugin offers it in the palette). */
  chartAdded: ((id: string, title: string) => void) | null = null;
  private _frame = 0;
  /**
   * A new subscription's history is on its way (it follows the topology): frames wait
   * for it, so a first frame drawn without it does not hold up its arrival (up to HISTORY_WAIT_MS).
   */
  private _historyDue: ReturnType<typeof setTimeout> | null = null;
  private _window = new TimeWindow(() => this._schedule());

  private _header: HTMLDivElement;
  private _status: HTMLDivElement;
  private _body: HTMLDivElement;
  private _filter: HTMLDetailsElement;
  private _filterSummary: HTMLElement;
  private _filterList: HTMLFieldSetElement;
  private _memoryPercent = false;
  private _filterKinds = '';
  private _chipSelect: HTMLSelectElement;
  private _chipOptions = '';
  private _grid: HTMLDivElement;
  private _utilization: TimeChart;
  private _chips: TimeChart;
  private _memory: TimeChart;
  private _stepTime: TimeChart;
  private _throughput: TimeChart;
  /** The phases loops mark (pw.phase), a lane per role on the time axis. */
  private _phases: PhaseLaneChart;

  constructor() {
    super();
    this.id = DASHBOARD_ID;
    this.addClass('jp-PathwaysDashboard');
    this.title.label = 'Pathways Dashboard';
    this.title.caption =
      'Utilization, memory, steps and events of the active notebook’s Pathways kernel';

    this._header = div('jp-PathwaysDashboard-header');
    this._status = div('jp-PathwaysDashboard-message');
    this._status.setAttribute('role', 'status');

    // One row: a menu whose summary names how many kinds are shown; routine kinds start hidden.
    this._filter = document.createElement('details');
    this._filter.className = 'jp-PathwaysDashboard-filter';
    this._filterSummary = document.createElement('summary');
    this._filterList = document.createElement('fieldset');
    this._filterList.className = 'jp-PathwaysDashboard-kinds';
    this._filter.append(this._filterSummary, this._filterList);
    this._filter.addEventListener('keydown', event => {
      if (event.key === 'Escape' && this._filter.open) {
        this._filter.open = false;
        this._filterSummary.focus();
      }
    });
    this._filter.addEventListener('change', event => {
      const box = event.target as HTMLInputElement;
      if (box.dataset.kind) {
        if (box.checked) {
          this.data.hiddenKinds.delete(box.dataset.kind);
        } else {
          this.data.hiddenKinds.add(box.dataset.kind);
        }
        this._schedule();
      }
    });
    const chipLabel = document.createElement('label');
    chipLabel.className = 'jp-PathwaysDashboard-chipPicker';
    chipLabel.textContent = 'Per-chip utilization of ';
    this._chipSelect = document.createElement('select');
    this._chipSelect.className = 'jp-mod-styled';
    this._chipSelect.addEventListener('change', () => {
      const value = this._chipSelect.value;
      this.data.setChipSlice(value === '' ? null : Number(value));
      void this._loadChipHistory();
      this._schedule();
    });
    chipLabel.append(this._chipSelect);
    const hint = div('jp-PathwaysDashboard-hint');
    hint.textContent =
      'Drag across a chart to zoom, double-click to go back to live; focus a chart and use the arrow keys to read it.';
    const controls = div('jp-PathwaysDashboard-controls');
    controls.append(this._filter, chipLabel, hint);

    const percent = (v: number) => `${Math.round(v)}%`;
    const utilization = UTILIZATION_MEANING;
    this._utilization = new TimeChart(
      {
        title: 'Utilization per slice',
        description: `${utilization}; percent, last 15 minutes`,
        axis: 'utilization (%)',
        format: percent,
        range: [0, 100]
      },
      this._window
    );
    this._chips = new TimeChart(
      {
        title: 'Utilization per chip',
        description: `${utilization}, per chip of the chosen slice; percent, last 5 minutes`,
        axis: 'utilization (%)',
        format: percent,
        range: [0, 100]
      },
      this._window
    );
    // Shown once a slice is chosen; hidden from the start, not only from the first frame drawn.
    this._chips.node.hidden = true;
    this._memory = new TimeChart(
      {
        title: 'Memory used vs capacity',
        description: 'bytes in use per slice and the slice capacity, last 15 minutes',
        ...MEMORY_BYTES,
        lastDashed: true,
        rangeOmitsLast: true
      },
      this._window
    );
    const percentLabel = document.createElement('label');
    percentLabel.className = 'jp-PathwaysDashboard-memoryScale';
    const percentBox = document.createElement('input');
    percentBox.type = 'checkbox';
    percentBox.addEventListener('change', () => {
      this._memoryPercent = percentBox.checked;
      this._memory.setOptions(
        this._memoryPercent
          ? { format: percent, range: [0, 100], axis: 'memory (% of capacity)', lastDashed: false }
          : { ...MEMORY_BYTES, range: undefined, lastDashed: true }
      );
      this._schedule();
    });
    percentLabel.append(percentBox, '% of capacity');
    this._memory.node.querySelector('figcaption')?.append(percentLabel);
    this._stepTime = new TimeChart(
      {
        title: 'Step time',
        description: 'wall milliseconds per step of each running loop, once a second',
        axis: 'step time (ms)',
        format: v => `${v.toPrecision(3)} ms`
      },
      this._window
    );
    this._throughput = new TimeChart(
      {
        title: 'Throughput',
        description: 'steps per second of each running loop, once a second',
        axis: 'steps/s',
        format: v => `${v.toPrecision(3)}/s`
      },
      this._window
    );
    this._metricSection = document.createElement('section');
    this._metricSection.className = 'jp-PathwaysDashboard-metrics';
    this._metricSection.setAttribute('aria-label', 'Training metrics');
    this._metricSection.hidden = true;
    const metricBar = div('jp-PathwaysDashboard-metricBar');
    const metricTitle = document.createElement('h3');
    metricTitle.textContent = 'Training metrics (per step, a line per run picked)';
    const smoothing = document.createElement('label');
    smoothing.className = 'jp-PathwaysDashboard-smoothing';
    smoothing.textContent = 'Smoothing ';
    this._smoothingInput = document.createElement('input');
    this._smoothingInput.type = 'range';
    this._smoothingInput.min = '0';
    this._smoothingInput.max = '0.99';
    this._smoothingInput.step = '0.01';
    this._smoothingInput.value = String(this._smoothing);
    this._smoothingInput.title = 'Exponential moving average weight, as TensorBoard’s (0: raw)';
    const smoothingValue = document.createElement('output');
    smoothingValue.textContent = this._smoothing.toFixed(2);
    this._smoothingInput.addEventListener('input', () => {
      this._smoothing = Number(this._smoothingInput.value);
      smoothingValue.textContent = this._smoothing.toFixed(2);
      this._schedule();
    });
    smoothing.append(this._smoothingInput, smoothingValue);
    const xLabel = document.createElement('label');
    xLabel.className = 'jp-PathwaysDashboard-xAxis';
    xLabel.textContent = 'X axis ';
    const xSelect = document.createElement('select');
    xSelect.className = 'jp-mod-styled';
    xSelect.append(new Option('step', 'step'), new Option('wall time since run start', 'wall'));
    xSelect.addEventListener('change', () => {
      this._xAxis = xSelect.value === 'wall' ? 'wall' : 'step';
      this._schedule();
    });
    xLabel.append(xSelect);
    metricBar.append(metricTitle, smoothing, xLabel);
    this._metricGrid = div('jp-PathwaysDashboard-grid');
    this._runPicker = new RunPicker(this.runs, () => this._schedule());
    this._metricSection.append(metricBar, this._runPicker.node, this._metricGrid);

    this._goodputSection = document.createElement('section');
    this._goodputSection.className = 'jp-PathwaysDashboard-goodput';
    this._goodputSection.setAttribute('aria-label', 'Goodput over time');
    this._goodputSection.hidden = true;
    this._goodputTitle = document.createElement('h3');
    this._goodput = new IntervalChart(
      'Goodput over time',
      'percent of each interval of the newest finished run spent productive and in each badput category, stacked'
    );
    this._intervalStepTime = new IntervalChart(
      'Mean step time per interval',
      'mean time of the steps started in each interval of the newest finished run, with one standard deviation either side; milliseconds'
    );
    const goodputGrid = div('jp-PathwaysDashboard-grid');
    goodputGrid.append(this._goodput.node, this._intervalStepTime.node);
    this._goodputSection.append(this._goodputTitle, goodputGrid);

    this._phases = new PhaseLaneChart(this._window);
    this._phases.node.hidden = true;
    this._grid = div('jp-PathwaysDashboard-grid');
    this._grid.append(
      this._utilization.node,
      this._phases.node,
      this._chips.node,
      this._memory.node,
      this._stepTime.node,
      this._throughput.node
    );
    this._body = div('jp-PathwaysDashboard-body');
    this._body.append(controls, this._metricSection, this._goodputSection, this._grid);
    this.node.append(this._header, this._status, this._body);
    const charts: Record<string, { node: HTMLElement }> = {
      utilization: this._utilization,
      chips: this._chips,
      memory: this._memory,
      'step-time': this._stepTime,
      throughput: this._throughput,
      goodput: this._goodput,
      'goodput-step-time': this._intervalStepTime
    };
    for (const { id, title } of DASHBOARD_CHARTS) {
      this._tabbable(charts[id].node, id, title);
    }

    this.model.subscribe(change => this._changed(change));
    this.session.stateChanged.connect((_, state) => this._sessionChanged(state));
    // The kernel went (another is followed, it shut down or died): its chart tabs close.
    this.session.ended.connect(() => this.closeCharts());
    this._renderChrome();
  }

  /** Follow the given notebook or console (or none) and its kernel changes. */
  follow(notebook: KernelView | null): void {
    this.session.follow(notebook);
    this._renderChrome();
  }

  /** Metrics rate asked of the kernel (Hz), the panel's setting. */
  setRate(rate: number): void {
    this.session.setRate(rate);
  }

  /** Memory per emulated chip (GiB) on the embedded backend: the capacity line there. */
  setEmulatedChipGiB(gib: number): void {
    this.data.setEmulatedChipGiB(gib);
    this._schedule();
  }

  /**
   * Open chart `id` in its own main-area tab (or show the one open): live,
   * drawn from this dashboard's data. Null when there is no such chart (yet).
   */
  openChart(id: string): ChartTab | null {
    let tab = this._tabs.get(id);
    if (!tab) {
      const figure = this.node.querySelector<HTMLElement>(`figure[data-chart="${CSS.escape(id)}"]`);
      if (!figure || !this.dock) {
        return null;
      }
      tab = new ChartTab(id, figure.dataset.title ?? id, figure, () => this._schedule());
      this._tabs.set(id, tab);
      tab.disposed.connect(() => {
        this._tabs.delete(id);
        this._schedule();
      });
      this.dock(tab);
    }
    this._schedule();
    return tab;
  }

  /** Close every chart tab (the kernel went, or the dashboard follows another). */
  closeCharts(): void {
    for (const tab of [...this._tabs.values()]) {
      tab.dispose();
    }
  }

  dispose(): void {
    if (this._historyDue !== null) {
      clearTimeout(this._historyDue);
    }
    this.closeCharts();
    this.session.dispose();
    for (const chart of this._allCharts()) {
      chart.dispose();
    }
    super.dispose();
  }

  protected onAfterShow(): void {
    this._schedule();
  }

  protected onResize(): void {
    this._schedule();
  }

  private _sessionChanged(state: SessionState): void {
    if (state.kind === 'connecting') {
      this._awaitHistory();
    } else if (state.kind === 'closed') {
      this.model.reset();
    }
    this._renderChrome();
  }

  private _changed(change: Change): void {
    switch (change) {
      case 'topology':
        this.data.setTopology(this.model.topology!);
        this._renderChrome();
        break;
      case 'history':
        this.data.loadSliceHistory(
          this.model.topology?.slices.map(sl => this.model.history(sl.index)) ?? []
        );
        this._historyArrived();
        break;
      case 'metrics':
        this.data.addMetrics(this.model.metrics!);
        break;
      case 'events':
        this.data.addEvents(this.model.events);
        break;
      case 'points':
        this.metrics.add(this.model.points!);
        break;
      case 'phases':
        this._phases.add(this.model.phases!);
        break;
      case 'reset':
        this.data.reset();
        this.metrics.clear();
        this._phases.clear();
        this._window.zoomed = null;
        this._renderChrome();
        break;
    }
    if (this._historyDue === null) {
      this._schedule();
    }
  }

  private _awaitHistory(): void {
    this._historyArrived();
    this._historyDue = setTimeout(() => this._historyArrived(), HISTORY_WAIT_MS);
  }

  private _historyArrived(): void {
    if (this._historyDue !== null) {
      clearTimeout(this._historyDue);
      this._historyDue = null;
      this._schedule();
    }
  }

  /** Ask the kernel for the last 5 minutes of the chosen slice's chips (`chip_history`). */
  private async _loadChipHistory(): Promise<void> {
    const slice = this.model.topology?.slices.find(s => s.index === this.data.chipSlice);
    if (!slice?.chip_count) {
      return;
    }
    const start = slice.chip_offset;
    const stop = start + Math.min(slice.chip_count, MAX_CHIP_HISTORY);
    try {
      const history = await this.session.chipHistory(start, stop);
      this.data.loadChipHistory(slice.index, history.time, history.utilization, stop - start);
      this._schedule();
    } catch (error) {
      console.warn(
        `pathways: no chip history for slice ${slice.index}: ${(error as Error).message}`
      );
    }
  }

  private _schedule(): void {
    if (this._frame) {
      return;
    }
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      if (this.isVisible || [...this._tabs.values()].some(t => t.isVisible)) {
        this._draw();
      }
    });
  }

  /** Draw one frame: one layout read, then every chart. */
  private _draw(): void {
    const width = Math.max(240, Math.floor(this._grid.clientWidth) - 2);
    this._renderControls();
    const t = this.model.topology;
    if (!t) {
      return;
    }
    const now = this.model.metrics?.time ?? Date.now() / 1000;
    const range = this._window.zoomed ?? this.data.liveRange(now, SLICE_WINDOW_S);
    this.node.dataset.zoomed = String(this._window.zoomed !== null);
    const markers = this.data.markers();
    const size = (chart: { node: HTMLElement }) => this._size(chart.node, width);
    this._utilization.render(this.data.utilization(), markers, range, ...size(this._utilization));
    this._phases.draw(range, width);
    const chips = this.data.chipSlice !== null;
    this._chips.node.hidden = !chips;
    if (chips) {
      this._chips.render(
        this.data.chips(),
        markers,
        this._window.zoomed ?? this.data.liveRange(now, CHIP_WINDOW_S),
        ...size(this._chips)
      );
    }
    this._memory.render(
      this._memoryPercent ? this.data.memoryPercent() : this.data.memory(),
      markers,
      range,
      ...size(this._memory)
    );
    this._stepTime.render(this.data.stepTime(), markers, range, ...size(this._stepTime));
    this._throughput.render(this.data.throughput(), markers, range, ...size(this._throughput));
    this._drawMetrics(markers, width);
    this._drawGoodput(width);
    this._renderHeader();
  }

  /** A chart's plot size: the dashboard's width, or its tab's size when it has one. */
  private _size(node: HTMLElement, width: number): [number, number] {
    const tab = this._tabs.get(node.dataset.chart ?? '');
    return tab ? tab.plotSize() : [width, CHART_HEIGHT];
  }

  /** The newest finished run's goodput by interval and step time per interval, once one ended. */
  private _drawGoodput(width: number): void {
    const message = this.model.goodput;
    this._goodputSection.hidden = message === null;
    if (!message) {
      return;
    }
    if (message !== this._goodputFrom || !this._goodputData) {
      this._goodputFrom = message;
      this._goodputData = [
        { kind: 'stacked', columns: goodputColumns(message) },
        { kind: 'band', columns: stepTimeColumns(message) }
      ];
      this._goodputTitle.textContent = `Goodput over time: ${message.header}`;
    }
    const [stacked, band] = this._goodputData;
    this._goodput.render(stacked, ...this._size(this._goodput.node, width));
    this._intervalStepTime.render(band, ...this._size(this._intervalStepTime.node, width));
  }

  /** Mark `figure` as chart `id` and give it a button that opens it in its own tab. */
  private _tabbable(figure: HTMLElement, id: string, title: string): void {
    figure.dataset.chart = id;
    figure.dataset.title = title;
    const button = document.createElement('button');
    button.className = 'jp-Button jp-mod-styled jp-mod-small jp-PathwaysDashboard-popout';
    button.textContent = 'Open in tab';
    button.title = `Open ${title} in its own tab, live while the kernel runs`;
    button.setAttribute('aria-label', `Open ${title} in its own tab`);
    button.addEventListener('click', () => this.openChart(id));
    figure.querySelector('figcaption')?.append(button);
    this.chartAdded?.(id, title);
  }

  /** One chart per metric name, each run a line, smoothed; the markers of the same events on its step axis. */
  private _drawMetrics(markers: MonitorEvent[], width: number): void {
    const names = this.metrics.names();
    this._metricSection.hidden = names.length === 0;
    const axis = this._xAxis;
    const runs = this.metrics.allRuns();
    const shown = this.runs.shown(runs);
    this._runPicker.render(runs, shown);
    for (const name of names) {
      let chart = this._metricCharts.get(name);
      if (!chart) {
        chart = new StepChart(name);
        this._metricCharts.set(name, chart);
        this._metricGrid.append(chart.node);
        this._tabbable(chart.node, `metric:${name}`, name);
      }
      const placed = markers.flatMap(event => {
        const step =
          axis === 'step' ? this.metrics.stepOf(name, event) : this.metrics.wallOf(name, event);
        return step === null ? [] : [{ step, event }];
      });
      const key = `${this.metrics.version}|${this.runs.version}|${this._smoothing}|${axis}`;
      let cached = this._metricColumns.get(name);
      if (cached?.key !== key) {
        cached = {
          key,
          columns: this.metrics.columns(name, this._smoothing, axis, run => shown.has(run))
        };
        this._metricColumns.set(name, cached);
      }
      const [w, h] = this._size(chart.node, width);
      chart.render(cached.columns, placed, w, axis, h);
    }
  }

  private _renderControls(): void {
    const kinds = this.data.kinds();
    const hidden = this.data.hiddenKinds;
    const key = `${kinds.join(',')}|${[...hidden].sort().join(',')}`;
    if (key !== this._filterKinds) {
      const rebuild = kinds.join(',') !== this._filterKinds.split('|')[0];
      this._filterKinds = key;
      const shown = kinds.filter(k => !hidden.has(k));
      this._filterSummary.textContent = `Event markers (${shown.length} of ${kinds.length}) `;
      for (const kind of shown) {
        const swatch = document.createElement('span');
        swatch.className = 'jp-PathwaysDashboard-swatch';
        swatch.dataset.kind = kind;
        swatch.title = kind;
        this._filterSummary.append(swatch);
      }
      if (rebuild) {
        this._filterList.textContent = '';
        for (const kind of kinds) {
          const label = document.createElement('label');
          label.className = 'jp-PathwaysDashboard-kind';
          const box = document.createElement('input');
          box.type = 'checkbox';
          box.dataset.kind = kind;
          box.checked = !hidden.has(kind);
          const swatch = document.createElement('span');
          swatch.className = 'jp-PathwaysDashboard-swatch';
          swatch.dataset.kind = kind;
          label.append(box, swatch, kind);
          this._filterList.append(label);
        }
      }
    }
    const slices = this.model.topology?.slices ?? [];
    const options = slices.map(s => `${s.index}:${s.chip_count}`).join(',');
    if (options !== this._chipOptions) {
      this._chipOptions = options;
      this._chipSelect.textContent = '';
      this._chipSelect.append(new Option('no slice', ''));
      for (const s of slices) {
        this._chipSelect.append(
          new Option(`slice ${s.index} (${s.chip_count} chips)`, String(s.index))
        );
      }
      this._chipSelect.value = this.data.chipSlice === null ? '' : String(this.data.chipSlice);
    }
  }

  private _renderHeader(): void {
    const t = this.model.topology;
    const path = this.session.view?.title.label ?? '';
    if (!t) {
      this._header.textContent = path ? `Following ${path}` : '';
      return;
    }
    const up = t.slices.filter(s => s.state === 'up').length;
    const backend = isEmulated(t) ? `${t.backend} (emulated chips)` : t.backend;
    const text = `Following ${path} · ${backend} · ${up}/${t.slices.length} slices up · ${t.chips} chips`;
    if (this._header.textContent !== text) {
      this._header.textContent = text;
    }
    this._header.classList.toggle('jp-mod-degraded', up < t.slices.length);
  }

  /** The friendly states: no notebook, not a Pathways kernel, connecting, disconnected. */
  private _renderChrome(): void {
    const message = this._message();
    this._status.textContent = message;
    this._status.hidden = !message;
    const live = !!this.model.topology;
    this._body.hidden = !live;
    this.node.dataset.state = live ? 'live' : 'waiting';
    this._renderHeader();
  }

  private _message(): string {
    const state = this.session.state;
    const label = this.session.view?.title.label ?? '';
    const name = this.session.kernel?.name ?? '';
    switch (state.kind) {
      case 'no-view':
        return 'Open a notebook or console on a Pathways kernel to chart its slices here.';
      case 'no-kernel':
        return 'This notebook or console has no kernel yet. Start the “Pathways (JAX)” kernel.';
      case 'not-accepted':
        return `“${label}” runs “${name}”, not a Pathways kernel.`;
      case 'no-monitor':
        return `“${label}” runs “${name}”, which has no Pathways monitor. Restart it to get one.`;
      case 'no-backend':
        return `No backend: ${state.error}. Run %pathways connect local:2x4 in a cell.`;
      case 'closed':
        return `Disconnected from the kernel’s monitor (${state.reason}). Reopen the dashboard to reconnect.`;
      default:
        return stateMessage(state);
    }
  }

  private _allCharts(): { dispose(): void }[] {
    return [
      this._utilization,
      this._chips,
      this._memory,
      this._stepTime,
      this._throughput,
      this._goodput,
      this._intervalStepTime,
      ...this._metricCharts.values()
    ];
  }
}

function div(className: string): HTMLDivElement {
  const node = document.createElement('div');
  node.className = className;
  return node;
}
