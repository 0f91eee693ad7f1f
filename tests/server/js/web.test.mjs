// The web page of `longctx serve` in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core; no browser is downloaded): load /, ask a question, see streamed text and the
// figures, take a screenshot (LONGCTX_SCREENSHOT, or the OS temp dir), no console errors.
//
//   node web.test.mjs LONGCTX_BINARY [MODEL.gguf]
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, importDependency } from './lib/serve.mjs';

const { chromium } = await importDependency('playwright-core');

const CHROMIUM = process.env.LONGCTX_CHROMIUM || '/usr/bin/chromium';
const screenshotPath = process.env.LONGCTX_SCREENSHOT || join(tmpdir(), 'longctx-web.png');

let server;
let browser;
let page;
const consoleErrors = [];

before(async () => {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`${CHROMIUM} is missing: install Debian's chromium (scripts/setup.sh does)`);
  }
  server = await startServer();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
  page.on('console', (msg) => { if (msg.type() === 'error') consoleErrors.push(`console: ${msg.text()}`); });
  page.on('pageerror', (err) => consoleErrors.push(`page error: ${err.message}`));
  page.on('requestfailed', (req) => {
    // A request the page itself aborted (the stream after [DONE]) is not a failure.
    const why = req.failure()?.errorText ?? '';
    if (!/ERR_ABORTED/.test(why)) consoleErrors.push(`request failed: ${req.method()} ${req.url()} ${why}`);
  });
});

after(async () => {
  if (browser) await browser.close().catch(() => {});
  if (server) await server.stop();
});

// Waits until the request finished: #tps filled, or an error shown (which fails the test).
const waitForReply = async (timeout = 120_000) => {
  await page.waitForFunction(() => {
    const tps = document.getElementById('tps')?.textContent.trim();
    const err = document.getElementById('error')?.textContent.trim();
    return (tps && document.body.dataset.state === 'idle') || err;
  }, null, { timeout });
  const err = (await page.textContent('#error')).trim();
  assert.equal(err, '', `the page shows an error: ${err}`);
};

test('the page loads with the methods filled in', async () => {
  const r = await page.goto(server.url + '/');
  assert.equal(r.status(), 200);
  assert.match(r.headers()['content-type'] ?? '', /text\/html/);
  for (const id of ['doc', 'file', 'question', 'send', 'attn', 'rope', 'press', 'reader', 'tps', 'kv', 'readmap']) {
    assert.equal(await page.locator('#' + id).count(), 1, `#${id} exists`);
  }
  // The attention select gets the server's backends from /v1/longctx/methods.
  await page.waitForFunction(() => document.querySelectorAll('#attn option').length > 1, null, { timeout: 10_000 });
  const attn = await page.$$eval('#attn option', (os) => os.map((o) => o.value).filter(Boolean));
  assert.ok(attn.includes('dense'), `dense among the attention backends: ${attn.join(', ')}`);
});

test('a question streams an answer with figures', async () => {
  await page.fill('#doc', 'The lighthouse stood on the northern cliff. Its keeper was named Ada.');
  await page.locator('#question').pressSequentially('Who kept the lighthouse?');
  await page.click('#send');
  await page.waitForFunction(() => (document.getElementById('output')?.textContent ?? '').length > 0,
                             null, { timeout: 120_000 });
  await waitForReply();
  const out = await page.textContent('#output');
  assert.ok(out.length > 0, 'streamed text in #output');
  const tps = (await page.textContent('#tps')).trim();
  assert.match(tps, /\d/, `#tps shows a number: ${tps}`);
  assert.equal(await page.getAttribute('#tps', 'data-source'), 'server',
               'tokens/s come from the final chunk\'s timings (the page fell back to its own estimate)');
  // The page polls /slots while the request runs and once after it.
  await page.waitForFunction(() => (document.getElementById('kv')?.textContent ?? '').trim().length > 0,
                             null, { timeout: 10_000 });
  const kv = (await page.textContent('#kv')).trim();
  assert.notEqual(kv, 'n/a', `GET /slots answered: ${await page.getAttribute('#kv', 'title')}`);
  await page.screenshot({ path: screenshotPath, fullPage: true });
  console.error(`# screenshot: ${screenshotPath}`);
});

test('a sparse backend draws the read map', async (t) => {
  const attn = await page.$$eval('#attn option', (os) => os.map((o) => o.value));
  if (!attn.includes('quest')) { t.skip('no quest backend offered'); return; }
  await page.click('#clear');
  const doc = Array.from({ length: 150 }, (_, i) =>
    `Paragraph ${i}: the river flows past the mill and the baker sells bread in the square.`).join('\n');
  await page.fill('#doc', doc);
  await page.selectOption('#attn', 'quest');
  await page.fill('#question', 'What does the baker sell?');
  await page.fill('#max-tokens', '8');
  await page.click('#send');
  await waitForReply();
  const cells = await page.locator('#readmap .cell').count();
  assert.ok(cells > 0, 'the final chunk of a quest request carries longctx.read_map, drawn as cells');
  await page.selectOption('#attn', '');
});

test('an unknown method shows the server\'s error message', async () => {
  await page.click('#clear');
  // Add a bogus option to the select, as a stale page would send it.
  await page.$eval('#attn', (s) => { const o = document.createElement('option'); o.value = o.textContent = 'nosuchmethod'; s.appendChild(o); });
  await page.selectOption('#attn', 'nosuchmethod');
  await page.fill('#question', 'Hello');
  const before = consoleErrors.length;
  await page.click('#send');
  await page.waitForFunction(() => document.getElementById('error').textContent.trim().length > 0
                             && document.body.dataset.state === 'idle', null, { timeout: 60_000 });
  assert.match(await page.textContent('#error'), /nosuchmethod/);
  // Chromium logs the 400 itself as a console error; that one is expected.
  consoleErrors.splice(before).filter((e) => !/status of 400/.test(e)).forEach((e) => consoleErrors.push(e));
  await page.selectOption('#attn', '');
});

test('no console errors', () => {
  assert.deepEqual(consoleErrors, []);
});
