// The Runs table with 10,000 runs: only the rows in view are in the DOM, scrolling and the
// keyboard reach the oldest run, and a filter on config narrows all of them. A log of 100,000
// lines: all of them come over the stream, a few dozen are in the DOM.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { launch, login, newPage } from './browser.mjs';
import { startKiln, submit, waitForJob } from './kiln.mjs';

const RUNS = 10_000;
/** CreateRun calls in flight at once. */
const PARALLEL = 32;

describe('scale', () => {
  let kiln;
  let browser;
  let first;
  let last;
  before(async () => {
    kiln = await startKiln();
    browser = await launch();
    let next = 0;
    await Promise.all(Array.from({ length: PARALLEL }, async () => {
      while (next < RUNS) {
        const index = next++;
        await kiln.call('JobService', 'CreateRun', { name: `run-${index}`, project: 'default' });
      }
    }));
    // Made in parallel: the list's own order says which came first and last.
    const ids = (await kiln.call('JobService', 'ListJobs', { all: true, everyone: true, limit: RUNS })).jobs.map((job) => job.id);
    assert.equal(ids.length, RUNS);
    last = ids[0];
    first = ids[RUNS - 1];
    // A config value on a few runs, to filter on.
    for (const [i, id] of [ids[10], ids[20], ids[30]].entries()) {
      await kiln.call('JobService', 'UpdateRun', { jobId: id, config: { lr: { floatValue: 0.1 * (i + 1) } } });
    }
  });
  after(async () => {
    await browser?.close();
    await kiln?.stop();
  });

  it('keeps only the visible rows of 10,000 in the DOM', async () => {
    const page = await newPage(browser);
    await login(page, kiln);
    await page.waitForFunction((n) => document.querySelector('[data-testid="run-count"]')?.textContent === `${n} of ${n} runs`, RUNS, { timeout: 60_000 });
    const rows = page.locator('tr[data-job-id]');
    assert.ok((await rows.count()) < 100, `${await rows.count()} rows in the DOM`);
    // Newest first: the last run made is at the top, the first at the bottom.
    assert.equal(await rows.first().getAttribute('data-job-id'), last);
    await page.getByTestId('runs-viewport').evaluate((viewport) => (viewport.scrollTop = viewport.scrollHeight));
    await page.locator(`tr[data-job-id="${first}"]`).waitFor();
    assert.ok((await rows.count()) < 100);

    // The keyboard: Home goes back to the newest, End to the oldest, Enter opens it.
    await page.locator(`tr[data-job-id="${first}"]`).focus();
    await page.keyboard.press('Home');
    await page.locator(`tr[data-job-id="${last}"]`).and(page.locator(':focus')).waitFor();
    await page.keyboard.press('ArrowDown');
    await page.keyboard.press('End');
    await page.locator(`tr[data-job-id="${first}"]`).and(page.locator(':focus')).waitFor();
    await page.keyboard.press('Space');
    assert.equal(await page.getByTestId('compare').textContent(), 'Compare (1)');
    await page.keyboard.press('Enter');
    await page.waitForURL(`${kiln.url}/runs/${first}`);

    await page.goBack();
    await page.getByTestId('filter').fill('lr>=0.2');
    await page.waitForFunction((n) => document.querySelector('[data-testid="run-count"]')?.textContent === `2 of ${n} runs`, RUNS);
    assert.deepEqual(page.errors, []);
  });

  it('streams a log of 100,000 lines into a virtualised view', async () => {
    const id = await submit(kiln, ['seq', '1', '100000'], { name: 'lines' });
    await waitForJob(kiln, id);
    const page = await newPage(browser);
    await login(page, kiln);
    await page.goto(`${kiln.url}/runs/${id}`);
    const logs = page.getByTestId('logs');
    await page.waitForFunction(() => document.querySelector('[data-testid="logs"]')?.dataset.lines === '100000', null, { timeout: 120_000 });
    const rendered = await logs.locator('[data-seq]').count();
    assert.ok(rendered > 10 && rendered < 200, `${rendered} lines in the DOM`);
    // Following: the view is at the end.
    await logs.locator('[data-seq]', { hasText: /^100000$/ }).waitFor();
    await page.getByTestId('log-search').fill('99999');
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="logs"] [data-seq]').length === 1);
    assert.equal(await logs.locator('[data-seq]').textContent(), '99999');
    await page.getByTestId('log-search').fill('');
    await logs.evaluate((element) => (element.scrollTop = 0));
    await logs.locator('[data-seq]', { hasText: /^1$/ }).waitFor();
    assert.equal(await page.getByTestId('log-follow').isChecked(), false);
    assert.deepEqual(page.errors, []);
  });
});
