// A real three-node `kiln serve --cluster`: writes through the store reach the leader
// (a store given only a follower follows its 307), every node reads them, and after the
// leader is killed -9 the store finds the new leader and goes on writing.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as K from "../dist/esm/index.js";
import { KilnServer, freePort, sleep, dbName } from "./helpers.mjs";

let servers = [];
before(async () => {
  const ports = [await freePort(), await freePort(), await freePort()];
  const spec = ports.map((p, i) => `${i + 1}=127.0.0.1:${p}`).join(",");
  servers = ports.map((port, i) => new KilnServer({
    port, dataDir: mkdtempSync(join(tmpdir(), `kiln-ts-cluster-${i + 1}-`)),
    extra: ["--node-id", String(i + 1), "--cluster", spec, "--election-timeout-ms", "300"],
  }));
  await Promise.all(servers.map((s) => s.start()));
});
after(async () => {
  await Promise.all(servers.map((s) => s.stop()));
});

async function leaderOf(urls) {
  for (let i = 0; i < 100; i++) {
    for (const u of urls) {
      try {
        const st = await (await fetch(`${u}/cluster`)).json();
        if (st.state === "leader") return u;
      } catch {
        // down
      }
    }
    await sleep(50);
  }
  throw new Error("no leader");
}

test("writes reach the leader, a follower's 307 is followed, a killed leader is replaced", async (t) => {
  const urls = servers.map((s) => s.url);
  const db = dbName();
  const store = new K.DocumentStore(urls, db, { failoverTimeoutMs: 15_000 });
  await store.createDatabase();
  const leader = await leaderOf(urls);
  const etag = await store.put("users/ada", { name: "Ada" });
  assert.equal(store.lastNode, leader);
  assert.equal(store.leaderUrl, leader);
  // Every node has it, with the same etag (a follower may lag a moment).
  for (const u of urls) {
    let doc;
    for (let i = 0; i < 50 && !doc; i++) {
      const r = await fetch(`${u}/dbs/${db}/docs/users/ada`);
      if (r.status === 200) doc = await r.json();
      else await sleep(20);
    }
    assert.equal(doc["@metadata"]["@etag"], etag, u);
  }
  // GET /cluster as the node in use (the first URL) sees it.
  const status = await store.clusterStatus();
  assert.equal(status.node_id, 1);
  assert.equal(`http://${status.members.find((m) => m.id === status.leader)?.address}`, leader);
  assert.deepEqual(status.members.map((m) => m.id).sort(), [1, 2, 3]);
  assert.equal(status.members.filter((m) => m.role === "leader").length, 1);
  assert.ok(status.term >= 1 && status.last_applied !== null, JSON.stringify(status));
  // A store given one follower's URL: its write is redirected (307) to the leader.
  const follower = urls.find((u) => u !== leader);
  const single = new K.DocumentStore(follower, db);
  await single.put("users/bob", { name: "Bob" });
  assert.equal(single.lastNode, leader);
  assert.equal(single.clustered, true);
  // Bulk insert goes to the leader too (replicated, one log entry per batch).
  const bulk = store.bulkInsert();
  for (let i = 0; i < 2000; i++) await bulk.store({ i }, `bulk/${i}`);
  await bulk.close();
  assert.equal(bulk.acked, 2000);
  // A session's batch, then the leader is killed -9: the store finds the new one.
  const s = store.session();
  s.store({ name: "Cy" }, "users/cy");
  await s.saveChanges();
  // A changes feed on the leader (first URL of its store): when that node dies the
  // feed moves to another node and resumes from the same etag (every node gives a
  // change the same etag): nothing missed, nothing repeated.
  const feedStore = new K.DocumentStore([leader, ...urls.filter((u) => u !== leader)], db, { failoverTimeoutMs: 15_000 });
  const changes = feedStore.changes({ reconnectDelayMs: 50, maxReconnectDelayMs: 200 });
  t.after(() => changes.close());
  const sub = changes.forPrefix("feed/");
  assert.ok(await sub.waitSubscribed(5000));
  await store.put("feed/1", { n: 1 });
  assert.equal((await sub.next(5000))?.id, "feed/1");
  await servers[urls.indexOf(leader)].kill();
  const e2 = await store.put("users/dan", { name: "Dan" });
  await store.put("feed/2", { n: 2 });
  await store.put("feed/3", { n: 3 });
  const got = [];
  for (let c; got.length < 2 && (c = await sub.next(10_000)) !== undefined;) got.push(c.id);
  assert.deepEqual(got, ["feed/2", "feed/3"]);
  assert.equal(await sub.next(300), undefined, "nothing repeated");
  assert.notEqual(feedStore.url, leader, "the feed (and reads) moved to another node");
  assert.match(e2, /^\d+-/);
  assert.notEqual(store.lastNode, leader);
  assert.notEqual(store.leaderUrl, leader);
  // Reads fail over too when the node in use was the one killed.
  assert.equal((await store.get("users/ada")).name, "Ada");
  assert.notEqual(store.lastNode, leader);
  await store.close();
});

test("a subscription's worker follows the leader across a kill -9 and misses nothing", async () => {
  // The node the test before killed comes back first: two must stay after this kill.
  for (const s of servers) if (!s.proc) await s.start();
  const urls = servers.map((s) => s.url);
  const db = dbName();
  const leader = await leaderOf(urls);
  // The followers first: the worker must still find the leader.
  const store = new K.DocumentStore([...urls.filter((u) => u !== leader), leader], db, { failoverTimeoutMs: 15_000 });
  await store.createDatabase();
  await store.createSubscription("all", "from items");
  for (let i = 0; i < 30; i++) await store.put(`items/${i}`, { i });
  const sub = store.subscription("all");
  const seen = [];
  let killed;
  const run = sub.run(async (batch) => {
    for (const d of batch.documents) seen.push([d["@metadata"]["@id"], Number(d["@metadata"]["@etag"].split("-")[0])]);
    // The first batch is acknowledged after its leader is gone: the new leader
    // sends it again (at least once), then the rest.
    killed ??= servers[urls.indexOf(leader)].kill();
    await killed;
  }, { batchSize: 10, reconnectDelayMs: 50, maxReconnectDelayMs: 200 });
  const deadline = Date.now() + 30_000;
  while (killed === undefined && Date.now() < deadline) await sleep(20);
  await killed;
  await leaderOf(urls.filter((u) => u !== leader));
  for (let i = 30; i < 45; i++) await store.put(`items/${i}`, { i });
  while (new Set(seen.map(([id]) => id)).size < 45 && Date.now() < deadline) await sleep(50);
  sub.stop();
  await run;
  const ids = new Set(seen.map(([id]) => id));
  assert.equal(ids.size, 45, JSON.stringify([...ids]));
  assert.ok(sub.connections >= 2, `connections ${sub.connections}`);
  // After the reconnection: from the position again (the first batch was never
  // acknowledged), in etag order.
  const again = seen.findIndex(([, e], i) => i > 0 && e === seen[0][1]);
  const after = seen.slice(again).map(([, e]) => e);
  assert.ok(again > 0, "the unacknowledged first batch came again");
  assert.deepEqual(after, [...after].sort((a, b) => a - b));
  assert.equal(new Set(after).size, 45);
  await store.close();
});
