// Streaming bulk insert: acks arrive while the upload goes on, the client's queue
// stays bounded, a bad line stops it with the line number and what was committed.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import * as K from "../dist/esm/index.js";
import { sleep, oneServerAndStore } from "./helpers.mjs";

let server, store;
oneServerAndStore((s, st) => ([server, store] = [s, st]));

test("100,000 documents (~70 MB): acks arrive during the upload, memory stays bounded", async () => {
  const acks = [];
  const bulk = store.bulkInsert({ maxPendingBytes: 1 << 20, onAck: (acked, etag) => acks.push([acked, etag, bulk.stored]) });
  // Live memory (after a full GC when the runner allows it: npm test passes --expose-gc),
  // JS heap plus the ArrayBuffers the encoded chunks live in.
  const live = () => { globalThis.gc?.(); const m = process.memoryUsage(); return m.heapUsed + m.arrayBuffers; };
  const mem0 = live();
  let memMax = mem0;
  let ackedMidway = 0;
  const payload = "p".repeat(600);
  for (let i = 0; i < 100_000; i++) {
    await bulk.store({ n: i, tag: `t${i % 10}`, payload }, `items/${i}`);
    if (i % 20_000 === 10_000) memMax = Math.max(memMax, live());
    if (i === 50_000) {
      // Half way, the upload still open: acks for what was sent arrive now, not at the end.
      const t0 = performance.now();
      while (bulk.acked === 0 && performance.now() - t0 < 10_000) await sleep(10);
      ackedMidway = bulk.acked;
    }
  }
  await bulk.close();
  assert.equal(bulk.acked, 100_000);
  assert.equal(bulk.done, true);
  assert.match(bulk.lastEtag, /^\d+-/);
  assert.ok(acks.length > 1, `acks: ${acks.length}`);
  assert.ok(ackedMidway > 0 && ackedMidway <= 50_001, `acked while the upload was open: ${ackedMidway}`);
  for (let i = 1; i < acks.length; i++) assert.ok(acks[i][0] > acks[i - 1][0], "acks grow");
  assert.ok(bulk.peakPendingBytes <= (1 << 20) + bulk.chunkBytes * 2, `peak queued: ${bulk.peakPendingBytes}`);
  assert.ok(bulk.segments >= 8, `requests: ${bulk.segments} (8 MiB each at most)`);
  if (globalThis.gc) {
    // ~70 MB went through: holding it (or a good part of it) would show here.
    assert.ok(memMax - mem0 < 24 << 20, `live memory grew by ${((memMax - mem0) / 1048576).toFixed(1)} MiB`);
  }
  const stats = await store.databaseStats();
  assert.ok(JSON.stringify(stats).includes("100000"), "the database counts 100,000 documents");
  assert.equal((await store.get("items/99999")).n, 99999);
});

test("generated ids under the collection; a bad line stops the stream with its number", async () => {
  const bulk = store.bulkInsert();
  await bulk.store({ a: 1, "@metadata": { "@collection": "gens" } });
  await bulk.store({ a: 2 }, "gens/");
  await bulk.close();
  assert.equal(bulk.acked, 2);
  assert.equal(await store.query("gens").count(), 2);

  const bad = store.bulkInsert();
  for (let i = 0; i < 10; i++) await bad.store({ i }, `okay/${i}`);
  await bad.store({ i: 10, "@metadata": { "@expires": "not a time" } }, "okay/10");
  for (let i = 11; i < 20; i++) await bad.store({ i }, `okay/${i}`);
  await assert.rejects(bad.close(), (e) => {
    assert.ok(e instanceof K.BulkInsertError, e.constructor.name);
    assert.equal(e.code, "invalid_document");
    assert.equal(e.line, 11);
    assert.equal(e.acked, 10);
    return true;
  });
  assert.equal(await store.get("okay/9") !== undefined, true, "the lines before it are committed");
  assert.equal(await store.get("okay/10"), undefined);
  assert.equal(await store.get("okay/11"), undefined, "nothing after it");
  await assert.rejects(bad.store({ i: 1 }, "okay/x"), K.BulkInsertError, "store() after the failure throws it");
});

