// Cluster awareness, against fake nodes whose answers the test scripts (node:http):
// 307 to the leader, a write retried ONCE when the error says not_written or the
// connection was refused, outcome "unknown" surfaced (WriteOutcomeUnknownError) instead
// of resending a write that would make a second document, RetryConflictError when the
// resent write's condition fails, read failover to another node. (cluster-real.test.mjs
// runs a real three-node `kiln serve --cluster`.)
import { test, afterEach } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import * as K from "../dist/esm/index.js";
import { freePort, sleep } from "./helpers.mjs";

const nodes = [];
afterEach(async () => {
  for (const n of nodes.splice(0)) await n.close();
});

/** A fake node: GET /cluster from `state`, every other request to `handler` (or 200 {}). */
async function fakeNode(id) {
  const port = await freePort();
  const node = {
    id, port, url: `http://127.0.0.1:${port}`, address: `127.0.0.1:${port}`,
    requests: [], handler: undefined, leaderId: undefined, term: 1, all: undefined,
  };
  const sockets = new Set();
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (d) => { body += d; });
    req.on("end", () => {
      if (req.method === "GET" && req.url === "/cluster") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({
          node_id: id, state: node.leaderId === id ? "leader" : "follower", leader: node.leaderId ?? null, term: node.term,
          members: node.all.map((n) => ({ id: n.id, address: n.address })),
        }));
        return;
      }
      node.requests.push({ method: req.method, url: req.url, body, headers: req.headers });
      if (node.handler) return node.handler(req, res, body);
      reply(res, 200, { id: "x", etag: "1-aaaa" });
    });
  });
  server.on("connection", (s) => { sockets.add(s); s.on("close", () => sockets.delete(s)); });
  await new Promise((r) => server.listen(port, "127.0.0.1", r));
  node.close = () => new Promise((r) => { for (const s of sockets) s.destroy(); server.close(() => r()); });
  nodes.push(node);
  return node;
}

function reply(res, status, body, headers = {}) {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}

async function cluster(n = 3, leader = 1) {
  const all = [];
  for (let i = 1; i <= n; i++) all.push(await fakeNode(i));
  for (const x of all) { x.all = all; x.leaderId = leader; }
  return all;
}

function setLeader(all, id) {
  for (const x of all) { x.leaderId = id; x.term++; }
}

const writes = (node) => node.requests.filter((r) => r.method !== "GET");

test("writes go to the leader found with GET /cluster; a 307 from a former leader is followed once", async () => {
  const [a, b, c] = await cluster(3, 2);
  const store = new K.DocumentStore([a.url, b.url, c.url], "shop", { failoverTimeoutMs: 2000 });
  await store.put("users/ada", { name: "Ada" });
  assert.equal(writes(b).length, 1);
  assert.equal(store.leaderUrl, b.url);
  assert.equal(store.lastNode, b.url);
  // b steps down: it redirects writes to c, and GET /cluster says c leads.
  setLeader([a, b, c], 3);
  b.handler = (req, res) => reply(res, 307, { error: "not_leader", message: "not the leader" }, { location: `http://${c.address}${req.url}` });
  await store.put("users/ada", { name: "Ada 2" }, { ifMatch: "1-aaaa" });
  assert.equal(writes(c).length, 1);
  assert.equal(writes(c)[0].headers["if-match"], '"1-aaaa"', "resent unchanged (same If-Match)");
  assert.equal(writes(c)[0].body, JSON.stringify({ name: "Ada 2" }), "same body");
  assert.equal(store.lastNode, c.url);
  assert.equal(store.leaderUrl, c.url);
  assert.equal(store.stats.failoverRetries, 1);
  // Reads go to the node in use (the first URL), not the leader.
  a.handler = (req, res) => reply(res, 200, { name: "from a" }, { etag: '"5-aaaa"' });
  assert.equal((await store.get("users/ada")).name, "from a");
  assert.equal(store.lastNode, a.url);
});

