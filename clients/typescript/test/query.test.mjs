// The query builder's text (values always parameters, names checked), queries run
// against the server, continuation paging as an async iterator, full-text search with
// scores and highlights, and groupBy(...).aggregate(...).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import * as K from "../dist/esm/index.js";
import { startServer, newStore } from "./helpers.mjs";

let server, store;
before(async () => {
  server = await startServer();
  store = await newStore(server);
  const bulk = store.bulkInsert();
  for (let i = 0; i < 60; i++) {
    await bulk.store({ name: `user${String(i).padStart(2, "0")}`, age: 20 + (i % 30), city: ["Oslo", "Paris", "Rome"][i % 3] }, `users/${i}`);
  }
  for (let i = 0; i < 12; i++) {
    await bulk.store({ company: `c${i % 3}`, amount: i + 1 }, `orders/${i}`);
  }
  await bulk.close();
});
after(async () => {
  await store?.done();
  await server?.stop();
});

test("the text: values are parameters, never spliced", () => {
  const s = store.session();
  const q = s.query("users").whereGreaterThan("age", 30).orderBy("name").take(20);
  assert.deepEqual(q.toRql(), { query: "from users where age > $p0 order by name limit 20", params: { p0: 30 } });
  const evil = "x' or 1=1 --";
  const q2 = s.query("users").whereEquals("name", evil).orElse().openSubclause().whereIn("city", ["a", "b"]).not().whereExists("age").closeSubclause();
  assert.deepEqual(q2.toRql(), {
    query: "from users where name = $p0 or (city in $p1 and not exists(age))",
    params: { p0: evil, p1: ["a", "b"] },
  });
  assert.ok(!q2.toRql().query.includes(evil));
  assert.equal(s.query("users").whereBetween("age", 1, 2).whereStartsWith("name", "A").skip(5).selectFields("name", "address.city").toString(),
    "from users where age between $p0 and $p1 and name startsWith $p2 offset 5 select name, address.city");
  assert.equal(s.query("orders").groupBy("company").aggregate("total", "sum", "amount").aggregate("n", "count").toString(),
    "from orders group by company select company, sum(amount) as total, count() as n");
  assert.equal(s.query("articles").search("body", 'lazy "brown dog" -cat').orderByScore().highlight("body").take(10).toString(),
    "from articles where search(body, $p0) order by score() limit 10 select highlight(body)");
  assert.equal(s.query({ index: "it's" }).whereEquals("a", 1).toString(), "from index 'it\\'s' where a = $p0");
  const raw = s.rawQuery("from users where age >= $min", { min: 30 });
  assert.deepEqual(raw.toRql(), { query: "from users where age >= $min", params: { min: 30 } });
  assert.throws(() => raw.whereEquals("a", 1), K.InvalidArgumentError);
  assert.throws(() => s.query("users").whereEquals("a", undefined), K.InvalidArgumentError);
  assert.throws(() => s.query("users").openSubclause().toRql(), /left open/);
  assert.throws(() => s.query("users").orElse(), K.InvalidArgumentError);
  assert.throws(() => s.query("users").aggregate("n", "count").toRql(), /groupBy/);
  assert.throws(() => s.query("users").aggregate("n", "sum"), K.InvalidArgumentError);
  assert.throws(() => s.query("users").whereEquals("order", 1), K.InvalidArgumentError, "a keyword is not a field");
});

test("queries run on the server; results are tracked by the session", async () => {
  const s = store.session();
  const r = await s.query("users").whereGreaterThanOrEqual("age", 45).orderByDescending("age").orderBy("name").take(5).waitForNonStale(5000).execute();
  assert.equal(r.total, 10);
  assert.equal(r.results.length, 5);
  assert.ok(r.results.every((u) => u.age >= 45));
  assert.equal(r.results[0].age, 49);
  assert.ok(r.results[0].name < r.results[1].name);
  // Tracked: a load of a query's result is the same object, without a request.
  const n = s.requests;
  assert.equal(await s.load(r.results[0]["@metadata"]["@id"]), r.results[0]);
  assert.equal(s.requests, n);
  r.results[0].age = 100;
  await s.saveChanges();
  assert.equal((await store.get(r.results[0]["@metadata"]["@id"])).age, 100);
  const raw = await s.rawQuery("from users where city = $c and age < $a", { c: "Rome", a: 25 }).toList();
  assert.ok(raw.length > 0 && raw.every((u) => u.city === "Rome" && u.age < 25));
  assert.equal(await store.query("users").whereEquals("city", "Oslo").count(), 20);
  assert.equal((await store.query("users").whereEquals("name", "user07").first()).age, 27);
  await assert.rejects(store.rawQuery("from users where").execute(), K.InvalidQueryError);
});

