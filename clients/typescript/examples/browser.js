// The browser example's script (examples/browser.html): kiln-client's ES module build,
// unbundled, against the Kiln server named by ?server=... (which must allow this page's
// origin: `kiln serve --cors-origin <this origin>`).
import { DocumentStore } from "../dist/esm/index.js";

const params = new URLSearchParams(location.search);
const status = document.getElementById("status");
const logList = document.getElementById("log");
const resultEl = document.getElementById("result");

function log(text) {
  const li = document.createElement("li");
  li.textContent = text;
  logList.append(li);
}

function finish(result) {
  resultEl.textContent = JSON.stringify(result, null, 2);
  status.textContent = result.ok ? "done" : "failed";
  status.dataset.state = result.ok ? "done" : "failed";
}

async function run() {
  const server = params.get("server");
  if (!server) throw new Error("no ?server=http://host:port in the page's URL");
  const db = params.get("db") ?? `browser-${Math.random().toString(36).slice(2, 10)}`;
  // No WebSocket option: the store uses the browser's own (globalThis.WebSocket).
  const store = new DocumentStore(server, db);
  const nativeWebSocket = typeof WebSocket === "function" && /\[native code\]/.test(Function.prototype.toString.call(WebSocket));
  try {
    await store.createDatabase();
    log(`database ${db} on ${server}`);

    // Subscribe first, so the session's write below is the change we read.
    const changes = store.changes();
    const sub = changes.forDocument("users/ada");
    if (!(await sub.waitSubscribed(10_000))) throw new Error("the changes feed did not subscribe within 10 s");
    log("changes feed subscribed (WebSocket)");

    // A session: store, saveChanges() (one batch), then load it in a second session.
    const s = store.session();
    const ada = { name: "Ada", age: 36, "@metadata": { "@collection": "users" } };
    s.store(ada, "users/ada");
    s.store({ name: "Bob", age: 25, "@metadata": { "@collection": "users" } }, "users/bob");
    s.store({ name: "Cy", age: 41, "@metadata": { "@collection": "users" } }, "users/cy");
    await s.saveChanges();
    const savedEtag = s.etagOf(ada);
    const s2 = store.session();
    const loaded = await s2.load("users/ada");
    const loadedEtag = s2.etagOf(loaded);
    log(`users/ada stored at etag ${savedEtag}, loaded at etag ${loadedEtag}`);

    // A parameterized query (the value travels as a parameter, never spliced).
    const q = store.query("users").whereGreaterThanOrEqual("age", 30).orderBy("name").waitForNonStale(10_000);
    const rql = q.toRql();
    const answer = await q.execute();
    log(`query ${rql.query} ${JSON.stringify(rql.params)}: ${answer.results.length} result(s)`);

    // One change from the feed (the put of users/ada).
    const change = await sub.next(10_000);
    if (change === undefined) throw new Error("no change arrived on the changes feed within 10 s");
    log(`change: ${change.change} ${change.id} at ${change.etag}`);
    await changes.close();

    return {
      ok: true,
      server,
      db,
      origin: location.origin,
      nativeWebSocket,
      document: {
        id: "users/ada",
        savedEtag,
        loadedEtag,
        name: loaded?.name,
        age: loaded?.age,
      },
      query: {
        rql: rql.query,
        params: rql.params,
        total: answer.total,
        stale: answer.stale,
        results: answer.results.map((d) => ({ id: d["@metadata"]?.["@id"], name: d.name, age: d.age })),
      },
      change: { id: change.id, change: change.change, etag: change.etag, collection: change.collection },
    };
  } finally {
    await store.close();
  }
}

run().then(finish, (e) => {
  finish({ ok: false, error: `${e?.name ?? "Error"}: ${e?.message ?? e}`, code: e?.code });
});
