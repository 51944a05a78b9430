// Writes deploy/compose/grafana/dashboards/*.json from src/ (run after changing a definition), and
// the panel list of deploy/compose/grafana/README.md.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { DASHBOARDS, DASHBOARD_DIR, README, render } from './src/all.mjs';
import { panelsMarkdown, withPanels } from './src/panels.mjs';

mkdirSync(DASHBOARD_DIR, { recursive: true });
for (const [file, dashboard] of Object.entries(DASHBOARDS)) {
  writeFileSync(new URL(file, DASHBOARD_DIR), render(dashboard));
  console.log(`wrote ${file}`);
}
const readme = withPanels(readFileSync(README, 'utf8'), panelsMarkdown(DASHBOARDS));
if (readme === null) {
  console.error('README.md has no panels:begin/panels:end markers');
  process.exit(1);
}
writeFileSync(README, readme);
console.log('wrote the panel list of README.md');
