/**
 * The event timeline, newest first: one line per event (time to the
 * millisecond, kind, details cut with an ellipsis), a run of routine events
 * (a snapshot every 10 steps) folded into one line with its count and ranges;
 * a click or Enter on a row shows its details in full. A kind filter above it
 * keeps, say, only the reshards among many snapshots, each on its own line.
 */
import { formatClock } from '../common/format';
import { EventRow, foldEvents, rowDetails } from '../model/eventrows';
import { MonitorModel } from '../model/monitormodel';

/** Rows drawn; the model keeps more. */
const SHOWN = 100;
/** The filter's value for "every kind". */
export const ALL_KINDS = '';

export class Timeline {
  readonly node: HTMLOListElement;
  /** The kind filter, placed by the panel next to the section title. */
  readonly filter: HTMLSelectElement;
  private _drawn = '';
  private _kinds = '';
  private _expanded = new Set<number>();

  constructor(private _model: MonitorModel) {
    this.node = document.createElement('ol');
    this.node.className = 'jp-PathwaysPanel-events';
    this.node.setAttribute('aria-label', 'Pathways events, newest first');
    this.filter = document.createElement('select');
    this.filter.className = 'jp-PathwaysPanel-eventFilter';
    this.filter.setAttribute('aria-label', 'Show events of kind');
    this.filter.title = 'Show only events of this kind';
    this.filter.addEventListener('change', () => this.render());
    this.node.addEventListener('click', e => this._toggle(e.target));
    this.node.addEventListener('keydown', e => {
      if (e.key === 'Enter' || e.key === ' ') {
        e.preventDefault();
        this._toggle(e.target);
      }
    });
  }

  /** The kind shown, or ALL_KINDS. */
  get kind(): string {
    return this.filter.value;
  }

  render(): void {
    const events = this._model.events;
    this._renderKinds();
    const kind = this.kind;
    const rows: EventRow[] = (
      kind === ALL_KINDS
        ? foldEvents(events)
        : events.filter(e => e.kind === kind).map(e => ({ events: [e] }))
    ).slice(0, SHOWN);
    const drawn = `${kind}|${rows.map(r => `${r.events[0].seq}:${r.events.length}`).join(',')}|${[...this._expanded].join(',')}`;
    if (drawn === this._drawn) {
      return;
    }
    this._drawn = drawn;
    this.node.textContent = '';
    if (!rows.length) {
      const empty = document.createElement('li');
      empty.className = 'jp-PathwaysPanel-empty';
      empty.textContent = events.length ? `No ${kind} events.` : 'No events yet.';
      this.node.append(empty);
      return;
    }
    for (const row of rows) {
      // A row is known by its oldest event, which stays while newer ones join it.
      const first = row.events[0];
      const e = row.events[row.events.length - 1];
      const n = row.events.length;
      const li = document.createElement('li');
      const expanded = this._expanded.has(first.seq);
      li.className = 'jp-PathwaysPanel-event';
      li.classList.toggle('jp-mod-expanded', expanded);
      li.dataset.kind = e.kind;
      li.dataset.seq = String(first.seq);
      li.dataset.count = String(n);
      li.tabIndex = 0;
      li.setAttribute('aria-expanded', String(expanded));
      const time = document.createElement('span');
      time.className = 'jp-PathwaysPanel-eventTime';
      time.textContent = formatClock(e.time);
      const kindNode = document.createElement('span');
      kindNode.className = `jp-PathwaysPanel-eventKind jp-mod-${e.kind}`;
      kindNode.textContent = n > 1 ? `${e.kind} ×${n}` : e.kind;
      const details = document.createElement('span');
      details.className = 'jp-PathwaysPanel-eventDetails';
      const range = n > 1 ? `${formatClock(first.time)}–${formatClock(e.time)} · ` : '';
      details.textContent = expanded ? `${range}${rowDetails(row)}` : rowDetails(row);
      li.title = `${range || `${formatClock(e.time)} `}${kindNode.textContent} ${rowDetails(row)}`;
      li.append(time, kindNode, details);
      this.node.append(li);
    }
  }

  /** One option per kind seen, so the filter never offers an empty choice. */
  private _renderKinds(): void {
    const kinds = [...new Set(this._model.events.map(e => e.kind))].sort();
    const key = kinds.join(',');
    if (key === this._kinds) {
      return;
    }
    this._kinds = key;
    const current = this.filter.value;
    this.filter.textContent = '';
    const all = new Option('all kinds', ALL_KINDS);
    this.filter.append(all, ...kinds.map(k => new Option(k, k)));
    this.filter.value = kinds.includes(current) ? current : ALL_KINDS;
  }

  private _toggle(target: EventTarget | null): void {
    const li = (target as HTMLElement | null)?.closest?.(
      '.jp-PathwaysPanel-event'
    ) as HTMLElement | null;
    if (!li) {
      return;
    }
    const seq = Number(li.dataset.seq);
    if (!this._expanded.delete(seq)) {
      this._expanded.add(seq);
    }
    this.render();
    this.node.querySelector<HTMLElement>(`[data-seq="${seq}"]`)?.focus();
  }
}
