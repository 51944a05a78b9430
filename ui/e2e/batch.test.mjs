// A batch from the CLI: its page's counters move live until it is DONE, with its dead letter,
// which Retry runs again; the list of batches following a new one from the change feed; Cancel
// from the page.
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { assertAccessible, launch, login, newPage, screenshot } from './browser.mjs';
import { startKiln } from './kiln.mjs';

describe('batches', () => {
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

  it('shows a batch\'s counters moving to DONE, and its dead letter', async () => {
    const created = await kiln.cli([
      'batch', 'create', '--name', 'e2e-batch', '--cpu', '0.25', '--mem', '128M', '--max-workers', '2', '--max-attempts', '1',
      '--', 'sh', '-c', 'sleep 0.2; echo "item $KILN_ITEM"; test "$KILN_ITEM" != bad',
    ]);
    const batchId = created.stdout.trim().split(/\s+/).pop();
    assert.ok(batchId, `no batch id in ${created.stdout} ${created.stderr}`);

    const page = await newPage(browser);
    await login(page, kiln);
    await page.goto(`${kiln.url}/batches/${batchId}`);
    await page.getByTestId('counters').waitFor();
    assert.equal(await page.getByTestId('count-total').textContent(), '0');

    const items = [...Array.from({ length: 19 }, (_, i) => `item-${i + 1}`), 'bad'].join('\n') + '\n';
    const file = join(kiln.home, 'items.txt');
    await writeFile(file, items);
    await kiln.cli(['batch', 'add', batchId, '--from', file]);
    await kiln.cli(['batch', 'seal', batchId]);

    // The page was opened before the items existed: the counters come by polling.
    await page.waitForFunction(() => document.querySelector('[data-testid="count-total"]')?.textContent === '20', null, { timeout: 30_000 });
    await page.getByTestId('batch-state').and(page.locator('[data-state="DONE"]')).waitFor({ timeout: 120_000 });
    assert.equal(await page.getByTestId('count-succeeded').textContent(), '19');
    assert.equal(await page.getByTestId('count-dead').textContent(), '1');
    const dead = page.getByTestId('dead-letters');
    await dead.locator('summary', { hasText: 'bad' }).click();
    await dead.getByTestId('item-logs').filter({ hasText: 'item bad' }).waitFor();
    // What the items used: the spreads and the sizing hint, and each item's own figures.
    await page.getByTestId('sizing-hint').filter({ hasText: 'items used p95' }).waitFor();
    const firstItem = page.getByTestId('items').locator('tbody tr').first();
    assert.match(await firstItem.textContent(), /\d+\.\d\d.*[KM]iB/);
    // The workers the page saw, over time.
    assert.ok(Number(await page.getByTestId('workers-chart').getAttribute('data-points')) > 1);
    // The items' logs searched (BatchLogService, log-ingest): a substring finds the dead
    // attempt's line; a regex over the attempts that succeeded leaves out `bad`'s.
    const search = page.getByTestId('batch-log-search');
    await search.getByTestId('batch-log-pattern').fill('item bad');
    await search.getByTestId('batch-log-pattern').press('Enter');
    const found = page.getByTestId('batch-log-results');
    await found.locator('tbody tr[data-key="bad"]').waitFor();
    assert.equal(await found.locator('tbody tr').count(), 1);
    assert.match(await found.locator('tbody tr').textContent(), /^bad\s*1\s*DEAD\s*item bad$/);
    await search.getByTestId('batch-log-pattern').fill('^item (item-1\\d|bad)$');
    await search.getByTestId('batch-log-regex').check();
    await search.getByTestId('batch-log-attempts').selectOption('succeeded');
    await search.getByTestId('batch-log-submit').click();
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="batch-log-results"] tbody tr').length === 10);
    assert.deepEqual(await found.locator('tbody tr').evaluateAll((rows) => rows.map((row) => row.dataset.key)),
      Array.from({ length: 10 }, (_, i) => `item-1${i}`));
    assert.equal(await page.getByTestId('batch-log-summary').textContent(), '10 matching lines.');
    await found.getByRole('button', { name: 'item-12' }).click();
    await found.getByTestId('item-logs').filter({ hasText: 'item item-12' }).waitFor();
    await screenshot(page, 'batch', { fullPage: true });
    await assertAccessible(page);

    // Retrying the dead item runs it again: the batch is live, then done again (and dead again).
    const before = await kiln.call('BatchService', 'GetBatch', { batchId });
    await page.getByTestId('retry').click();
    assert.equal(await page.getByTestId('retry-result').textContent(), 'Retried 1 dead item.');
    const deadline = Date.now() + 120_000;
    for (;;) {
      const now = await kiln.call('BatchService', 'GetBatch', { batchId });
      if (now.state === 'BATCH_STATE_DONE' && now.finishedAtMs > before.finishedAtMs) {
        assert.equal(now.counts.dead, 1);
        break;
      }
      assert.ok(Date.now() < deadline, `the retried batch never finished again: ${JSON.stringify(now)}`);
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    await page.getByTestId('batch-state').and(page.locator('[data-state="DONE"]')).waitFor();

    await page.goto(`${kiln.url}/batches`);
    await page.locator(`tr[data-batch-id="${batchId}"]`).waitFor();
    await screenshot(page, 'batches');
    await assertAccessible(page);
    assert.deepEqual(page.errors, []);
  });

  it('lists a new batch and its items live, then cancels it from its page', async () => {
    const page = await newPage(browser);
    // The ListBatches calls made, and the watches opened.
    const calls = { list: 0, watch: 0 };
    page.on('request', (request) => {
      const { pathname } = new URL(request.url());
      if (pathname === '/api/v1/rpc/BatchService/ListBatches') calls.list++;
      if (pathname === '/api/v1/stream/BatchService/WatchBatches') calls.watch++;
    });
    await login(page, kiln);
    await page.goto(`${kiln.url}/batches`);
    // The first list has come (the first test's batch, or none); a reload would wipe the marker.
    await page.getByTestId('batches').or(page.getByText('No batches.')).waitFor();
    await page.evaluate(() => (window.__noReload = true));

    const created = await kiln.cli(['batch', 'create', '--name', 'slow', '--cpu', '0.25', '--mem', '128M', '--max-workers', '1', '--', 'sleep', '30']);
    const batchId = created.stdout.trim().split(/\s+/).pop();
    const row = page.locator(`tr[data-batch-id="${batchId}"]`);
    await row.waitFor();
    const file = join(kiln.home, 'slow.txt');
    await writeFile(file, 'a\nb\nc\n');
    await kiln.cli(['batch', 'add', batchId, '--from', file]);
    await row.getByTestId('batch-done').filter({ hasText: '0 / 3' }).waitFor();
    assert.equal(await page.evaluate(() => window.__noReload), true);
    assert.deepEqual(calls, { list: 0, watch: 1 });

    await row.getByRole('link').click();
    await page.waitForURL(`${kiln.url}/batches/${batchId}`);
    await page.waitForFunction(() => document.querySelector('[data-testid="count-total"]')?.textContent === '3');
    await page.getByTestId('cancel').click();
    await page.getByTestId('cancel-confirm').click();
    await page.getByTestId('batch-state').and(page.locator('[data-state="CANCELLED"]')).waitFor();
    assert.equal(await page.getByTestId('cancel').count(), 0);
    assert.deepEqual(page.errors, []);
  });
});
