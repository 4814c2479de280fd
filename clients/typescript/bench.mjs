#!/usr/bin/env node
// The TypeScript client's benchmark (issue 54), beside clients/python/bench.py.
//
// 1. PUT: `store.put` of --docs documents, one request at a time (docs/s).
// 2. GET: `store.get` of the same documents without the HTTP cache (every GET a 200
//    with the body), one at a time, against a raw `fetch` of the same URLs (the ratio
//    is the client's overhead); and with the cache (every GET a 304).
// 3. Bulk insert from Node: --bulk-docs ~300-byte documents shaped like W10's over one
//    streaming request, against `kiln import` of the same documents (written to an
//    NDJSON file first) into another database of the same server, in the same run.
// Median of --rounds interleaved rounds. Starts its own `kiln serve` on a free port in
// a temporary directory (KILN_BIN, else <repo>/target/release/kiln) unless --url.
// Prints a table, or JSON with --json. Needs `npm run build` first.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, createWriteStream } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { DocumentStore } from "./dist/esm/index.js";

const HERE = fileURLToPath(new URL(".", import.meta.url));
const REPO = resolve(HERE, "..", "..");
const { values: a } = parseArgs({
  options: {
    url: { type: "string" },
    docs: { type: "string", default: "2000" },
    "bulk-docs": { type: "string", default: "100000" },
    rounds: { type: "string", default: "3" },
    json: { type: "boolean", default: false },
  },
});
const DOCS = Number(a.docs);
const BULK = Number(a["bulk-docs"]);
const ROUNDS = Number(a.rounds);
const kilnBin = process.env.KILN_BIN || join(REPO, "target", "release", "kiln");

function freePort() {
  return new Promise((res) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => res(port)); });
  });
}

async function startServer() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-tsbench-"));
  const port = await freePort();
  const proc = spawn(kilnBin, ["serve", "--data-dir", join(dir, "data"), "--bind", `127.0.0.1:${port}`], { stdio: "ignore" });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 300; i++) {
    try {
      if ((await fetch(`${url}/health`)).status === 200) return { url, dir, proc };
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("kiln serve did not start");
}

const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
const rate = (n, ms) => Math.round(n / (ms / 1000));

async function timed(fn) {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

const rng = (() => { let x = 0x4b494c4e; return () => { x = (x * 1103515245 + 12345) & 0x7fffffff; return x; }; })();
const payloads = Array.from({ length: 1000 }, () => Array.from({ length: 150 }, () => String.fromCharCode(97 + (rng() % 26))).join(""));
const w10 = (n) => ({ name: `item-${n}`, n, tag: `tag-${n % 100}`, email: `user${n}@example.com`, active: n % 3 !== 0, payload: payloads[n % 1000] });

async function main() {
  const server = a.url ? undefined : await startServer();
  const url = a.url ?? server.url;
  const results = { docs: DOCS, bulk_docs: BULK, rounds: ROUNDS, node: process.version };
  const runs = { put: [], get_client: [], get_raw_fetch: [], get_304: [], bulk_node: [], kiln_import: [] };
  const tmp = mkdtempSync(join(tmpdir(), "kiln-tsbench-nd-"));
  try {
    // The bulk documents as an NDJSON file for `kiln import` (the same documents).
    const file = join(tmp, "w10.ndjson");
    await new Promise((res, rej) => {
      const out = createWriteStream(file);
      out.on("error", rej);
      for (let n = 0; n < BULK; n++) out.write(JSON.stringify({ id: `items/${String(n).padStart(9, "0")}`, document: w10(n) }) + "\n");
      out.end(res);
    });
    const ids = Array.from({ length: DOCS }, (_, i) => `users/${i}`);
    for (let round = 0; round < ROUNDS; round++) {
      const db = `tsbench${round}`;
      const plain = new DocumentStore(url, db, { cacheSizeBytes: 0 });
      await plain.createDatabase();
      runs.put.push(rate(DOCS, await timed(async () => {
        for (const id of ids) await plain.put(id, { name: `user ${id}`, age: 30, bio: "x".repeat(200) });
      })));
      // GET through the client vs a raw fetch of the same URLs, interleaved per round.
      runs.get_client.push(rate(DOCS, await timed(async () => {
        for (const id of ids) await plain.get(id);
      })));
      runs.get_raw_fetch.push(rate(DOCS, await timed(async () => {
        for (const id of ids) {
          const r = await fetch(`${url}${plain.docPath(id)}`, { headers: { accept: "application/json" } });
          await r.json();
        }
      })));
      const cached = new DocumentStore(url, db);
      for (const id of ids) await cached.get(id);
      runs.get_304.push(rate(DOCS, await timed(async () => {
        for (const id of ids) await cached.get(id);
      })));
      // Bulk insert from Node, then `kiln import` of the same documents.
      const bdb = new DocumentStore(url, `tsbulk${round}`);
      await bdb.createDatabase();
      let acked = 0;
      runs.bulk_node.push(rate(BULK, await timed(async () => {
        const bulk = bdb.bulkInsert();
        for (let n = 0; n < BULK; n++) await bulk.store(w10(n), `items/${String(n).padStart(9, "0")}`);
        await bulk.close();
        acked = bulk.acked;
      })));
      if (acked !== BULK) throw new Error(`bulk insert acked ${acked} of ${BULK}`);
      const imp = spawnSync(kilnBin, ["import", "--url", url, "--db", `tsimport${round}`, "--json", "--state", join(tmp, `state${round}`), file],
        { encoding: "utf8" });
      if (imp.status !== 0) throw new Error(`kiln import failed: ${imp.stderr}`);
      const summary = JSON.parse(imp.stdout.trim().split("\n").pop());
      if (summary.documents !== BULK) throw new Error(`kiln import wrote ${summary.documents}`);
      runs.kiln_import.push(Math.round(summary.docs_per_sec));
      for (const d of [plain, bdb, new DocumentStore(url, `tsimport${round}`)]) await d.deleteDatabase().catch(() => {});
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
    if (server) {
      server.proc.kill("SIGTERM");
      await new Promise((r) => server.proc.once("exit", r));
      rmSync(server.dir, { recursive: true, force: true });
    }
  }
  for (const [k, v] of Object.entries(runs)) results[k] = { docs_per_sec: median(v), all_rounds: v };
  results.ratio_get_client_vs_raw_fetch = +(results.get_client.docs_per_sec / results.get_raw_fetch.docs_per_sec).toFixed(3);
  results.ratio_bulk_node_vs_kiln_import = +(results.bulk_node.docs_per_sec / results.kiln_import.docs_per_sec).toFixed(3);
  if (a.json) {
    console.log(JSON.stringify(results));
    return;
  }
  const row = (name, k, note = "") => console.log(`  ${name.padEnd(34)}${results[k].docs_per_sec.toLocaleString("en").padStart(10)}   ${JSON.stringify(results[k].all_rounds)} ${note}`);
  console.log(`kiln-client (TypeScript) on Node ${process.version}, median of ${ROUNDS} rounds (docs/s, all rounds):`);
  row(`PUT, one at a time (${DOCS})`, "put");
  row(`GET via the client, no cache (${DOCS})`, "get_client");
  row(`GET via raw fetch, same URLs`, "get_raw_fetch");
  row(`GET via the client, 304s`, "get_304");
  row(`bulk insert from Node (${BULK})`, "bulk_node");
  row(`kiln import, same documents`, "kiln_import");
  console.log(`  GET client / raw fetch: ${results.ratio_get_client_vs_raw_fetch}`);
  console.log(`  bulk from Node / kiln import: ${results.ratio_bulk_node_vs_kiln_import}`);
}

await main();
