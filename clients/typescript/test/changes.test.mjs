// The changes feed over the WebSocket: subscriptions as async iterators and callbacks,
// a backlog from an etag, and reconnect with resume (no change missed or repeated)
// after a dropped connection and after the server is killed and restarted.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import * as K from "../dist/esm/index.js";
import { sleep, oneServerAndStore } from "./helpers.mjs";

let server, store;
oneServerAndStore((s, st) => ([server, store] = [s, st]));

async function take(sub, n, timeoutMs = 5000) {
  const out = [];
  const deadline = performance.now() + timeoutMs;
  while (out.length < n) {
    const c = await sub.next(Math.max(1, deadline - performance.now()));
    if (c === undefined) break;
    out.push(c);
  }
  return out;
}

test("a prefix subscription as an async iterator, and callbacks", async () => {
  const changes = store.changes();
  const sub = changes.forPrefix("users/");
  const seen = [];
  const cb = changes.forCollection("orders").subscribe((c) => seen.push(c));
  assert.ok(await sub.waitSubscribed(5000));
  assert.ok(await cb.waitSubscribed(5000));
  await store.put("users/ada", { name: "Ada" });
  await store.put("other/x", { a: 1 });
  await store.put("orders/1", { total: 1 });
  await store.delete("users/ada");
  const got = [];
  for await (const c of sub) {
    got.push(c);
    if (got.length === 2) break;
  }
  assert.deepEqual(got.map((c) => [c.id, c.change]), [["users/ada", "put"], ["users/ada", "delete"]]);
  assert.ok(seen.length === 1 && seen[0].id === "orders/1" && seen[0].collection === "orders");
  assert.equal(await sub.next(100), undefined, "nothing else (other/x is not under users/)");
  await changes.close();
});

test("from an etag: the backlog, then caught_up, then live", async () => {
  const e0 = await store.put("log/0", { n: 0 });
  await store.put("log/1", { n: 1 });
  await store.put("log/2", { n: 2 });
  const changes = store.changes();
  const sub = changes.forPrefix("log/", e0);
  const backlog = await take(sub, 2);
  assert.deepEqual(backlog.map((c) => c.id), ["log/1", "log/2"]);
  assert.ok(await sub.waitCaughtUp(5000));
  await store.put("log/3", { n: 3 });
  assert.equal((await sub.next(5000)).id, "log/3");
  await changes.close();
});

test("reconnect and resume: a dropped connection and a kill -9 of the server miss and repeat nothing", async (t) => {
  const changes = store.changes({ reconnectDelayMs: 50, maxReconnectDelayMs: 200 });
  t.after(() => changes.close());
  const sub = changes.forPrefix("feed/");
  assert.ok(await sub.waitSubscribed(5000));
  const written = [];
  const put = async (i) => { await store.put(`feed/${i}`, { i }); written.push(`feed/${i}`); };
  for (let i = 0; i < 5; i++) await put(i);
  assert.deepEqual((await take(sub, 5)).map((c) => c.id), written.slice(0, 5));

  // Dropped by the network: writes while it is down come on reconnect.
  changes.dropConnection();
  for (let i = 5; i < 10; i++) await put(i);
  const afterDrop = await take(sub, 5);
  assert.deepEqual(afterDrop.map((c) => c.id), written.slice(5, 10));
  assert.ok(changes.connections >= 2, `connections: ${changes.connections}`);

  // The server is killed and started again (same data): resume from the last etag.
  await server.kill();
  await sleep(100);
  await server.start();
  for (let i = 10; i < 15; i++) await put(i);
  const afterRestart = await take(sub, 5, 10000);
  assert.deepEqual(afterRestart.map((c) => c.id), written.slice(10, 15));
  assert.equal(await sub.next(300), undefined, "nothing repeated");
  assert.ok(changes.connections >= 3);
  await changes.close();
  // After close the iterator ends.
  assert.equal(await sub.next(), undefined);
});

test("no WebSocket on the platform: a clear error, or a constructor given in the options", async () => {
  const saved = globalThis.WebSocket;
  try {
    globalThis.WebSocket = undefined;
    const st = new K.DocumentStore(server.url, store.database);
    assert.throws(() => st.changes(), (e) => e.code === "no_websocket" && /--experimental-websocket/.test(e.message));
    const st2 = new K.DocumentStore(server.url, store.database, { WebSocket: saved });
    const ch = st2.changes();
    const sub = ch.forDocument("one/1");
    assert.ok(await sub.waitSubscribed(5000));
    await store.put("one/1", { a: 1 });
    assert.equal((await sub.next(5000)).id, "one/1");
    await ch.close();
  } finally {
    globalThis.WebSocket = saved;
  }
});
