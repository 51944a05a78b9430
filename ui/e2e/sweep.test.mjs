// A sweep whose trials log their objective through the HTTP API (with their own job token): the
// list of sweeps follows it from the change feed until it finishes; its page shows the best
// trial, the best-so-far curve, parallel coordinates and the trials' runs.
import assert from 'node:assert/strict';
import { chmod, mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { assertAccessible, launch, login, newPage, screenshot } from './browser.mjs';
import { startKiln } from './kiln.mjs';

// A trial: its objective is a made-up function of its knobs, logged at three steps.
const TRIAL_SCRIPT = `#!/bin/sh
lr=$1; batch=$2; opt=$3
for step in 1 2 3; do
  value=$(awk -v lr="$lr" -v b="$batch" -v o="$opt" -v s="$step" 'BEGIN { x = (log(lr) / log(10) + 2.5) ^ 2 + b / 256 + 1 / s; if (o == "sgd") x += 0.3; print x }')
  curl -sf -X POST "$KILN_E2E_URL/api/v1/rpc/LogService/WriteMetrics" \\
    -H "Authorization: Bearer $KILN_TOKEN" -H 'X-Kiln-Csrf: 1' -H 'Content-Type: application/json' \\
    -d "{\\"jobId\\":\\"$KILN_JOB_ID\\",\\"points\\":[{\\"key\\":\\"val/loss\\",\\"step\\":$step,\\"value\\":$value}]}" >/dev/null || exit 1
  echo "step $step val/loss $value"
done
`;

describe('sweeps', () => {
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

  it('shows a finished sweep\'s best trial, curve, coordinates and trials', async () => {
    // Not in KILN_HOME (0700): run as root, kiln up's trials are uids of their own that read it.
    const shared = await mkdtemp(join(tmpdir(), 'kiln-trial-'));
    await chmod(shared, 0o755);
    const script = join(shared, 'trial.sh');
    await writeFile(script, TRIAL_SCRIPT, { mode: 0o755 });
    const spec = join(kiln.home, 'sweep.yaml');
    await writeFile(spec, [
      'name: e2e-sweep',
      'objective: {metric: val/loss, goal: minimize}',
      'algorithm: {name: random, seed: 1}',
      'early-stop: {name: none}',
      'budget: {max-trials: 6, max-parallel: 3}',
      'parameters:',
      '  lr: {type: float, min: 1.0e-4, max: 1.0e-1, log: true}',
      '  batch: {type: int, values: [32, 64, 128]}',
      '  opt: {type: categorical, values: [sgd, adam]}',
      `trial: {command: ["sh", "${script}", "\${lr}", "\${batch}", "\${opt}"], cpu: 0.25, mem: 128M, env: {KILN_E2E_URL: "${kiln.url}"}}`,
      '',
    ].join('\n'));
    const page = await newPage(browser);
    // The ListSweeps calls made, and the watches opened.
    const calls = { list: 0, watch: 0 };
    page.on('request', (request) => {
      const { pathname } = new URL(request.url());
      if (pathname === '/api/v1/rpc/SweepService/ListSweeps') calls.list++;
      if (pathname === '/api/v1/stream/SweepService/WatchSweeps') calls.watch++;
    });
    await login(page, kiln);
    await page.goto(`${kiln.url}/sweeps`);
    await page.getByText('No sweeps.').waitFor();
    // A marker that a reload would wipe.
    await page.evaluate(() => (window.__noReload = true));
    const created = await kiln.cli(['sweep', 'create', '-f', spec, '--no-code']);
    const sweepId = created.stdout.trim().split(/\s+/).pop();

    // The new sweep, then its end, come to the open list without a reload or a ListSweeps call.
    const row = page.locator(`tr[data-sweep-id="${sweepId}"]`);
    await row.waitFor();
    await page.waitForFunction((id) => document.querySelector(`tr[data-sweep-id="${id}"] [data-testid="sweep-state"]`)?.textContent === 'finished', sweepId, { timeout: 120_000 });
    assert.match(await row.textContent(), /6 ok/);
    assert.equal(await page.evaluate(() => window.__noReload), true);
    assert.deepEqual(calls, { list: 0, watch: 1 });
    await page.getByRole('link', { name: 'e2e-sweep' }).click();
    await page.waitForURL(`${kiln.url}/sweeps/${sweepId}`);
    const trials = page.getByTestId('trials').locator('tbody tr');
    await page.waitForFunction(() => document.querySelector('[data-testid="sweep-state"]')?.textContent === 'finished', null, { timeout: 120_000 });
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="trials"] td[data-testid="trial-value"]:not(:empty)').length === 6);
    assert.equal(await trials.count(), 6);
    // The best trial's value is the least of the trials'.
    const values = (await page.getByTestId('trials').locator('td[data-testid="trial-value"]').allTextContents()).map(Number);
    const best = Number(await page.getByTestId('best-value').textContent());
    assert.equal(best, Math.min(...values));
    await page.locator('[data-key="best-so-far"][data-drawn="true"]').waitFor();
    assert.equal(await page.getByTestId('parallel-coords').locator('polyline').count(), 6);
    await screenshot(page, 'sweep', { fullPage: true });
    await assertAccessible(page);
    await page.goto(`${kiln.url}/sweeps`);
    await page.getByTestId('sweeps').waitFor();
    await screenshot(page, 'sweeps');
    await assertAccessible(page);
    assert.deepEqual(page.errors, []);
  });
});
