// Every error code the server can send maps to its own class (from the server's one
// list, clients/error-codes.json), real error answers arrive as those classes, and bad
// input to the client is refused with a clear typed error before any request.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as K from "../dist/esm/index.js";
import { REPO, newStore, freePort, oneServerAndStore } from "./helpers.mjs";

const { DocumentStore } = K;
let server, store;
oneServerAndStore((s, st) => ([server, store] = [s, st]));

test("every code in clients/error-codes.json has its own class, under the class of its status", () => {
  const rows = JSON.parse(readFileSync(join(REPO, "clients", "error-codes.json"), "utf8")).codes;
  const json = Object.fromEntries(rows.map((r) => [r.code, r.status]));
  // The generated list is the JSON one (npm run gen-codes writes it).
  assert.deepEqual({ ...K.SERVER_ERROR_CODES }, json, "src/codes.ts is stale: run npm run gen-codes");
  const missing = Object.keys(json).filter((c) => !(c in K.ERROR_CLASSES)).sort();
  assert.deepEqual(missing, [], `server error codes without a class: ${missing}`);
  const extra = Object.keys(K.ERROR_CLASSES).filter((c) => !(c in json)).sort();
  assert.deepEqual(extra, [], `classes for codes the server never sends: ${extra}`);
  for (const [code, cls] of Object.entries(K.ERROR_CLASSES)) {
    assert.equal(cls.code, code);
    assert.ok(cls.prototype instanceof K.KilnError, code);
    const status = json[code];
    const family = K.STATUS_CLASSES[status];
    if (family !== undefined && family !== cls) {
      assert.ok(cls.prototype instanceof family, `${cls.name} (${code}, sent with ${status}) is not a ${family.name}`);
    }
    const e = K.errorFromResponse(status, JSON.stringify({ error: code, message: "m" }));
    assert.ok(e instanceof cls, `${code} -> ${e.constructor.name}`);
    assert.equal(e.code, code);
    assert.equal(e.status, status);
  }
});

test("a code the client lacks would fail the check above (the check is live)", () => {
  const json = { ...K.SERVER_ERROR_CODES, brand_new_code: 400 };
  const missing = Object.keys(json).filter((c) => !(c in K.ERROR_CLASSES));
  assert.deepEqual(missing, ["brand_new_code"]);
});

test("an unknown code falls back by status; Retry-After and outcome are kept", () => {
  let e = K.errorFromResponse(503, '{"error":"brand_new","message":"m"}');
  assert.equal(e.constructor, K.ServiceUnavailableError);
  assert.equal(e.code, "brand_new");
  e = K.errorFromResponse(502, "bad gateway");
  assert.ok(e instanceof K.ServerError);
  assert.match(e.message, /bad gateway/);
  e = K.errorFromResponse(503, '{"error":"overloaded","message":"x"}', new Headers({ "retry-after": "1" }));
  assert.ok(e instanceof K.OverloadedError);
  assert.equal(e.retryAfter, 1);
  e = K.errorFromResponse(503, '{"error":"no_quorum","message":"x","outcome":"unknown"}');
  assert.ok(e instanceof K.NoQuorumError);
  assert.equal(e.outcome, "unknown");
  // A WebSocket error message has a code and no status: the server's list gives the family.
  e = K.makeError("invalid_message", "m");
  assert.ok(e instanceof K.InvalidMessageError && e instanceof K.BadRequestError);
});

