// A server started with --auth: no key is an AuthenticationError on HTTP and on the
// WebSocket features; with a key from `kiln api-key create` everything works, the
// changes feed and data subscriptions included (the key travels as the
// kiln.key.<key> subprotocol, which a browser's WebSocket can send).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as K from "../dist/esm/index.js";
import { KilnServer, kilnBin, dbName } from "./helpers.mjs";

let server, key;
before(async () => {
  const dir = mkdtempSync(join(tmpdir(), "kiln-ts-auth-"));
  mkdirSync(join(dir, "data"));
  const r = spawnSync(kilnBin(), ["api-key", "create", "--data-dir", join(dir, "data"), "--name", "ts-test", "--operator"], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  key = r.stdout.trim().split(/\s+/).find((w) => w.length >= 20);
  assert.ok(key, `a key in: ${r.stdout}`);
  server = await new KilnServer({ dataDir: dir, extra: ["--auth"] }).start();
});
after(async () => { await server?.stop(); });

test("no key: AuthenticationError; a key: reads, writes, the changes feed and a data subscription", async (t) => {
  const db = dbName();
  const anon = new K.DocumentStore(server.url, db);
  await assert.rejects(anon.createDatabase(), (e) => e instanceof K.AuthenticationError && e.status === 401);
  const bad = new K.DocumentStore(server.url, db, { apiKey: "not-a-key" });
  await assert.rejects(bad.get("a/1"), K.AuthenticationError);
  // The server-wide calls too (the studio asks for a key on this error).
  await assert.rejects(anon.serverStats(), K.AuthenticationError);
  await assert.rejects(bad.databaseNames(), K.AuthenticationError);

  const store = new K.DocumentStore(server.url, db, { apiKey: key });
  await store.createDatabase();
  assert.ok((await store.databaseNames()).includes(db));
  assert.ok((await store.serverStats()).databases.some((d) => d.name === db));
  const changes = store.changes();
  t.after(() => changes.close());
  const sub = changes.forAll();
  assert.ok(await sub.waitSubscribed(5000), `the feed accepted the key (last close: ${changes.lastClose})`);
  await store.put("orders/1", { total: 500 });
  assert.equal((await sub.next(5000)).id, "orders/1");
  await changes.close();
  await store.createSubscription("all-orders", "from orders");
  const got = [];
  await store.subscription("all-orders").run((b) => { got.push(...b.documents.map((d) => d.total)); }, { maxBatches: 1 });
  assert.deepEqual(got, [500]);
  // Without the key the worker is refused, as a typed error (not an endless reconnect).
  await assert.rejects(anon.subscription("all-orders").run(() => {}), K.AuthenticationError);
  await store.deleteDatabase();
  await store.close();
});

test("a key for one database: whoami, accessTo, and ForbiddenError beyond its clearance", async () => {
  const db = dbName();
  const admin = new K.DocumentStore(server.url, db, { apiKey: key });
  await admin.createDatabase();
  await admin.put("notes/1", { text: "hi" });
  const r = spawnSync(kilnBin(), ["api-key", "create", "--data-dir", join(server.dataDir, "data"), "--name", "reader", "--db", `${db}:read`], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  const reader = new K.DocumentStore(server.url, db, { apiKey: r.stdout.trim() });
  const me = await reader.whoami();
  assert.equal(me.name, "reader");
  assert.deepEqual(me.clearance, { databases: [{ database: db, access: "read" }] });
  assert.equal(K.accessTo(me, db), "read");
  assert.equal(K.accessTo(me, `${db}-other`), null);
  assert.equal(K.accessTo(await admin.whoami(), "anything"), "admin");
  assert.equal((await reader.get("notes/1")).text, "hi");
  assert.deepEqual(await reader.databaseNames(), [db], "only what it may read is listed");
  await assert.rejects(reader.put("notes/2", { text: "no" }), (e) => e instanceof K.ForbiddenError && e.status === 403 && /read_write/.test(e.message));
  await assert.rejects(reader.serverStats(), K.ForbiddenError);
  assert.equal(await admin.get("notes/2"), undefined, "the refused write changed nothing");
  await admin.deleteDatabase();
  await Promise.all([admin.close(), reader.close()]);
});

test("API keys made, listed and revoked through the server", async () => {
  const db = dbName();
  const admin = new K.DocumentStore(server.url, db, { apiKey: key });
  await admin.createDatabase();
  await admin.put("notes/1", { text: "hi" });
  const made = await admin.createApiKey("ts-reader", { grants: [`${db}:read`] });
  assert.ok(made.key.startsWith(`kiln_${made.id}_`), JSON.stringify(made));
  assert.deepEqual(made.clearance, { databases: [{ database: db, access: "read" }] });
  const listed = (await admin.apiKeys()).find((k) => k.id === made.id);
  assert.equal(listed.name, "ts-reader");
  assert.equal(listed.key, undefined, "a listing never shows the key");
  const reader = new K.DocumentStore(server.url, db, { apiKey: made.key });
  assert.equal((await reader.get("notes/1")).text, "hi");
  await assert.rejects(reader.createApiKey("escalate", { operator: true }), K.ForbiddenError);
  await admin.revokeApiKey(made.id);
  await assert.rejects(reader.get("notes/1"), K.AuthenticationError);
  await assert.rejects(admin.revokeApiKey(made.id), K.NotFoundError);
  await assert.rejects(admin.createApiKey("neither"), (e) => e.status === 400);
  await admin.deleteDatabase();
  await Promise.all([admin.close(), reader.close()]);
});
