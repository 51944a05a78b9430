// A live inference service on the Services page: its worker, and the requests it answered as
// rate, latency and partial and failed shares; its stop shown from the change feed.
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { assertAccessible, launch, login, newPage, screenshot } from './browser.mjs';
import { startKiln, submit, waitForJob } from './kiln.mjs';

/** A worker speaking the Open Inference Protocol's REST with the standard library alone:
 * y = factor · x, the factor read from its model version's factor.txt. */
const WORKER = `
import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

with open(os.path.join(os.environ["KILN_MODEL_DIR"], "factor.txt")) as f:
    factor = float(f.read())

class Handler(BaseHTTPRequestHandler):
    def answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer({})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        x = request["inputs"][0]
        self.answer({"outputs": [{"name": "y", "datatype": "FP64", "shape": x["shape"], "data": [v * factor for v in x["data"]]}]})

    def log_message(self, *args):
        pass

ThreadingHTTPServer((os.environ.get("KILN_SERVE_HOST", "127.0.0.1"), int(os.environ["KILN_SERVE_PORT"])), Handler).serve_forever()
`;

describe('services', () => {
  let kiln;
  let browser;
  let code;
  before(async () => {
    kiln = await startKiln();
    browser = await launch();
    code = await mkdtemp(join(tmpdir(), 'kiln-ui-worker-'));
    await writeFile(join(code, 'worker.py'), WORKER);
  });
  after(async () => {
    await browser?.close();
    await kiln?.stop();
    if (code) await rm(code, { recursive: true, force: true });
  });

  it('shows a live service with its worker and its traffic', async () => {
    const job = await submit(kiln, ['sh', '-c', 'mkdir -p "$KILN_OUTPUTS/model" && echo 3 > "$KILN_OUTPUTS/model/factor.txt"'], { name: 'make-scale' });
    await waitForJob(kiln, job);
    await kiln.cli(['model', 'register', 'scale', '--from', `${job}:model/`]);
    await kiln.cli([
      'serve', 'create', 'scale', '--model', 'scale', '--deadline-ms', '2000', '--cpu', '0.1', '--mem', '64M',
      '--input', 'x:FP64:-1', '--output', 'y:FP64:-1', '--code', code, '--', 'python3', 'worker.py',
    ]);

    // Requests until the worker answers, then 20 more.
    const infer = async (x) => {
      const response = await fetch(`${kiln.predictorUrl}/v2/models/scale/infer`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${kiln.token}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ inputs: [{ name: 'x', shape: [1], datatype: 'FP64', data: [x] }] }),
      });
      return { status: response.status, body: await response.json().catch(() => null) };
    };
    const deadline = Date.now() + 120_000;
    let refused = 0;
    for (;;) {
      const reply = await infer(1);
      if (reply.status === 200) break;
      refused++;
      assert.ok(Date.now() < deadline, `the service never answered: ${reply.status} ${JSON.stringify(reply.body)}\n${kiln.log()}`);
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    for (let i = 0; i < 20; i++) {
      const reply = await infer(i);
      assert.equal(reply.status, 200);
      assert.deepEqual(reply.body.outputs[0].data, [3 * i]);
    }

    const page = await newPage(browser);
    // The ListServices calls made, and the watches opened.
    const calls = { list: 0, watch: 0 };
    page.on('request', (request) => {
      const { pathname } = new URL(request.url());
      if (pathname === '/api/v1/rpc/ServeService/ListServices') calls.list++;
      if (pathname === '/api/v1/stream/ServeService/WatchServices') calls.watch++;
    });
    await login(page, kiln);
    await page.goto(`${kiln.url}/services`);
    // A marker that a reload would wipe.
    await page.evaluate(() => (window.__noReload = true));
    const row = page.getByTestId('services').locator('tbody tr', { hasText: 'scale' });
    await row.waitFor();
    await row.locator('[data-testid="worker-state"][data-state="RUNNING"]').waitFor();
    assert.match(await row.getByTestId('service-rate').textContent(), /^\d+(\.\d+)?\/s$/);
    assert.match(await row.getByTestId('service-latency').textContent(), /^[\d.]+ m?s \/ [\d.]+ m?s \/ [\d.]+ m?s$/);
    assert.equal(await row.getByTestId('service-partial').textContent(), '0%');
    // The requests refused before the worker was ready count as failed.
    const failedShare = await row.getByTestId('service-failed').textContent();
    if (refused === 0) assert.equal(failedShare, '0%');
    else assert.match(failedShare, /^[\d.]+%$/);
    // The API's figures behind them: every request counted once.
    const { recent } = await kiln.call('ServeService', 'GetService', { name: 'scale' });
    assert.deepEqual([recent.requests, recent.answered, recent.partial, recent.failed + recent.invalid], [21 + refused, 21, 0, refused]);
    await screenshot(page, 'services');
    await assertAccessible(page);

    // Stopped, from the change feed: no reload, no ListServices call.
    await kiln.cli(['serve', 'stop', 'scale']);
    await row.getByTestId('service-state').filter({ hasText: /^STOPPED/ }).waitFor();
    assert.equal(await page.evaluate(() => window.__noReload), true);
    assert.deepEqual(calls, { list: 0, watch: 1 });
    assert.deepEqual(page.errors, []);
  });
});
