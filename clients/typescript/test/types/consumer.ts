// A strict TypeScript consumer of the package's declarations (type-checked by
// test/package.test.cjs with tsc --noEmit; never run).
import {
  DocumentStore, ConcurrencyError, KilnError, type Doc, type QueryResult, type Change, WriteOutcomeUnknownError,
  NotClusteredError, type ServerStats, type ClusterStatus, type DocumentPage, type IndexInfo,
} from "kiln-client";

interface User extends Doc {
  name: string;
  age: number;
}

export async function example(): Promise<void> {
  const store = new DocumentStore(["http://a:1", "http://b:2"], "shop", { apiKey: "k", timeoutMs: 5000 });
  const s = store.session({ maxRequests: 10 });
  const u: User | undefined = await s.load<User>("users/1");
  if (u !== undefined) u.age += 1;
  s.store({ name: "x", age: 1 } satisfies User, "users/2");
  try {
    await s.saveChanges();
  } catch (e) {
    if (e instanceof ConcurrencyError) {
      const cur: string | undefined = e.currentEtag;
      void cur;
    } else if (e instanceof WriteOutcomeUnknownError) {
      const o: "unknown" = e.outcome;
      void o;
    } else if (e instanceof KilnError) {
      const code: string = e.code;
      void code;
    }
  }
  const r: QueryResult<User> = await store.query("users").whereGreaterThan("age", 3).execute() as QueryResult<User>;
  for (const x of r.results) void x.name;
  for await (const d of store.query("users").stream({ pageSize: 10 })) void d["@metadata"];
  const changes = store.changes();
  for await (const c of changes.forPrefix("users/")) {
    const id: string = c.id;
    const ch: Change["change"] = c.change;
    void id; void ch;
  }
  const bulk = store.bulkInsert({ onAck: (n: number) => void n });
  await bulk.store({ a: 1 }, "a/1");
  await bulk.close();
  const att = await store.getAttachment("a/1", "f", { range: [0, 9] });
  const stream: ReadableStream<Uint8Array> = att.body;
  void stream;
  await store.subscription("s").run(async (batch) => { void batch.documents.length; }, { strategy: "take_over" });
  const stats: ServerStats = await store.serverStats();
  const p99: number = stats.databases[0]!.journal_write_p99_us;
  void p99;
  try {
    const cluster: ClusterStatus = await store.clusterStatus();
    const leader: number | null = cluster.leader;
    void leader;
  } catch (e) {
    if (!(e instanceof NotClusteredError)) throw e;
  }
  const page: DocumentPage<User> = await store.listDocuments<User>({ prefix: "users/", pageSize: 10 });
  const next: string | null = page.next;
  void next;
  const names: string[] = await store.databaseNames();
  void names;
  const idx: IndexInfo = await store.defineIndex("by-age", { collection: "users", fields: ["age", { path: "name", case_insensitive: true }] });
  const behind: number = idx.docs_behind;
  void behind;
  await store.put("users/3", { name: "y", age: 2 }, { ifNoneMatch: "*" });
}
