// Sessions: the identity map, saveChanges as one batch with if_match, the request
// budget, ConcurrencyError with both etags, generated ids, deletes, patches, expiry.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import * as K from "../dist/esm/index.js";
import { requestsTo, oneServerAndStore } from "./helpers.mjs";

let server, store;
oneServerAndStore((s, st) => ([server, store] = [s, st]));

test("store and load: same object, no second request; generated ids", async () => {
  const s = store.session();
  s.store({ name: "Ada", age: 36 }, "users/ada");
  const bob = { name: "Bob", "@metadata": { "@collection": "users" } };
  s.store(bob);
  assert.equal(s.hasChanges(), true);
  await s.saveChanges();
  assert.equal(s.requests, 1);
  assert.match(s.idOf(bob), /^users\/\d+$/);
  assert.equal(bob["@metadata"]["@id"], s.idOf(bob));
  assert.equal(s.hasChanges(), false);

  const s2 = store.session();
  const ada = await s2.load("users/ada");
  assert.equal(ada.name, "Ada");
  assert.equal(await s2.load("users/ada"), ada, "same object");
  assert.equal(s2.requests, 1, "the second load sent nothing");
  assert.equal(await s2.load("users/nobody"), undefined);
  assert.equal(await s2.load("users/nobody"), undefined);
  assert.equal(s2.requests, 2, "a missing id is remembered too");
  const many = await s2.loadMany(["users/ada", s.idOf(bob), "users/zed"]);
  assert.equal(many["users/ada"], ada);
  assert.equal(many[s.idOf(bob)].name, "Bob");
  assert.equal(many["users/zed"], undefined);
  assert.equal(s2.requests, 4);
});

test("changes to loaded documents are saved as one batch with if_match", async () => {
  await store.put("users/cy", { name: "Cy", age: 1 });
  await store.put("users/di", { name: "Di", age: 2 });
  const before = requestsTo(await server.metrics(), { route: "/dbs/{db}/batch", method: "POST" });
  const s = store.session();
  const cy = await s.load("users/cy");
  const di = await s.load("users/di");
  const etagBefore = s.etagOf(cy);
  cy.age = 10;
  s.delete(di);
  s.store({ name: "Ed" }, "users/ed");
  await s.saveChanges();
  const afterM = requestsTo(await server.metrics(), { route: "/dbs/{db}/batch", method: "POST" });
  assert.equal(afterM - before, 1, "one batch request");
  assert.notEqual(s.etagOf(cy), etagBefore);
  assert.equal((await store.get("users/cy")).age, 10);
  assert.equal(await store.get("users/di"), undefined);
  assert.equal((await store.get("users/ed")).name, "Ed");
  // Nothing changed: nothing sent.
  await s.saveChanges();
  assert.equal(s.requests, 3);
});

test("a document changed meanwhile fails the whole batch with ConcurrencyError (expected and current etags)", async () => {
  await store.put("users/fay", { name: "Fay", age: 30 });
  const s = store.session();
  const fay = await s.load("users/fay");
  const loaded = s.etagOf(fay);
  fay.age = 31;
  s.store({ name: "New" }, "users/new-in-failed-batch");
  const theirs = await store.put("users/fay", { name: "Fay", age: 99 });
  await assert.rejects(s.saveChanges(), (e) => {
    assert.ok(e instanceof K.ConcurrencyError, e.constructor.name);
    assert.equal(e.id, "users/fay");
    assert.equal(e.expectedEtag, loaded);
    assert.equal(e.currentEtag, theirs);
    assert.equal(e.status, 409);
    return true;
  });
  assert.equal((await store.get("users/fay")).age, 99, "nothing of the batch was written");
  assert.equal(await store.get("users/new-in-failed-batch"), undefined, "all or nothing");
});

test("the request budget: the 31st request of a session throws RequestBudgetExceededError", async () => {
  const s = store.session();
  for (let i = 0; i < 30; i++) await s.load(`budget/${i}`);
  await assert.rejects(s.load("budget/30"), (e) => e instanceof K.RequestBudgetExceededError && /maxRequests=30/.test(e.message));
  const s2 = store.session({ maxRequests: 2 });
  await s2.load("budget/a");
  await s2.load("budget/b");
  await assert.rejects(s2.load("budget/c"), K.RequestBudgetExceededError);
  await assert.rejects(s2.query("users").toList(), K.RequestBudgetExceededError);
  s2.close();
  await assert.rejects(s2.load("budget/a-new"), K.SessionClosedError);
});

test("store() of an id another object holds is refused; delete by id without loading", async () => {
  await store.put("users/gil", { name: "Gil" });
  const s = store.session();
  const gil = await s.load("users/gil");
  assert.throws(() => s.store({ name: "other" }, "users/gil"), K.InvalidArgumentError);
  s.store(gil); // the same object again: fine
  const s2 = store.session();
  s2.delete("users/gil");
  await s2.saveChanges();
  assert.equal(await store.get("users/gil"), undefined);
});

test("patch, conditional put and expiry", async () => {
  const e1 = await store.put("users/hal", { name: "Hal", address: { city: "Oslo", zip: "1" } });
  const e2 = await store.patch("users/hal", { address: { zip: null, city: "Paris" }, tags: ["x"] });
  assert.notEqual(e1, e2);
  const hal = await store.get("users/hal");
  assert.deepEqual(hal.address, { city: "Paris" });
  assert.deepEqual(hal.tags, ["x"]);
  await assert.rejects(store.put("users/hal", { name: "Hal" }, { ifMatch: e1 }), (e) => e instanceof K.ConcurrencyError && e.currentEtag === e2);
  await store.put("users/hal", { name: "Hal 2" }, { ifMatch: e2 });
  await assert.rejects(store.patch("users/none", { a: 1 }), K.DocumentNotFoundError);
  const at = new Date(Date.now() + 3600_000);
  await store.put("sessions/1", { user: "hal" }, { expires: at });
  assert.equal((await store.get("sessions/1"))["@metadata"]["@expires"], at.toISOString());
  await store.delete("sessions/1");
  await assert.rejects(store.delete("sessions/1"), K.DocumentNotFoundError);
});
