/**
 * The query builder: text in the server's query language, values as parameters.
 *
 * `session.query("users").whereGreaterThan("age", 30).orderBy("name").take(20)` is
 * `from users where age > $p0 order by name limit 20` with `{p0: 30}`. Values are
 * never spliced into the text; field, collection and index names are checked against
 * the language's grammar (or quoted) and anything else is refused.
 */

import { InvalidArgumentError } from "./errors.js";
import type { Session } from "./session.js";
import type { Doc, DocumentStore } from "./store.js";

const IDENT = "[A-Za-z_][A-Za-z0-9_]*";
const FIELD_RE = new RegExp(`^${IDENT}(\\[\\])?(\\.${IDENT}(\\[\\])?)*$`);
const COLLECTION_RE = new RegExp(`^${IDENT}$`);
const KEYWORDS = new Set(["from", "where", "and", "or", "not", "order", "by", "asc", "desc", "limit",
  "offset", "select", "between", "in", "startswith", "exists", "index", "true", "false", "null",
  "group", "as", "search", "score", "highlight"]);

/** A field path (`age`, `address.city`, `tags[]`), or InvalidArgumentError. */
export function checkField(name: unknown): string {
  if (typeof name !== "string" || !FIELD_RE.test(name) || KEYWORDS.has(name.toLowerCase())) {
    throw new InvalidArgumentError(
      `invalid field path ${JSON.stringify(name)}: identifiers joined by '.', optionally ending in [] (each element of an array)`);
  }
  return name;
}

/** A single-quoted string literal of the language (for an index name). */
export function quoteString(text: string): string {
  return `'${text.replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`;
}

export type AggregateFunction = "count" | "sum" | "avg" | "min" | "max";

/** What `POST /dbs/{db}/queries` answered. */
export interface QueryResult<T = Doc> {
  results: T[];
  total: number;
  skipped: number;
  /** True when the index had not caught up at the query's snapshot. */
  stale: boolean;
  index: string | null;
  indexEtag: string | null;
  durationMs: number | undefined;
  /** Present when the page was full: the next page's token. */
  continuation: string | null;
  /** With search(): each result's BM25 score (taken out of `@metadata.@score`). */
  scores: (number | undefined)[];
  /** With highlight(): each result's snippets, path -> HTML (taken out of `@metadata.@highlights`). */
  highlights: Record<string, string>[];
  /** `""`, `"304"` or `"aggressive"`. */
  fromCache: "" | "304" | "aggressive";
  raw: Record<string, unknown>;
}

interface QueryInit {
  collection?: string | undefined;
  index?: string | undefined;
  raw?: string | undefined;
  rawParams?: Record<string, unknown> | undefined;
}

export class Query<T extends Doc = Doc> {
  private readonly store: DocumentStore;
  private readonly session: Session | undefined;
  private readonly collection: string | undefined;
  private readonly indexName: string | undefined;
  private readonly raw: string | undefined;
  private params: Record<string, unknown>;
  private where: string[] = [];
  private nextJoin: "and" | "or" = "and";
  private negate = false;
  private open = 0;
  private order: string[] = [];
  private limit: number | undefined;
  private offset: number | undefined;
  private selects: string[] = [];
  private groups: string[] = [];
  private aggregates: string[] = [];
  private highlights: string[] = [];
  private waitMs: number | undefined;
  private n = 0;

  constructor(store: DocumentStore, session: Session | undefined, init: QueryInit) {
    this.store = store;
    this.session = session;
    if (init.raw === undefined && (init.collection === undefined) === (init.index === undefined)) {
      throw new InvalidArgumentError("give a collection or an index (one of them)");
    }
    if (init.raw !== undefined && (typeof init.raw !== "string" || init.raw.trim() === "")) {
      throw new InvalidArgumentError("a raw query is a non-empty string");
    }
    if (init.collection !== undefined && (typeof init.collection !== "string" || !COLLECTION_RE.test(init.collection))) {
      throw new InvalidArgumentError(`invalid collection name ${JSON.stringify(init.collection)}`);
    }
    if (init.index !== undefined && (typeof init.index !== "string" || init.index.length === 0)) {
      throw new InvalidArgumentError(`invalid index name ${JSON.stringify(init.index)}`);
    }
    this.collection = init.collection;
    this.indexName = init.index;
    this.raw = init.raw;
    this.params = { ...(init.rawParams ?? {}) };
  }

