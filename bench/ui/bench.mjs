// The web UI benchmark: time from navigation to a drawn chart of a 1,000,000-point series, to
// 20 runs × 10 keys compared, and to the Runs table of 10,000 runs (then scrolled to its last
// run), in kiln's UI and, on the same data and with the same browser script, in MLflow's UI.
// It prints figures side by side; it asserts nothing. Run it through bench/ui/run.sh.
//
// Sizes (the issue's by default; scaled down equally for both sides when changed):
//   KILN_BENCH_POINTS          points of the one long series            (1,000,000)
//   KILN_BENCH_COMPARE_RUNS    runs compared                            (20)
//   KILN_BENCH_COMPARE_KEYS    metric keys of each compared run         (10)
//   KILN_BENCH_COMPARE_POINTS  points of each key of each compared run  (1,000)
//   KILN_BENCH_RUNS            runs in the Runs table                   (10,000)
//   KILN_BENCH_REPS            timed repetitions per scenario           (5)
//   KILN_BENCH_BUDGET_MS       stop repeating a scenario once its timed repetitions took this long (180,000)
//   KILN_BENCH_TIMEOUT_MS      give up on one measurement after        (600,000)
//   KILN_BENCH_MLFLOW=0        kiln only;  MLFLOW_PYTHON: the venv's python (target/mlflow-venv/bin/python)
//   KILN_BENCH_OUT             the JSON report (target/ui-bench.json)
//   KILN_BENCH_ONLY            only these scenarios (kiln-chart,kiln-compare,kiln-runs,mlflow-chart,mlflow-metric,mlflow-compare,mlflow-runs)
//   KILN_BENCH_TRACE=1         also write a chromium performance trace of one kiln repetition per scenario
//                              to target/ui-bench-trace-<scenario>.json (open it in chrome://tracing or Perfetto)
//   KILN_BIN, KILN_CHROMIUM    as for ui/e2e (kiln.mjs, browser.mjs)
//
// How a figure is taken (the same for both UIs): one browser context per UI (signed in: kiln's
// session cookie from POST /api/v1/login; MLflow needs none), one untimed warm-up visit of each
// page (so the UI's scripts are in the HTTP cache, as for someone who has used the UI before),
// then each repetition opens a NEW page (tab) and navigates. A script injected before the page's
// own (addInitScript) checks the page's "drawn" condition on every animation frame from the
// start of the document and records performance.now() when it first holds: the time from the
// navigation's start to the first frame at which the condition holds. Charts load only as they
// scroll into view in both UIs, so that script scrolls the first chart not yet drawn into view,
// as a user reading down the page would. The drawn conditions are documented at `watch` below.
// Each figure also notes when the last API response before it ended (resource timing), which
// splits the time into "waiting for the server" and "drawing after the data came".

import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { launch } from '../../ui/e2e/browser.mjs';
import { KILN_BIN, REPO, startKiln } from '../../ui/e2e/kiln.mjs';

const env = process.env;
const int = (name, fallback) => (env[name] ? Number(env[name].replaceAll('_', '')) : fallback);
const SIZES = {
  points: int('KILN_BENCH_POINTS', 1_000_000),
  compareRuns: int('KILN_BENCH_COMPARE_RUNS', 20),
  compareKeys: int('KILN_BENCH_COMPARE_KEYS', 10),
  comparePoints: int('KILN_BENCH_COMPARE_POINTS', 1_000),
  runs: int('KILN_BENCH_RUNS', 10_000),
};
const REPS = int('KILN_BENCH_REPS', 5);
const BUDGET_MS = int('KILN_BENCH_BUDGET_MS', 180_000);
const TIMEOUT_MS = int('KILN_BENCH_TIMEOUT_MS', 600_000);
const WITH_MLFLOW = env.KILN_BENCH_MLFLOW !== '0';
const MLFLOW_PYTHON = env.MLFLOW_PYTHON || join(REPO, 'target', 'mlflow-venv', 'bin', 'python');
const OUT = env.KILN_BENCH_OUT || join(REPO, 'target', 'ui-bench.json');
const TRACE = env.KILN_BENCH_TRACE === '1';
/** Only these scenarios (comma-separated names such as kiln-chart,mlflow-compare), for working on the script. */
const ONLY = env.KILN_BENCH_ONLY ? env.KILN_BENCH_ONLY.split(',') : undefined;
const KEY = 'train/loss';
const T0 = 1_760_000_000_000;
/** Points per WriteMetrics call; with steps, values and timestamps about 1.8 MB of protobuf, under log-ingest's 4 MiB. */
const CHUNK = 100_000;

const log = (...args) => console.error(`[${new Date().toISOString().slice(11, 19)}]`, ...args);
const fmt = (n) => n.toLocaleString('en-US');

