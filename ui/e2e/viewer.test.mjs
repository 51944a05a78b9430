// A project's viewer reads a run but gets no Stop button, and the API refuses them StopJob;
// the admin sees the button and stops the job with it.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { assertAccessible, launch, login, newPage, screenshot } from './browser.mjs';
import { startKiln, submit } from './kiln.mjs';

describe('roles', () => {
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

  it('hides Stop from a viewer, whom the API refuses with 403', async () => {
    const created = await kiln.cli(['user', 'create', 'vera']);
    const viewerToken = created.stdout.trim().split('\n').pop().trim();
    assert.match(viewerToken, /\S{16,}/);
    await kiln.cli(['project', 'create', 'vision']);
    await kiln.cli(['project', 'add-member', 'vision', 'vera', '--role', 'viewer']);
    const id = await submit(kiln, ['sleep', '300'], { name: 'long', project: 'vision' });

    const viewer = await newPage(browser);
    await login(viewer, kiln, viewerToken);
    await viewer.locator(`tr[data-job-id="${id}"]`).waitFor({ timeout: 30_000 });
    await viewer.goto(`${kiln.url}/runs/${id}`);
    await viewer.getByTestId('run-state').and(viewer.locator('[data-state="RUNNING"]')).waitFor({ timeout: 60_000 });
    assert.equal(await viewer.getByTestId('stop').count(), 0);
    assert.equal(await viewer.getByTestId('rerun').count(), 0);
    // No Admin link either.
    assert.equal(await viewer.getByRole('link', { name: 'Admin' }).count(), 0);
    await screenshot(viewer, 'run-viewer');
    await assertAccessible(viewer);

    const forced = await kiln.api('JobService', 'StopJob', { jobId: id }, viewerToken);
    assert.equal(forced.status, 403);
    assert.equal(forced.body.code, 'permission_denied');

    // A member may stop their own job, not another's (the admin's here).
    const member = (await kiln.cli(['user', 'create', 'mia'])).stdout.trim().split('\n').pop().trim();
    await kiln.cli(['project', 'add-member', 'vision', 'mia', '--role', 'member']);
    const own = await submit(kiln, ['sleep', '300'], { name: 'mine', project: 'vision', token: member });
    const page = await newPage(browser);
    await login(page, kiln, member);
    await page.goto(`${kiln.url}/runs/${own}`);
    await page.getByTestId('stop').waitFor();
    await page.goto(`${kiln.url}/runs/${id}`);
    await page.getByTestId('run-state').and(page.locator('[data-state="RUNNING"]')).waitFor();
    assert.equal(await page.getByTestId('stop').count(), 0);
    // The User column names the member's own runs.
    await page.goto(`${kiln.url}/?q=user:mia`);
    await page.locator(`tr[data-job-id="${own}"]`).waitFor();
    assert.equal(await page.locator('tr[data-job-id]').count(), 1);
    await page.goto(`${kiln.url}/runs/${own}`);
    await page.getByTestId('stop').click();
    await page.getByTestId('run-state').and(page.locator('[data-state="STOPPED"]')).waitFor({ timeout: 60_000 });

    const admin = await newPage(browser);
    await login(admin, kiln);
    await admin.goto(`${kiln.url}/runs/${id}`);
    await admin.getByTestId('stop').click();
    await admin.getByTestId('run-state').and(admin.locator('[data-state="STOPPED"]')).waitFor({ timeout: 60_000 });
    assert.deepEqual(viewer.errors, []);
    assert.deepEqual(page.errors, []);
    assert.deepEqual(admin.errors, []);
  });
});
