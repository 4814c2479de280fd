// HTTPS and WSS against `kiln serve --tls-cert --tls-key --auth` with a self-signed
// certificate (openssl). The platform fetch takes no CA per request, so the client
// runs in a child process started with NODE_EXTRA_CA_CERTS (as the README says); an
// untrusted certificate is a ConnectionFailedError that says so.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as K from "../dist/esm/index.js";
import { KilnServer, kilnBin, dbName, PKG } from "./helpers.mjs";

let server, key, certDir;
before(async () => {
  certDir = mkdtempSync(join(tmpdir(), "kiln-ts-cert-"));
  const cert = join(certDir, "cert.pem");
  const keyPem = join(certDir, "key.pem");
  const r = spawnSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
    "-keyout", keyPem, "-out", cert], { encoding: "utf8" });
  assert.equal(r.status, 0, `openssl is needed for this test: ${r.error ?? r.stderr}`);
  const dir = mkdtempSync(join(tmpdir(), "kiln-ts-tls-"));
  mkdirSync(join(dir, "data"));
  const k = spawnSync(kilnBin(), ["api-key", "create", "--data-dir", join(dir, "data"), "--name", "tls", "--operator"], { encoding: "utf8" });
  key = k.stdout.trim().split(/\s+/).find((w) => w.length >= 20);
  server = await new KilnServer({ dataDir: dir, tls: { cert, key: keyPem }, extra: ["--auth"] }).start();
});
after(async () => {
  await server?.stop();
  if (certDir) rmSync(certDir, { recursive: true, force: true });
});

test("an untrusted certificate is a ConnectionFailedError naming the cause", async () => {
  const st = new K.DocumentStore(server.url, dbName(), { apiKey: key });
  await assert.rejects(st.get("a/1"), (e) => e instanceof K.ConnectionFailedError && /certificate/i.test(e.message));
});

test("https and wss with the certificate trusted (NODE_EXTRA_CA_CERTS) and an API key", () => {
  const code = `
    import { DocumentStore } from ${JSON.stringify(join(PKG, "dist/esm/index.js"))};
    const store = new DocumentStore(${JSON.stringify(server.url)}, ${JSON.stringify(dbName())}, { apiKey: ${JSON.stringify(key)} });
    await store.createDatabase();
    const changes = store.changes();
    const sub = changes.forPrefix("users/");
    if (!(await sub.waitSubscribed(5000))) throw new Error("wss feed: " + changes.lastClose);
    const s = store.session();
    s.store({ name: "Ada" }, "users/ada");
    await s.saveChanges();
    const c = await sub.next(5000);
    const doc = await store.get("users/ada");
    const bulk = store.bulkInsert();
    for (let i = 0; i < 500; i++) await bulk.store({ i }, "items/" + i);
    await bulk.close();
    console.log(JSON.stringify({ name: doc.name, change: c && c.id, acked: bulk.acked }));
    await changes.close();
    await store.deleteDatabase();
  `;
  const r = spawnSync(process.execPath, ["--experimental-websocket", "--input-type=module", "-e", code], {
    encoding: "utf8", timeout: 30_000, env: { ...process.env, NODE_EXTRA_CA_CERTS: server.tls.cert },
  });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.deepEqual(JSON.parse(r.stdout.trim().split("\n").pop()), { name: "Ada", change: "users/ada", acked: 500 });
});