/** The series both loaders write: a decaying curve with noise, NaN at step 7 (mlflow_load.py has the same). */
function value(step, count, scale = 1) {
  return step === 7 ? 'NaN' : scale * (Math.exp(-step / (count / 4)) + 0.05 * Math.sin(step));
}

async function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

async function pool(count, concurrency, fn) {
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < count) await fn(next++);
  }));
}

// ---------------------------------------------------------------------------------------------
// kiln: load the data through the HTTP API (JobService/CreateRun, LogService/WriteMetrics in
// columns, JobService/FinishRun), then wait until QueryMetrics counts every point.

async function writeColumns(kiln, jobId, keys, count, scale) {
  const total = keys.length * count;
  for (let first = 0; first < total; first += CHUNK) {
    const n = Math.min(CHUNK, total - first);
    const keyIndex = new Array(n);
    const steps = new Array(n);
    const values = new Array(n);
    const timestampsMs = new Array(n);
    for (let i = 0; i < n; i++) {
      const flat = first + i;
      const step = flat % count;
      keyIndex[i] = Math.floor(flat / count);
      steps[i] = step;
      values[i] = value(step, count, scale);
      timestampsMs[i] = T0 + step;
    }
    await kiln.call('LogService', 'WriteMetrics', { jobId, columns: { keys, keyIndex, steps, values, timestampsMs } });
  }
}

async function waitForPoints(kiln, jobIds, keys, count) {
  const deadline = Date.now() + 300_000;
  for (;;) {
    const { series } = await kiln.call('LogService', 'QueryMetrics', { jobIds, keys, maxPoints: 10, bands: true });
    const complete = series.filter((s) => Number(s.totalPoints) === count).length;
    if (complete === jobIds.length * keys.length) return;
    if (Date.now() > deadline) throw new Error(`QueryMetrics: ${complete} of ${jobIds.length * keys.length} series complete after 5 min`);
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

async function loadKiln(kiln) {
  const started = Date.now();
  const times = {};
  let t = Date.now();
  const million = await kiln.call('JobService', 'CreateRun', { name: 'million', project: 'default' });
  await writeColumns(kiln, million.id, [KEY], SIZES.points, 1);
  await kiln.call('JobService', 'FinishRun', { jobId: million.id, exitCode: 0 });
  await waitForPoints(kiln, [million.id], [KEY], SIZES.points);
  times.million = (Date.now() - t) / 1000;
  log(`kiln: ${fmt(SIZES.points)} points in ${times.million.toFixed(1)} s`);

  t = Date.now();
  const keys = Array.from({ length: SIZES.compareKeys }, (_, k) => `metric/${k}`);
  const compareIds = [];
  for (let i = 0; i < SIZES.compareRuns; i++) {
    const run = await kiln.call('JobService', 'CreateRun', { name: `compare-${i}`, project: 'default' });
    await writeColumns(kiln, run.id, keys, SIZES.comparePoints, 1 + i / SIZES.compareRuns);
    await kiln.call('JobService', 'FinishRun', { jobId: run.id, exitCode: 0 });
    compareIds.push(run.id);
  }
  await waitForPoints(kiln, compareIds, keys, SIZES.comparePoints);
  times.compare = (Date.now() - t) / 1000;
  log(`kiln: ${SIZES.compareRuns} runs × ${SIZES.compareKeys} keys in ${times.compare.toFixed(1)} s`);

  // The Runs table's runs last: ListJobs lists newest first, so the table (at most 10,000 rows)
  // holds exactly these, as MLflow's experiment "bench-runs" does.
  t = Date.now();
  await pool(SIZES.runs, 8, async (i) => {
    const run = await kiln.call('JobService', 'CreateRun', { name: `run-${i}`, project: 'default' });
    await kiln.call('JobService', 'FinishRun', { jobId: run.id, exitCode: 0 });
  });
  times.runs = (Date.now() - t) / 1000;
  log(`kiln: ${fmt(SIZES.runs)} runs in ${times.runs.toFixed(1)} s (CreateRun + FinishRun, 8 at a time)`);
  times.total = (Date.now() - started) / 1000;
  return { millionId: million.id, compareIds, keys, times };
}

// ---------------------------------------------------------------------------------------------
// MLflow: `mlflow server` on sqlite in a temporary directory; mlflow_load.py loads the same data.

async function startMlflow() {
  const dir = await mkdtemp(join(tmpdir(), 'kiln-ui-bench-mlflow-'));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const mlflowBin = join(MLFLOW_PYTHON, '..', 'mlflow');
  const child = spawn(mlflowBin, [
    'server', '--backend-store-uri', `sqlite:///${dir}/mlflow.db`, '--default-artifact-root', join(dir, 'artifacts'),
    '--host', '127.0.0.1', '--port', String(port), '--workers', '1',
  ], { cwd: dir, detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: { ...env, MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT: 'true' } });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  const deadline = Date.now() + 180_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`mlflow server exited (${child.exitCode}):\n${output}`);
    try {
      if ((await fetch(`${url}/health`)).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`mlflow server not healthy after 3 min:\n${output}`);
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
  async function stop() {
    if (child.exitCode === null) {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      process.kill(-child.pid, 'SIGTERM'); // its process group: the server and its workers
      const timer = setTimeout(() => process.kill(-child.pid, 'SIGKILL'), 20_000);
      await exited;
      clearTimeout(timer);
    }
    await rm(dir, { recursive: true, force: true });
  }
  return { url, stop, log: () => output };
}

async function loadMlflow(mlflow) {
  const started = Date.now();
  const args = [
    join(REPO, 'bench', 'ui', 'mlflow_load.py'), '--url', mlflow.url,
    '--points', SIZES.points, '--compare-runs', SIZES.compareRuns, '--compare-keys', SIZES.compareKeys,
    '--compare-points', SIZES.comparePoints, '--runs', SIZES.runs,
  ].map(String);
  const child = spawn(MLFLOW_PYTHON, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...env, MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT: 'true' } });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk) => (stdout += chunk));
  child.stderr.on('data', (chunk) => {
    stderr += chunk;
    for (const line of String(chunk).split('\n')) if (line.startsWith('mlflow:')) log(line);
  });
  const code = await new Promise((resolve) => child.on('exit', resolve));
  if (code !== 0) throw new Error(`mlflow_load.py exited ${code}:\n${stderr.slice(-4000)}`);
  const result = JSON.parse(stdout.trim().split('\n').pop());
  result.times = { total: (Date.now() - started) / 1000, million: result.million.seconds, compare: result.compare.seconds, runs: result.runs.seconds };
  return result;
}

