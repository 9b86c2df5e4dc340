/**
 * The event list's rows: a run of routine events (a snapshot every 10 steps,
 * the client's connect lines) folds into one row with a count and ranges, as
 * `%pathways events` does (eventlog.fold). Pure, unit-tested.
 */
import { MonitorEvent } from '../protocol/messages';
import { formatBytes, formatDuration, formatSlices } from '../common/format';

/** Kinds that come in runs; eventlog.ROUTINE_KINDS. */
export const ROUTINE_KINDS = new Set([
  'snapshot',
  'steps',
  'connection_update',
  'compile',
  'transfer',
  'sidecar'
]);

/** One row: its events, oldest first (one, or a folded run). */
export interface EventRow {
  events: MonitorEvent[];
}

/**
 * `events` (newest first, as the model keeps them) as rows, newest first.
 * Routine events of one kind and the same slices join one row while no
 * event of another, non-routine kind comes between; a row stands where its
 * newest event does.
 */
export function foldEvents(events: readonly MonitorEvent[]): EventRow[] {
  const rows: EventRow[] = [];
  const newest = new Map<EventRow, number>();
  let open = new Map<string, EventRow>();
  const oldestFirst = [...events].reverse();
  oldestFirst.forEach((e, i) => {
    let row: EventRow | undefined;
    if (!ROUTINE_KINDS.has(e.kind)) {
      open = new Map();
      row = { events: [e] };
      rows.push(row);
    } else {
      const key = `${e.kind}|${formatSlices(e.slices_before)}|${formatSlices(e.slices_after)}`;
      row = open.get(key);
      if (!row) {
        row = { events: [] };
        open.set(key, row);
        rows.push(row);
      }
      row.events.push(e);
    }
    newest.set(row, i);
  });
  return rows.sort((a, b) => newest.get(b)! - newest.get(a)!);
}

/** One value when all agree, else the first and the last: "step 0–60". */
function span(values: string[]): string {
  const shown = values.filter(v => v);
  if (!shown.length) {
    return '';
  }
  return new Set(shown).size === 1 ? shown[0] : `${shown[0]}–${shown[shown.length - 1]}`;
}

/** A folded row's details: "×7 · step 0–60 · 4.0 KiB · newest: ..."; a single event's as eventDetails. */
export function rowDetails(row: EventRow): string {
  const events = row.events;
  const e = events[events.length - 1];
  const parts: string[] = [];
  if (e.slices_before !== null || e.slices_after !== null) {
    parts.push(`slices ${formatSlices(e.slices_before)} → ${formatSlices(e.slices_after)}`);
  }
  const steps = span(events.map(x => (x.step === null ? '' : String(x.step))));
  if (steps) {
    parts.push(`step ${steps}`);
  }
  const bytes = span(events.map(x => (x.bytes === null ? '' : formatBytes(x.bytes))));
  if (bytes) {
    parts.push(bytes);
  }
  const durations = span(
    events.map(x => (x.duration_s === null ? '' : formatDuration(x.duration_s)))
  );
  if (durations) {
    parts.push(durations);
  }
  if (e.detail) {
    parts.push(events.length > 1 ? `newest: ${e.detail}` : e.detail);
  }
  return parts.join(' · ');
}
