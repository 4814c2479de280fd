/**
 * The session: a unit of work with an identity map.
 *
 * `load` returns the same object for the same id within a session; changes made to
 * loaded objects are found by comparing them with what was loaded; `saveChanges`
 * sends every new, changed and deleted document in ONE batch (one transaction, all
 * or nothing) with `if_match` on every document the session loaded, so a document
 * changed by someone else meanwhile fails the whole batch with a ConcurrencyError.
 */

import {
  ConcurrencyError, DocumentNotFoundError, InvalidArgumentError, RequestBudgetExceededError,
  RetryConflictError, SessionClosedError,
} from "./errors.js";
import { Query } from "./query.js";
import type { BatchOp, BatchResult, Doc, DocumentStore } from "./store.js";

const SERVER_META = new Set(["@id", "@etag", "@last-modified"]);

export interface SessionOptions {
  /** Requests this session may make (default: the store's, 30). */
  maxRequests?: number;
}

/** A stable JSON text of a document without the server's own metadata (to find changes). */
export function snapshot(body: Doc): string {
  const copy: Doc = { ...body };
  const meta = body["@metadata"];
  if (meta !== null && typeof meta === "object" && !Array.isArray(meta)) {
    copy["@metadata"] = Object.fromEntries(Object.entries(meta as Doc).filter(([k]) => !SERVER_META.has(k)));
  }
  return stableStringify(copy);
}

function stableStringify(v: unknown): string {
  return JSON.stringify(v, (_k, value: unknown) => {
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      return Object.fromEntries(Object.keys(value as Doc).sort().map((k) => [k, (value as Doc)[k]]));
    }
    return value;
  });
}

/** The id prefix (`users/`) under which the server generates an id: from `@metadata.@collection`. */
export function collectionPrefix(doc: Doc): string {
  const meta = doc["@metadata"];
  if (meta !== null && typeof meta === "object" && typeof (meta as Doc)["@collection"] === "string") {
    return `${(meta as Doc)["@collection"] as string}/`;
  }
  throw new InvalidArgumentError(
    "no id given and no collection known: pass an id (or a prefix such as 'users/'), or set @metadata.@collection");
}

function checkDoc(entity: unknown): asserts entity is Doc {
  if (entity === null || typeof entity !== "object" || Array.isArray(entity)) {
    throw new InvalidArgumentError(`a document is a plain JSON object, not ${Array.isArray(entity) ? "an array" : String(entity)}`);
  }
}

interface Tracked {
  id: string | undefined;
  entity: Doc;
  etag: string | undefined;
  snapshot: string | undefined;
  /** The prefix to generate an id under (a new document without an id). */
  prefix: string | undefined;
  deleted: boolean;
  isNew: boolean;
}

export class Session {
  readonly documentStore: DocumentStore;
  readonly maxRequests: number;
  /** Requests this session sent to the server (304s count, aggressive-cache answers don't). */
  requests = 0;
  private byId = new Map<string, Tracked>();
  private byObj = new Map<Doc, Tracked>();
  private missing = new Set<string>();
  private deletes = new Map<string, string | undefined>();
  private newOnes: Tracked[] = [];
  private closed = false;

  constructor(store: DocumentStore, options: SessionOptions = {}) {
    this.documentStore = store;
    const max = options.maxRequests ?? store.maxRequestsPerSession;
    if (!Number.isInteger(max) || max < 0) throw new InvalidArgumentError(`maxRequests must be a non-negative integer, not ${max}`);
    this.maxRequests = max;
  }

  close(): void {
    this.closed = true;
  }


  /** @internal Counts one request against the budget (throws when it is spent). */
  countRequest(): void {
    if (this.closed) throw new SessionClosedError("the session is closed");
    if (this.requests >= this.maxRequests) {
      throw new RequestBudgetExceededError(
        `this session already made ${this.requests} requests, its budget (maxRequests=${this.maxRequests}): ` +
        "a loop of loads would hammer the server. Load what you need once (loadMany, a query), use a new " +
        "session per unit of work, or raise maxRequests if you mean it.");
    }
    this.requests++;
  }

  // --- loading ----------------------------------------------------------------------------

  /** The document, or undefined if it does not exist. Loading an id again returns the same object. */
  async load<T extends Doc = Doc>(id: string): Promise<T | undefined> {
    if (typeof id !== "string" || id.length === 0) throw new InvalidArgumentError(`an id is a non-empty string, not ${JSON.stringify(id)}`);
    const known = this.known(id);
    if (known.known) return known.value as T | undefined;
    let r;
    try {
      r = await this.documentStore.cachedRequest("GET", this.documentStore.docPath(id), {
        onRequest: () => this.countRequest(), isDocument: true,
      });
    } catch (e) {
      if (e instanceof DocumentNotFoundError) {
        this.missing.add(id);
        return undefined;
      }
      throw e;
    }
    return this.trackLoaded(id, r.json<Doc>(), r.etag) as T;
  }

