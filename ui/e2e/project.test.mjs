// The project page's writes, each driven through its form against a real kiln and checked with
// the CLI or the API: members and roles, secrets (never shown), tokens (shown once, revoked),
// datasets created by upload (the digest is the file's sha256); quotas on the Admin page; and a
// viewer, who sees none of the writes and whom the API refuses each one with 403.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { assertAccessible, launch, login, newPage, screenshot } from './browser.mjs';
import { startKiln } from './kiln.mjs';

const run = promisify(execFile);

describe('project management', () => {
  let kiln;
  let browser;
  let scratch;
  /** Each user's first token, by name. */
  const tokens = {};

  /** Runs the CLI and parses its `-o json` output. */
  async function json(args) {
    return JSON.parse((await kiln.cli([...args, '-o', 'json'])).stdout);
  }

  /** Opens the project page of `vision` as `user`, through the Projects link. */
  async function projectPage(user) {
    const page = await newPage(browser);
    await login(page, kiln, user ? tokens[user] : kiln.token);
    await page.getByRole('link', { name: 'Projects' }).click();
    await page.getByTestId('project-list').getByRole('link', { name: 'vision' }).click();
    await page.getByTestId('members').locator('tr[data-user="maya"]').waitFor();
    return page;
  }

  before(async () => {
    [kiln, browser, scratch] = await Promise.all([startKiln(), launch(), mkdtemp(join(tmpdir(), 'kiln-project-e2e-'))]);
    await kiln.cli(['project', 'create', 'vision']);
    await Promise.all(['maya', 'mia', 'vera', 'ola'].map(async (name) => {
      tokens[name] = (await kiln.cli(['user', 'create', name])).stdout.trim().split('\n').pop().trim();
    }));
    for (const [name, role] of [['maya', 'maintainer'], ['mia', 'member'], ['vera', 'viewer']]) {
      await kiln.cli(['project', 'add-member', 'vision', name, '--role', role]);
    }
  });
  after(async () => {
    await browser?.close();
    await kiln?.stop();
    if (scratch) await rm(scratch, { recursive: true, force: true });
  });

  it('lets a maintainer manage members, secrets and their tokens', async () => {
    const page = await projectPage('maya');
    assert.equal(await page.getByTestId('my-role').textContent().then((text) => text.trim()), 'Your role: maintainer');
    const members = page.getByTestId('members');

    // Add a member, change their role (AddMember again), remove them.
    const form = page.getByTestId('add-member');
    await form.getByLabel('User').fill('ola');
    await form.getByLabel('Role').selectOption({ label: 'viewer' });
    await form.getByRole('button', { name: 'Add member' }).click();
    await members.locator('tr[data-user="ola"]').waitFor();
    assert.deepEqual((await json(['project', 'members', 'vision'])).find((m) => m.user === 'ola'), { user: 'ola', role: 'viewer' });
    await page.getByLabel('Role of ola').selectOption({ label: 'maintainer' });
    await page.getByRole('button', { name: 'Set role of ola' }).click();
    await page.getByRole('button', { name: 'Set role of ola' }).and(page.locator(':disabled')).waitFor();
    assert.equal((await json(['project', 'members', 'vision'])).find((m) => m.user === 'ola').role, 'maintainer');
    await page.getByRole('button', { name: 'Remove ola' }).click();
    await members.locator('tr[data-user="ola"]').waitFor({ state: 'detached' });
    assert.equal((await json(['project', 'members', 'vision'])).some((m) => m.user === 'ola'), false);

    // A secret and a registry's credentials; no value ever reaches the page.
    const secretForm = page.getByTestId('set-secret');
    await secretForm.getByLabel('Name').fill('HF_TOKEN');
    await secretForm.getByLabel('Value').fill('hf-value-never-shown');
    await secretForm.getByRole('button', { name: 'Set secret' }).click();
    await page.getByTestId('secrets').locator('tr[data-secret="HF_TOKEN"]').waitFor();
    assert.equal(await secretForm.getByLabel('Value').inputValue(), '');
    await secretForm.getByLabel('Registry credentials').check();
    await secretForm.getByLabel('Registry', { exact: true }).fill('127.0.0.1:5000');
    await secretForm.getByLabel('Username').fill('robot');
    await secretForm.getByLabel('Password or token').fill('registry-password-never-shown');
    await secretForm.getByRole('button', { name: 'Set secret' }).click();
    await page.getByTestId('secrets').locator('tr[data-secret="registry:127.0.0.1:5000"]').getByText('registry credentials').waitFor();
    let secrets = (await json(['secret', 'ls', '--project', 'vision'])).map((s) => s.name).sort();
    assert.deepEqual(secrets, ['HF_TOKEN', 'registry:127.0.0.1:5000']);
    await page.getByRole('button', { name: 'Delete HF_TOKEN' }).click();
    await page.getByTestId('secrets').locator('tr[data-secret="HF_TOKEN"]').waitFor({ state: 'detached' });
    secrets = (await json(['secret', 'ls', '--project', 'vision'])).map((s) => s.name);
    assert.deepEqual(secrets, ['registry:127.0.0.1:5000']);
    assert.doesNotMatch(await page.content(), /never-shown/);

    // A token narrowed to the project, shown once: it works until it is revoked.
    const tokenForm = page.getByTestId('create-token');
    await tokenForm.getByLabel('Name').fill('ci-vision');
    assert.equal(await tokenForm.getByLabel('Rights').inputValue(), 'ROLE_MAINTAINER');
    await tokenForm.getByRole('button', { name: 'Create token' }).click();
    const secret = await page.getByTestId('new-token-secret').inputValue();
    assert.match(secret, /\S{16,}/);
    await page.getByTestId('tokens').locator('tr[data-token="ci-vision"]').getByText('vision as maintainer').waitFor();
    await screenshot(page, 'project', { fullPage: true });
    await assertAccessible(page);
    const whoami = await kiln.call('NodeService', 'WhoAmI', {}, secret);
    assert.equal(whoami.user, 'maya');
    assert.deepEqual(whoami.memberships.map((m) => [m.project, m.role]), [['vision', 'ROLE_MAINTAINER']]);
    await page.getByRole('button', { name: 'Done' }).click();
    await page.reload();
    await page.getByTestId('tokens').locator('tr[data-token="ci-vision"]').waitFor();
    assert.equal(await page.getByTestId('new-token').count(), 0);
    assert.equal((await page.content()).includes(secret), false);
    await page.getByRole('button', { name: 'Revoke ci-vision' }).click();
    await page.getByTestId('tokens').locator('tr[data-token="ci-vision"]').waitFor({ state: 'detached' });
    assert.equal((await kiln.api('NodeService', 'WhoAmI', {}, secret)).status, 401);
    assert.deepEqual(page.errors, []);
    assert.deepEqual(page.externalRequests, []);
  });

  it('lets a member create a dataset by upload and delete only their own', async () => {
    const data = join(scratch, 'data');
    await mkdir(data, { recursive: true });
    await writeFile(join(data, 'train.csv'), 'x,y\n1,2\n3,4\n');
    await writeFile(join(data, 'labels.txt'), 'cat\ndog\n');
    const archive = join(scratch, 'mnist.tar.gz');
    await run('tar', ['-czf', archive, '-C', data, '.']);
    const sha256 = createHash('sha256').update(await readFile(archive)).digest('hex');
    // A dataset of another user, which a member may not delete.
    await kiln.cli(['dataset', 'create', 'imagenet', '--from', data, '--project', 'vision']);

    const page = await projectPage('mia');
    // A member has no member or secret controls, but reads the secrets' names.
    assert.equal(await page.getByTestId('add-member').count(), 0);
    assert.equal(await page.getByTestId('set-secret').count(), 0);
    await page.getByTestId('secrets').locator('tr[data-secret="registry:127.0.0.1:5000"]').waitFor();
    await page.getByTestId('datasets').locator('tr[data-dataset="imagenet"]').waitFor();
    assert.equal(await page.getByRole('button', { name: 'Delete imagenet' }).count(), 0);

    const form = page.getByTestId('create-dataset');
    await form.getByLabel('Name').fill('mnist');
    await form.getByLabel('Archive (.tar.gz)').setInputFiles(archive);
    await form.getByRole('button', { name: 'Upload' }).click();
    await page.getByTestId('datasets-notice').getByText(`Dataset mnist created (sha256 ${sha256}).`).waitFor();
    await page.getByTestId('datasets').locator('tr[data-dataset="mnist"]').waitFor();
    const listed = (await json(['dataset', 'ls'])).find((d) => d.name === 'mnist');
    assert.equal(listed.digest, sha256);
    assert.equal(listed.created_by, 'mia');
    await screenshot(page, 'project-member');
    await assertAccessible(page);

    await page.getByRole('button', { name: 'Delete mnist' }).click();
    await page.getByTestId('datasets').locator('tr[data-dataset="mnist"]').waitFor({ state: 'detached' });
    assert.deepEqual((await json(['dataset', 'ls'])).map((d) => d.name), ['imagenet']);
    assert.deepEqual(page.errors, []);
  });

  it('shows a viewer none of the writes, and the API refuses each forced one with 403', async () => {
    const page = await projectPage('vera');
    await page.getByTestId('datasets').locator('tr[data-dataset="imagenet"]').waitFor();
    for (const form of ['add-member', 'set-secret', 'create-dataset']) assert.equal(await page.getByTestId(form).count(), 0, form);
    await page.getByTestId('secrets-hidden').waitFor();
    for (const table of ['members', 'datasets']) assert.equal(await page.getByTestId(table).getByRole('button').count(), 0, table);
    assert.equal(await page.getByTestId('members').locator('select').count(), 0);
    // Their own tokens are theirs to make, narrowed to no more than viewer here.
    const rights = await page.getByTestId('create-token').getByLabel('Rights').locator('option').allTextContents();
    assert.deepEqual(rights, ['vision as viewer', 'all yours']);
    assert.equal(await page.getByRole('link', { name: 'Admin' }).count(), 0);
    await screenshot(page, 'project-viewer');
    await assertAccessible(page);
    assert.deepEqual(page.errors, []);

    const viewer = tokens.vera;
    const forced = [
      ['ProjectService', 'AddMember', { project: 'vision', user: 'ola', role: 'ROLE_MEMBER' }],
      ['ProjectService', 'RemoveMember', { project: 'vision', user: 'mia' }],
      ['SecretService', 'ListSecrets', { project: 'vision' }],
      ['SecretService', 'SetSecret', { project: 'vision', name: 'FORCED', value: 'x' }],
      ['SecretService', 'DeleteSecret', { project: 'vision', name: 'registry:127.0.0.1:5000' }],
      ['DatasetService', 'CreateDataset', { project: 'vision', name: 'forced', digest: (await json(['dataset', 'ls']))[0].digest }],
      ['DatasetService', 'DeleteDataset', { project: 'vision', name: 'imagenet' }],
      ['QuotaService', 'SetQuota', { scope: 'project:vision', runningJobs: 1 }],
      ['QuotaService', 'SetQuota', { scope: 'global', runningJobs: 1 }],
      ['QuotaService', 'DeleteQuota', { scope: 'project:vision' }],
      ['UserService', 'CreateToken', { name: 'forced', project: 'vision', role: 'ROLE_MEMBER' }],
    ];
    for (const [service, method, request] of forced) {
      const answer = await kiln.api(service, method, request, viewer);
      assert.deepEqual([answer.status, answer.body.code], [403, 'permission_denied'], `${service}/${method} ${JSON.stringify(answer.body)}`);
    }
    const upload = await fetch(`${kiln.url}/api/v1/upload?project=vision`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${viewer}`, 'Content-Type': 'application/octet-stream', 'X-Kiln-Csrf': '1' },
      body: 'not for a viewer',
    });
    assert.deepEqual([upload.status, (await upload.json()).code], [403, 'permission_denied']);
    // Nothing changed.
    assert.deepEqual((await json(['secret', 'ls', '--project', 'vision'])).map((s) => s.name), ['registry:127.0.0.1:5000']);
    assert.deepEqual((await json(['dataset', 'ls'])).map((d) => d.name), ['imagenet']);
    assert.deepEqual((await json(['project', 'members', 'vision'])).map((m) => m.user).sort(), ['maya', 'mia', 'vera']);
  });

  it('lets the admin set and delete a quota on the Admin page', async () => {
    const page = await newPage(browser);
    await login(page, kiln);
    await page.getByRole('link', { name: 'Admin' }).click();
    const form = page.getByTestId('set-quota');
    await form.getByLabel('Scope').selectOption('project');
    await form.getByLabel('Project').fill('vision');
    await form.getByLabel('CPU cores').fill('2.5');
    await form.getByLabel('Memory').fill('4G');
    await form.getByLabel('Running jobs').fill('3');
    await form.getByLabel('Weight').fill('2');
    await form.getByRole('button', { name: 'Set quota' }).click();
    const row = page.getByTestId('quotas').locator('tr[data-scope="project:vision"]');
    await row.getByText('4.0 GiB').waitFor();
    const [quota] = await json(['quota', 'get', 'project:vision']);
    assert.deepEqual(quota, {
      scope: 'project:vision', cpu_millis: 2500, memory_bytes: 4 * 2 ** 30, gpus: null, running_jobs: 3, queued_jobs: null, weight: 2,
    });
    // Edit fills the form with the quota's limits in the form's units.
    await page.reload();
    await page.getByRole('button', { name: 'Edit project:vision' }).click();
    assert.deepEqual(await Promise.all(['Project', 'CPU cores', 'Memory', 'GPUs', 'Running jobs', 'Weight'].map((label) => form.getByLabel(label).inputValue())), ['vision', '2.5', '4G', '', '3', '2']);
    // A bad size is refused in the page, with the CLI's words.
    await form.getByLabel('Memory').fill('4X');
    await form.getByRole('button', { name: 'Set quota' }).click();
    await page.getByTestId('quota-error').getByText('use a number with K, M, G or T').waitFor();
    await screenshot(page, 'admin-quotas');
    await assertAccessible(page);
    await page.getByRole('button', { name: 'Delete project:vision' }).click();
    await row.waitFor({ state: 'detached' });
    assert.equal((await json(['quota', 'ls'])).some((q) => q.scope === 'project:vision'), false);
    assert.deepEqual(page.errors, []);
  });
});