// ---------------------------------------------------------------------------------------------
// The browser side.

/**
 * Injected into every timed page before its own scripts (so it sees the page from the start of
 * the document): on every animation frame, checks `cfg.kind`'s drawn condition and, the first
 * time it holds, stores { ms: performance.now(), ...details } in window.__benchDone. Runs in the
 * page, so it must not use anything from this module. The conditions:
 *
 * kiln-chart     kiln's run page: the chart container `[data-testid=chart][data-key=<key>]` has
 *                `data-drawn="true"`, which MetricChart's uPlot `draw` hook sets once the
 *                QueryMetrics bands (one bucket per pixel over all points) are on the canvas.
 * kiln-compare   kiln's /compare?ids=...: every `[data-testid=compare-chart]` (one per key) has
 *                `data-drawn="true"` with `data-runs` equal to the runs compared.
 * kiln-runs      kiln's Runs page: at least min(10, runs) `tr[data-job-id]` rows in the table.
 * mlflow-chart   MLflow's run page, "Model metrics" tab: a plotly chart (`.js-plotly-plot`) whose
 *                traces hold points and whose SVG has a line (`path.js-line`, non-empty `d`).
 *                That page asks get-history-bulk-interval for max_results=320: it draws at most
 *                320 sampled points of the series; `points` records how many.
 * mlflow-metric  MLflow's metric page (#/metric?...), fully loaded: its plotly line is drawn (it
 *                too draws the 320 sampled points of get-history-bulk-interval) and the page has
 *                read the whole history, which it pages through 25,000 points a get-history call,
 *                one call after the other, for its Latest/Min/Max table: the last get-history
 *                answer (the one without next_page_token) has arrived. That answer is seen by
 *                wrapping window.fetch, which only reads a clone of the response.
 * mlflow-compare MLflow's experiment page in chart mode (compareRunsMode=CHART, "Show first 20"
 *                runs chosen once in the warm-up, kept in localStorage): for every key, its card
 *                (`[data-testid=experiment-view-compare-runs-card]`, titled by the key) has a
 *                plotly chart with at least `runs` traces holding points and at least `runs`
 *                drawn SVG lines. The cards are virtualised (only those near the view are in the
 *                DOM), so keys seen drawn are remembered while scrolling down.
 * mlflow-runs    MLflow's experiment runs table (ag-grid): at least min(10, runs) rows
 *                (`.ag-row[row-id]`) and run names in them.
 */
