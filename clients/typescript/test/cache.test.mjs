// The HTTP cache: 304 revalidation (counted by the server), the LRU byte bound,
// aggressive caching that sends no request while the changes feed is quiet, is
// invalidated by another client's write, and falls back to revalidation when the
// feed is down.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { DocumentStore, HttpCache } from "../dist/esm/index.js";
import { requestsTo, sleep, oneServerAndStore } from "./helpers.mjs";

let server, store;
oneServerAndStore((s, st) => ([server, store] = [s, st]));

test("a cached document is revalidated with If-None-Match: the server answers 304", async () => {
  await store.put("users/ada", { name: "Ada", bio: "x".repeat(500) });
  const st = new DocumentStore(server.url, store.database);
  const m0 = await server.metrics();
  for (let i = 0; i < 5; i++) {
    const s = st.session();
    assert.equal((await s.load("users/ada")).name, "Ada");
  }
  const m1 = await server.metrics();
  assert.equal(requestsTo(m1, { status: "200" }) - requestsTo(m0, { status: "200" }), 1, "one 200");
  assert.equal(requestsTo(m1, { status: "304" }) - requestsTo(m0, { status: "304" }), 4, "four 304s");
  assert.equal(st.stats.notModified, 4);
  // A change makes the next revalidation a 200 with the new body.
  await store.put("users/ada", { name: "Ada L." });
  assert.equal((await st.session().load("users/ada")).name, "Ada L.");
  // Queries are cached too (their ETag covers the database and index).
  const q = () => st.query("users").whereEquals("name", "Ada L.").execute();
  assert.equal((await q()).fromCache, "");
  // The first query made an auto index, which catches up in the background (its
  // progress is part of the ETag): once it has, the answer is a 304.
  let from = "";
  for (let i = 0; i < 50 && from !== "304"; i++) {
    from = (await q()).fromCache;
    if (from !== "304") await sleep(20);
  }
  assert.equal(from, "304");
  assert.equal((await q()).results[0].name, "Ada L.");
  await store.put("users/zz", { name: "Zz" });
  assert.equal((await q()).fromCache, "", "a write changes the database etag: not a 304");
  await st.close();
});

test("the cache is bounded by bytes, least recently used out", () => {
  const c = new HttpCache(10_000);
  for (let i = 0; i < 100; i++) c.put(`k${i}`, `e${i}`, "y".repeat(500), 0, true);
  assert.ok(c.sizeBytes <= 10_000, String(c.sizeBytes));
  assert.ok(c.size < 100 && c.size > 0);
  assert.ok(c.evictions > 0);
  assert.ok(c.has("k99") && !c.has("k0"));
  c.get("k95"); // most recent now
  for (let i = 100; i < 105; i++) c.put(`k${i}`, "e", "y".repeat(500), 0, true);
  assert.ok(c.has("k95"), "a recently read entry stays");
  c.put("huge", "e", "z".repeat(20_000), 0, true);
  assert.ok(!c.has("huge"), "larger than the bound: not kept");
  const off = new HttpCache(0);
  off.put("k", "e", "v", 0, true);
  assert.equal(off.size, 0);
});

test("aggressive caching: no request while the feed is quiet, invalidated at once by another client's write", async (t) => {
  await store.put("users/bob", { name: "Bob", n: 0 });
  const st = new DocumentStore(server.url, store.database);
  t.after(() => st.close()); // a failed assertion must not leave its feed reconnecting
  await st.session().load("users/bob"); // cached
  const scope = await st.aggressiveCaching({ durationMs: 60_000 });
  assert.ok(st.aggressiveFeedConnected, "the feed connected");
  const before = st.stats.requests;
  // The first read after the feed connected revalidates once, then none.
  for (let i = 0; i < 1000; i++) {
    const s = st.session();
    assert.equal((await s.load("users/bob")).n, 0);
  }
  assert.ok(st.stats.requests - before <= 1, `requests: ${st.stats.requests - before}`);
  assert.ok(st.stats.aggressiveHits >= 999);
  // Another client writes (a raw fetch, not through this store).
  const r = await fetch(`${server.url}${st.docPath("users/bob")}`, { method: "PUT", body: JSON.stringify({ name: "Bob", n: 1 }) });
  assert.equal(r.status, 200);
  const t0 = performance.now();
  let seen = 0;
  while (performance.now() - t0 < 2000) {
    seen = (await st.session().load("users/bob")).n;
    if (seen === 1) break;
    await sleep(5);
  }
  const took = performance.now() - t0;
  assert.equal(seen, 1, "the write was seen");
  assert.ok(took < 500, `invalidated within ${took.toFixed(0)} ms`);
  scope.dispose();
  // Outside the scope: revalidated (a request each).
  const b2 = st.stats.requests;
  await st.session().load("users/bob");
  assert.equal(st.stats.requests - b2, 1);
  await st.close();
});

test("aggressive caching falls back to revalidation while the feed is down (server restart)", async (t) => {
  await store.put("users/cat", { name: "Cat", n: 0 });
  const st = new DocumentStore(server.url, store.database);
  t.after(() => st.close());
  await st.session().load("users/cat");
  await st.withAggressiveCaching(async () => {
    await st.session().load("users/cat");
    const hits = st.stats.aggressiveHits;
    await st.session().load("users/cat");
    assert.equal(st.stats.aggressiveHits, hits + 1);
    await server.kill();
    // The feed notices the lost connection: every read is sent to the server again.
    const t0 = performance.now();
    while (st.aggressiveFeedConnected && performance.now() - t0 < 3000) await sleep(10);
    assert.equal(st.aggressiveFeedConnected, false);
    await assert.rejects(st.session().load("users/cat"), /ECONNREFUSED|connection/i);
    await server.start();
    // Written while this store's feed was down or reconnecting: still seen.
    await fetch(`${server.url}${st.docPath("users/cat")}`, { method: "PUT", body: '{"name":"Cat","n":2}' });
    assert.equal((await st.session().load("users/cat")).n, 2);
    assert.ok(await st.waitFeed(5000), "the feed reconnected");
    // The resumed feed first delivers what it missed (the write above), which makes
    // the next read revalidate once more; then reads are answered from the cache.
    const h2 = st.stats.aggressiveHits;
    const t1 = performance.now();
    while (st.stats.aggressiveHits === h2 && performance.now() - t1 < 3000) {
      assert.equal((await st.session().load("users/cat")).n, 2);
      await sleep(20);
    }
    assert.ok(st.stats.aggressiveHits > h2, "served from the cache again once reconnected");
  }, { durationMs: 60_000 });
  await st.close();
});
