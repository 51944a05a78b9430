// A stand-in for kiln's HTTP gateway, for working on the UI without a running kiln: it serves
// ui/dist and answers the calls the pages make with made-up data (10,000 runs, a 1,000,000-step
// series folded into bands, 100,000 log lines). Not used by any test.
//
//   npm run build && node dev/mock-api.mjs [port]      then open http://127.0.0.1:PORT/

import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { extname, join } from 'node:path';

const DIST = new URL('../dist/', import.meta.url).pathname;
const PORT = Number(process.argv[2] ?? 5199);
const RUNS = 10_000;
const STATES = ['JOB_STATE_RUNNING', 'JOB_STATE_SUCCEEDED', 'JOB_STATE_FAILED', 'JOB_STATE_QUEUED', 'JOB_STATE_STOPPED'];
const start = Date.now() - 3_600_000;

const jobs = Array.from({ length: RUNS }, (_, i) => ({
  id: `01mock${String(i).padStart(6, '0')}`,
  spec: { name: `train-${i % 7 === 0 ? 'resnet' : 'bert'}-${i}`, command: ['python', 'train.py'], env: {}, resources: { cpuMillis: 2000, memoryBytes: 4 * 2 ** 30 }, codeDigest: '', project: i % 3 ? 'vision' : 'default', image: '', gpus: i % 4 === 0 ? 1 : 0, maxRuntimeSecs: 0, datasets: [], priorityClass: '', market: 'MARKET_UNSPECIFIED', pool: '', secrets: [] },
  state: STATES[i % STATES.length], version: 3, reason: '', owner: `u${i % 5}`, pool: 'local', runnerId: 'r1', instanceId: 'i-1', attempt: 1,
  stopRequested: false, createdAtMs: start + i * 300, startedAtMs: i % 5 === 3 ? 0 : start + i * 300 + 2000,
  finishedAtMs: i % 5 === 0 || i % 5 === 3 ? 0 : start + i * 300 + 60_000 + i, preemptions: i % 11 === 0 ? 1 : 0, market: 'spot',
  cost: i * 0.001, onDemandCost: i * 0.003, sweepId: '', summary: {},
  config: { lr: { floatValue: [0.1, 0.01, 0.001][i % 3] }, batch: { intValue: 32 << (i % 3) }, opt: { stringValue: i % 2 ? 'adam' : 'sgd' } },
}));
const byId = new Map(jobs.map((job) => [job.id, job]));

function bands(key, maxPoints, minStep = 0, maxStep = 999_999) {
  const n = Math.max(1, Math.min(maxPoints, maxStep - minStep + 1));
  const width = (maxStep - minStep + 1) / n;
  const out = { steps: [], timestampsMs: [], mins: [], maxs: [], lasts: [] };
  for (let b = 0; b < n; b++) {
    const step = Math.floor(minStep + (b + 1) * width - 1);
    const base = key.startsWith('sys/') ? 50 + 20 * Math.sin(step / 5000) : 2 * Math.exp(-step / 200_000) + 0.1;
    out.steps.push(step);
    out.timestampsMs.push(start + step);
    out.mins.push(base - 0.05);
    out.maxs.push(base + 0.05);
    out.lasts.push(b === 3 ? 'NaN' : base);
  }
  return out;
}

