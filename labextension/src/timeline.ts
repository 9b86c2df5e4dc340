/**
 * The event timeline, newest first: time, kind and details (a reshard shows
 * slices before -> after, bytes and duration).
 */
import { eventDetails, formatClock } from './format';
import { MonitorModel } from './model';

/** Rows drawn; the model keeps more. */
const SHOWN = 100;

export class Timeline {
  readonly node: HTMLOListElement;
  private _newest = -1;
  private _count = -1;

  constructor(private _model: MonitorModel) {
    this.node = document.createElement('ol');
    this.node.className = 'jp-PathwaysPanel-events';
    this.node.setAttribute('aria-label', 'Pathways events, newest first');
  }

  render(): void {
    const events = this._model.events;
    const newest = events.length ? events[0].seq : -1;
    if (newest === this._newest && events.length === this._count) {
      return;
    }
    this._newest = newest;
    this._count = events.length;
    this.node.textContent = '';
    if (!events.length) {
      const empty = document.createElement('li');
      empty.className = 'jp-PathwaysPanel-empty';
      empty.textContent = 'No events yet.';
      this.node.append(empty);
      return;
    }
    for (const e of events.slice(0, SHOWN)) {
      const li = document.createElement('li');
      li.className = 'jp-PathwaysPanel-event';
      li.dataset.kind = e.kind;
      li.dataset.seq = String(e.seq);
      const time = document.createElement('span');
      time.className = 'jp-PathwaysPanel-eventTime';
      time.textContent = formatClock(e.time);
      const kind = document.createElement('span');
      kind.className = `jp-PathwaysPanel-eventKind jp-mod-${e.kind}`;
      kind.textContent = e.kind;
      const details = document.createElement('span');
      details.className = 'jp-PathwaysPanel-eventDetails';
      details.textContent = eventDetails(e);
      li.append(time, kind, details);
      this.node.append(li);
    }
  }
}