  /** `{id: document or undefined}`; the ids not yet in the session are fetched concurrently (each costs a request). */
  async loadMany<T extends Doc = Doc>(ids: string[]): Promise<Record<string, T | undefined>> {
    const unique = [...new Set(ids)];
    const docs = await Promise.all(unique.map((i) => this.load<T>(i)));
    return Object.fromEntries(unique.map((i, n) => [i, docs[n]]));
  }

  private known(id: string): { known: boolean; value: Doc | undefined } {
    const t = this.byId.get(id);
    if (t !== undefined) return { known: true, value: t.deleted ? undefined : t.entity };
    if (this.missing.has(id)) return { known: true, value: undefined };
    return { known: false, value: undefined };
  }

  /** @internal */
  trackLoaded(id: string, body: Doc, etag: string | undefined): Doc {
    const existing = this.byId.get(id);
    if (existing !== undefined) return existing.entity;
    const meta = (body["@metadata"] ?? {}) as Doc;
    const e = etag ?? (typeof meta["@etag"] === "string" ? (meta["@etag"] as string) : undefined);
    const t: Tracked = { id, entity: body, etag: e, snapshot: snapshot(body), prefix: undefined, deleted: false, isNew: false };
    this.byId.set(id, t);
    this.byObj.set(body, t);
    return body;
  }

  // --- changing -------------------------------------------------------------------------

  /**
   * Adds a new document to the session (written by saveChanges). An id undefined, or
   * ending in `/`, has the server generate one (under `@metadata.@collection`); it is
   * known after saveChanges ({@link idOf}).
   */
  store(entity: Doc, id?: string): void {
    checkDoc(entity);
    if (this.closed) throw new SessionClosedError("the session is closed");
    const t = this.byObj.get(entity);
    if (t !== undefined) {
      if (id !== undefined && t.id !== undefined && id !== t.id) {
        throw new InvalidArgumentError(`this object is already in the session as ${JSON.stringify(t.id)}`);
      }
      return;
    }
    let prefix: string | undefined;
    let docId: string | undefined;
    if (id === undefined || id.endsWith("/")) {
      prefix = id ?? collectionPrefix(entity);
    } else {
      if (typeof id !== "string" || id.length === 0) throw new InvalidArgumentError(`an id is a non-empty string, not ${JSON.stringify(id)}`);
      docId = id;
      const other = this.byId.get(docId);
      if (other !== undefined && !other.deleted) {
        throw new InvalidArgumentError(`another object is already in the session as ${JSON.stringify(docId)}`);
      }
    }
    const n: Tracked = { id: docId, entity, etag: undefined, snapshot: undefined, prefix, deleted: false, isNew: true };
    if (docId !== undefined) {
      const old = this.byId.get(docId);
      if (old !== undefined) {
        // Deleted then stored again: the new one replaces it, conditional on the etag loaded.
        n.etag = old.etag;
        this.byObj.delete(old.entity);
      }
      this.byId.set(docId, n);
      this.missing.delete(docId);
      this.deletes.delete(docId);
    }
    this.byObj.set(entity, n);
    this.newOnes.push(n);
  }

  /** Deletes a document: a loaded one with If-Match, an id not loaded without. */
  delete(entityOrId: Doc | string): void {
    if (this.closed) throw new SessionClosedError("the session is closed");
    let t: Tracked | undefined;
    let id: string;
    if (typeof entityOrId === "string") {
      t = this.byId.get(entityOrId);
      id = entityOrId;
    } else {
      t = this.byObj.get(entityOrId);
      if (t === undefined || t.id === undefined) throw new InvalidArgumentError("this object is not a stored document of the session");
      id = t.id;
    }
    if (t !== undefined) {
      const i = this.newOnes.indexOf(t);
      if (i >= 0) {
        this.newOnes.splice(i, 1);
        this.byObj.delete(t.entity);
        this.byId.delete(id);
        if (t.etag === undefined) return;
      }
      t.deleted = true;
      this.deletes.set(id, t.etag);
    } else {
      this.deletes.set(id, undefined);
      this.missing.add(id);
    }
  }

  idOf(entity: Doc): string | undefined {
    return this.byObj.get(entity)?.id;
  }

  etagOf(entity: Doc): string | undefined {
    return this.byObj.get(entity)?.etag;
  }

  hasChanges(): boolean {
    return this.pending().ops.length > 0;
  }