function watch(cfg) {
  if (window.top !== window) return;
  try {
    performance.setResourceTimingBufferSize(100_000);
  } catch {
    // older browsers
  }
  const drawnKeys = new Set();
  let historyRead = false;
  if (cfg.kind === 'mlflow-metric') {
    const fetch = window.fetch;
    window.fetch = async (...args) => {
      const response = await fetch(...args);
      const url = String(args[0]?.url ?? args[0]);
      if (url.includes('/metrics/get-history?')) {
        response.clone().json().then((body) => {
          if (!body.next_page_token) historyRead = true;
        }, () => {});
      }
      return response;
    };
  }
  const plotOf = (root) => {
    const plot = root.querySelector('.js-plotly-plot');
    if (!plot || !Array.isArray(plot.data)) return undefined;
    const traces = plot.data.filter((trace) => trace && trace.x && trace.x.length > 0);
    const lines = [...root.querySelectorAll('path.js-line')].filter((path) => (path.getAttribute('d') || '').length > 10).length;
    return { traces: traces.length, lines, points: traces.reduce((max, trace) => Math.max(max, trace.x.length), 0) };
  };
  const scrollTo = (element) => {
    if (element && element !== window.__benchScrolled) {
      window.__benchScrolled = element;
      element.scrollIntoView({ block: 'nearest' });
    }
  };
  const checks = {
    'kiln-chart': () => {
      const chart = document.querySelector(`[data-testid="chart"][data-key="${CSS.escape(cfg.key)}"]`);
      if (!chart) return undefined;
      if (chart.dataset.drawn !== 'true') return scrollTo(chart);
      return { points: Number(chart.dataset.points) };
    },
    'kiln-compare': () => {
      const charts = [...document.querySelectorAll('[data-testid="compare-chart"]')];
      for (const chart of charts) if (chart.dataset.drawn === 'true' && Number(chart.dataset.runs) === cfg.runs) drawnKeys.add(chart.dataset.key);
      if (drawnKeys.size >= cfg.keys) return { charts: drawnKeys.size, points: charts.map((chart) => Number(chart.dataset.points)).reduce((a, b) => a + b, 0) };
      return scrollTo(charts.find((chart) => !drawnKeys.has(chart.dataset.key)));
    },
    'kiln-runs': () => {
      const rows = document.querySelectorAll('tr[data-job-id]').length;
      if (rows < Math.min(10, cfg.runs)) return undefined;
      return { rows: Number(document.querySelector('[data-testid="runs-table"]').getAttribute('aria-rowcount')) - 1 };
    },
    'mlflow-chart': () => {
      const plot = plotOf(document);
      if (!plot || plot.traces < 1 || plot.lines < 1) return undefined;
      return { points: plot.points };
    },
    'mlflow-metric': () => {
      const plot = plotOf(document);
      if (!plot || plot.traces < 1 || plot.lines < 1 || !historyRead) return undefined;
      return { points: plot.points };
    },
    'mlflow-compare': () => {
      const cards = [...document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]')];
      const keyOf = (card) => card.innerText.trim().split('\n')[0];
      let points = 0;
      for (const card of cards) {
        const plot = plotOf(card);
        if (plot && plot.traces >= cfg.runs && plot.lines >= cfg.runs) {
          drawnKeys.add(keyOf(card));
          points += plot.points;
        }
      }
      if (drawnKeys.size >= cfg.keys) return { charts: drawnKeys.size, pointsPerTrace: points };
      if (cards.length === 0) return undefined;
      const next = cards.find((card) => !drawnKeys.has(keyOf(card)));
      if (next) return scrollTo(next);
      // Every card in the DOM is drawn: scroll on, so that the next ones are mounted.
      let scroller = cards[cards.length - 1].parentElement;
      while (scroller && !(scroller.scrollHeight > scroller.clientHeight + 1 && /auto|scroll/.test(getComputedStyle(scroller).overflowY))) scroller = scroller.parentElement;
      if (scroller) scroller.scrollTop += cards[cards.length - 1].offsetHeight;
      return undefined;
    },
    'mlflow-runs': () => {
      const rows = document.querySelectorAll('.ag-row[row-id]');
      if (rows.length < Math.min(10, cfg.runs)) return undefined;
      if (![...rows].slice(0, 20).some((row) => row.innerText.includes('run-'))) {
        // The name is in the pinned column's row of the same row-id.
        const names = document.querySelector('.ag-pinned-left-cols-container');
        if (!names || !names.innerText.includes('run-')) return undefined;
      }
      return { rows: new Set([...rows].map((row) => row.getAttribute('row-id')).filter((id) => /^[0-9a-f]{32}$/.test(id))).size };
    },
  };
  const check = checks[cfg.kind];
  const frame = () => {
    let result;
    try {
      result = check();
    } catch (error) {
      window.__benchError = String(error);
    }
    if (result) window.__benchDone = { ms: performance.now(), ...result };
    else requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}

/**
 * Scrolls an already shown table to its last row and waits until that row is rendered; returns
 * the time from the scroll to the first frame with the row in the DOM.
 * kiln: the Runs viewport (`[data-testid=runs-viewport]`) scrolled to its end; its last row
 *   `tr[data-index=<rows-1>]` (all rows are loaded, only those in view are in the DOM).
 * MLflow: its table holds the first 100 runs; the next come by pressing "Load more" at its
 *   bottom, 100 a press. So: scroll to the end, press "Load more" when it is there and enabled
 *   and the last press has brought its rows, until the row `row-index=<runs-1>` is in the DOM.
 *   That is what it takes to see the 10,000th run in MLflow's table.
 */
function scrollToLast(cfg) {
  return new Promise((resolve) => {
    const started = performance.now();
    let clicks = 0;
    let lastClick = 0;
    let rowsAtClick = -1;
    // ag-grid's aria-rowcount counts the rows it holds (plus the header): a cheap "did the press load more".
    const loaded = () => Number(document.querySelector('[aria-rowcount].ag-root, [role="treegrid"][aria-rowcount], [role="grid"][aria-rowcount]')?.getAttribute('aria-rowcount') ?? -1);
    const frame = () => {
      const now = performance.now();
      if (now - started > cfg.timeoutMs) return resolve({ ms: now - started, timeout: true, clicks });
      if (cfg.kind === 'kiln') {
        const viewport = document.querySelector('[data-testid="runs-viewport"]');
        if (viewport.scrollTop + viewport.clientHeight < viewport.scrollHeight - 1) viewport.scrollTop = viewport.scrollHeight;
        if (document.querySelector(`tr[data-index="${cfg.rows - 1}"]`)) return resolve({ ms: now - started });
      } else {
        const viewport = document.querySelector('.ag-body-viewport');
        if (viewport && viewport.scrollTop + viewport.clientHeight < viewport.scrollHeight - 1) viewport.scrollTop = viewport.scrollHeight;
        if (document.querySelector(`.ag-row[row-index="${cfg.rows - 1}"]`)) return resolve({ ms: now - started, clicks });
        const more = [...document.querySelectorAll('button')].find((button) => button.textContent.trim() === 'Load more' && !button.disabled);
        const count = loaded();
        if (more && (count !== rowsAtClick || now - lastClick > 10_000) && now - lastClick > 100) {
          rowsAtClick = count;
          lastClick = now;
          clicks++;
          more.click();
        }
      }
      requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
  });
}

/** The API calls of the page (resource timing), for where the time went. */
function apiTimings(prefix) {
  const calls = performance.getEntriesByType('resource').filter((entry) => entry.name.includes(prefix));
  return calls.map((entry) => ({ name: entry.name.replace(/^https?:\/\/[^/]+/, '').slice(0, 120), start: entry.startTime, end: entry.responseEnd, bytes: entry.encodedBodySize }));
}

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
};
const stats = (values) => (values.length === 0 ? undefined : { min: Math.min(...values), median: median(values), max: Math.max(...values), n: values.length });

/**
 * Measures one scenario: an untimed warm-up, then up to REPS timed visits in new pages.
 * `after(page, done)` optionally measures a second figure on the same page (the scroll).
 */
async function measure(context, { name, url, cfg, apiPrefix, after, trace }) {
  if (ONLY && !ONLY.includes(name)) return { name, url, reps: 0 };
  const results = [];
  const seconds = [];
  const extra = [];
  let spent = 0;
  for (let rep = 0; rep <= REPS; rep++) {
    const page = await context.newPage();
    const errors = [];
    page.on('pageerror', (error) => errors.push(error.message));
    await page.addInitScript(watch, cfg);
    const tracing = trace && rep === 1;
    if (tracing) await context.browser().startTracing(page, { path: join(REPO, 'target', `ui-bench-trace-${name}.json`), screenshots: false });
    const wall = Date.now();
    let done;
    try {
      await page.goto(url, { waitUntil: 'commit', timeout: TIMEOUT_MS });
      const handle = await page.waitForFunction(() => window.__benchDone, undefined, { timeout: TIMEOUT_MS, polling: 100 });
      done = await handle.jsonValue();
    } catch (error) {
      const why = await page.evaluate(() => window.__benchError).catch(() => undefined);
      log(`${name}: repetition ${rep} failed: ${error.message.split('\n')[0]}${why ? ` (${why})` : ''}`);
      await page.screenshot({ path: join(REPO, 'target', `ui-bench-failed-${name}.png`) }).catch(() => {});
      done = { ms: Date.now() - wall, timeout: true };
    }
    if (tracing) await context.browser().stopTracing();
    const api = await page.evaluate(apiTimings, apiPrefix).catch(() => []);
    const before = api.filter((call) => call.end <= done.ms);
    done.apiDoneMs = before.length ? Math.max(...before.map((call) => call.end)) : 0;
    done.apiCalls = before.length;
    const slowest = before.reduce((a, b) => (b.end - b.start > (a ? a.end - a.start : -1) ? b : a), undefined);
    if (slowest) done.slowestCall = { name: slowest.name, ms: Math.round(slowest.end - slowest.start), bytes: slowest.bytes };
    done.errors = errors.length;
    // The waterfall of the API calls before the drawn frame (in the JSON report only).
    done.calls = before.map((call) => ({ name: call.name, start: Math.round(call.start), end: Math.round(call.end), bytes: call.bytes }));
    let second;
    if (after && !done.timeout) second = await after(page, done);
    await page.close();
    if (rep === 0) {
      log(`${name}: warm-up ${Math.round(done.ms)} ms ${JSON.stringify({ ...done, ms: undefined, slowestCall: undefined, calls: undefined })}${second ? ` then ${Math.round(second.ms)} ms` : ''}`);
      if (done.timeout) break;
      continue;
    }
    results.push(done);
    seconds.push(second);
    log(`${name}: ${Math.round(done.ms)} ms (API done at ${Math.round(done.apiDoneMs)} ms, ${done.apiCalls} calls)${second ? `, then ${Math.round(second.ms)} ms${second.clicks !== undefined ? ` (${second.clicks} Load more)` : ''}` : ''}`);
    spent += done.ms + (second?.ms ?? 0);
    if (done.timeout || second?.timeout) break;
    if (spent > BUDGET_MS) {
      log(`${name}: stopping after ${rep} repetitions (${Math.round(spent / 1000)} s spent)`);
      break;
    }
  }
  const ok = results.filter((r) => !r.timeout);
  return {
    name,
    url,
    reps: results.length,
    timeouts: results.length - ok.length,
    ms: stats(ok.map((r) => r.ms)),
    apiDoneMs: stats(ok.map((r) => r.apiDoneMs)),
    detail: results[results.length - 1],
    then: seconds.some(Boolean) ? { ms: stats(seconds.filter((s) => s && !s.timeout).map((s) => s.ms)), timeouts: seconds.filter((s) => s?.timeout).length, detail: seconds[seconds.length - 1] } : undefined,
  };
}

async function newContext(browser, storageState) {
  return browser.newContext({ viewport: { width: 1280, height: 720 }, colorScheme: 'light', storageState });
}

async function benchKiln(browser, kiln, data) {
  const context = await newContext(browser);
  const login = await context.request.post(`${kiln.url}/api/v1/login`, { data: { token: kiln.token }, headers: { 'X-Kiln-Csrf': '1' } });
  if (!login.ok()) throw new Error(`kiln login: ${login.status()} ${await login.text()}`);
  const out = {};
  out.chart = await measure(context, {
    name: 'kiln-chart', url: `${kiln.url}/runs/${data.millionId}`, cfg: { kind: 'kiln-chart', key: KEY }, apiPrefix: '/api/v1/', trace: TRACE,
  });
  out.compare = await measure(context, {
    name: 'kiln-compare', url: `${kiln.url}/compare?ids=${data.compareIds.join(',')}`,
    cfg: { kind: 'kiln-compare', keys: SIZES.compareKeys, runs: SIZES.compareRuns }, apiPrefix: '/api/v1/', trace: TRACE,
  });
  out.runs = await measure(context, {
    name: 'kiln-runs', url: `${kiln.url}/`, cfg: { kind: 'kiln-runs', runs: SIZES.runs }, apiPrefix: '/api/v1/', trace: TRACE,
    after: (page, done) => page.evaluate(scrollToLast, { kind: 'kiln', rows: done.rows, timeoutMs: TIMEOUT_MS }),
  });
  await context.close();
  return out;
}

/** MLflow's UI state the timed visits start from: its assistant panel closed, 20 runs shown in charts. */
async function mlflowState(browser, mlflow, data) {
  const context = await newContext(browser);
  const page = await context.newPage();
  await page.goto(`${mlflow.url}/#/experiments/${data.compare.experiment_id}/runs?compareRunsMode=CHART`);
  const close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]');
  await close.waitFor({ timeout: 60_000 }).then(() => close.click()).catch(() => log('mlflow: no assistant panel to close'));
  const visibility = page.locator('button[aria-label="Toggle visibility of runs"]');
  await visibility.waitFor({ timeout: 60_000 });
  if (SIZES.compareRuns > 10) {
    await visibility.click();
    await page.getByText(SIZES.compareRuns <= 20 ? 'Show first 20' : 'Show all runs', { exact: true }).click();
  }
  await page.waitForTimeout(2000);
  const state = await context.storageState();
  await context.close();
  return state;
}

