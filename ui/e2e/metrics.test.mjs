// A run with 1,000,000 points in one series drawn as one chart, zoomed, and three runs compared.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { assertAccessible, launch, login, newPage, screenshot } from './browser.mjs';
import { startKiln } from './kiln.mjs';

/** Points per WriteMetrics call: log-ingest takes at most 4 MiB of protobuf a request. */
const CHUNK = 50_000;

/** Writes `count` points of `key` (a decaying curve with noise; one NaN), 10 ms apart, in chunks. */
async function writeSeries(kiln, jobId, key, count, scale = 1) {
  const start = Date.now() - count * 10;
  for (let first = 0; first < count; first += CHUNK) {
    const n = Math.min(CHUNK, count - first);
    const steps = Array.from({ length: n }, (_, i) => first + i);
    const values = steps.map((step) => (step === 7 ? 'NaN' : scale * (Math.exp(-step / (count / 4)) + 0.05 * Math.sin(step))));
    const timestampsMs = steps.map((step) => start + step * 10);
    await kiln.call('LogService', 'WriteMetrics', { jobId, columns: { keys: [key], keyIndex: new Array(n).fill(0), steps, values, timestampsMs } });
  }
}

describe('metrics', () => {
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

  it('draws a series of 1,000,000 points and zooms into it', async () => {
    const run = await kiln.call('JobService', 'CreateRun', { name: 'million', project: 'default' });
    await writeSeries(kiln, run.id, 'train/loss', 1_000_000);
    await kiln.call('JobService', 'FinishRun', { jobId: run.id, exitCode: 0 });

    const page = await newPage(browser);
    await login(page, kiln);
    await page.goto(`${kiln.url}/runs/${run.id}`);
    const chart = page.locator('[data-key="train/loss"]');
    await chart.scrollIntoViewIfNeeded();
    await chart.and(page.locator('[data-drawn="true"]')).waitFor({ timeout: 60_000 });
    const points = Number(await chart.getAttribute('data-points'));
    const width = await chart.locator('canvas').evaluate((canvas) => canvas.clientWidth);
    // One bucket per pixel of the chart, not a million points.
    assert.ok(points > 100 && points <= width, `drew ${points} points on ${width} px`);
    assert.equal(await chart.getByTestId('total-points').getAttribute('data-total'), '1000000');
    await screenshot(page, 'run-million', { fullPage: true });

    // Pointing at the chart reads the bucket under the cursor.
    const box = await chart.locator('.u-over').boundingBox();
    await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
    await page.waitForFunction(() => /^step \d+: /.test(document.querySelector('[data-key="train/loss"] [data-testid="chart-value"]')?.textContent ?? ''));

    // Dragging across the middle asks for that step range only.
    await page.mouse.move(box.x + box.width * 0.4, box.y + box.height / 2);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.5, box.y + box.height / 2, { steps: 5 });
    await page.mouse.up();
    await chart.getByTestId('reset-zoom').waitFor();
    await chart.and(page.locator('[data-drawn="true"]')).waitFor();
    const zoomedTotal = Number(await chart.getByTestId('total-points').getAttribute('data-total'));
    assert.ok(zoomedTotal > 50_000 && zoomedTotal < 200_000, `the zoomed range holds ${zoomedTotal} points`);
    await screenshot(page, 'run-metrics', { fullPage: true });
    await assertAccessible(page);
    assert.deepEqual(page.errors, []);
  });

  it('compares three runs, smoothed, on a step and a time axis', async () => {
    const ids = [];
    for (const [i, name] of ['alpha', 'beta', 'gamma'].entries()) {
      const run = await kiln.call('JobService', 'CreateRun', { name: `compare-${name}`, project: 'default' });
      await kiln.call('JobService', 'UpdateRun', { jobId: run.id, config: { lr: { floatValue: 0.1 / (i + 1) } } });
      await writeSeries(kiln, run.id, 'loss', 2_000, i + 1);
      ids.push(run.id);
    }
    const page = await newPage(browser);
    await login(page, kiln);
    for (const id of ids) await page.locator(`tr[data-job-id="${id}"] [data-testid="select"]`).check();
    // The config and the latest metric values are columns of the table.
    await page.locator(`tr[data-job-id="${ids[0]}"] td[data-metric="loss"]`).filter({ hasText: /\d/ }).waitFor();
    // The best loss is the series' lowest value, as the table shows numbers (4 digits).
    const lowest = (scale) => Math.min(...Array.from({ length: 2_000 }, (_, step) => (step === 7 ? Infinity : scale * (Math.exp(-step / 500) + 0.05 * Math.sin(step)))));
    const shown = (value) => Number(value.toPrecision(4)).toString();
    assert.equal(await page.locator(`tr[data-job-id="${ids[0]}"] td[data-best="loss"]`).textContent(), shown(lowest(1)));
    // Sorting by it puts the lowest first: the run scaled by 3 dips furthest below zero.
    await page.getByTestId('sort-best-loss').click();
    const order = await page.locator('tr[data-job-id]').evaluateAll((rows) => rows.slice(0, 3).map((row) => row.dataset.jobId));
    assert.deepEqual(order, [ids[2], ids[1], ids[0]]);
    await screenshot(page, 'runs-selected');
    await page.getByTestId('compare').click();
    await page.waitForURL(/\/compare\?ids=/);
    assert.deepEqual(new URL(page.url()).searchParams.get('ids').split(',').sort(), [...ids].sort());
    assert.equal(await page.getByTestId('legend').locator('li').count(), 3);
    const chart = page.locator('[data-testid="compare-chart"][data-key="loss"]');
    await chart.and(page.locator('[data-drawn="true"]')).waitFor({ timeout: 30_000 });
    assert.equal(await chart.getAttribute('data-runs'), '3');
    await page.getByTestId('smoothing').fill('0.9');
    await chart.and(page.locator('[data-drawn="true"]')).waitFor();
    await screenshot(page, 'compare');
    await assertAccessible(page);
    await page.getByTestId('x-time').check();
    await chart.and(page.locator('[data-drawn="true"]')).waitFor();
    // Points 10 ms apart: on a time axis they stay apart.
    assert.ok(Number(await chart.getAttribute('data-points')) > 500);
    assert.deepEqual(page.errors, []);
  });
});
