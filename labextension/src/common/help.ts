/** What "utilization" means here, wherever a view shows it (tooltips, sparkline labels, chart descriptions). */
export const UTILIZATION_MEANING =
  "fraction of time a chip spent executing programs, as the header's 'measured by' says: " +
  "the chips' own service (the local server's runtime metrics, Cloud Monitoring) or, from the client, " +
  'the time a chip had dispatched work not yet complete';

export const UTILIZATION_HELP = `Utilization: ${UTILIZATION_MEANING}`;
