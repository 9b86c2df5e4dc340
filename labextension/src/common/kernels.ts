/**
 * Which kernels the panel can talk to. Pure: no JupyterLab imports, unit-tested.
 */

/** Kernelspec names of Pathways kernels: `pathways` and any `pathways-*` added by `install`. */
export function isPathwaysKernel(specName: string | undefined | null): boolean {
  return !!specName && /^pathways([-_].*)?$/.test(specName);
}
