// Streaming bulk insert: acks arrive while the upload goes on, the client's queue
// stays bounded, a bad line stops it with the line number and what was committed.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import * as K from "../dist/esm/index.js";
import { startServer, newStore, sleep } from "./helpers.mjs";

let server, store;
before(async () => {
  server = await startServer();
  store = await newStore(server);
});
after(async () => {
  await store?.done();
  await server?.stop();
});

test("100,000 documents: acks arrive during the upload, memory stays bounded", async () => {
  const acks = [];
  const bulk = store.bulkInsert({ maxPendingBytes: 1 << 20, onAck: (acked, etag) => acks.push([acked, etag, bulk.stored]) });
  const heap0 = process.memoryUsage().heapUsed;
  let heapMax = heap0;
  let ackedMidway = 0;
  for (let i = 0; i < 100_000; i++) {
    await bulk.store({ n: i, tag: `t${i % 10}`, payload: "p".repeat(100) }, `items/${i}`);
    if (i % 10_000 === 0) heapMax = Math.max(heapMax, process.memoryUsage().heapUsed);
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
  // Acks came while documents were still being given to store(): streamed, not at the end.
  assert.ok(ackedMidway > 0 && ackedMidway <= 50_001, `acked while the upload was open: ${ackedMidway}`);
  for (let i = 1; i < acks.length; i++) assert.ok(acks[i][0] > acks[i - 1][0], "acks grow");
  assert.ok(bulk.peakPendingBytes <= (1 << 20) + bulk.chunkBytes * 2, `peak queued: ${bulk.peakPendingBytes}`);
  assert.ok(heapMax - heap0 < 64 << 20, `heap grew by ${((heapMax - heap0) >> 20)} MiB`);
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
