/**
 * The phases loops mark with `pw.phase` (an RL loop's rollout, reward, update,
 * sync), kept apart from drawing: spans by role, the lane's uPlot columns over
 * a time range (one series per phase, drawn on its role's row), what runs at a
 * given time (the readout), and each role's time in the range split into busy
 * and waiting for the other roles (the kernel's `pw.goodput()` split,
 * training/phases.py's `role_split`). Pure: no DOM, unit-tested.
 */
import { PhaseSpan, PhasesMessage } from '../protocol/messages';

/** Spans kept (the kernel replays as many). */
export const MAX_SPANS = 20_000;
/** Most spans one frame draws (the newest in range). */
export const MAX_DRAWN = 4_000;
/** Roles drawn first, top to bottom, when present. */
const ROLE_ORDER = ['trainer', 'rollout'];

/** uPlot's aligned data: times, then one column per phase (its role's row, or null). */
export interface LaneColumns {
  phases: string[];
  roles: string[];
  data: (number | null)[][];
}

/** One role's share of a span of time. */
export interface RoleShare {
  role: string;
  mesh: string;
  wallS: number;
  busyS: number;
  /** Per other role: the time only that role's phases ran. */
  waitedS: Record<string, number>;
}

export class PhaseLanes {
  /** Bumped on every change, for views that cache. */
  version = 0;
  private _spans: PhaseSpan[] = [];

  /** Take a `phases` message: a replay replaces what was held, live spans add to it. */
  add(message: PhasesMessage): void {
    if (message.replay) {
      this._spans = [...message.spans];
    } else {
      const last = this._spans.length ? this._spans[this._spans.length - 1].seq : 0;
      this._spans.push(...message.spans.filter(s => s.seq > last));
    }
    if (this._spans.length > MAX_SPANS) {
      this._spans.splice(0, this._spans.length - MAX_SPANS);
    }
    this.version++;
  }

  clear(): void {
    this._spans = [];
    this.version++;
  }

  get empty(): boolean {
    return this._spans.length === 0;
  }

  /** The roles, trainer and rollout first, then the others as they first appeared. */
  roles(): string[] {
    const seen = [...new Set(this._spans.map(s => s.role))];
    return [
      ...ROLE_ORDER.filter(r => seen.includes(r)),
      ...seen.filter(r => !ROLE_ORDER.includes(r))
    ];
  }

  /** Each role's mesh, as its spans name it ("slice 1 · TPU v6 lite"; "" when not given). */
  meshOf(role: string): string {
    const meshes = [
      ...new Set(this._spans.filter(s => s.role === role && s.mesh).map(s => s.mesh))
    ];
    return meshes.join(' + ');
  }

  /** The spans that overlap `[t0, t1]`, oldest first (at most the newest `MAX_DRAWN`). */
  within(t0: number, t1: number): PhaseSpan[] {
    const shown = this._spans.filter(s => s.end >= t0 && s.start <= t1);
    return shown.length > MAX_DRAWN ? shown.slice(shown.length - MAX_DRAWN) : shown;
  }

  /**
   * The lane over `[t0, t1]`: a row per role (the first role on top), a series per
   * phase whose value is its role's row while one of its spans runs, null between
   * (a point just after each end breaks the line there).
   */
  columns(t0: number, t1: number): LaneColumns {
    const roles = this.roles();
    const spans = this.within(t0, t1);
    const phases = [...new Set(spans.map(s => s.phase))];
    const gap = 1e-3;
    const xs = [...new Set(spans.flatMap(s => [s.start, s.end, s.end + gap]))].sort(
      (a, b) => a - b
    );
    const row = (role: string) => roles.length - 1 - roles.indexOf(role);
    const data: (number | null)[][] = [xs];
    for (const phase of phases) {
      const own = spans.filter(s => s.phase === phase).sort((a, b) => a.start - b.start);
      const column = new Array<number | null>(xs.length).fill(null);
      let j = 0;
      xs.forEach((x, i) => {
        while (j < own.length && own[j].end < x) {
          j++;
        }
        // Spans of one phase may overlap (two loops): any that covers x.
        for (let k = j; k < own.length && own[k].start <= x; k++) {
          if (own[k].end >= x) {
            column[i] = row(own[k].role);
            break;
          }
        }
      });
      data.push(column);
    }
    return { phases, roles, data };
  }

  /** The spans running at `time`, one per role at most (the newest), in role order. */
  at(time: number): PhaseSpan[] {
    const found = new Map<string, PhaseSpan>();
    for (const s of this._spans) {
      if (s.start <= time && time <= s.end) {
        found.set(s.role, s);
      }
    }
    return this.roles()
      .filter(r => found.has(r))
      .map(r => found.get(r)!);
  }

  /**
   * Each role's time over `[t0, t1]`, clipped to where spans are (the loop's own
   * span, not the idle window around it): busy in its phases, and, per other
   * role, waiting while only that role's phases ran. Null without spans there.
   */
  split(t0: number, t1: number): { start: number; end: number; roles: RoleShare[] } | null {
    const spans = this.within(t0, t1);
    if (!spans.length) {
      return null;
    }
    const start = Math.max(t0, Math.min(...spans.map(s => s.start)));
    const end = Math.min(t1, Math.max(...spans.map(s => s.end)));
    const roles = this.roles().filter(r => spans.some(s => s.role === r));
    const busy = new Map(
      roles.map(r => [
        r,
        union(
          spans.filter(s => s.role === r).map(s => [Math.max(s.start, start), Math.min(s.end, end)])
        )
      ])
    );
    return {
      start,
      end,
      roles: roles.map(role => {
        const waitedS: Record<string, number> = {};
        for (const other of roles) {
          if (other !== role) {
            waitedS[other] = length(minus(busy.get(other)!, busy.get(role)!));
          }
        }
        return {
          role,
          mesh: this.meshOf(role),
          wallS: end - start,
          busyS: length(busy.get(role)!),
          waitedS
        };
      })
    };
  }
}

/** "trainer (slice 0 · TPU v5p): busy 30%, waited for rollout 70%" */
export function shareText(share: RoleShare): string {
  const pct = (s: number) => `${share.wallS > 0 ? Math.round((100 * s) / share.wallS) : 0}%`;
  const mesh = share.mesh ? ` (${share.mesh})` : '';
  const waits = Object.entries(share.waitedS).map(([r, s]) => `, waited for ${r} ${pct(s)}`);
  return `${share.role}${mesh}: busy ${pct(share.busyS)}${waits.join('')}`;
}

type Interval = [number, number];

function union(intervals: Interval[]): Interval[] {
  const merged: Interval[] = [];
  for (const [a, b] of intervals.filter(([a, b]) => b > a).sort((x, y) => x[0] - y[0])) {
    const last = merged[merged.length - 1];
    if (last && a <= last[1]) {
      last[1] = Math.max(last[1], b);
    } else {
      merged.push([a, b]);
    }
  }
  return merged;
}

function minus(these: Interval[], those: Interval[]): Interval[] {
  const out: Interval[] = [];
  for (const [a, b] of these) {
    let cursor = a;
    for (const [c, d] of those) {
      if (d <= cursor || c >= b) {
        continue;
      }
      if (c > cursor) {
        out.push([cursor, c]);
      }
      cursor = Math.max(cursor, d);
    }
    if (cursor < b) {
      out.push([cursor, b]);
    }
  }
  return out;
}

function length(intervals: Interval[]): number {
  return intervals.reduce((sum, [a, b]) => sum + b - a, 0);
}