  // --- where ------------------------------------------------------------------------------

  private param(value: unknown): string {
    if (value === undefined) throw new InvalidArgumentError("a query value cannot be undefined (use null)");
    while (`p${this.n}` in this.params) this.n++;
    const name = `p${this.n++}`;
    this.params[name] = value;
    return `$${name}`;
  }

  private clause(text: string): this {
    if (this.raw !== undefined) throw new InvalidArgumentError("a raw query takes no builder clauses");
    const last = this.where[this.where.length - 1];
    if (last !== undefined && !last.endsWith("(")) this.where.push(this.nextJoin);
    if (this.negate) {
      text = `not ${text}`;
      this.negate = false;
    }
    this.where.push(text);
    this.nextJoin = "and";
    return this;
  }

  private cmp(name: string, op: string, value: unknown): this {
    return this.clause(`${checkField(name)} ${op} ${this.param(value)}`);
  }

  whereEquals(name: string, value: unknown): this { return this.cmp(name, "=", value); }
  whereNotEquals(name: string, value: unknown): this { return this.cmp(name, "!=", value); }
  whereGreaterThan(name: string, value: unknown): this { return this.cmp(name, ">", value); }
  whereGreaterThanOrEqual(name: string, value: unknown): this { return this.cmp(name, ">=", value); }
  whereLessThan(name: string, value: unknown): this { return this.cmp(name, "<", value); }
  whereLessThanOrEqual(name: string, value: unknown): this { return this.cmp(name, "<=", value); }

  whereBetween(name: string, low: unknown, high: unknown): this {
    return this.clause(`${checkField(name)} between ${this.param(low)} and ${this.param(high)}`);
  }

  whereIn(name: string, values: readonly unknown[]): this {
    if (!Array.isArray(values)) throw new InvalidArgumentError("whereIn() takes an array of values");
    return this.clause(`${checkField(name)} in ${this.param([...values])}`);
  }

  whereStartsWith(name: string, prefix: string): this {
    if (typeof prefix !== "string") throw new InvalidArgumentError("whereStartsWith() takes a string prefix");
    return this.cmp(name, "startsWith", prefix);
  }

  whereExists(name: string): this {
    return this.clause(`exists(${checkField(name)})`);
  }

  /**
   * A full-text condition, `search(name, $p)`: words, `"a phrase"`, `prefix*`,
   * `+required`, `-excluded`, `word^2`. Needs a full-text index of the collection with
   * `name` (`"search": true`); a condition of the where's top-level `and`.
   */
  search(name: string, text: string): this {
    if (typeof text !== "string") throw new InvalidArgumentError("search() needs the text as a string");
    return this.clause(`search(${checkField(name)}, ${this.param(text)})`);
  }

  andAlso(): this {
    this.nextJoin = "and";
    return this;
  }

  orElse(): this {
    const last = this.where[this.where.length - 1];
    if (last === undefined || last.endsWith("(")) throw new InvalidArgumentError("orElse() needs a clause before it");
    this.nextJoin = "or";
    return this;
  }

  /** Negates the next clause or subclause. */
  not(): this {
    this.negate = !this.negate;
    return this;
  }

  openSubclause(): this {
    if (this.raw !== undefined) throw new InvalidArgumentError("a raw query takes no builder clauses");
    const last = this.where[this.where.length - 1];
    if (last !== undefined && !last.endsWith("(")) this.where.push(this.nextJoin);
    this.where.push(this.negate ? "not (" : "(");
    this.negate = false;
    this.nextJoin = "and";
    this.open++;
    return this;
  }

  closeSubclause(): this {
    const last = this.where[this.where.length - 1];
    if (this.open === 0 || last === undefined || last === "(" || last === "not (") {
      throw new InvalidArgumentError("closeSubclause() without an open, non-empty subclause");
    }
    this.where.push(")");
    this.open--;
    return this;
  }

  // --- the rest -------------------------------------------------------------------------------

  orderBy(...names: string[]): this {
    this.order.push(...names.map(checkField));
    return this;
  }

  orderByDescending(...names: string[]): this {
    this.order.push(...names.map((n) => `${checkField(n)} desc`));
    return this;
  }

  /** Orders by the search() relevance (BM25), best first unless `ascending`. */
  orderByScore(ascending = false): this {
    this.order.push(ascending ? "score() asc" : "score()");
    return this;
  }

