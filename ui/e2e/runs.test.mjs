// Signing in, the Runs table following jobs live (from the change feed, or polling without
// one), and a run's live logs.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { assertAccessible, launch, login, loginWithToken, newPage, screenshot } from './browser.mjs';
import { startKiln, submit } from './kiln.mjs';

describe('runs', () => {
  let kiln;
  let browser;
  before(async () => {
    kiln = await startKiln();
    browser = await launch();
  });
  after(async () => {
    await browser?.close();
    await kiln?.stop();
  });

  it('refuses a wrong token and signs in with the right one', async () => {
    const page = await newPage(browser);
    await page.goto(`${kiln.url}/`);
    // Not signed in: any page sends the user to the login form.
    await page.waitForURL(`${kiln.url}/login`);
    await page.getByLabel('API token').fill('kiln_not_a_token');
    await page.getByTestId('login-submit').click();
    await page.getByTestId('login-error').waitFor();
    await screenshot(page, 'login');
    await assertAccessible(page);
    await loginWithToken(page, kiln.url, kiln.token);
    assert.equal(await page.getByTestId('whoami').textContent(), 'admin (admin)');
    assert.deepEqual(page.errors, []);
  });

  it('shows a job going RUNNING then SUCCEEDED without a reload', async () => {
    const page = await newPage(browser);
    await login(page, kiln);
    // A marker that a reload would wipe.
    await page.evaluate(() => (window.__noReload = true));
    const id = await submit(kiln, ['sh', '-c', 'echo hello; sleep 5; echo done'], { name: 'hello' });
    const state = page.locator(`tr[data-job-id="${id}"] [data-testid="state"]`);
    await state.and(page.locator('[data-state="RUNNING"]')).waitFor({ timeout: 60_000 });
    await screenshot(page, 'runs');
    await assertAccessible(page);
    await state.and(page.locator('[data-state="SUCCEEDED"]')).waitFor({ timeout: 60_000 });
    assert.equal(await page.evaluate(() => window.__noReload), true);

    // The filter box narrows the table.
    await page.getByTestId('filter').fill('state:failed');
    await page.getByTestId('runs-empty').waitFor();
    await page.getByTestId('filter').fill('state:succeeded name:hello');
    await page.locator(`tr[data-job-id="${id}"]`).waitFor();

    // Re-run submits the same spec as a new job, and opens it.
    await page.locator(`tr[data-job-id="${id}"] [data-testid="run-link"]`).click();
    await page.getByTestId('rerun').click();
    await page.waitForURL((url) => url.pathname.startsWith('/runs/') && !url.pathname.endsWith(id));
    await page.getByTestId('logs').locator('[data-seq]', { hasText: 'done' }).waitFor({ timeout: 60_000 });
    assert.deepEqual(page.errors, []);
  });

  it('follows the change feed: new runs and their states come without a reload or polling', async () => {
    const page = await newPage(browser);
    // The ListJobs limits asked for, and the watches opened.
    const calls = { list: [], watch: 0 };
    page.on('request', (request) => {
      const { pathname } = new URL(request.url());
      if (pathname === '/api/v1/rpc/JobService/ListJobs') calls.list.push(JSON.parse(request.postData()).limit);
      if (pathname === '/api/v1/stream/JobService/WatchJobs') calls.watch++;
    });
    await login(page, kiln);
    await page.evaluate(() => (window.__noReload = true));
    const id = await submit(kiln, ['sh', '-c', 'sleep 3'], { name: 'fed' });
    const state = page.locator(`tr[data-job-id="${id}"] [data-testid="state"]`);
    await state.and(page.locator('[data-state="RUNNING"]')).waitFor({ timeout: 60_000 });
    await state.and(page.locator('[data-state="SUCCEEDED"]')).waitFor({ timeout: 60_000 });
    // A run (CreateRun, FinishRun) as well, and the table's count follows.
    const before = await page.getByTestId('run-count').textContent();
    const run = await kiln.call('JobService', 'CreateRun', { name: 'fed-run', project: 'default' });
    const runState = page.locator(`tr[data-job-id="${run.id}"] [data-testid="state"]`);
    await runState.and(page.locator('[data-state="RUNNING"]')).waitFor({ timeout: 30_000 });
    assert.notEqual(await page.getByTestId('run-count').textContent(), before);
    await kiln.call('JobService', 'FinishRun', { jobId: run.id, exitCode: 3 });
    await runState.and(page.locator('[data-state="FAILED"]')).waitFor({ timeout: 30_000 });
    // A few polling intervals more: the page asked for no list but its first screenfuls, once.
    await page.waitForTimeout(5_000);
    assert.equal(await page.evaluate(() => window.__noReload), true);
    assert.deepEqual(calls, { list: [200], watch: 1 });
    assert.deepEqual(page.errors, []);
  });

  it('polls ListJobs against an api without the change feed', async () => {
    const page = await newPage(browser);
    let lists = 0;
    page.on('request', (request) => {
      if (new URL(request.url()).pathname === '/api/v1/rpc/JobService/ListJobs') lists++;
    });
    // What an api from before WatchJobs answers.
    const body = JSON.stringify({ code: 'not_found', message: 'no method JobService/WatchJobs (see proto/kiln/v1)' });
    await page.route((url) => url.pathname === '/api/v1/stream/JobService/WatchJobs', (route) => route.fulfill({ status: 404, contentType: 'application/json', body }));
    await login(page, kiln);
    const run = await kiln.call('JobService', 'CreateRun', { name: 'polled', project: 'default' });
    const state = page.locator(`tr[data-job-id="${run.id}"] [data-testid="state"]`);
    await state.and(page.locator('[data-state="RUNNING"]')).waitFor({ timeout: 30_000 });
    await kiln.call('JobService', 'FinishRun', { jobId: run.id, exitCode: 0 });
    await state.and(page.locator('[data-state="SUCCEEDED"]')).waitFor({ timeout: 30_000 });
    assert.ok(lists >= 2, `${lists} ListJobs calls`);
    assert.deepEqual(page.errors, []);
  });

  it('says why a queued job waits, and stops it', async () => {
    const page = await newPage(browser);
    await login(page, kiln);
    // More CPU than the machine has: it stays queued.
    const id = await submit(kiln, ['true'], { name: 'too-big', cpu: '512' });
    await page.goto(`${kiln.url}/runs/${id}`);
    await page.getByTestId('run-state').and(page.locator('[data-state="QUEUED"]')).waitFor();
    const explanation = page.getByTestId('explanation');
    await explanation.waitFor();
    // The scheduler's own words name what the job asks for.
    assert.match(await explanation.textContent(), /512 CPU/);
    await screenshot(page, 'run-queued');
    await page.getByTestId('stop').click();
    await page.getByTestId('run-state').and(page.locator('[data-state="STOPPED"]')).waitFor();
    await explanation.waitFor({ state: 'detached' });
    assert.deepEqual(page.errors, []);
  });

  it('takes a gang job\'s nodes over the HTTP API, and refuses too many', async () => {
    // The gang itself runs in the e2e tests (tests/e2e/tests/gang.rs): this `kiln up` runs as
    // root, whose process jobs are isolated from one another, so its runner refuses gangs.
    const resources = { cpuMillis: 100, memoryBytes: String(64 << 20) };
    const { job } = await kiln.call('JobService', 'SubmitJob', {
      spec: { name: 'gang', command: ['true'], resources, nodes: 2 },
      idempotencyKey: `http-gang-${Date.now()}`,
    });
    assert.equal(job.spec.nodes, 2);
    assert.equal((await kiln.call('JobService', 'GetJob', { jobId: job.id })).spec.nodes, 2);
    const refused = await kiln.api('JobService', 'SubmitJob', { spec: { command: ['true'], resources, nodes: 65 } });
    assert.equal(refused.status, 400, JSON.stringify(refused.body));
    assert.match(refused.body.message, /nodes/);
  });

  it('follows a run\'s logs live, in colour', async () => {
    const page = await newPage(browser);
    await login(page, kiln);
    const script = 'for i in $(seq 1 30); do printf "\\033[32mline\\033[0m %s\\n" $i; sleep 0.2; done';
    const id = await submit(kiln, ['sh', '-c', script], { name: 'logger' });
    await page.goto(`${kiln.url}/runs/${id}`);
    const logs = page.getByTestId('logs');
    await logs.waitFor();
    // Lines arrive while the page is open: the first is there before the last is printed.
    await logs.locator('[data-seq]').first().waitFor({ timeout: 60_000 });
    await logs.locator('[data-seq]', { hasText: 'line 30' }).waitFor({ timeout: 60_000 });
    assert.equal(await logs.getAttribute('data-lines'), '30');
    const green = logs.locator('[data-seq] span.ansi-fg-2', { hasText: 'line' }).first();
    assert.equal(await green.textContent(), 'line');
    await page.getByTestId('run-state').and(page.locator('[data-state="SUCCEEDED"]')).waitFor({ timeout: 60_000 });
    await page.getByTestId('log-search').fill('line 2');
    // "line 2" and "line 20".."line 29".
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="logs"] [data-seq]').length === 11);
    await page.getByTestId('log-search').fill('');
    // The runner records the job's CPU and memory: they are charted apart, under System, each
    // drawn once scrolled into view.
    const system = page.getByTestId('system-charts').locator('[data-testid="chart"]');
    await system.first().waitFor({ timeout: 30_000 });
    const count = await system.count();
    assert.ok(count >= 1);
    for (let i = 0; i < count; i++) {
      await system.nth(i).scrollIntoViewIfNeeded();
      await system.nth(i).and(page.locator('[data-drawn="true"]')).waitFor();
    }
    assert.ok((await system.first().getAttribute('data-key')).startsWith('sys/'));
    await screenshot(page, 'run', { fullPage: true });
    await assertAccessible(page);
    assert.deepEqual(page.externalRequests, []);
    assert.deepEqual(page.errors, []);
  });
});
