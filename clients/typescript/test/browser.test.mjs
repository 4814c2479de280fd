// The browser example (examples/browser.html) in a real headless Chromium against a real
// `kiln serve --cors-origin <the page's origin>`: the page and dist/ come from a small
// static server on another loopback port (so every request is cross-origin, as in an
// app), the page uses the ES module build unbundled and the browser's own fetch and
// WebSocket. Chromium is driven as studio/tests do it (playwright-core, a dev-dependency,
// with the system's Chromium).
//   CHROMIUM_BIN      the browser (default: `chromium` on the PATH)
//   KILN_SKIP_BROWSER=1  skip these tests when there is no Chromium (otherwise they FAIL)
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { accessSync, constants, readFileSync, statSync } from "node:fs";
import { delimiter, extname, join, normalize, sep } from "node:path";
import { startServer, dbName, freePort, PKG } from "./helpers.mjs";
import { stripQuotes } from "../dist/esm/index.js";

function executable(p) {
  try {
    accessSync(p, constants.X_OK);
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

/** CHROMIUM_BIN, else `command -v chromium`; { bin } or { problem }. */
function findChromium() {
  const env = process.env.CHROMIUM_BIN;
  if (env) return executable(env) ? { bin: env } : { problem: `CHROMIUM_BIN=${env} is not an executable file` };
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir && executable(join(dir, "chromium"))) return { bin: join(dir, "chromium") };
  }
  return { problem: "no chromium on the PATH and CHROMIUM_BIN is not set" };
}

const chromium = findChromium();
const skipBrowser = process.env.KILN_SKIP_BROWSER === "1";
const skip = chromium.bin === undefined && skipBrowser
  ? `SKIPPED (KILN_SKIP_BROWSER=1): ${chromium.problem}; the browser example was not tested`
  : false;
if (skip) console.log(`browser.test.mjs: ${skip}`);

const TYPES = { ".html": "text/html; charset=utf-8", ".mjs": "text/javascript", ".js": "text/javascript", ".map": "application/json", ".ts": "text/plain" };

/** A static file server for examples/ and dist/esm/ of the package, on a free loopback port. */
async function startStatic() {
  const roots = [join(PKG, "examples") + sep, join(PKG, "dist", "esm") + sep];
  const served = [];
  const srv = createServer((req, res) => {
    const path = normalize(join(PKG, decodeURIComponent(new URL(req.url, "http://x").pathname)));
    served.push(req.url);
    if (req.method !== "GET" || !roots.some((r) => path.startsWith(r))) {
      res.writeHead(404).end("not found");
      return;
    }
    let body;
    try {
      body = readFileSync(path);
    } catch {
      res.writeHead(404).end("not found");
      return;
    }
    res.writeHead(200, { "Content-Type": TYPES[extname(path)] ?? "application/octet-stream", "Cache-Control": "no-store" });
    res.end(body);
  });
  const port = await freePort();
  await new Promise((r, j) => srv.once("error", j).listen(port, "127.0.0.1", r));
  return {
    origin: `http://127.0.0.1:${port}`,
    served,
    close: () => new Promise((r) => { srv.closeAllConnections?.(); srv.close(r); }),
  };
}

/** Loads the example page for `server`/`db` and waits for its JSON result. */
async function runPage(browser, pageUrl, timeoutMs = 30_000) {
  const context = await browser.newContext();
  try {
    const page = await context.newPage();
    const problems = [];
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
    page.on("response", (r) => { if (r.status() >= 400) problems.push(`response: ${r.status()} ${r.request().method()} ${r.url()}`); });
    await page.goto(pageUrl);
    await page.waitForSelector("#status:not([data-state=running])", { timeout: timeoutMs });
    const text = await page.textContent("#result");
    const log = await page.$$eval("#log li", (lis) => lis.map((li) => li.textContent));
    return { result: JSON.parse(text), log, problems };
  } finally {
    await context.close();
  }
}

describe("browser example in headless Chromium", () => {
  let kiln, statics, browser;
  before(async () => {
    if (skip) return;
    if (chromium.bin === undefined) {
      throw new Error(`the browser test needs Chromium: ${chromium.problem} ` +
        "(apt-get install -y chromium, or set CHROMIUM_BIN; KILN_SKIP_BROWSER=1 skips this test instead)");
    }
    statics = await startStatic();
    kiln = await startServer({ extra: ["--cors-origin", statics.origin] });
    const { chromium: pw } = await import("playwright-core");
    browser = await pw.launch({
      executablePath: chromium.bin,
      headless: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
  });
  after(async () => {
    await browser?.close();
    await kiln?.stop();
    await statics?.close();
  });

  test("examples/browser.html: session put/get with etag, parameterized query, one change over the native WebSocket", { skip }, async () => {
    const db = dbName();
    const url = `${statics.origin}/examples/browser.html?server=${encodeURIComponent(kiln.url)}&db=${db}`;
    const { result, log, problems } = await runPage(browser, url);
    assert.equal(result.ok, true, `the page failed: ${JSON.stringify(result)}\n${log.join("\n")}\n${problems.join("\n")}`);
    assert.deepEqual(problems, []);
    assert.notEqual(result.origin, new URL(kiln.url).origin, "the page is cross-origin to the server");
    assert.equal(result.origin, statics.origin);
    assert.equal(result.nativeWebSocket, true);
    assert.ok(statics.served.some((u) => u.startsWith("/dist/esm/")), "the page loaded the ES module build from dist/");

    // The document's etag, as the page saw it, is the server's: asked directly from Node.
    const r = await fetch(`${kiln.url}/dbs/${db}/docs/users/ada`);
    assert.equal(r.status, 200);
    const serverEtag = stripQuotes(r.headers.get("etag"));
    assert.ok(serverEtag, "the server sends an ETag");
    assert.equal(result.document.savedEtag, serverEtag, "the session's etag after saveChanges()");
    assert.equal(result.document.loadedEtag, serverEtag, "the etag of the document loaded by a second session");
    const doc = await r.json();
    assert.deepEqual([doc.name, doc.age], ["Ada", 36]);
    assert.deepEqual([result.document.name, result.document.age], ["Ada", 36]);

    // The query: parameterized (the value is not in the text), and its answer.
    assert.equal(result.query.rql, "from users where age >= $p0 order by name");
    assert.deepEqual(result.query.params, { p0: 30 });
    assert.equal(result.query.stale, false);
    assert.deepEqual(result.query.results, [
      { id: "users/ada", name: "Ada", age: 36 },
      { id: "users/cy", name: "Cy", age: 41 },
    ]);
    assert.equal(result.query.total, 2);

    // The change read over the WebSocket is the put of users/ada at that etag.
    assert.deepEqual(result.change, { id: "users/ada", change: "put", etag: serverEtag, collection: "users" });
  });

  test("the same page against a server without --cors-origin is refused by the browser (CORS is what makes it work)", { skip }, async () => {
    const plain = await startServer();
    try {
      const db = dbName();
      const url = `${statics.origin}/examples/browser.html?server=${encodeURIComponent(plain.url)}&db=${db}`;
      const { result } = await runPage(browser, url);
      assert.equal(result.ok, false, JSON.stringify(result));
      // The browser's fetch only says "Failed to fetch" (the CORS refusal is on its console).
      assert.equal(result.code, "connection_failed", JSON.stringify(result));
      const r = await fetch(`${plain.url}/dbs/${db}`);
      assert.equal(r.status, 404, "the browser did not get to create the database");
    } finally {
      await plain.stop();
    }
  });
});