test("a store given one follower's URL follows its 307 and is in cluster mode from then on", async () => {
  const [a, b] = await cluster(2, 2);
  a.handler = (req, res) => reply(res, 307, { error: "not_leader", message: "follower" }, { location: `http://${b.address}${req.url}` });
  const store = new K.DocumentStore(a.url, "shop");
  assert.equal(store.clustered, false);
  await store.put("users/x", { a: 1 });
  assert.equal(writes(b).length, 1);
  assert.equal(store.clustered, true);
  assert.equal(store.leaderUrl, b.url);
  await store.put("users/y", { a: 1 });
  assert.equal(writes(a).length, 1, "the next write goes straight to the leader");
  assert.equal(writes(b).length, 2);
});

test("503 no_quorum with outcome not_written: a write that generates its id is retried once", async () => {
  const [a, b] = await cluster(2, 1);
  let n = 0;
  a.handler = (req, res) => {
    n++;
    if (n === 1) {
      setLeader([a, b], 2);
      return reply(res, 503, { error: "no_quorum", message: "the cluster has no leader", outcome: "not_written" });
    }
    reply(res, 500, { error: "internal_error", message: "must not come here" });
  };
  b.handler = (req, res) => reply(res, 200, { results: [{ id: "users/17", etag: "9-bbbb" }] });
  const store = new K.DocumentStore([a.url, b.url], "shop");
  const s = store.session();
  const doc = { name: "Gen", "@metadata": { "@collection": "users" } };
  s.store(doc);
  await s.saveChanges();
  assert.equal(s.idOf(doc), "users/17");
  assert.equal(writes(a).length, 1);
  assert.equal(writes(b).length, 1);
  assert.equal(store.stats.failoverRetries, 1);
});

test("outcome unknown: a write that would make a second document is NOT resent (WriteOutcomeUnknownError)", async () => {
  const [a, b] = await cluster(2, 1);
  a.handler = (req, res) => {
    setLeader([a, b], 2);
    reply(res, 503, { error: "no_quorum", message: "no majority within 5000 ms", outcome: "unknown" });
  };
  const store = new K.DocumentStore([a.url, b.url], "shop");
  await assert.rejects(store.request("POST", "/dbs/shop/docs/users/", { json: { name: "Gen" } }), (e) => {
    assert.ok(e instanceof K.WriteOutcomeUnknownError, e.constructor.name);
    assert.equal(e.outcome, "unknown");
    assert.ok(e.cause instanceof K.NoQuorumError && e.cause.outcome === "unknown");
    assert.match(e.message, /may or may not have been applied/);
    assert.equal(e.node, a.url);
    return true;
  });
  assert.equal(writes(b).length, 0, "not sent again");
  // A session batch storing a document without an id: the same.
  const s = store.session();
  s.store({ "@metadata": { "@collection": "users" } });
  setLeader([a, b], 1);
  await assert.rejects(s.saveChanges(), K.WriteOutcomeUnknownError);
  assert.equal(writes(b).length, 0);
});

test("outcome unknown on a named write: resent once; a conflict on the resend is a RetryConflictError", async () => {
  const [a, b] = await cluster(2, 1);
  a.handler = (req, res) => {
    setLeader([a, b], 2);
    reply(res, 503, { error: "not_leader", message: "leadership moved while the write waited", outcome: "unknown" });
  };
  b.handler = (req, res) => reply(res, 409, { error: "conflict", message: "etag mismatch", current_etag: "8-cccc" });
  const store = new K.DocumentStore([a.url, b.url], "shop");
  await assert.rejects(store.put("users/ada", { n: 1 }, { ifMatch: "7-cccc" }), (e) => {
    assert.ok(e instanceof K.RetryConflictError && e instanceof K.ConcurrencyError, e.constructor.name);
    assert.equal(e.id, "users/ada");
    assert.equal(e.expectedEtag, "7-cccc");
    assert.equal(e.currentEtag, "8-cccc");
    assert.ok(e.firstError instanceof K.NotLeaderError);
    assert.ok(e.retryError instanceof K.ConcurrencyError);
    assert.match(e.message, /may have been applied/);
    return true;
  });
  assert.equal(writes(a).length + writes(b).length, 2, "exactly two attempts");
});