test("real error answers arrive as their classes with the server's message", async () => {
  await assert.rejects(store.request("GET", store.docPath("nope/1")), (e) =>
    e instanceof K.DocumentNotFoundError && e.status === 404 && e.message.includes('"nope/1"') && e.node === server.url);
  const other = new DocumentStore(server.url, "no_such_database");
  await assert.rejects(other.get("a/1"), K.DatabaseNotFoundError);
  await assert.rejects(store.createDatabase({ existOk: false }), K.DatabaseExistsError);
  await assert.rejects(store.request("PUT", store.docPath("a/1"), { body: '{"a": 1,,}' }),
    (e) => e instanceof K.MalformedJsonError && /column/.test(e.message));
  await assert.rejects(store.request("PUT", store.docPath("a/1"), { body: "[1, 2]" }), K.InvalidDocumentError);
  await assert.rejects(store.request("PUT", store.docPath("a/1"), { json: {}, headers: { "if-match": '"zz"' } }), K.InvalidEtagError);
  await assert.rejects(store.request("PUT", store.docPath("a/1"), { json: {}, headers: { "if-match": "*", "if-none-match": "*" } }),
    K.InvalidPreconditionError);
  await store.put("a/2", { v: 1 });
  await assert.rejects(store.request("PUT", store.docPath("a/2"), { json: {}, headers: { "if-none-match": "*" } }),
    (e) => e instanceof K.ConcurrencyError && typeof e.currentEtag === "string");
  await assert.rejects(store.request("GET", `${store.dbPath}/docs`, { params: { page_size: 10 ** 9 } }), K.PageSizeTooLargeError);
  await assert.rejects(store.request("GET", `${store.dbPath}/docs`, { params: { page_size: 0 } }), K.InvalidPageSizeError);
  await assert.rejects(store.request("GET", `${store.dbPath}/docs`, { params: { page_size: "many" } }), K.InvalidQueryError);
  await assert.rejects(store.request("GET", "/no/such/route"), K.RouteNotFoundError);
  await assert.rejects(store.request("PATCH", store.dbPath), K.MethodNotAllowedError);
  await assert.rejects(new DocumentStore(server.url, "bad name!").createDatabase(), K.InvalidDatabaseNameError);
  await assert.rejects(store.patch("a/2", { v: 2 }, { ifMatch: "1-00000000" }), K.ConcurrencyError);
  await assert.rejects(store.request("PATCH", store.docPath("a/2"), { body: "[]", headers: { "content-type": "application/json-patch+json" } }),
    K.UnsupportedMediaTypeError);
});

test("bad input is refused with a clear typed error before any request", async () => {
  assert.throws(() => new DocumentStore("localhost:8080", "db"), (e) => e instanceof K.InvalidArgumentError && /http/.test(e.message));
  assert.throws(() => new DocumentStore("ftp://h:1", "db"), K.InvalidArgumentError);
  assert.throws(() => new DocumentStore([], "db"), K.InvalidArgumentError);
  assert.throws(() => new DocumentStore(["http://a:1", "https://b:2"], "db"), /mix http and https/);
  assert.throws(() => new DocumentStore("http://a:1/some/path", "db"), K.InvalidArgumentError);
  assert.throws(() => new DocumentStore("http://a:1", ""), K.InvalidArgumentError);
  assert.throws(() => new DocumentStore("http://a:1", "db", { ca: "PEM" }), (e) => e instanceof K.InvalidArgumentError && /NODE_EXTRA_CA_CERTS/.test(e.message));
  const before = store.stats.requests;
  await assert.rejects(store.put("", { a: 1 }), K.InvalidArgumentError);
  await assert.rejects(store.put("a/3", [1, 2]), K.InvalidArgumentError);
  await assert.rejects(store.put("a/3", null), K.InvalidArgumentError);
  await assert.rejects(store.put("a/3", { a: 1 }, { expires: new Date("nope") }), K.InvalidArgumentError);
  const s = store.session();
  assert.throws(() => s.store({ no: "collection" }), (e) => e instanceof K.InvalidArgumentError && /collection/.test(e.message));
  assert.throws(() => s.store("not an object", "x/1"), K.InvalidArgumentError);
  assert.throws(() => s.query("users; drop"), K.InvalidArgumentError);
  assert.throws(() => s.query("users").whereEquals("name = 1 or 1", 1), K.InvalidArgumentError);
  assert.throws(() => s.query("users").take(-1), K.InvalidArgumentError);
  assert.throws(() => s.query("users").aggregate("n", "median", "x"), K.InvalidArgumentError);
  assert.throws(() => store.attachmentPath("a/1", "x/y"), K.InvalidArgumentError);
  assert.throws(() => store.subscription("../etc"), K.InvalidArgumentError);
  assert.equal(store.stats.requests, before, "no request was sent for bad input");
});

test("a server that cannot be reached is a ConnectionFailedError naming the node", async () => {
  const url = `http://127.0.0.1:${await freePort()}`;
  const dead = new DocumentStore(url, "db", { timeoutMs: 2000 });
  await assert.rejects(dead.get("a/1"), (e) => e instanceof K.ConnectionFailedError && e.node === url && /ECONNREFUSED/.test(e.message));
  await assert.rejects(dead.put("a/1", {}), K.ConnectionFailedError);
});

test("an etag from an earlier database of the same name is a 410", async () => {
  const st = await newStore(server);
  const etag = await st.put("a/1", { v: 1 });
  await st.put("a/2", { v: 1 });
  await st.deleteDatabase();
  await st.createDatabase();
  await assert.rejects(st.request("GET", `${st.dbPath}/changes`, { params: { since: etag } }),
    (e) => e instanceof K.EtagFromOtherIncarnationError && e.status === 410);
  await st.done();
});