  /** Snippets of these full-text fields with the matched words in `<b>` (QueryResult.highlights). */
  highlight(...names: string[]): this {
    this.highlights.push(...names.map((n) => `highlight(${checkField(n)})`));
    return this;
  }

  take(n: number): this {
    if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError(`take() needs a non-negative integer, not ${n}`);
    this.limit = n;
    return this;
  }

  skip(n: number): this {
    if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError(`skip() needs a non-negative integer, not ${n}`);
    this.offset = n;
    return this;
  }

  /** Projects the results to these fields (not tracked by the session). */
  selectFields(...names: string[]): this {
    this.selects.push(...names.map(checkField));
    return this;
  }

  /** One result per group of these fields (a plain object of the group fields and the aggregate outputs). */
  groupBy(...names: string[]): this {
    if (names.length === 0) throw new InvalidArgumentError("groupBy() needs at least one field");
    this.groups.push(...names.map(checkField));
    return this;
  }

  /** Adds an output `name`: count (no field), or sum/avg/min/max of `field`. */
  aggregate(name: string, fn: AggregateFunction, field?: string): this {
    const f = typeof fn === "string" ? fn.toLowerCase() : fn;
    if (!["count", "sum", "avg", "min", "max"].includes(f)) {
      throw new InvalidArgumentError(`unknown aggregate ${JSON.stringify(fn)}: count, sum, avg, min or max`);
    }
    if ((f === "count") !== (field === undefined)) {
      throw new InvalidArgumentError("count takes no field; sum, avg, min and max take one");
    }
    const arg = field === undefined ? "" : checkField(field);
    this.aggregates.push(`${f}(${arg}) as ${checkField(name)}`);
    return this;
  }

  /** The server waits (bounded, at most 30 s) for the index to catch up with the database. */
  waitForNonStale(timeoutMs = 15_000): this {
    if (!Number.isInteger(timeoutMs) || timeoutMs < 0 || timeoutMs > 30_000) {
      throw new InvalidArgumentError(`waitForNonStale() takes 0..30000 ms, not ${timeoutMs}`);
    }
    this.waitMs = timeoutMs;
    return this;
  }

  // --- the text ------------------------------------------------------------------------------

  /** `{query, params}` as sent to the server. */
  toRql(limitOverride?: number): { query: string; params: Record<string, unknown> } {
    if (this.raw !== undefined) return { query: this.raw, params: { ...this.params } };
    if (this.open) throw new InvalidArgumentError(`${this.open} subclause(s) left open`);
    const parts = [this.collection !== undefined ? `from ${this.collection}` : `from index ${quoteString(this.indexName ?? "")}`];
    if (this.where.length > 0) {
      let text = "";
      for (const tok of this.where) {
        if (tok === ")") text += ")";
        else if (text.endsWith("(")) text += tok;
        else text += (text ? " " : "") + tok;
      }
      parts.push(`where ${text}`);
    }
    if (this.aggregates.length > 0 && this.groups.length === 0) throw new InvalidArgumentError("aggregate() needs groupBy()");
    if (this.groups.length > 0) parts.push(`group by ${this.groups.join(", ")}`);
    if (this.order.length > 0) parts.push(`order by ${this.order.join(", ")}`);
    const limit = limitOverride ?? this.limit;
    if (limit !== undefined) parts.push(`limit ${limit}`);
    if (this.offset !== undefined) parts.push(`offset ${this.offset}`);
    let outputs = [...this.selects, ...this.aggregates];
    if (this.groups.length > 0 && this.selects.length === 0) outputs = [...this.groups, ...this.aggregates];
    if (outputs.length > 0 && (this.aggregates.length > 0 || this.selects.length > 0)) outputs = [...outputs, ...this.highlights];
    else outputs = [...this.highlights];
    if (outputs.length > 0) parts.push(`select ${outputs.join(", ")}`);
    return { query: parts.join(" "), params: { ...this.params } };
  }

  toString(): string {
    return this.toRql().query;
  }

  /** The JSON body of `POST /queries`. */
  requestBody(opts: { limit?: number; continuation?: string } = {}): Record<string, unknown> {
    const { query, params } = this.toRql(opts.limit);
    const body: Record<string, unknown> = { query, params };
    if (this.waitMs !== undefined) body["wait_for_non_stale_ms"] = this.waitMs;
    if (opts.continuation !== undefined) body["continuation"] = opts.continuation;
    return body;
  }

  // --- running ----------------------------------------------------------------------------------

