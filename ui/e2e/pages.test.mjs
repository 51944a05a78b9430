// The remaining pages render for the admin (and are screenshotted), the dark theme, signing out,
// a lost session sending the user to the login page, and `kiln ui`'s login, which signs in only the
// browser that asked for it.
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
    await login(page, kiln);
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
    await page.getByTestId('quotas').locator('tr[data-scope="global"]').waitFor();
    await screenshot(page, 'admin');
    await assertAccessible(page);
    assert.deepEqual(page.externalRequests, []);
    assert.deepEqual(page.errors, []);
  });

  it('switches to the dark theme and remembers it', async () => {
    await submit(kiln, ['sh', '-c', 'echo dark'], { name: 'dark-theme' });
    const page = await newPage(browser);
    await login(page, kiln);
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
    await login(page, kiln);
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark');
    // From the system's choice, the toggle picks the other theme.
    await page.getByTestId('theme-toggle').click();
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'light');
    await assertAccessible(page);
  });

  it('sends the user to the login page when the session is gone', async () => {
    const page = await newPage(browser);
    await login(page, kiln);
    await page.context().clearCookies();
    // The next poll of the Runs table gets a 401.
    await page.waitForURL(`${kiln.url}/login`, { timeout: 15_000 });
    await login(page, kiln);
    await page.getByTestId('logout').click();
    await page.waitForURL(`${kiln.url}/login`);
    await page.goto(`${kiln.url}/batches`);
    await page.waitForURL(`${kiln.url}/login`);
  });

  it('signs in with `kiln ui` only the browser that asked, once the CLI approves its code', async () => {
    const { stdout, stderr } = await kiln.cli(['ui', '--print-url']);
    const link = stdout.trim().split('\n').pop();
    // The attack: the link opened in another browser (leaked, or sent by someone) signs nothing in.
    const finder = await newPage(browser);
    await finder.goto(link);
    await finder.waitForLoadState('networkidle');
    assert.equal(await signedIn(finder), false, `opening ${link} signed a browser in`);
    assert.equal(link, `${kiln.url}/login?via=cli`);
    assert.match(stderr, /kiln ui --approve CODE/);

    const page = await newPage(browser);
    await page.goto(link);
    const code = (await page.getByTestId('login-code').textContent()).trim();
    assert.match(code, /^[A-Z]{4}-[A-Z]{4}$/);
    const theirs = (await finder.getByTestId('login-code').textContent()).trim();
    assert.notEqual(theirs, code, 'each browser asks for a login of its own');
    await screenshot(page, 'login-code');
    await assertAccessible(page);
    const { stderr: approved } = await kiln.cli(['ui', '--approve', code]);
    assert.match(approved, /^approved/);
    // The control: the browser that asked goes on, signed in.
    await page.waitForURL(`${kiln.url}/`);
    await page.getByTestId('runs-table').waitFor();
    assert.equal(await page.getByTestId('whoami').textContent(), 'admin (admin)');
    // The other browser still waits for its own code, signed out.
    await finder.waitForTimeout(2_500);
    await finder.getByTestId('login-waiting').waitFor();
    assert.equal(await signedIn(finder), false);
    // A replayed approval is refused, saying why.
    await assert.rejects(kiln.cli(['ui', '--approve', code]), /approved already/);
    assert.deepEqual(page.errors, []);
    assert.deepEqual(finder.errors, []);
  });

  it('says what to do when the code was approved by another user', async () => {
    const eve = (await kiln.cli(['user', 'create', 'eve'])).stdout.trim().split('\n').pop().trim();
    const page = await newPage(browser);
    await page.goto(`${kiln.url}/login?via=cli`);
    const code = (await page.getByTestId('login-code').textContent()).trim();
    await kiln.cli(['ui', '--approve', code], { env: { KILN_TOKEN: eve } });
    await assert.rejects(kiln.cli(['ui', '--approve', code]), /approved by another user/);
    // Eve's approval may have signed the page in before ada's cancelled it: that session is revoked.
    await page.waitForURL(/\/login/, { timeout: 15_000 });
    assert.equal(await signedIn(page), false);
  });
});

/** Whether the page's browser has a session (a WhoAmI call from the page is answered). */
async function signedIn(page) {
  const status = await page.evaluate(async () => {
    const response = await fetch('/api/v1/rpc/NodeService/WhoAmI', { method: 'POST', headers: { 'X-Kiln-Csrf': '1' }, body: '{}' });
    return response.status;
  });
  return status === 200;
}
