// Starts a real kiln (`kiln up`, every service in one process, jobs as local processes) on free
// ports with its own home, serving the built UI, and gives tests its URL, the admin token, the
// CLI and the HTTP API. Set KILN_BIN to another build; KILN_E2E_KEEP=1 keeps the home.

import { spawn, execFile } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
export const REPO = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const KILN_BIN = process.env.KILN_BIN || join(REPO, 'target', 'debug', 'kiln');
/** The built UI kiln serves (`npm run build`); KILN_UI_DIST tests another build. */
export const UI_DIST = process.env.KILN_UI_DIST || join(REPO, 'ui', 'dist');

async function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** Waits until `pattern` appears in the child's output; rejects if it exits or the wait is over. */
function waitForOutput(child, pattern, timeoutMs) {
  return new Promise((resolve, reject) => {
    let output = '';
    const onData = (chunk) => {
      output += chunk;
      const found = pattern.exec(output);
      if (found) {
        cleanup();
        resolve(found);
      }
    };
    const onExit = (code) => {
      cleanup();
      reject(new Error(`kiln up exited (${code}) before it was ready:\n${output}`));
    };
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`kiln up printed no ${pattern} in ${timeoutMs} ms:\n${output}`));
    }, timeoutMs);
    function cleanup() {
      clearTimeout(timer);
      child.stdout.off('data', onData);
      child.stderr.off('data', onData);
      child.off('exit', onExit);
    }
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('exit', onExit);
  });
}

/**
 * Starts kiln; a free port found here may be taken by another process before kiln binds it,
 * so a start that fails on a port in use is tried again on new ports.
 */
export async function startKiln() {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startKilnOnce();
    } catch (error) {
      if (attempt >= 3 || !/Address already in use/.test(String(error.message))) throw error;
    }
  }
}

async function startKilnOnce() {
  const home = await mkdtemp(join(tmpdir(), 'kiln-ui-e2e-'));
  const [apiPort, logs, batch, advisor, predictor, predictorHttp, metrics, http] = await Promise.all(Array.from({ length: 8 }, freePort));
  const at = (port) => `127.0.0.1:${port}`;
  const child = spawn(KILN_BIN, [
    'up', '--home', home, '--provider', 'process',
    '--api-addr', at(apiPort), '--logs-addr', at(logs), '--batch-addr', at(batch), '--advisor-addr', at(advisor),
    '--predictor-addr', at(predictor), '--predictor-http-addr', at(predictorHttp), '--metrics-addr', at(metrics),
    '--http-addr', at(http), '--ui-dir', UI_DIST,
  ], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, KILN_HOME: home } });
  child.stdout.setEncoding('utf8');
  child.stderr.setEncoding('utf8');
  let log = '';
  const keepLog = (chunk) => (log += chunk);
  child.stdout.on('data', keepLog);
  child.stderr.on('data', keepLog);

  let url;
  try {
    [, url] = await waitForOutput(child, /\bui:\s+(http:\/\/\S+?)\/?\s/, 120_000);
  } catch (error) {
    if (child.exitCode === null) child.kill('SIGKILL');
    await rm(home, { recursive: true, force: true });
    throw error;
  }
  const credentials = await readFile(join(home, 'credentials.toml'), 'utf8');
  const token = /^token\s*=\s*"([^"]+)"/m.exec(credentials)?.[1];
  if (!token) throw new Error(`no token in ${home}/credentials.toml`);

  /** Runs the kiln CLI against this instance; returns stdout and stderr. */
  async function cli(args, { env = {}, input } = {}) {
    const options = { env: { ...process.env, KILN_HOME: home, ...env }, maxBuffer: 16 << 20 };
    if (input === undefined) return run(KILN_BIN, args, options);
    return new Promise((resolve, reject) => {
      const proc = execFile(KILN_BIN, args, options, (error, stdout, stderr) => (error ? reject(Object.assign(error, { stdout, stderr })) : resolve({ stdout, stderr })));
      proc.stdin.end(input);
    });
  }

  /** Calls the HTTP API as a script would (bearer token); returns { status, body }. */
  async function api(service, method, request = {}, bearer = token) {
    const response = await fetch(`${url}/api/v1/rpc/${service}/${method}`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${bearer}`, 'Content-Type': 'application/json', 'X-Kiln-Csrf': '1' },
      body: JSON.stringify(request),
    });
    const text = await response.text();
    let body;
    try {
      body = JSON.parse(text);
    } catch {
      body = text;
    }
    return { status: response.status, body };
  }

  /** Calls the API and fails the test on any answer but 200. */
  async function call(service, method, request = {}, bearer = token) {
    const { status, body } = await api(service, method, request, bearer);
    if (status !== 200) throw new Error(`${service}/${method}: ${status} ${JSON.stringify(body)}`);
    return body;
  }

  async function stop() {
    if (child.exitCode === null) {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
      await exited;
      clearTimeout(timer);
    }
    if (process.env.KILN_E2E_KEEP === '1') console.log(`kiln home kept at ${home}`);
    else await rm(home, { recursive: true, force: true });
  }

  return { home, url, token, predictorUrl: `http://${at(predictorHttp)}`, cli, api, call, stop, log: () => log };
}

/** Submits a job with the CLI (no code) and returns its id. */
export async function submit(kiln, command, { name, project, cpu = '0.1', token } = {}) {
  const args = ['run', '--no-code', '--cpu', cpu, '--mem', '64M'];
  if (name) args.push('--name', name);
  if (project) args.push('--project', project);
  const env = token ? { KILN_TOKEN: token } : {};
  const { stdout, stderr } = await kiln.cli([...args, '--', ...command], { env });
  const id = /job (\S+) submitted/.exec(stderr)?.[1] ?? stdout.trim().split(/\s+/).pop();
  if (!id) throw new Error(`no job id in: ${stdout} ${stderr}`);
  return id;
}

/** Polls a job through the API until it is in `state` (or any end state, which fails). */
export async function waitForJob(kiln, id, state = 'JOB_STATE_SUCCEEDED') {
  for (;;) {
    const job = await kiln.call('JobService', 'GetJob', { jobId: id });
    if (job.state === state) return job;
    if (['JOB_STATE_SUCCEEDED', 'JOB_STATE_FAILED', 'JOB_STATE_STOPPED', 'JOB_STATE_LOST'].includes(job.state)) {
      throw new Error(`job ${id} ended ${job.state}, not ${state}: ${job.reason}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}