test("continuation paging as an async iterator: every match once, in order, page by page", async () => {
  const seen = [];
  let requests = store.stats.requests;
  for await (const u of store.query("users").orderBy("name").stream({ pageSize: 7 })) seen.push(u.name);
  requests = store.stats.requests - requests;
  assert.equal(seen.length, 60);
  assert.deepEqual(seen, [...seen].sort());
  assert.equal(new Set(seen).size, 60);
  assert.ok(requests >= 9, `pages: ${requests}`);
  // The pages after the first send the server's continuation back.
  const bodies = [];
  const spy = new K.DocumentStore(server.url, store.database, {
    fetch: (url, init) => { if (String(url).endsWith("/queries")) bodies.push(JSON.parse(init.body)); return fetch(url, init); },
  });
  let m = 0;
  for await (const _u of spy.query("users").orderBy("name").stream({ pageSize: 25 })) m++;
  assert.equal(m, 60);
  assert.equal(bodies.length, 3);
  assert.equal(bodies[0].continuation, undefined);
  assert.ok(typeof bodies[1].continuation === "string" && typeof bodies[2].continuation === "string");
  assert.ok(bodies.every((b) => b.query === "from users order by name limit 25"));
  // take() bounds the total; a where filters.
  const some = [];
  for await (const u of store.query("users").whereEquals("city", "Paris").orderBy("name").take(11).stream({ pageSize: 4 })) some.push(u);
  assert.equal(some.length, 11);
  assert.ok(some.every((u) => u.city === "Paris"));
  // The default iterator.
  let n = 0;
  for await (const _u of store.query("users")) n++;
  assert.equal(n, 60);
});

test("full-text search: scores and highlights taken out of @metadata", async () => {
  await store.request("PUT", `${store.dbPath}/indexes/articles-text`, {
    json: { collection: "articles", fields: [{ path: "body", search: true, analyzer: "english" }] },
  });
  await store.put("articles/1", { body: "The quick brown fox jumps over the lazy dog" });
  await store.put("articles/2", { body: "A lazy dog sleeps all day. The dog is lazy." });
  await store.put("articles/3", { body: "Cats only" });
  const r = await store.session().query("articles").search("body", "lazy dogs").orderByScore().highlight("body").take(10).waitForNonStale(5000).execute();
  assert.equal(r.total, 2);
  assert.deepEqual(r.results.map((d) => d["@metadata"]["@id"]), ["articles/2", "articles/1"]);
  assert.ok(r.scores[0] > r.scores[1] && r.scores[1] > 0);
  assert.match(r.highlights[0].body, /<b>lazy<\/b>/);
  assert.ok(!("@score" in r.results[0]["@metadata"]), "taken out of the document");
  assert.ok("@score" in r.raw.results[0]["@metadata"], "the raw answer keeps it");
});

test("groupBy(...).aggregate(...): one plain object per group", async () => {
  const r = await store.session().query("orders").groupBy("company").aggregate("total", "sum", "amount").aggregate("n", "count")
    .orderByDescending("total").waitForNonStale(5000).execute();
  const by = Object.fromEntries(r.results.map((g) => [g.company, g]));
  // c0: 1+4+7+10, c1: 2+5+8+11, c2: 3+6+9+12
  assert.equal(by.c0.total, 22);
  assert.equal(by.c1.total, 26);
  assert.equal(by.c2.total, 30);
  assert.equal(by.c2.n, 4);
  assert.equal(r.results[0].company, "c2");
});
