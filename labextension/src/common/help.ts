/** What "utilization" means here, wherever a view shows it (the panel's tooltips, sparkline labels). */
export const UTILIZATION_HELP =
  'Utilization: fraction of time a chip has dispatched work not yet complete, measured from the client';
