// The server and a database as an admin sees them (what the studio shows): the
// database list, GET /stats, GET /cluster on a single server, collections, documents
// listed by id prefix and by collection with their continuation, a create-only put,
// and an index defined, listed, rebuilt and deleted, each as typed answers and errors.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as K from "../dist/esm/index.js";
import { oneServerAndStore, sleep } from "./helpers.mjs";

let server, store;
oneServerAndStore((s, st) => { server = s; store = st; });

test("databaseNames, serverStats and clusterStatus (a single server: NotClusteredError)", async () => {
  await store.put("users/ada", { name: "Ada" });
  assert.ok((await store.databaseNames()).includes(store.database));
  const stats = await store.serverStats();
  assert.ok(stats.uptime_seconds >= 0 && stats.connections_open >= 1, JSON.stringify(stats));
  assert.equal(typeof stats.http_requests_by_status["2xx"], "number");
  const mine = stats.databases.find((d) => d.name === store.database);
  assert.ok(mine, `${store.database} in ${JSON.stringify(stats.databases)}`);
  assert.ok(mine.documents >= 1 && mine.documents_written >= 1 && mine.commits >= 1, JSON.stringify(mine));
  await assert.rejects(store.clusterStatus(), (e) =>
    e instanceof K.NotClusteredError && e instanceof K.NotFoundError && e.code === "not_clustered" && e.status === 404);
});

test("collections, and listDocuments by id prefix and by collection, page by page", async () => {
  const ops = [];
  for (let i = 0; i < 7; i++) ops.push({ op: "put", id: `people/p${i}`, document: { i } });
  for (let i = 0; i < 3; i++) ops.push({ op: "put", id: `x/${i}`, document: { i, "@metadata": { "@collection": "orders" } } });
  await store.batch(ops);
  const counts = Object.fromEntries((await store.collections()).map((c) => [c.name, c.documents]));
  assert.equal(counts.people, 7);
  assert.equal(counts.orders, 3);

  // By id prefix, in id order: pages of 3, each continuing after the last's `next`.
  const seen = [];
  let page = await store.listDocuments({ prefix: "people/", pageSize: 3 });
  const sizes = [page.results.length];
  seen.push(...page.results.map((d) => d["@metadata"]["@id"]));
  while (page.next !== null) {
    page = await store.listDocuments({ prefix: "people/", pageSize: 3, after: page.next });
    sizes.push(page.results.length);
    seen.push(...page.results.map((d) => d["@metadata"]["@id"]));
  }
  assert.deepEqual(seen, [0, 1, 2, 3, 4, 5, 6].map((i) => `people/p${i}`));
  assert.deepEqual(sizes.slice(0, 3), [3, 3, 1]);
  assert.ok(seen.every((id) => id.startsWith("people/")));

  // A collection, in etag order (the order written), across two pages.
  const first = await store.listDocuments({ collection: "orders", pageSize: 2 });
  assert.equal(first.results.length, 2);
  assert.notEqual(first.next, null);
  const rest = await store.listDocuments({ collection: "orders", pageSize: 2, after: first.next });
  assert.deepEqual([...first.results, ...rest.results].map((d) => d.i), [0, 1, 2]);
  assert.equal(rest.next, null);

  // Every document (no prefix): the database's, in id order.
  const all = await store.listDocuments({ pageSize: 100 });
  const ids = all.results.map((d) => d["@metadata"]["@id"]);
  assert.deepEqual(ids, [...ids].sort());
  assert.ok(ids.includes("x/2") && ids.includes("people/p6"));

  await assert.rejects(store.listDocuments({ collection: "orders", prefix: "x/" }), K.InvalidArgumentError);
  await assert.rejects(store.listDocuments({ pageSize: 0 }), K.InvalidArgumentError);
  await assert.rejects(store.listDocuments({ collection: "orders", after: "not-an-etag" }), K.InvalidEtagError);
});

test("put with ifNoneMatch '*' creates only: a second one is a ConcurrencyError with the current etag", async () => {
  const etag = await store.put("notes/1", { text: "first" }, { ifNoneMatch: "*" });
  await assert.rejects(store.put("notes/1", { text: "second" }, { ifNoneMatch: "*" }), (e) =>
    e instanceof K.ConcurrencyError && e.status === 409 && e.currentEtag === etag);
  assert.equal((await store.get("notes/1")).text, "first");
  await assert.rejects(store.put("notes/2", {}, { ifMatch: etag, ifNoneMatch: "*" }), K.InvalidArgumentError);
  await assert.rejects(store.put("notes/2", {}, { ifNoneMatch: "yes" }), K.InvalidArgumentError);
});

test("defineIndex, indexes, getIndex, resetIndex, deleteIndex (a name with '/' too)", async () => {
  const name = "people/by-i";
  const info = await store.defineIndex(name, { collection: "people", fields: ["i"] });
  assert.equal(info.name, name);
  assert.equal(info.collection, "people");
  assert.deepEqual(info.fields.map((f) => f.path), ["i"]);
  assert.equal(info.auto, false);
  // The same definition again is a no-op; another under that name is refused.
  assert.equal((await store.defineIndex(name, { collection: "people", fields: ["i"] })).name, name);
  await assert.rejects(store.defineIndex(name, { collection: "people", fields: ["other"] }), K.IndexExistsError);
  await assert.rejects(store.defineIndex(name, "i"), K.InvalidArgumentError);
  await assert.rejects(store.defineIndex("bad", { collection: "people", fields: [] }), K.InvalidIndexError);

  let built;
  for (let i = 0; i < 100; i++) {
    built = await store.getIndex(name);
    if (!built.stale && built.entries === 7) break;
    await sleep(50);
  }
  assert.equal(built.entries, 7, JSON.stringify(built));
  assert.equal(built.docs_behind, 0);
  assert.ok((await store.indexes()).some((i) => i.name === name));
  assert.equal((await store.query({ index: name }).whereGreaterThanOrEqual("i", 5).count()), 2);

  const reset = await store.resetIndex(name);
  assert.equal(reset.name, name);
  assert.ok(reset.entries <= 7);
  await store.deleteIndex(name);
  assert.ok(!(await store.indexes()).some((i) => i.name === name));
  await assert.rejects(store.getIndex(name), K.IndexNotFoundError);
  await assert.rejects(store.deleteIndex(name), K.IndexNotFoundError);
  await assert.rejects(store.getIndex(""), K.InvalidArgumentError);
});
