// Data subscriptions: a worker acknowledges batches, a handler that throws leaves its
// batch to the next worker (at least once), a worker resumes after a crash (its
// process gone without acknowledging), take_over / if_free, typed errors.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import * as K from "../dist/esm/index.js";
import { PKG, oneServerAndStore } from "./helpers.mjs";

let server, store;
oneServerAndStore((s, st) => ([server, store] = [s, st]));

test("create, run with acknowledgments, position moves; a failing handler's batch comes again", async () => {
  for (let i = 0; i < 10; i++) await store.put(`orders/${i}`, { total: i * 50 });
  const sub = await store.createSubscription("big-orders", "from orders where total > $min", { parameters: { min: 100 } });
  await assert.rejects(store.createSubscription("big-orders", "from orders"), K.SubscriptionExistsError);
  await assert.rejects(store.createSubscription("bad", "from orders order by total"), K.InvalidQueryError);
  // A handler that throws: run ends with its error, nothing acknowledged.
  await assert.rejects(sub.run(() => { throw new Error("boom"); }, { batchSize: 3 }), /boom/);
  assert.equal((await sub.info()).position, null);
  const got = [];
  await sub.run((batch) => { for (const d of batch.documents) got.push(d["@metadata"]["@id"]); }, { batchSize: 3, maxBatches: 3 });
  assert.deepEqual(got, ["orders/3", "orders/4", "orders/5", "orders/6", "orders/7", "orders/8", "orders/9"]);
  const info = await sub.info();
  assert.ok(info.position, "the position moved");
  assert.equal(sub.batches, 3);
  // Later writes come to the next run, from the position.
  await store.put("orders/3", { total: 999 });
  await store.put("orders/20", { total: 5 });
  const next = [];
  await sub.run((b) => { next.push(...b.documents.map((d) => [d["@metadata"]["@id"], d.total])); }, { maxBatches: 1 });
  assert.deepEqual(next, [["orders/3", 999]]);
  assert.equal((await store.subscriptions()).length, 1);
});

test("a worker process killed in its handler: the next worker gets the same batch", async () => {
  for (let i = 0; i < 4; i++) await store.put(`jobs/${i}`, { n: i });
  await store.createSubscription("jobs", "from jobs");
  // A child process runs a worker whose handler never returns; it is killed -9.
  const code = `
    import { DocumentStore } from ${JSON.stringify(PKG + "/dist/esm/index.js")};
    const store = new DocumentStore(${JSON.stringify(server.url)}, ${JSON.stringify(store.database)});
    await store.subscription("jobs").run(async (b) => { console.log("got " + b.documents.length); await new Promise(() => {}); });
  `;
  const child = spawn(process.execPath, ["--experimental-websocket", "--input-type=module", "-e", code], { stdio: ["ignore", "pipe", "inherit"] });
  await new Promise((resolve, reject) => {
    child.stdout.on("data", (d) => { if (String(d).includes("got 4")) resolve(); });
    child.once("exit", () => reject(new Error("the worker exited")));
  });
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGKILL");
  await exited;
  const sub = store.subscription("jobs");
  const seen = [];
  // "wait" (the default) waits until the server has noticed the dead worker.
  await sub.run((b) => { seen.push(...b.documents.map((d) => d.n)); }, { maxBatches: 1 });
  assert.deepEqual(seen, [0, 1, 2, 3], "delivered again: at least once");
});

test("take_over closes the holder with 4009; if_free is refused while held; unknown names are typed", async () => {
  await store.put("tasks/1", { n: 1 });
  await store.createSubscription("tasks", "from tasks");
  const first = store.subscription("tasks");
  let started, release;
  const holding = new Promise((r) => { started = r; });
  const released = new Promise((r) => { release = r; });
  const firstRun = first.run(async () => { started(); await released; });
  await holding;
  await assert.rejects(store.subscription("tasks").run(() => {}, { strategy: "if_free", reconnect: false }), K.SubscriptionBusyError);
  const second = store.subscription("tasks");
  const got = [];
  const secondRun = second.run((b) => { got.push(...b.documents.map((d) => d.n)); }, { strategy: "take_over", maxBatches: 1 });
  await secondRun;
  release(); // the first worker's handler returns: its ack moves nothing, its run ends
  await assert.rejects(firstRun, (e) => e instanceof K.SubscriptionClosedError && e.closeCode === 4009);
  assert.deepEqual(got, [1]);
  await assert.rejects(store.subscription("nope").run(() => {}), K.SubscriptionNotFoundError);
  await store.deleteSubscription("tasks");
  await assert.rejects(store.subscription("tasks").info(), K.SubscriptionNotFoundError);
  // stop() ends a waiting run.
  await store.createSubscription("idle", "from nothing_here");
  const idle = store.subscription("idle");
  const r = idle.run(() => {});
  setTimeout(() => idle.stop(), 200);
  await r;
});
