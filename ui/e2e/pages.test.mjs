// The remaining pages render for the admin (and are screenshotted), the dark theme, signing out,
// a lost session sending the user to the login page, and `kiln ui`'s single-use link.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { assertAccessible, launch, login, newPage, screenshot } from './browser.mjs';
import { startKiln, submit, waitForJob } from './kiln.mjs';

describe('pages', () => {
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

  it('renders sweeps, services, models and admin', async () => {
    await kiln.cli(['quota', 'set', 'global', '--running-jobs', '50', '--queued-jobs', '1000']);
    await kiln.cli(['user', 'create', 'ada']);
    await kiln.cli(['project', 'create', 'vision']);
    await kiln.cli(['project', 'add-member', 'vision', 'ada', '--role', 'maintainer']);
    const page = await newPage(browser);
    await login(page, kiln.url, kiln.token);
    for (const [path, name, ready] of [
      ['/sweeps', 'sweeps-empty', 'No sweeps'],
      ['/services', 'services-empty', 'No inference services'],
    ]) {
      await page.goto(`${kiln.url}${path}`);
      await page.getByText(ready).waitFor();
      await screenshot(page, name);
      await assertAccessible(page);
    }
    // A model registered from a job's outputs, twice.
    const job = await submit(kiln, ['sh', '-c', 'echo weights > "$KILN_OUTPUTS/model.bin"'], { name: 'train-resnet' });
    await waitForJob(kiln, job);
    await kiln.cli(['model', 'register', 'resnet', '--from', job, '--tag', 'stage=e2e', '--description', 'first']);
    await kiln.cli(['model', 'register', 'resnet', '--from', job, '--alias', 'production', '--description', 'second']);
    await page.goto(`${kiln.url}/models`);
    await page.getByRole('button', { name: 'resnet' }).click();
    const versions = page.getByTestId('model-versions').locator('tbody tr');
    await versions.first().waitFor();
    assert.equal(await versions.count(), 2);
    assert.match(await versions.first().textContent(), /v2.*production/);
    await screenshot(page, 'models');
    await assertAccessible(page);

    await page.getByRole('link', { name: 'Admin' }).click();
    await page.getByTestId('users').locator('td', { hasText: 'admin' }).first().waitFor();
    await page.getByTestId('projects').locator('td', { hasText: 'ada (maintainer)' }).waitFor();
    await page.getByTestId('quotas').locator('td', { hasText: 'global' }).waitFor();
    await screenshot(page, 'admin');
    await assertAccessible(page);
    assert.deepEqual(page.externalRequests, []);
    assert.deepEqual(page.errors, []);
  });

  it('switches to the dark theme and remembers it', async () => {
    await submit(kiln, ['sh', '-c', 'echo dark'], { name: 'dark-theme' });
    const page = await newPage(browser);
    await login(page, kiln.url, kiln.token);
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'light');
    await page.getByTestId('theme-toggle').click();
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark');
    await page.reload();
    await page.getByTestId('runs-table').waitFor();
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark');
    const background = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    assert.equal(background, 'rgb(13, 17, 23)');
    await screenshot(page, 'runs-dark');
    await assertAccessible(page);
  });

  it('follows the system\'s dark preference until the toggle says otherwise', async () => {
    const page = await newPage(browser, { colorScheme: 'dark' });
    await login(page, kiln.url, kiln.token);
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark');
    // From the system's choice, the toggle picks the other theme.
    await page.getByTestId('theme-toggle').click();
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'light');
    await assertAccessible(page);
  });

  it('sends the user to the login page when the session is gone', async () => {
    const page = await newPage(browser);
    await login(page, kiln.url, kiln.token);
    await page.context().clearCookies();
    // The next poll of the Runs table gets a 401.
    await page.waitForURL(`${kiln.url}/login`, { timeout: 15_000 });
    await login(page, kiln.url, kiln.token);
    await page.getByTestId('logout').click();
    await page.waitForURL(`${kiln.url}/login`);
    await page.goto(`${kiln.url}/batches`);
    await page.waitForURL(`${kiln.url}/login`);
  });

  it('signs in once with `kiln ui --print-url`', async () => {
    const { stdout } = await kiln.cli(['ui', '--print-url']);
    const link = stdout.trim().split('\n').pop();
    assert.match(link, /\/api\/v1\/login\/code\?code=/);
    const page = await newPage(browser);
    await page.goto(link);
    await page.waitForURL(`${kiln.url}/`);
    await page.getByTestId('runs-table').waitFor();
    // A used code is refused, and the login page says why.
    const second = await newPage(browser);
    await second.goto(link);
    await second.waitForURL(/\/login\?error=/);
    await second.getByTestId('login-link-error').waitFor();
  });
});
