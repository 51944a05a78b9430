// Checks every dashboard in deploy/compose/grafana/dashboards/:
// 1. the generated ones are what src/ generates (no hand edit left behind, no stale file), and so
//    is the panel list in deploy/compose/grafana/README.md;
// 2. each one, and each of its panels, type-checks against @grafana/schema's Dashboard, Panel and
//    RowPanel types (`tsc --noEmit --strict`: an unknown or mistyped field fails);
// 3. every panel queries the provisioned Prometheus (uid `prometheus`) with at least one target,
//    and every target has a PromQL `expr`.
// `node check.mjs --metrics` prints the metric names the queries use, one a line;
// `node check.mjs --rules FILE` writes every query (variables filled in as Grafana would: $pool and
// $project as .*, $__rate_interval 1m, $__range 1h) as a recording rule, for `promtool check rules`.
import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { DASHBOARDS, DASHBOARD_DIR, README, render } from './src/all.mjs';
import { panelsMarkdown, withPanels } from './src/panels.mjs';

const SCHEMA = '@grafana/schema/dist/esm/raw/dashboard/x/Dashboard_types.gen';
const failures = [];
const fail = (message) => failures.push(message);

const files = readdirSync(DASHBOARD_DIR).filter((f) => f.endsWith('.json')).sort();
for (const file of Object.keys(DASHBOARDS)) {
  if (!files.includes(file)) fail(`${file}: missing; run \`npm run generate\``);
}
const dashboards = {};
for (const file of files) {
  const text = readFileSync(new URL(file, DASHBOARD_DIR), 'utf8');
  try {
    dashboards[file] = JSON.parse(text);
  } catch (e) {
    fail(`${file}: not JSON: ${e.message}`);
    continue;
  }
  if (DASHBOARDS[file] && render(DASHBOARDS[file]) !== text) {
    fail(`${file}: differs from what src/ generates; change src/ and run \`npm run generate\``);
  }
}
const readme = readFileSync(README, 'utf8');
if (withPanels(readme, panelsMarkdown(DASHBOARDS)) !== readme) {
  fail('deploy/compose/grafana/README.md: its panel list differs from the dashboards; run `npm run generate`');
}

const isPrometheus = (ds) => ds && ds.type === 'prometheus' && ds.uid === 'prometheus';
const panelsOf = (d) => (d.panels || []).flatMap((p) => (p.type === 'row' ? [p, ...(p.panels || [])] : [p]));

// 3. the queries.
const metrics = new Set();
const queries = [];
for (const [file, d] of Object.entries(dashboards)) {
  const ids = new Set();
  for (const v of d.templating?.list || []) {
    if (v.type === 'query' && !isPrometheus(v.datasource)) fail(`${file}: variable ${v.name}: datasource is not uid "prometheus"`);
    if (v.type === 'query') for (const m of String(v.query).match(/kiln_[a-z_]+/g) || []) metrics.add(m);
  }
  for (const p of panelsOf(d)) {
    const where = `${file}: panel ${p.id} "${p.title}"`;
    if (ids.has(p.id)) fail(`${where}: id used twice`);
    ids.add(p.id);
    if (p.type === 'row') continue;
    if (!isPrometheus(p.datasource)) fail(`${where}: datasource is not {type: "prometheus", uid: "prometheus"}`);
    if (!Array.isArray(p.targets) || p.targets.length === 0) {
      fail(`${where}: no targets`);
      continue;
    }
    const refIds = new Set();
    for (const t of p.targets) {
      if (typeof t.expr !== 'string' || t.expr.trim() === '') fail(`${where}: target ${t.refId} has no expr`);
      if (t.datasource !== undefined && !isPrometheus(t.datasource)) fail(`${where}: target ${t.refId}: datasource is not uid "prometheus"`);
      if (refIds.has(t.refId)) fail(`${where}: refId ${t.refId} used twice`);
      refIds.add(t.refId);
      queries.push({ where: `${where} ${t.refId}`, expr: String(t.expr) });
      for (const m of String(t.expr).match(/kiln_[a-z_]+/g) || []) metrics.add(m);
      for (const m of String(t.expr).match(/__name__=~"[^"]+"/g) || []) metrics.add(m);
    }
  }
}
const rulesAt = process.argv.indexOf('--rules');
if (rulesAt > 0) {
  const fill = (expr) =>
    expr.replaceAll('$__rate_interval', '1m').replaceAll('$__range', '1h').replaceAll('$pool', '.*').replaceAll('$project', '.*');
  const rules = queries.map(({ where, expr }, i) => `      # ${where}\n      - record: kiln_dashboard_query_${i}\n        expr: ${JSON.stringify(fill(expr))}`);
  writeFileSync(process.argv[rulesAt + 1], `groups:\n  - name: dashboard-queries\n    rules:\n${rules.join('\n')}\n`);
  console.log(`wrote ${queries.length} queries to ${process.argv[rulesAt + 1]}`);
  process.exit(failures.length ? 1 : 0);
}
if (process.argv.includes('--metrics')) {
  for (const m of [...metrics].sort()) console.log(m);
  process.exit(0);
}

// 2. the schema: each dashboard, and each panel again with its own type (a panel in a union of
// Panel | RowPanel would let a row's field pass on a panel).
const dir = new URL('./.check/', import.meta.url);
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir);
for (const [file, d] of Object.entries(dashboards)) {
  const lines = [`import type { Dashboard, Panel, RowPanel } from '${SCHEMA}';`, ''];
  lines.push(`export const dashboard: Dashboard = ${JSON.stringify(d, null, 2)};`);
  panelsOf(d).forEach((p, i) => {
    lines.push(`export const panel${i}: ${p.type === 'row' ? 'RowPanel' : 'Panel'} = ${JSON.stringify(p, null, 2)};`);
  });
  writeFileSync(new URL(file.replace(/\.json$/, '.ts'), dir), lines.join('\n') + '\n');
}
writeFileSync(
  new URL('tsconfig.json', dir),
  JSON.stringify({
    compilerOptions: { strict: true, noEmit: true, target: 'es2022', module: 'esnext', moduleResolution: 'bundler', skipLibCheck: true, types: [] },
    include: ['*.ts'],
  }),
);
try {
  execFileSync(new URL('./node_modules/.bin/tsc', import.meta.url).pathname, ['--noEmit', '--strict', '-p', new URL('tsconfig.json', dir).pathname], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
} catch (e) {
  fail(`tsc: the dashboards do not match @grafana/schema's types (files in deploy/dashboards-check/.check/):\n${e.stdout}${e.stderr}`);
}

if (failures.length) {
  for (const f of failures) console.error(`FAIL ${f}`);
  process.exit(1);
}
console.log(`ok: ${files.length} dashboards, ${Object.values(dashboards).reduce((n, d) => n + panelsOf(d).filter((p) => p.type !== 'row').length, 0)} panels; schema @grafana/schema ${JSON.parse(readFileSync(new URL('./node_modules/@grafana/schema/package.json', import.meta.url))).version}`);