test("a connection broken after the request was sent: POST not resent, PUT resent; a refused one is resent", async () => {
  const [a, b] = await cluster(2, 1);
  a.handler = (req, res) => { setLeader([a, b], 2); req.socket.destroy(); };
  b.handler = (req, res) => reply(res, 201, { id: "users/9", etag: "3-dddd" });
  const store = new K.DocumentStore([a.url, b.url], "shop");
  await assert.rejects(store.request("POST", "/dbs/shop/docs/users/", { json: {} }), K.WriteOutcomeUnknownError);
  assert.equal(writes(b).length, 0);
  setLeader([a, b], 1);
  store.view.leader = undefined;
  const etag = await store.put("users/9", { a: 1 });
  assert.equal(etag, "3-dddd");
  assert.equal(writes(b).length, 1);
  // The leader is down (refused): never sent, so even a POST is resent to the new leader.
  setLeader([a, b], 2);
  await a.close();
  await sleep(50); // the client's pooled connection to a sees it close (else: sent on a dead socket, unknown)
  store.view.leader = a.url;
  const r = await store.request("POST", "/dbs/shop/docs/users/", { json: {} });
  assert.equal(r.status, 201);
  assert.equal(writes(b).length, 2);
});

test("a second failure is not retried again; other errors are never retried", async () => {
  const [a, b] = await cluster(2, 1);
  const fail = (res) => reply(res, 503, { error: "no_quorum", message: "no leader", outcome: "not_written" });
  a.handler = (req, res) => { setLeader([a, b], 2); fail(res); };
  b.handler = (req, res) => { setLeader([a, b], 1); fail(res); };
  const store = new K.DocumentStore([a.url, b.url], "shop");
  await assert.rejects(store.put("users/1", {}), (e) => e instanceof K.NoQuorumError && /a retry after/.test(e.message));
  assert.equal(writes(a).length + writes(b).length, 2);
  a.handler = (req, res) => reply(res, 500, { error: "internal_error", message: "bug 42" });
  store.view.leader = a.url;
  await assert.rejects(store.put("users/1", {}), K.InternalServerError);
  assert.equal(writes(a).length + writes(b).length, 3, "a 500 is not retried");
});

test("reads fail over to the next node when the one in use stops answering", async () => {
  const [a, b, c] = await cluster(3, 1);
  for (const n of [a, b, c]) n.handler = (req, res) => reply(res, 200, { from: n.id }, { etag: `"${n.id}-eeee"` });
  const store = new K.DocumentStore([a.url, b.url, c.url], "shop");
  assert.equal((await store.get("x/1")).from, 1);
  await a.close();
  assert.equal((await store.get("x/2")).from, 2);
  assert.equal(store.url, b.url, "the store uses b from now on");
  assert.equal(store.lastNode, b.url);
  await b.close();
  await c.close();
  await assert.rejects(store.get("x/3"), K.ConnectionFailedError);
});

test("no node says it leads within failoverTimeoutMs: NoQuorumError, nothing written", async () => {
  const [a, b] = await cluster(2, null); // an election that does not end
  const store = new K.DocumentStore([a.url, b.url], "shop", { failoverTimeoutMs: 300 });
  const t0 = performance.now();
  await assert.rejects(store.put("users/1", {}), (e) => e instanceof K.NoQuorumError && /within 300 ms/.test(e.message));
  assert.ok(performance.now() - t0 < 2000);
  assert.equal(writes(a).length + writes(b).length, 0);
});

test("the retry rules, unit by unit", () => {
  assert.equal(K.isWrite("POST", "/dbs/d/queries"), false);
  assert.equal(K.isWrite("PUT", "/dbs/d/docs/a"), true);
  assert.equal(K.isWrite("GET", "/dbs/d/docs/a"), false);
  assert.equal(K.resendCannotDuplicate("PUT", "/dbs/d/docs/users/1", undefined), true);
  assert.equal(K.resendCannotDuplicate("PUT", "/dbs/d/docs/users/", undefined), false);
  assert.equal(K.resendCannotDuplicate("POST", "/dbs/d/docs/users/", "{}"), false);
  assert.equal(K.resendCannotDuplicate("DELETE", "/dbs/d/docs/users/1", undefined), true);
  assert.equal(K.resendCannotDuplicate("POST", "/dbs/d/batch", JSON.stringify({ ops: [{ op: "put", id: "a/1", document: {} }] })), true);
  assert.equal(K.resendCannotDuplicate("POST", "/dbs/d/batch", JSON.stringify({ ops: [{ op: "put", id: "a/", document: {} }] })), false);
  assert.equal(K.resendCannotDuplicate("POST", "/dbs/d/bulk", undefined), false);
});
