// Every generated dashboard, by the file name it is written to.
import { overview, scheduler, runners } from './jobs.mjs';
import { ingest, nats, batches } from './data.mjs';

export const DASHBOARDS = {
  'overview.json': overview,
  'scheduler.json': scheduler,
  'runners.json': runners,
  'ingest.json': ingest,
  'nats.json': nats,
  'batches.json': batches,
};

export const DASHBOARD_DIR = new URL('../../compose/grafana/dashboards/', import.meta.url);

export const README = new URL('../../compose/grafana/README.md', import.meta.url);

export const render = (dashboard) => JSON.stringify(dashboard, null, 2) + '\n';
