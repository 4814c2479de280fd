// Attachments as streams both ways (a ReadableStream up, a ReadableStream down), Range
// and If-Range, and document revisions (list with continuation, revert, purge).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import * as K from "../dist/esm/index.js";
import { oneServerAndStore } from "./helpers.mjs";

let server, store;
oneServerAndStore((s, st) => ([server, store] = [s, st]));

/** A stream of `total` pseudo-random bytes in 64 KiB chunks, made as it is read. */
function byteStream(total, seed = 1) {
  let sent = 0;
  let x = seed;
  return new ReadableStream({
    pull(c) {
      if (sent >= total) return c.close();
      const n = Math.min(65536, total - sent);
      const chunk = new Uint8Array(n);
      for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) & 0x7fffffff; chunk[i] = x & 0xff; }
      sent += n;
      c.enqueue(chunk);
    },
  });
}

async function sha256OfStream(stream) {
  const h = createHash("sha256");
  let n = 0;
  for await (const chunk of stream) { h.update(chunk); n += chunk.length; }
  return [h.digest("hex"), n];
}

test("a 24 MiB attachment streamed up and down; Range and If-Range", async () => {
  const size = 24 << 20;
  const etag0 = await store.put("users/ada", { name: "Ada" });
  const [expected] = await sha256OfStream(byteStream(size, 7));
  const res = await store.putAttachment("users/ada", "big.bin", byteStream(size, 7), { contentType: "application/x-test", ifMatch: etag0 });
  assert.equal(res.attachment.size, size);
  assert.equal(res.attachment.hash, expected);
  assert.notEqual(res.etag, etag0, "the document has a new etag");
  const list = await store.attachments("users/ada");
  assert.deepEqual(list.map((a) => [a.name, a.size, a.content_type]), [["big.bin", size, "application/x-test"]]);

  const a = await store.getAttachment("users/ada", "big.bin");
  assert.equal(a.status, 200);
  assert.equal(a.etag, expected);
  assert.equal(a.size, size);
  const [got, n] = await sha256OfStream(a.body);
  assert.equal(n, size);
  assert.equal(got, expected);

  const part = await store.getAttachment("users/ada", "big.bin", { range: [10, 19] });
  assert.equal(part.status, 206);
  assert.equal(part.size, size);
  const partBytes = new Uint8Array(await new Response(part.body).arrayBuffer());
  assert.equal(partBytes.length, 10);
  // If-Range with the current etag: the part; with an old one: the whole body (200).
  const same = await store.getAttachment("users/ada", "big.bin", { range: [0, 3], ifRange: expected });
  assert.equal(same.status, 206);
  await same.body.cancel();
  const changed = await store.getAttachment("users/ada", "big.bin", { range: [0, 3], ifRange: "0".repeat(64) });
  assert.equal(changed.status, 200, "If-Range with another etag gives the whole body");
  await changed.body.cancel();
  await assert.rejects(store.getAttachment("users/ada", "big.bin", { range: [size + 10, undefined] }), K.RangeNotSatisfiableError);
  await assert.rejects(store.getAttachment("users/ada", "big.bin", { range: [5, 2] }), K.InvalidArgumentError);
});

test("small attachments, conflicts and deletes", async () => {
  const e = await store.put("users/bob", { name: "Bob" });
  await store.putAttachment("users/bob", "note.txt", "hello world", { contentType: "text/plain" });
  assert.equal(new TextDecoder().decode(await store.attachmentBytes("users/bob", "note.txt")), "hello world");
  await assert.rejects(store.putAttachment("users/bob", "x.txt", "x", { ifMatch: e }), K.ConcurrencyError);
  await assert.rejects(store.putAttachment("users/nobody", "x.txt", "x"), K.DocumentNotFoundError);
  await assert.rejects(store.getAttachment("users/bob", "missing.txt"), K.AttachmentNotFoundError);
  await store.deleteAttachment("users/bob", "note.txt");
  assert.deepEqual(await store.attachments("users/bob"), []);
});

test("revisions: listed newest first across pages, reverted, purged", async () => {
  const cfg = await store.setRevisionsConfig({ collections: { orders: { max_revisions: 50 } } });
  assert.equal(cfg.collections.orders.max_revisions, 50);
  assert.equal((await store.revisionsConfig()).collections.orders.max_revisions, 50);
  await assert.rejects(store.setRevisionsConfig({ collections: { orders: { max_revisions: 0 } } }), K.InvalidRevisionsConfigError);
  const etags = [];
  for (let i = 0; i < 7; i++) etags.push(await store.put("orders/1", { total: i }));
  const revs = [];
  for await (const r of store.iterateRevisions("orders/1", 2)) revs.push(r);
  assert.deepEqual(revs.map((r) => r.document.total), [5, 4, 3, 2, 1, 0]);
  assert.deepEqual((await store.revisions("orders/1", { limit: 3 })).map((r) => r.document.total), [5, 4, 3]);
  const old = revs.find((r) => r.document.total === 2);
  await assert.rejects(store.revert("orders/1", old.etag, { ifMatch: etags[0] }), K.ConcurrencyError);
  await store.revert("orders/1", old.etag);
  assert.equal((await store.get("orders/1")).total, 2);
  await assert.rejects(store.revert("orders/1", "1-00000000"), (e) => e instanceof K.RevisionNotFoundError || e instanceof K.InvalidEtagError);
  assert.equal(await store.purgeRevisions("orders/1"), 7);
  assert.deepEqual(await store.revisions("orders/1"), []);
});