test("across segments (small requests): counts and a bad line's number are of the whole insert", async () => {
  const bulk = store.bulkInsert({ chunkBytes: 1024, segmentBytes: 4096 });
  for (let i = 0; i < 300; i++) {
    await bulk.store(i === 250 ? { i, "@metadata": { "@expires": "never" } } : { i, pad: "x".repeat(40) }, `seg/${i}`);
  }
  await assert.rejects(bulk.close(), (e) => {
    assert.ok(e instanceof K.BulkInsertError, e.constructor.name);
    assert.equal(e.line, 251, e.message);
    assert.equal(e.acked, 250);
    return true;
  });
  assert.ok(bulk.segments > 3, `segments: ${bulk.segments}`);
  assert.equal((await store.get("seg/249")).i, 249);
  assert.equal(await store.get("seg/250"), undefined);
  const ok = store.bulkInsert({ chunkBytes: 1024, segmentBytes: 4096 });
  for (let i = 0; i < 300; i++) await ok.store({ i }, `seg2/${i}`);
  await ok.close();
  assert.equal(ok.acked, 300);
  assert.equal(await store.query("seg2").count(), 300);
});

test("bufferSegments (for a fetch that cannot stream a body): each segment one ordinary request", async () => {
  const bodies = [];
  const spy = new K.DocumentStore(server.url, store.database, {
    fetch: (url, init) => { if (String(url).endsWith("/bulk")) bodies.push(init.body); return fetch(url, init); },
  });
  const bulk = spy.bulkInsert({ bufferSegments: true, segmentBytes: 64 << 10, chunkBytes: 8 << 10 });
  for (let i = 0; i < 3000; i++) await bulk.store({ i, pad: "y".repeat(50) }, `buf/${i}`);
  await bulk.close();
  assert.equal(bulk.acked, 3000);
  assert.ok(bodies.length >= 3, `requests: ${bodies.length}`);
  assert.ok(bodies.every((b) => b instanceof Uint8Array && b.length <= (64 << 10) + (8 << 10)), "bounded, not streams");
  assert.equal(await store.query("buf").count(), 3000);
});

test("a request whose answer is lost (EPIPE at a bad line) is sent again once as one body, unless it generates ids", async () => {
  // A fetch whose first bulk request reads part of its body and then fails, as fetch
  // does when the server stops reading at a bad line and its answer is not read.
  const flaky = (failures) => async (url, init) => {
    if (String(url).endsWith("/bulk") && init.body instanceof ReadableStream && failures.left-- > 0) {
      const reader = init.body.getReader();
      await reader.read();
      await reader.cancel();
      throw new TypeError("fetch failed", { cause: Object.assign(new Error("write EPIPE"), { code: "EPIPE" }) });
    }
    return fetch(url, init);
  };
  const st = new K.DocumentStore(server.url, store.database, { fetch: flaky({ left: 1 }) });
  const bulk = st.bulkInsert({ chunkBytes: 512 });
  // store() throws the insert's error once it failed, close() too: either may see it.
  const run = async (b, docs) => { try { for (const [d, id] of docs) await b.store(d, id); await b.close(); } catch (e) { return e; } };
  const e1 = await run(bulk, Array.from({ length: 100 }, (_, i) => [i === 60 ? { i, "@metadata": { "@expires": "bad" } } : { i }, `lost/${i}`]));
  assert.ok(e1 instanceof K.BulkInsertError && e1.line === 61 && e1.acked === 60, String(e1));
  assert.ok(bulk.segments >= 2, `requests: ${bulk.segments}`);
  assert.equal((await store.get("lost/59")).i, 59);

  const st2 = new K.DocumentStore(server.url, store.database, { fetch: flaky({ left: 1 }) });
  const gen = st2.bulkInsert({ chunkBytes: 512 });
  const e2 = await run(gen, Array.from({ length: 50 }, (_, i) => [{ i }, "lostgen/"]));
  assert.ok(e2 instanceof K.ConnectionFailedError && /may or may not/.test(e2.message), String(e2));
  assert.equal(gen.segments, 1, "not sent again: it would create second documents");
});

test("a bulk insert into a database that does not exist fails with its typed error", async () => {
  const other = new K.DocumentStore(server.url, "nosuchdb_bulk");
  const bulk = other.bulkInsert();
  await bulk.store({ a: 1 }, "a/1").catch(() => {});
  await assert.rejects(bulk.close(), K.DatabaseNotFoundError);
  const b2 = store.bulkInsert();
  await assert.rejects(b2.store([1], "x/1"), K.InvalidArgumentError);
  await assert.rejects(b2.store({ no: "collection" }), K.InvalidArgumentError);
  await b2.close();
  assert.equal(b2.acked, 0);
});
