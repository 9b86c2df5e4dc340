/**
 * Which kernels the panel can talk to. Pure: no JupyterLab imports, unit-tested.
 */

/** Kernelspec names of Pathways kernels: `pathways` and any `pathways-*` added by `install`. */
export function isPathwaysKernel(specName: string | undefined | null): boolean {
  return !!specName && /^pathways([-_].*)?$/.test(specName);
}

/** Kernel display statuses of a kernel on its way up (JupyterLab's `kernelDisplayStatus`). */
const STARTING = new Set(['initializing', 'starting', 'restarting', 'autorestarting', 'unknown']);

/**
 * What a view says while a Pathways kernel starts (`status`: the session's
 * `kernelDisplayStatus`; `ready`: whether the session is set up yet), or null
 * when it is not starting one: the kernel starts a local Pathways server
 * before it runs a cell, which takes a while.
 */
export function startingMessage(
  specName: string | undefined | null,
  status: string,
  ready = true
): string | null {
  if (!ready && !isPathwaysKernel(specName)) {
    // The notebook is still opening its session: which kernel it asks for is not known yet.
    return 'Starting the notebook’s kernel…';
  }
  if (!isPathwaysKernel(specName) || !(STARTING.has(status) || !ready)) {
    return null;
  }
  const verb = status.includes('restart') ? 'Restarting' : 'Starting';
  return `${verb} the Pathways kernel and its local Pathways server (2 slices x 4 chips by default)… Cells run once it is up; this takes longest the first time.`;
}