async function benchMlflow(browser, mlflow, data) {
  const context = await newContext(browser, await mlflowState(browser, mlflow, data));
  const out = {};
  const { experiment_id: exp, run_id: run } = data.million;
  out.chart = await measure(context, {
    name: 'mlflow-chart', url: `${mlflow.url}/#/experiments/${exp}/runs/${run}/model-metrics`, cfg: { kind: 'mlflow-chart' }, apiPrefix: '/ajax-api/',
  });
  const q = (value) => encodeURIComponent(JSON.stringify(value));
  out.metric = await measure(context, {
    name: 'mlflow-metric',
    url: `${mlflow.url}/#/metric?runs=${q([run])}&metric=${q(KEY)}&experiments=${q([exp])}&plot_metric_keys=${q([KEY])}&plot_layout={}&x_axis=step&y_axis_scale=linear&line_smoothness=1&show_point=false&deselected_curves=[]&last_linear_y_axis_range=[]`,
    cfg: { kind: 'mlflow-metric', points: SIZES.points }, apiPrefix: '/ajax-api/',
  });
  out.compare = await measure(context, {
    name: 'mlflow-compare', url: `${mlflow.url}/#/experiments/${data.compare.experiment_id}/runs?compareRunsMode=CHART`,
    cfg: { kind: 'mlflow-compare', keys: SIZES.compareKeys, runs: SIZES.compareRuns }, apiPrefix: '/ajax-api/',
  });
  out.runs = await measure(context, {
    name: 'mlflow-runs', url: `${mlflow.url}/#/experiments/${data.runs.experiment_id}/runs`, cfg: { kind: 'mlflow-runs', runs: SIZES.runs }, apiPrefix: '/ajax-api/',
    after: (page) => page.evaluate(scrollToLast, { kind: 'mlflow', rows: SIZES.runs, timeoutMs: TIMEOUT_MS }),
  });
  await context.close();
  return out;
}

