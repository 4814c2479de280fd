// Test fixtures: a real `kiln serve` on a free loopback port with a temporary data
// directory (never a mock). The binary is KILN_BIN, else <repo>/target/release/kiln.
import { spawn } from "node:child_process";
import { accessSync, constants, mkdtempSync, rmSync, openSync, readFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";
import { before, after } from "node:test";
import { DocumentStore } from "../dist/esm/index.js";

export const HERE = fileURLToPath(new URL(".", import.meta.url));
export const PKG = resolve(HERE, "..");
export const REPO = resolve(PKG, "..", "..");

export function kilnBin() {
  const bin = process.env.KILN_BIN || join(REPO, "target", "release", "kiln");
  try {
    accessSync(bin, constants.X_OK);
  } catch {
    throw new Error(`no kiln binary at ${bin}: build it (cargo build --release -p kiln-cli) or set KILN_BIN`);
  }
  return bin;
}

export function freePort() {
  return new Promise((resolveP, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolveP(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Servers still running when this process ends (a test that timed out and never ran
// its after hook, a Ctrl-C) are killed, and their directories removed, so that none
// outlives the test run.
const live = new Set();
function killLive() {
  for (const s of live) {
    try {
      s.proc?.kill("SIGKILL");
    } catch {
      // already gone
    }
    rmSync(s.dataDir, { recursive: true, force: true });
    rmSync(s.logPath, { force: true });
  }
  live.clear();
}
process.once("exit", killLive);
for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"]) {
  process.once(sig, () => {
    killLive();
    process.exit(128 + (sig === "SIGINT" ? 2 : sig === "SIGHUP" ? 1 : 15));
  });
}

/** One `kiln serve` process. */
export class KilnServer {
  constructor({ extra = [], port, dataDir, tls } = {}) {
    this.tls = tls; // { cert, key } PEM paths: serves HTTPS
    this.bin = kilnBin();
    this.dataDir = dataDir ?? mkdtempSync(join(tmpdir(), "kiln-ts-test-"));
    this.extra = extra;
    this.port = port;
    this.proc = undefined;
    this.logPath = join(this.dataDir, "..", `${this.dataDir.split("/").pop()}.log`);
  }

  get url() {
    return `${this.tls ? "https" : "http"}://127.0.0.1:${this.port}`;
  }

  /** GET /health (over TLS with the test's own CA: the platform fetch cannot take one). */
  async health() {
    if (!this.tls) {
      const r = await fetch(`${this.url}/health`, { signal: AbortSignal.timeout(1000) });
      return r.status;
    }
    const { get } = await import("node:https");
    const ca = readFileSync(this.tls.cert);
    return new Promise((resolveP, reject) => {
      const req = get(`${this.url}/health`, { ca, timeout: 1000 }, (res) => { res.resume(); resolveP(res.statusCode); });
      req.on("error", reject);
      req.on("timeout", () => req.destroy(new Error("timeout")));
    });
  }

  async start(timeoutMs = 15000) {
    this.port ??= await freePort();
    const log = openSync(this.logPath, "a");
    const tlsArgs = this.tls ? ["--tls-cert", this.tls.cert, "--tls-key", this.tls.key] : [];
    this.proc = spawn(this.bin, ["serve", "--data-dir", join(this.dataDir, "data"), "--bind", `127.0.0.1:${this.port}`, ...tlsArgs, ...this.extra],
      { stdio: ["ignore", log, log] });
    const proc = this.proc;
    live.add(this);
    let exited = false;
    proc.once("exit", () => { exited = true; });
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (exited) throw new Error(`kiln serve exited: ${readFileSync(this.logPath, "utf8").slice(-2000)}`);
      try {
        if ((await this.health()) === 200) return this;
      } catch {
        // not yet
      }
      await sleep(30);
    }
    throw new Error(`kiln serve did not answer /health within ${timeoutMs} ms`);
  }

  /** SIGKILL, as a crash would. */
  async kill() {
    const p = this.proc;
    this.proc = undefined;
    if (p && p.exitCode === null && p.signalCode === null) {
      const gone = new Promise((r) => p.once("exit", r));
      p.kill("SIGKILL");
      await gone;
    }
  }

  async restart() {
    await this.kill();
    await this.start();
  }

  async stop() {
    const p = this.proc;
    this.proc = undefined;
    if (p && p.exitCode === null && p.signalCode === null) {
      const gone = new Promise((r) => p.once("exit", r));
      p.kill("SIGTERM");
      const t = setTimeout(() => p.kill("SIGKILL"), 10000);
      await gone;
      clearTimeout(t);
    }
    rmSync(this.dataDir, { recursive: true, force: true });
    rmSync(this.logPath, { force: true });
    live.delete(this);
  }

  async metrics() {
    return (await fetch(`${this.url}/metrics`)).text();
  }
}

export async function startServer(opts) {
  return new KilnServer(opts).start();
}

/** Sum of the samples of a Prometheus metric whose labels include `labels`. */
export function metric(text, name, labels = {}) {
  let total = 0;
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = Object.fromEntries([...(m[3] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => have[k] === v)) total += Number(m[4]);
  }
  return total;
}

export const DOC_ROUTE = "/dbs/{db}/docs/{*id}";

export function requestsTo(text, { route = DOC_ROUTE, method = "GET", status } = {}) {
  const labels = { route, method };
  if (status !== undefined) labels.status = status;
  return metric(text, "kiln_http_requests_total", labels);
}

export function dbName() {
  return "t" + randomBytes(5).toString("hex");
}

/** A store on a new database of `server`; `done()` deletes the database and closes the store. */
export async function newStore(server, options = {}) {
  const store = new DocumentStore(server.url, dbName(), options);
  await store.createDatabase();
  store.done = async () => {
    try {
      await store.deleteDatabase();
    } catch {
      // already gone
    }
    await store.close();
  };
  return store;
}

/** One server and one store for a test file: started before its tests, closed and
 * stopped after them; `set(server, store)` hands them to the file's variables. */
export function oneServerAndStore(set) {
  let server, store;
  before(async () => {
    server = await startServer();
    store = await newStore(server);
    set(server, store);
  });
  after(async () => {
    await store?.done();
    await server?.stop();
  });
}
