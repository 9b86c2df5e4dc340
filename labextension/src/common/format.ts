/**
 * Text the panel shows: percentages, byte counts, durations, event lines,
 * the status-bar label. Pure, unit-tested; matches events.py's wording.
 */
import { MonitorEvent } from '../protocol/messages';
import { Summary } from '../model/monitormodel';

export function formatPercent(fraction: number | null): string {
  return fraction === null ? '–' : `${Math.round(fraction * 100)}%`;
}

/** Like events.format_bytes: "512 B", "1.5 KiB", ... "3.0 GiB". */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${Math.round(value)} B` : `${value.toFixed(1)} ${units[unit]}`;
}

export function formatDuration(seconds: number): string {
  return seconds < 1
    ? `${Math.round(seconds * 1000)} ms`
    : `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
}

export function formatSlices(indices: number[] | null): string {
  return indices === null ? '-' : `[${indices.join(',')}]`;
}

/** The details of an event after its kind: "slices [0,1] → [0] · step 40 · 1.5 MiB · 340 ms · detail". */
export function eventDetails(e: MonitorEvent): string {
  const parts: string[] = [];
  if (e.slices_before !== null || e.slices_after !== null) {
    parts.push(`slices ${formatSlices(e.slices_before)} → ${formatSlices(e.slices_after)}`);
  }
  if (e.step !== null) {
    parts.push(`step ${e.step}`);
  }
  if (e.bytes !== null) {
    parts.push(formatBytes(e.bytes));
  }
  if (e.duration_s !== null) {
    parts.push(formatDuration(e.duration_s));
  }
  if (e.detail) {
    parts.push(e.detail);
  }
  return parts.join(' · ');
}

/** "HH:MM:SS.mmm" in local time: events of one elastic run fall within the same second. */
export function formatClock(epochSeconds: number): string {
  const d = new Date(Math.round(epochSeconds * 1000));
  const hms = [d.getHours(), d.getMinutes(), d.getSeconds()]
    .map(v => String(v).padStart(2, '0'))
    .join(':');
  return `${hms}.${String(d.getMilliseconds()).padStart(3, '0')}`;
}

/** The status-bar label: "Pathways 2/2 slices · 47%". */
export function statusLabel(summary: Summary | null): string {
  if (!summary) {
    return 'Pathways';
  }
  const base = `Pathways ${summary.slicesUp}/${summary.slicesTotal} slices`;
  return summary.utilization === null ? base : `${base} · ${formatPercent(summary.utilization)}`;
}
