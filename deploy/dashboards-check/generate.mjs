// Writes deploy/compose/grafana/dashboards/*.json from src/ (run after changing a definition).
import { mkdirSync, writeFileSync } from 'node:fs';
import { DASHBOARDS, DASHBOARD_DIR, render } from './src/all.mjs';

mkdirSync(DASHBOARD_DIR, { recursive: true });
for (const [file, dashboard] of Object.entries(DASHBOARDS)) {
  writeFileSync(new URL(file, DASHBOARD_DIR), render(dashboard));
  console.log(`wrote ${file}`);
}