const handlers = {
  'NodeService/WhoAmI': () => ({ user: 'admin', admin: true, tokenName: 'mock', jobId: '', memberships: [], service: 'api' }),
  'JobService/ListJobs': (r) => ({ jobs: r.sweepId ? [] : r.everyone ? jobs.slice(0, r.limit || 100) : jobs.filter((j) => j.owner === 'u0').slice(0, r.limit || 100) }),
  'JobService/GetJob': (r) => byId.get(r.jobId) ?? null,
  'JobService/ExplainJob': (r) => ({ jobId: r.jobId, state: 'JOB_STATE_QUEUED', summary: 'waits for CPU in pool local', jobsAhead: 3, details: ['pool local: 0 of 8 CPU free'] }),
  'JobService/StopJob': (r) => ({ ...byId.get(r.jobId), stopRequested: true }),
  'LogService/LatestMetrics': (r) => ({ series: r.jobIds.flatMap((id, i) => ['loss', 'acc', 'sys/cpu'].filter((k) => !r.keys?.length || r.keys.includes(k)).map((key) => ({ jobId: id, key, totalPoints: 1, points: [{ key, step: 100, value: key === 'loss' ? ((i * 7) % 10) / 10 : 0.9, timestampMs: 0 }] }))) }),
  'LogService/ListMetricKeys': () => ({ keys: ['loss', 'acc', 'val/loss', 'sys/cpu', 'sys/memory'] }),
  'LogService/QueryMetrics': (r) => ({ series: r.jobIds.flatMap((jobId) => r.keys.map((key) => ({ jobId, key, points: [], totalPoints: 1_000_000, bands: bands(key, r.maxPoints || 1000, r.minStep, r.maxStep) }))) }),
  'ArtifactService/ListRunArtifacts': () => ({ files: [{ name: 'model', path: 'weights.pt', digest: 'ab'.repeat(32), size: 123456789 }] }),
  'ArtifactService/ListOutputs': () => ({ files: [{ path: 'checkpoints/last.pt', size: 987654321 }, { path: 'metrics.json', size: 2048 }] }),
  'ProjectService/ListProjects': () => ({ projects: [{ name: 'default', createdAtMs: start, role: 'ROLE_UNSPECIFIED' }] }),
  'DatasetService/ListDatasets': (r) => ({ datasets: [{ name: 'imagenet', digest: 'cd'.repeat(32), size: 1 << 30, createdBy: 'admin', createdAtMs: start, project: r.project }] }),
  'SecretService/ListSecrets': (r) => ({ secrets: [{ project: r.project, name: 'HF_TOKEN', createdAtMs: start, updatedAtMs: start }] }),
  'JobService/SubmitJob': () => ({ job: jobs[0] }),
  'BatchService/ListBatches': () => ({ batches: [batch()] }),
  'BatchService/GetBatch': () => batch(),
  'BatchService/ListItems': (r) => ({ items: (r.states?.length ? [3] : [0, 1, 2, 3]).map((i) => ({ key: `item-${i}`, uri: `s3://b/${i}`, state: i === 3 ? 'ITEM_STATE_DEAD' : 'ITEM_STATE_SUCCEEDED', attempts: i === 3 ? 3 : 1, exitCode: i === 3 ? 2 : 0, reason: i === 3 ? 'exit code 2' : '', updatedAtMs: Date.now() })), nextPageToken: '' }),
  'BatchService/GetItemLogs': () => ({ lines: [{ attempt: 1, seq: 1, stream: 'LOG_STREAM_STDERR', timestampMs: 0, text: 'Traceback: boom' }] }),
  'BatchLogService/SearchBatchLogs': (r) => ({ lines: [1, 2, 3].map((attempt) => ({ key: 'item-3', attempt, line: 1, stream: 'LOG_STREAM_STDERR', timestampMs: start, text: `\x1b[31mTraceback\x1b[0m: boom (${r.pattern})`, state: attempt === 3 ? 'ITEM_STATE_DEAD' : 'ITEM_STATE_FAILED' })).filter((l) => r.state === 'ITEM_STATE_UNSPECIFIED' || l.state === r.state), truncated: false }),
};
let done = 0;
function batch() {
  done = Math.min(1000, done + 17);
  return { id: 'b1', spec: { name: 'resize', project: 'default', command: ['resize', '{uri}'], maxWorkers: 4, image: '' }, state: done >= 1000 ? 'BATCH_STATE_DONE' : 'BATCH_STATE_SEALED', owner: 'u0', counts: { total: 1000, pending: 1000 - done - 4, running: 3, succeeded: done - 1, failed: 0, dead: 1 }, itemsPerSecond: 8.5, etaSeconds: 100, workers: 3, cpuSecondsPerItem: 0.2, peakMemoryBytes: 1 << 26, createdAtMs: start, finishedAtMs: 0, stalledReason: '' };
}

function logs(res, lastId) {
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  const colours = ['\x1b[32mINFO\x1b[0m', '\x1b[33mWARN\x1b[0m', '\x1b[1;31mERROR\x1b[0m'];
  let out = '';
  for (let seq = Number(lastId || 0) + 1; seq <= 100_000; seq++) {
    const line = { attempt: 1, seq, stream: seq % 50 ? 'LOG_STREAM_STDOUT' : 'LOG_STREAM_STDERR', timestampMs: start + seq, text: `${colours[seq % 3]} step ${seq} loss=${(1 / seq).toFixed(6)}` };
    out += `id: ${seq}\ndata: ${JSON.stringify(line)}\n\n`;
  }
  res.write(out);
  res.write('event: end\ndata: {}\n\n');
  res.end();
}

const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.svg': 'image/svg+xml', '.map': 'application/json' };

createServer(async (req, res) => {
  const url = new URL(req.url, 'http://x');
  if (url.pathname.startsWith('/api/v1/rpc/')) {
    let body = '';
    for await (const chunk of req) body += chunk;
    const handler = handlers[url.pathname.slice('/api/v1/rpc/'.length)];
    const answer = handler ? handler(JSON.parse(body || '{}')) : undefined;
    if (answer === undefined) {
      res.writeHead(501, { 'Content-Type': 'application/json' }).end(JSON.stringify({ code: 'unimplemented', message: 'the mock has no answer' }));
      return;
    }
    res.writeHead(answer ? 200 : 404, { 'Content-Type': 'application/json' }).end(JSON.stringify(answer ?? { code: 'not_found', message: 'no such job' }));
  } else if (url.pathname === '/api/v1/login/pending') {
    // The mock's login: any code, approved at once.
    res.writeHead(200, { 'Content-Type': 'application/json' }).end(JSON.stringify({ code: 'BCDF-GHJK', expiresAtMs: Date.now() + 300_000 }));
  } else if (url.pathname === '/api/v1/login' || url.pathname === '/api/v1/logout' || url.pathname === '/api/v1/login/pending/redeem') {
    res.writeHead(200, { 'Content-Type': 'application/json' }).end(JSON.stringify(handlers['NodeService/WhoAmI']()));
  } else if (url.pathname === '/api/v1/stream/LogService/GetLogs') {
    logs(res, req.headers['last-event-id']);
  } else {
    const path = join(DIST, url.pathname === '/' ? 'index.html' : url.pathname);
    const file = await readFile(path).catch(() => null);
    const isFile = file && path.startsWith(DIST);
    res.writeHead(200, { 'Content-Type': isFile ? TYPES[extname(path)] ?? 'application/octet-stream' : TYPES['.html'] });
    res.end(isFile ? file : await readFile(join(DIST, 'index.html')));
  }
}).listen(PORT, '127.0.0.1', () => console.log(`mock api: http://127.0.0.1:${PORT}/`));
