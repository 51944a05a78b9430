// What the UI writes, each through the RPC the CLI uses: a job submitted from the form (its spec
// equal to the one its displayed `kiln run` line makes), a run's outputs downloaded, a model
// version's alias set, moved and removed, a service scaled and a tried revision's traffic set, one
// sweep trial stopped. A project's viewer sees none of these controls and the API refuses them all.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmod, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { assertAccessible, launch, login, newPage, screenshot } from './browser.mjs';
import { KILN_BIN, startKiln, waitForJob } from './kiln.mjs';

const run = promisify(execFile);

describe('managing from the UI', () => {
  let kiln;
  let browser;
  let scratch;
  let viewerToken;
  let sweepId;
  /** The job the form submitted that wrote outputs (the model's source). */
  let writerId;
  /** A spec the viewer is refused, and a trial they may not stop. */
  let richSpec;
  let runningTrial;

  before(async () => {
    kiln = await startKiln();
    browser = await launch();
    scratch = await mkdtemp(join(tmpdir(), 'kiln-ui-manage-'));
    await chmod(scratch, 0o755);
    const created = await kiln.cli(['user', 'create', 'vera']);
    viewerToken = created.stdout.trim().split('\n').pop().trim();
    await kiln.cli(['project', 'create', 'vision']);
    const data = join(scratch, 'imgs');
    await mkdir(data);
    await writeFile(join(data, 'a.txt'), 'pixels\n');
    const spec = join(scratch, 'sweep.yaml');
    await writeFile(spec, [
      'name: manage-sweep',
      'objective: {metric: loss, goal: minimize}',
      'algorithm: {name: random, seed: 1}',
      'early-stop: {name: none}',
      'budget: {max-trials: 2, max-parallel: 2}',
      'parameters:',
      '  lr: {type: float, min: 0.001, max: 0.1}',
      'trial: {command: ["sleep", "300"], cpu: 0.1, mem: 64M}',
      '',
    ].join('\n'));
    const [, , , sweep] = await Promise.all([
      kiln.cli(['project', 'add-member', 'vision', 'vera', '--role', 'viewer']),
      kiln.cli(['dataset', 'create', 'imgs', '--from', data, '--project', 'vision']),
      kiln.cli(['secret', 'set', 'HF_TOKEN', '--project', 'vision'], { input: 'hunter2\n' }),
      kiln.cli(['sweep', 'create', '-f', spec, '--no-code', '--project', 'vision']),
    ]);
    sweepId = sweep.stdout.trim().split(/\s+/).pop();
  });
  after(async () => {
    await browser?.close();
    await kiln?.stop();
    if (scratch) await rm(scratch, { recursive: true, force: true });
  });

  /** Opens the Submit page from the nav and waits for the form with `project` chosen. */
  async function openSubmit(page) {
    await page.getByTestId('nav-submit').click();
    await page.getByTestId('submit-form').waitFor();
    await page.getByLabel('Project', { exact: true }).selectOption('vision');
    await page.getByTestId('datasets').getByText('imgs').waitFor();
  }

  it('submits the job its `kiln run` line makes, and shows the API\'s refusal', async () => {
    const page = await newPage(browser);
    await login(page, kiln);
    await openSubmit(page);
    await assertAccessible(page);
    const field = (label) => page.getByLabel(label, { exact: true });

    // A reserved name: the API says why, the form stays.
    await field('Command').fill('true');
    await field('Environment').fill('KILN_X=1');
    await page.getByTestId('submit').click();
    assert.match(await page.getByRole('alert').textContent(), /reserved/);

    await field('Name').fill('rich job');
    await field('Image').fill('busybox:1.36');
    await field('Command').fill(`python3 -c 'print("hi there")' --lr 0.1 "it's" ''`);
    await field('CPU cores').fill('0.5');
    await field('Memory').fill('256M');
    await field('GPUs').fill('1');
    await field('Nodes').fill('2');
    await field('Disk').fill('20G');
    await field('Shared memory').fill('128M');
    await field('Max runtime').fill('2h');
    await field('Priority').selectOption('high');
    await field('Market').selectOption('spot');
    // No runner serves this pool: the job waits, holding nothing.
    await field('Pool').fill('nowhere');
    await page.getByTestId('datasets').getByLabel('imgs').check();
    await page.getByTestId('secrets').getByLabel('HF_TOKEN').check();
    await field('Environment').fill("GREETING=hello world\nQUOTE=it's");
    const line = await page.getByTestId('cli-line').textContent();
    assert.equal(line,
      "kiln run --no-code --project vision --name 'rich job' --image busybox:1.36 --cpu 0.5 --mem 256M --disk 20G --shm 128M " +
      "--gpus 1 --nodes 2 --max-runtime 2h --dataset imgs --secret HF_TOKEN --env 'GREETING=hello world' --env 'QUOTE=it'\\''s' " +
      `--priority high --spot --pool nowhere -- python3 -c 'print("hi there")' --lr 0.1 'it'\\''s' ''`);
    await screenshot(page, 'submit', { fullPage: true });
    await assertAccessible(page);
    await page.getByTestId('submit').click();
    await page.waitForURL(/\/runs\/[^/]+$/);
    const uiId = page.url().split('/').pop();

    // The line, run by a POSIX shell with this kiln's CLI as `kiln`, makes the same spec.
    const bin = join(scratch, 'bin');
    await mkdir(bin);
    await symlink(KILN_BIN, join(bin, 'kiln'));
    const shell = await run('sh', ['-c', line], { env: { ...process.env, KILN_HOME: kiln.home, PATH: `${bin}:${process.env.PATH}` } });
    const cliId = shell.stdout.trim().split(/\s+/).pop();
    const [uiJob, cliJob] = await Promise.all([uiId, cliId].map((jobId) => kiln.call('JobService', 'GetJob', { jobId })));
    assert.deepEqual(uiJob.spec, cliJob.spec);
    assert.deepEqual(uiJob.spec.command, ['python3', '-c', 'print("hi there")', '--lr', '0.1', "it's", '']);
    assert.deepEqual(uiJob.spec.env, { GREETING: 'hello world', QUOTE: "it's" });
    assert.deepEqual([uiJob.spec.nodes, uiJob.spec.gpus, uiJob.spec.resources.shmBytes], [2, 1, 128 << 20]);
    richSpec = uiJob.spec;
    await Promise.all([uiId, cliId].map((jobId) => kiln.call('JobService', 'StopJob', { jobId })));
    assert.deepEqual(page.errors, []);
  });

  it('lists a run\'s outputs with their sizes, each downloadable', async () => {
    const page = await newPage(browser);
    await login(page, kiln);
    await page.getByTestId('runs-submit').click();
    await page.getByTestId('submit-form').waitFor();
    await page.getByLabel('Project', { exact: true }).selectOption('vision');
    await page.getByLabel('Name', { exact: true }).fill('writer');
    await page.getByLabel('Command', { exact: true })
      .fill(`sh -c 'mkdir -p "$KILN_OUTPUTS/model" && printf 3 > "$KILN_OUTPUTS/model/factor.txt" && echo hello > "$KILN_OUTPUTS/greeting.txt"'`);
    await page.getByLabel('CPU cores', { exact: true }).fill('0.1');
    await page.getByLabel('Memory', { exact: true }).fill('64M');
    await page.getByTestId('submit').click();
    await page.waitForURL(/\/runs\/[^/]+$/);
    writerId = page.url().split('/').pop();
    await waitForJob(kiln, writerId);
    const outputs = page.getByTestId('outputs');
    await outputs.locator('tr[data-path="model/factor.txt"]').waitFor({ timeout: 30_000 });
    assert.equal(await outputs.locator('tr[data-path="greeting.txt"] [data-testid="output-size"]').textContent(), '6 B');
    assert.equal(await outputs.locator('tr[data-path="model/factor.txt"] [data-testid="output-size"]').textContent(), '1 B');
    const href = await outputs.locator('tr[data-path="greeting.txt"] a').getAttribute('href');
    const download = await page.request.get(`${kiln.url}${href}`);
    assert.equal(download.status(), 200);
    assert.match(download.headers()['content-disposition'], /attachment.*greeting\.txt/);
    assert.equal(await download.text(), 'hello\n');
    await screenshot(page, 'run-outputs', { fullPage: true });
    await assertAccessible(page);
    assert.deepEqual(page.errors, []);
  });

  it('points an alias at a model version, moves it and removes it', async () => {
    await kiln.cli(['model', 'register', 'greet', '--from', `${writerId}:model/`]);
    await kiln.cli(['model', 'register', 'greet', '--from', `${writerId}:model/`]);
    const aliases = async () => (await kiln.call('ModelService', 'GetModel', { name: 'greet', project: 'vision' })).aliases;
    const page = await newPage(browser);
    await login(page, kiln);
    await page.goto(`${kiln.url}/models`);
    await page.getByRole('button', { name: 'greet' }).click();
    const form = page.getByTestId('alias-form');
    await form.getByLabel('Alias').fill('production');
    await form.getByLabel('at version').selectOption('1');
    await page.getByTestId('set-alias').click();
    const versions = page.getByTestId('model-versions');
    await versions.locator('[data-alias="production"]').waitFor();
    assert.deepEqual(await aliases(), { production: 1 });
    await form.getByLabel('Alias').fill('production');
    await form.getByLabel('at version').selectOption('2');
    await page.getByTestId('set-alias').click();
    await page.getByRole('button', { name: 'Remove alias production from v2' }).waitFor();
    assert.deepEqual(await aliases(), { production: 2 });
    await screenshot(page, 'models-alias');
    await assertAccessible(page);
    await page.getByRole('button', { name: 'Remove alias production from v2' }).click();
    await versions.locator('[data-alias]').waitFor({ state: 'detached' });
    assert.deepEqual(await aliases(), {});
    assert.deepEqual(page.errors, []);
  });

  it('scales a service and sets the traffic of the revision it tries', async () => {
    // Workers that never answer: scaling and the split are the controller's, not theirs.
    const worker = ['--model', 'greet', '--cpu', '0.1', '--mem', '64M', '--no-code', '--', 'sleep', '600'];
    await kiln.cli(['serve', 'create', 'greeter', '--project', 'vision', ...worker]);
    await kiln.cli(['serve', 'update', 'greeter', '--project', 'vision', '--traffic', 'new=10', ...worker]);
    const page = await newPage(browser);
    await login(page, kiln);
    await page.goto(`${kiln.url}/services`);
    const row = page.locator('tr[data-service="vision/greeter"]');
    await row.getByTestId('scale-form').waitFor();
    await row.getByTestId('replicas').fill('2');
    await row.getByTestId('scale').click();
    const service = () => kiln.call('ServeService', 'GetService', { name: 'greeter', project: 'vision' });
    for (let tries = 0; (await service()).scaling.minReplicas !== 2; tries++) {
      assert.ok(tries < 100, 'ScaleService never took effect');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.equal((await service()).scaling.maxReplicas, 2);
    assert.equal(await row.getByTestId('service-error').count(), 0);
    await row.getByTestId('traffic').fill('40');
    await row.getByTestId('set-traffic').click();
    await row.getByTestId('service-revision').filter({ hasText: '(40%)' }).waitFor();
    assert.equal((await service()).traffic, 40);
    await screenshot(page, 'services-manage');
    await assertAccessible(page);
    assert.deepEqual(page.errors, []);
  });

  /** The sweep's trial jobs once both run. */
  async function runningTrials() {
    for (;;) {
      const sweep = await kiln.call('SweepService', 'GetSweep', { sweepId });
      const ids = sweep.trials.map((trial) => trial.jobId).filter(Boolean);
      if (ids.length === 2) {
        await Promise.all(ids.map((id) => waitForJob(kiln, id, 'JOB_STATE_RUNNING')));
        return ids;
      }
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }

  it('stops one trial of a sweep and leaves the others', async () => {
    const [first, second] = await runningTrials();
    runningTrial = second;
    const page = await newPage(browser);
    await login(page, kiln);
    await page.goto(`${kiln.url}/sweeps/${sweepId}`);
    await page.locator(`tr[data-job-id="${first}"]`).getByTestId('stop-trial').click();
    await waitForJob(kiln, first, 'JOB_STATE_STOPPED');
    assert.equal((await kiln.call('JobService', 'GetJob', { jobId: second })).state, 'JOB_STATE_RUNNING');
    assert.equal((await kiln.call('SweepService', 'GetSweep', { sweepId })).state, 'running');
    await page.locator(`tr[data-job-id="${first}"] [data-testid="stop-trial"]`).waitFor({ state: 'detached' });
    await screenshot(page, 'sweep-stop-trial');
    await assertAccessible(page);
    assert.deepEqual(page.errors, []);
  });

  it('shows a viewer none of the controls, and the API refuses each call', async () => {
    await kiln.cli(['model', 'alias', 'greet', '1', 'staging', '--project', 'vision']);
    const page = await newPage(browser);
    await login(page, kiln, viewerToken);
    assert.equal(await page.getByTestId('nav-submit').count(), 0);
    assert.equal(await page.getByTestId('runs-submit').count(), 0);
    await page.goto(`${kiln.url}/submit`);
    await page.getByTestId('submit-refused').waitFor();
    assert.equal(await page.getByTestId('submit-form').count(), 0);
    await assertAccessible(page);

    await page.goto(`${kiln.url}/sweeps/${sweepId}`);
    await page.getByTestId('trials').locator('tbody tr').first().waitFor();
    assert.equal(await page.getByTestId('stop-trial').count(), 0);
    await page.goto(`${kiln.url}/models`);
    await page.getByRole('button', { name: 'greet' }).click();
    await page.getByTestId('model-versions').locator('[data-alias="staging"]').waitFor();
    assert.equal(await page.getByTestId('alias-form').count(), 0);
    assert.equal(await page.getByTestId('remove-alias').count(), 0);
    await page.goto(`${kiln.url}/services`);
    await page.locator('tr[data-service="vision/greeter"]').waitFor();
    assert.equal(await page.getByTestId('scale-form').count(), 0);
    assert.equal(await page.getByTestId('traffic-form').count(), 0);
    await screenshot(page, 'services-viewer');
    assert.deepEqual(page.errors, []);

    const forced = [
      ['JobService', 'SubmitJob', { spec: richSpec }],
      ['JobService', 'StopJob', { jobId: runningTrial }],
      ['ModelService', 'SetModelAlias', { name: 'greet', project: 'vision', version: 2, alias: 'staging' }],
      ['ModelService', 'DeleteModelAlias', { name: 'greet', project: 'vision', alias: 'staging' }],
      ['ServeService', 'ScaleService', { name: 'greeter', project: 'vision', replicas: 3 }],
      ['ServeService', 'UpdateService', { name: 'greeter', project: 'vision', traffic: 90 }],
    ];
    for (const [service, method, request] of forced) {
      const answer = await kiln.api(service, method, request, viewerToken);
      assert.deepEqual([answer.status, answer.body.code], [403, 'permission_denied'], `${service}/${method}: ${JSON.stringify(answer.body)}`);
    }
  });
});