// ---------------------------------------------------------------------------------------------

function report(kiln, mlflow, load, meta) {
  const rows = [
    { scenario: `${fmt(SIZES.points)}-point chart (run page)`, size: `${fmt(SIZES.points)} points`, kiln: kiln.chart.ms, mlflow: mlflow?.chart?.ms, goalMs: 1000, note: `MLflow: run page, ${mlflow?.chart?.detail?.points ?? '?'} sampled points drawn; kiln: ${kiln.chart.detail?.points ?? '?'} buckets (min/max band + last)` },
    { scenario: `${fmt(SIZES.points)}-point chart (MLflow: metric page)`, size: `${fmt(SIZES.points)} points`, kiln: kiln.chart.ms, mlflow: mlflow?.metric?.ms, goalMs: 1000, note: mlflow?.metric ? `MLflow: metric page, ${mlflow.metric.detail?.points ?? '?'} points in the trace${mlflow.metric.timeouts ? `, ${mlflow.metric.timeouts} timed out` : ''}` : '' },
    { scenario: `compare ${SIZES.compareRuns} runs × ${SIZES.compareKeys} keys`, size: `${SIZES.compareRuns} runs × ${SIZES.compareKeys} keys × ${fmt(SIZES.comparePoints)} pts`, kiln: kiln.compare.ms, mlflow: mlflow?.compare?.ms, goalMs: 1500, note: 'MLflow: experiment chart view, 20 runs shown' },
    { scenario: `Runs table: first rows`, size: `${fmt(SIZES.runs)} runs`, kiln: kiln.runs.ms, mlflow: mlflow?.runs?.ms, goalMs: 1000, note: `rows listed: kiln ${kiln.runs.detail?.rows ?? '?'}, MLflow ${mlflow?.runs?.detail?.rows ?? '?'} (a page)` },
    { scenario: `Runs table: scroll to the last run`, size: `${fmt(SIZES.runs)} runs`, kiln: kiln.runs.then?.ms, mlflow: mlflow?.runs?.then?.ms, goalMs: 1000, note: mlflow?.runs?.then ? `MLflow: ${mlflow.runs.then.detail?.clicks ?? '?'} "Load more" presses${mlflow.runs.then.timeouts ? ', timed out' : ''}` : '' },
  ].filter((row) => WITH_MLFLOW || !row.scenario.includes('MLflow')).map((row) => {
    const ratio = row.kiln && row.mlflow ? row.mlflow.median / row.kiln.median : undefined;
    return {
      ...row,
      ratio,
      goalMet: row.kiln ? row.kiln.median < row.goalMs && (ratio === undefined ? !WITH_MLFLOW || undefined : ratio >= 5) : false,
      underGoalMs: row.kiln ? row.kiln.median < row.goalMs : false,
      atLeast5x: ratio === undefined ? undefined : ratio >= 5,
    };
  });
  const ms = (s) => (s ? `${Math.round(s.min)}/${Math.round(s.median)}/${Math.round(s.max)} (${s.n})` : '—');
  const header = ['scenario', 'size', 'kiln min/med/max ms (n)', 'MLflow min/med/max ms (n)', 'MLflow/kiln', 'goal (kiln < goal, ≥5×)'];
  const lines = rows.map((row) => [
    row.scenario, row.size, ms(row.kiln), ms(row.mlflow), row.ratio ? `${row.ratio.toFixed(1)}×` : '—',
    `< ${row.goalMs} ms: ${row.underGoalMs ? 'yes' : 'NO'}; ≥5×: ${row.atLeast5x === undefined ? '—' : row.atLeast5x ? 'yes' : 'NO'}`,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((line) => line[i].length)));
  const printLine = (cells) => console.log(cells.map((cell, i) => cell.padEnd(widths[i])).join(' | '));
  console.log('');
  console.log(`kiln web UI${meta.mlflowVersion ? ` vs MLflow ${meta.mlflowVersion} UI` : ''} — ${meta.kilnBin} — chromium ${meta.chromium} — ${meta.cpus} CPUs, load ${meta.loadBefore.map((l) => l.toFixed(2)).join(' ')} before / ${meta.loadAfter.map((l) => l.toFixed(2)).join(' ')} after`);
  printLine(header);
  console.log(widths.map((w) => '-'.repeat(w)).join('-|-'));
  for (const line of lines) printLine(line);
  console.log('');
  for (const row of rows) if (row.note) console.log(`  ${row.scenario}: ${row.note}`);
  const split = (name, r) => r?.ms && console.log(`  ${name}: last API response before drawn at ${Math.round(r.apiDoneMs.median)} ms (median), drawn at ${Math.round(r.ms.median)} ms; slowest call ${r.detail?.slowestCall ? `${r.detail.slowestCall.name} ${r.detail.slowestCall.ms} ms, ${fmt(r.detail.slowestCall.bytes ?? 0)} B` : '—'}`);
  console.log('');
  for (const [side, result] of [['kiln', kiln], ['MLflow', mlflow]]) for (const [name, r] of Object.entries(result ?? {})) split(`${side} ${name}`, r);
  console.log('');
  console.log(`  data load: kiln ${load.kiln.total.toFixed(0)} s (1M points ${load.kiln.million.toFixed(1)} s, compare ${load.kiln.compare.toFixed(1)} s, runs ${load.kiln.runs.toFixed(1)} s)` +
    (load.mlflow ? `; MLflow ${load.mlflow.total.toFixed(0)} s (1M points ${load.mlflow.million.toFixed(1)} s, compare ${load.mlflow.compare.toFixed(1)} s, runs ${load.mlflow.runs.toFixed(1)} s)` : ''));
  return rows;
}

