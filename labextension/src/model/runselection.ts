/**
 * Which runs the metric charts overlay: the user's picks, else the newest
 * few, the run in progress always. Pure, unit-tested.
 */
import { RunInfo } from './metricseries';

/** Runs shown by default: the newest ones, as TensorBoard and W&B show recent runs first. */
export const DEFAULT_RUNS = 3;

export class RunSelection {
  /** Bumped on every pick, so views rebuild their columns only when needed. */
  version = 0;
  /** The user's picks by run key; a run not picked follows the default. */
  private _picked = new Map<string, boolean>();

  /** Show (`on`) or hide one run; the pick stays while points stream in and runs start. */
  pick(run: string, on: boolean): void {
    this._picked.set(run, on);
    this.version++;
  }

  /** Back to the default for every run. */
  reset(): void {
    this._picked.clear();
    this.version++;
  }

  /**
   * The runs of `runs` (in the order they started) that are shown: each run
   * as picked, else shown when it is among the newest `DEFAULT_RUNS` or is
   * this kernel's newest run (the run in progress, or the last one).
   */
  shown(runs: readonly RunInfo[]): Set<string> {
    const newest = new Set(runs.slice(-DEFAULT_RUNS).map(r => r.run));
    const current = [...runs].reverse().find(r => !r.earlier);
    if (current) {
      newest.add(current.run);
    }
    return new Set(runs.filter(r => this._picked.get(r.run) ?? newest.has(r.run)).map(r => r.run));
  }

  /** Whether the user picked any run (the view offers to go back to the default). */
  get picked(): boolean {
    return this._picked.size > 0;
  }
}
