// Starts a real `kiln serve` and a real headless Chromium for the studio's tests.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, mkdirSync, existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const here = new URL('.', import.meta.url).pathname;
export const repoRoot = resolve(here, '../..');

export const KILN_BIN =
  process.env.KILN_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(repoRoot, 'target'), 'release/kiln');
export const CHROMIUM = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium';
export const SCREENSHOTS = process.env.STUDIO_SCREENSHOTS_DIR ?? join(repoRoot, 'docs/studio');

async function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.on('error', fail);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

/** `kiln serve` on a free port (or `port`) and a fresh data dir; `auth` creates a key
 * first, `tls` a self-signed certificate; `extraArgs` go to `kiln serve`. */
export async function startKiln({ auth = false, tls = false, port = null, extraArgs = [] } = {}) {
  if (!existsSync(KILN_BIN)) throw new Error(`no kiln binary at ${KILN_BIN}: build it or set KILN_BIN`);
  const dir = mkdtempSync(join(tmpdir(), 'kiln-studio-test-'));
  const dataDir = join(dir, 'data');
  const args = ['serve', '--data-dir', dataDir];
  let key = null;
  if (auth) {
    const out = execFileSync(KILN_BIN, ['api-key', 'create', '--data-dir', dataDir, '--name', 'studio-test', '--operator'], {
      encoding: 'utf8',
    });
    key = out.trim().split('\n').pop().trim();
    if (!key.startsWith('kiln_')) throw new Error(`unexpected api-key output: ${out}`);
    args.push('--auth');
  }
  if (tls) {
    const cert = join(dir, 'cert.pem');
    const pkey = join(dir, 'key.pem');
    execFileSync('openssl', [
      'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
      '-keyout', pkey, '-out', cert, '-days', '1', '-subj', '/CN=localhost',
      '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
    ], { stdio: 'ignore' });
    args.push('--tls-cert', cert, '--tls-key', pkey);
  }
  port ??= await freePort();
  args.push('--bind', `127.0.0.1:${port}`, ...extraArgs);
  const proc = spawn(KILN_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stdout.on('data', (d) => (log += d));
  proc.stderr.on('data', (d) => (log += d));
  let exited = null;
  proc.on('exit', (code) => (exited = code));
  const base = `${tls ? 'https' : 'http'}://127.0.0.1:${port}`;
  const deadline = Date.now() + 15000;
  for (;;) {
    if (exited !== null) throw new Error(`kiln serve exited with ${exited}:\n${log}`);
    try {
      const r = await fetch(`${base}/health`);
      if (r.ok) break;
    } catch {}
    if (Date.now() > deadline) throw new Error(`kiln serve did not answer /health:\n${log}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  /** The test's own HTTP client (it plays "somebody else"). */
  const http = async (method, path, body, extra = {}) => {
    const r = await fetch(base + path, {
      method,
      headers: { ...headers, ...(body !== undefined ? { 'Content-Type': 'application/json' } : {}), ...extra },
      body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    });
    const text = await r.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {}
    return { status: r.status, etag: r.headers.get('etag'), json, text, headers: r.headers };
  };
  return {
    base,
    key,
    dataDir,
    http,
    log: () => log,
    async stop() {
      if (exited === null) {
        proc.kill('SIGTERM');
        await new Promise((r) => (exited !== null ? r() : proc.on('exit', r)));
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** `n` clustered `kiln serve` nodes (ids 1..n) on free ports, each with its own
 * data dir; `stop()` stops them all. */
export async function startCluster(n = 3) {
  const ports = [];
  for (let i = 0; i < n; i++) ports.push(await freePort());
  const members = ports.map((p, i) => `${i + 1}=127.0.0.1:${p}`).join(',');
  const started = await Promise.allSettled(
    ports.map((port, i) =>
      startKiln({
        port,
        extraArgs: ['--node-id', String(i + 1), '--cluster', members, '--election-timeout-ms', '200'],
      }),
    ),
  );
  const nodes = started.filter((s) => s.status === 'fulfilled').map((s) => s.value);
  const stop = () => Promise.all(nodes.map((k) => k.stop()));
  const failed = started.find((s) => s.status === 'rejected');
  if (failed) {
    await stop();
    throw failed.reason;
  }
  return { nodes, stop };
}

export async function launchBrowser() {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}

export async function newPage(browser, { tls = false } = {}) {
  const context = await browser.newContext({
    viewport: { width: 1280, height: 860 },
    ignoreHTTPSErrors: tls,
  });
  const page = await context.newPage();
  page.setDefaultTimeout(10000);
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/status of (400|401|403|404|409)/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  return { context, page, problems };
}

export async function screenshot(page, name) {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: false });
}

/** Waits until `f()` is truthy (polling), or fails with `what`. */
export async function until(what, f, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await f();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
