// The system chromium, driven by playwright-core (never a downloaded browser), and what every
// test does with it: sign in (as `kiln ui` does, or with a token), take screenshots into e2e/artifacts/.

import { mkdir, readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const ARTIFACTS = join(dirname(fileURLToPath(import.meta.url)), 'artifacts');

export async function launch() {
  return chromium.launch({
    executablePath: process.env.KILN_CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

/** A new page at 1280×720 (the smallest size the UI is made for), with page errors collected. */
export async function newPage(browser, { colorScheme = 'light' } = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 720 }, colorScheme });
  const page = await context.newPage();
  page.errors = [];
  page.on('pageerror', (error) => page.errors.push(error.message));
  // Everything the UI needs is bundled and served by kiln: no request may leave for the net.
  page.externalRequests = [];
  page.on('request', (request) => {
    const url = new URL(request.url());
    if (!['127.0.0.1', 'localhost'].includes(url.hostname) && !['data:', 'blob:'].includes(url.protocol)) page.externalRequests.push(request.url());
  });
  return page;
}

/**
 * Signs in as `kiln ui` does and waits for the Runs page: the login page asks for a login and
 * shows its code, the CLI approves the code as `token`'s user, and the page redeems it.
 */
export async function login(page, kiln, token = kiln.token) {
  await page.goto(`${kiln.url}/login?via=cli`);
  const code = (await page.getByTestId('login-code').textContent()).trim();
  await kiln.cli(['ui', '--approve', code], { env: { KILN_TOKEN: token } });
  await page.waitForURL(`${kiln.url}/`);
  await page.getByTestId('runs-table').waitFor();
}

/** Signs in through the token form and waits for the Runs page. */
export async function loginWithToken(page, url, token) {
  await page.goto(`${url}/login`);
  await page.getByLabel('API token').fill(token);
  await page.getByTestId('login-submit').click();
  await page.waitForURL(`${url}/`);
  await page.getByTestId('runs-table').waitFor();
}

const AXE = createRequire(import.meta.url).resolve('axe-core/axe.min.js');

/**
 * Runs axe-core (WCAG 2 A and AA rules, colour contrast included) on the page as it is and
 * fails on any serious or critical violation, naming each.
 */
export async function assertAccessible(page) {
  // Evaluated through the DevTools protocol: the gateway's CSP rightly refuses inline scripts.
  await page.evaluate(await readFile(AXE, 'utf8'));
  const violations = await page.evaluate(async () => {
    const result = await window.axe.run(document, { runOnly: ['wcag2a', 'wcag2aa'], resultTypes: ['violations'] });
    return result.violations
      .filter((violation) => violation.impact === 'serious' || violation.impact === 'critical')
      .map((violation) => `${violation.id}: ${violation.nodes.map((node) => node.target.join(' ')).slice(0, 3).join(', ')}`);
  });
  if (violations.length > 0) throw new Error(`accessibility violations on ${page.url()}:\n${violations.join('\n')}`);
}

export async function screenshot(page, name, options = {}) {
  await mkdir(ARTIFACTS, { recursive: true });
  // A full-page shot of a scrolled page would draw the sticky header mid-page.
  if (options.fullPage) await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), ...options });
}