/** What is running, for stopping it on SIGINT/SIGTERM as on the way out. */
const running = { kiln: undefined, mlflow: undefined, browser: undefined };
async function cleanup() {
  await running.browser?.close().catch(() => {});
  await running.kiln?.stop().catch(() => {});
  await running.mlflow?.stop().catch(() => {});
}
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.once(signal, () => {
    log(`${signal}: stopping kiln and mlflow`);
    cleanup().finally(() => process.exit(130));
  });
}

async function main() {
  if (!existsSync(KILN_BIN)) throw new Error(`no kiln binary at ${KILN_BIN}: cargo build -p kiln-cli, or set KILN_BIN`);
  if (!existsSync(join(REPO, 'ui', 'dist', 'index.html'))) throw new Error('no ui/dist: npm --prefix ui run build');
  const loadBefore = loadavg();
  log(`sizes ${JSON.stringify(SIZES)}, ${REPS} repetitions, kiln ${KILN_BIN}${WITH_MLFLOW ? `, MLflow through ${MLFLOW_PYTHON}` : ', no MLflow'}`);

  const kiln = (running.kiln = await startKiln());
  let mlflow;
  let browser;
  try {
    log(`kiln up at ${kiln.url}`);
    if (WITH_MLFLOW) {
      mlflow = running.mlflow = await startMlflow();
      log(`mlflow server at ${mlflow.url}`);
    }
    // Both loads at once (neither is timed in the UI figures); the browser runs after both.
    const [kilnData, mlflowData] = await Promise.all([loadKiln(kiln), WITH_MLFLOW ? loadMlflow(mlflow) : undefined]);
    browser = running.browser = await launch();
    const chromium = browser.version();
    log('measuring kiln');
    const kilnResults = await benchKiln(browser, kiln, kilnData);
    await kiln.stop();
    let mlflowResults;
    let mlflowVersion;
    if (WITH_MLFLOW) {
      mlflowVersion = await fetch(`${mlflow.url}/version`).then((r) => (r.ok ? r.text() : '?')).then((t) => t.trim()).catch(() => '?');
      log(`measuring MLflow ${mlflowVersion}`);
      mlflowResults = await benchMlflow(browser, mlflow, mlflowData);
    }
    const meta = { kilnBin: KILN_BIN, chromium, mlflowVersion, cpus: cpus().length, loadBefore, loadAfter: loadavg(), date: new Date().toISOString(), sizes: SIZES, reps: REPS };
    const rows = report(kilnResults, mlflowResults, { kiln: kilnData.times, mlflow: mlflowData?.times }, meta);
    await mkdir(join(REPO, 'target'), { recursive: true });
    await writeFile(OUT, JSON.stringify({ meta, rows, kiln: kilnResults, mlflow: mlflowResults, load: { kiln: kilnData.times, mlflow: mlflowData?.times } }, null, 2));
    log(`wrote ${OUT}`);
  } finally {
    await cleanup();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