  /** Runs the query (`POST /dbs/{db}/queries`, through the HTTP cache). */
  async execute(opts: { continuation?: string; limit?: number } = {}): Promise<QueryResult<T>> {
    const body = stableJson(this.requestBody(opts));
    const s = this.session;
    const r = await this.store.cachedRequest("POST", `${this.store.dbPath}/queries`, {
      body, ...(s ? { onRequest: () => s.countRequest() } : {}),
    });
    return this.result(r.json<Record<string, unknown>>(), r.fromCache);
  }

  private result(a: Record<string, unknown>, fromCache: "" | "304" | "aggressive"): QueryResult<T> {
    const { results, scores, highlights } = takeSearchMetadata((a["results"] as unknown[]) ?? []);
    let out = results;
    if (this.selects.length === 0 && this.groups.length === 0 && this.session !== undefined) {
      const s = this.session;
      out = results.map((d) => (d !== null && typeof d === "object" ? s.trackQueryResult(d as Doc) : d));
    }
    return {
      results: out as T[],
      total: Number(a["total"] ?? out.length),
      skipped: Number(a["skipped"] ?? 0),
      stale: Boolean(a["stale"]),
      index: (a["index"] as string | null | undefined) ?? null,
      indexEtag: (a["index_etag"] as string | null | undefined) ?? null,
      durationMs: a["duration_ms"] as number | undefined,
      continuation: (a["continuation"] as string | null | undefined) ?? null,
      scores, highlights, fromCache, raw: a,
    };
  }

  async toList(): Promise<T[]> {
    return (await this.execute()).results;
  }

  async first(): Promise<T | undefined> {
    return (await this.execute({ limit: 1 })).results[0];
  }

  /** The exact number of matches (the answer's `total`). */
  async count(): Promise<number> {
    return (await this.execute({ limit: 1 })).total;
  }

  /**
   * Every match, page by page (`pageSize` per request), following the server's
   * `continuation` (an ordered index scan resumes after its last entry instead of
   * walking an offset). `take()` bounds the total. In a session each page is a
   * request of its budget.
   */
  async *stream(opts: { pageSize?: number } = {}): AsyncGenerator<T> {
    const pageSize = opts.pageSize ?? 256;
    if (!Number.isInteger(pageSize) || pageSize < 1) throw new InvalidArgumentError(`pageSize must be a positive integer, not ${pageSize}`);
    const cap = this.limit;
    let given = 0;
    let continuation: string | undefined;
    for (;;) {
      const want = cap === undefined ? pageSize : Math.min(pageSize, cap);
      if (cap !== undefined && given >= cap) return;
      const page = await this.execute({ limit: want, ...(continuation !== undefined ? { continuation } : {}) });
      for (const r of page.results) {
        if (cap !== undefined && given >= cap) return;
        given++;
        yield r;
      }
      if (!page.continuation || page.results.length === 0) return;
      continuation = page.continuation;
    }
  }

  [Symbol.asyncIterator](): AsyncGenerator<T> {
    return this.stream();
  }
}

function stableJson(v: unknown): string {
  return JSON.stringify(v, (_k, value: unknown) => {
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      return Object.fromEntries(Object.keys(value as Doc).sort().map((k) => [k, (value as Doc)[k]]));
    }
    return value;
  });
}

/** The results without `@score` and `@highlights` in their `@metadata` (new objects), and those values. */
function takeSearchMetadata(results: unknown[]): { results: unknown[]; scores: (number | undefined)[]; highlights: Record<string, string>[] } {
  const out: unknown[] = [];
  const scores: (number | undefined)[] = [];
  const highlights: Record<string, string>[] = [];
  for (const r of results) {
    const meta = r !== null && typeof r === "object" ? (r as Doc)["@metadata"] : undefined;
    if (meta !== null && typeof meta === "object" && ("@score" in (meta as Doc) || "@highlights" in (meta as Doc))) {
      const m = { ...(meta as Doc) };
      const score = m["@score"];
      delete m["@score"];
      const hl = m["@highlights"];
      delete m["@highlights"];
      scores.push(typeof score === "number" ? score : undefined);
      highlights.push({ ...((hl as Record<string, string> | undefined) ?? {}) });
      out.push({ ...(r as Doc), "@metadata": m });
    } else {
      scores.push(undefined);
      highlights.push({});
      out.push(r);
    }
  }
  return { results: out, scores, highlights };
}
