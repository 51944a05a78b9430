// The system chromium, driven by playwright-core (never a downloaded browser), and what every
// test does with it: sign in through the form, take screenshots into e2e/artifacts/.

import { mkdir } from 'node:fs/promises';
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
  return page;
}

/** Signs in through the login form and waits for the Runs page. */
export async function login(page, url, token) {
  await page.goto(`${url}/login`);
  await page.getByLabel('API token').fill(token);
  await page.getByTestId('login-submit').click();
  await page.waitForURL(`${url}/`);
  await page.getByTestId('runs-table').waitFor();
}

export async function screenshot(page, name, options = {}) {
  await mkdir(ARTIFACTS, { recursive: true });
  // A full-page shot of a scrolled page would draw the sticky header mid-page.
  if (options.fullPage) await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), ...options });
}