  private pending(): { ops: BatchOp[]; targets: (Tracked | undefined)[] } {
    const ops: BatchOp[] = [];
    const targets: (Tracked | undefined)[] = [];
    const newSet = new Set(this.newOnes);
    for (const t of this.newOnes) {
      const op: BatchOp = { op: "put", id: t.id ?? t.prefix!, document: t.entity };
      if (t.etag) op.if_match = t.etag;
      ops.push(op);
      targets.push(t);
    }
    for (const [id, t] of this.byId) {
      if (newSet.has(t) || t.deleted) continue;
      if (snapshot(t.entity) !== t.snapshot) {
        const op: BatchOp = { op: "put", id, document: t.entity };
        if (t.etag) op.if_match = t.etag;
        ops.push(op);
        targets.push(t);
      }
    }
    for (const [id, etag] of this.deletes) {
      if (this.byId.get(id)?.isNew) continue;
      const op: BatchOp = { op: "delete", id };
      if (etag) op.if_match = etag;
      ops.push(op);
      targets.push(this.byId.get(id));
    }
    return { ops, targets };
  }

  /** Sends every change as ONE batch (one transaction): all or nothing. */
  async saveChanges(): Promise<void> {
    const { ops, targets } = this.pending();
    if (ops.length === 0) return;
    this.countRequest();
    let results: BatchResult[];
    try {
      results = await this.documentStore.batch(ops);
    } catch (e) {
      if (e instanceof ConcurrencyError) throw this.conflict(e, ops);
      throw e;
    }
    this.apply(ops, targets, results);
  }

  private apply(ops: BatchOp[], targets: (Tracked | undefined)[], results: BatchResult[]): void {
    ops.forEach((op, i) => {
      const t = targets[i];
      const res = results[i]!;
      if (op.op === "delete") {
        this.byId.delete(op.id);
        if (t !== undefined) this.byObj.delete(t.entity);
        this.missing.add(op.id);
        return;
      }
      if (t === undefined) return;
      t.etag = res.etag;
      if (t.id === undefined) {
        t.id = res.id;
        this.byId.set(t.id, t);
        const meta = t.entity["@metadata"];
        if (meta === undefined) t.entity["@metadata"] = { "@id": t.id };
        else if (meta !== null && typeof meta === "object") (meta as Doc)["@id"] = t.id;
      }
      t.prefix = undefined;
      t.isNew = false;
      t.snapshot = snapshot(t.entity);
    });
    this.newOnes = [];
    this.deletes = new Map();
  }

  /** Names the document and both etags (the server names the operation's index and sends the current etag). */
  private conflict(e: ConcurrencyError, ops: BatchOp[]): ConcurrencyError {
    let op: BatchOp | undefined;
    const m = /batch operation (\d+)/.exec(e.message);
    if (m && Number(m[1]) < ops.length) {
      op = ops[Number(m[1])];
    } else {
      const m2 = /document "((?:[^"\\]|\\.)*)"/.exec(e.message);
      if (m2) op = ops.find((o) => o.id === m2[1]);
    }
    const id = op?.id;
    const expected = op?.if_match;
    const current = e.currentEtag;
    if (e instanceof RetryConflictError) {
      const out = new RetryConflictError(
        `document ${JSON.stringify(id)}: this session's batch failed during a failover and was sent again once, ` +
        `unchanged; the second attempt found etag ${JSON.stringify(current)} where the session loaded ` +
        `${JSON.stringify(expected)}. The first attempt may have been applied (the whole batch): load the ` +
        `documents again before deciding what to do (${e.message})`,
        { id, expectedEtag: expected, currentEtag: current, status: e.status, body: e.body, code: e.code });
      out.firstError = e.firstError;
      out.retryError = e.retryError;
      out.node = e.node;
      return out;
    }
    const plain = new ConcurrencyError(
      `document ${JSON.stringify(id)} was changed by someone else: this session loaded it at etag ` +
      `${JSON.stringify(expected)}, the server has ${JSON.stringify(current)}; nothing in the batch was written (${e.message})`,
      { id, expectedEtag: expected, currentEtag: current, status: e.status, body: e.body, code: "conflict" });
    plain.node = e.node;
    return plain;
  }

  // --- queries ------------------------------------------------------------------------------

  /** A query builder: `session.query("users").whereGreaterThan("age", 30)`; results are tracked. */
  query(collection: string): Query;
  query(options: { collection?: string; index?: string }): Query;
  query(arg: string | { collection?: string; index?: string }): Query {
    const o = typeof arg === "string" ? { collection: arg } : arg;
    return new Query(this.documentStore, this, o);
  }

  /** A query in the server's language, with `$name` parameters. */
  rawQuery(text: string, params: Record<string, unknown> = {}): Query {
    return new Query(this.documentStore, this, { raw: text, rawParams: params });
  }

  /** @internal */
  trackQueryResult(body: Doc): Doc {
    const meta = body["@metadata"];
    if (meta !== null && typeof meta === "object" && typeof (meta as Doc)["@id"] === "string") {
      const m = meta as Doc;
      return this.trackLoaded(m["@id"] as string, body, typeof m["@etag"] === "string" ? (m["@etag"] as string) : undefined);
    }
    return body;
  }
}
