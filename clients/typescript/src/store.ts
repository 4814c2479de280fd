/**
 * The document store: one per server (or cluster) and database, shared by the whole
 * program. It holds the HTTP cache and (in aggressive mode) a changes connection that
 * keeps the cache honest; sessions, bulk inserts and changes subscriptions are made
 * from it. Given the URLs of a cluster's nodes, it sends writes to the leader and
 * fails over as `cluster.ts` describes.
 *
 * Only platform APIs: `fetch`, `WebSocket`, `ReadableStream`, `TextEncoder`. No
 * Node-only import, so the same code runs in Node >= 20 and in browsers.
 */

import { AggressiveState, CacheStats, HttpCache } from "./cache.js";
import {
  ClusterView, type Failover, PROBE_INTERVAL_MS, afterRetry, describeFailover, describeFetchError,
  failoverOfAnswer, failoverOfTransport, isNotClustered, isWrite, noLeaderError, normalizeUrls,
  notRetried, resendCannotDuplicate,
} from "./cluster.js";
import {
  ConnectionFailedError, DocumentNotFoundError, InvalidArgumentError, KilnError,
  StoreClosedError, UnexpectedResponseError, errorFromResponse, type RetriedWrite, ClientError,
} from "./errors.js";
import { Session, type SessionOptions } from "./session.js";
import { Query } from "./query.js";
import { BulkInsert, type BulkInsertOptions } from "./bulk.js";
import { Changes, type ChangesOptions } from "./changes.js";
import { DataSubscription } from "./subscriptions.js";

/** A JSON object (a document, with its `@metadata`). */
export type Doc = Record<string, unknown>;

/** The constructor of a WebSocket (the platform's, or e.g. the `ws` package's). */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocket;

export interface DocumentStoreOptions {
  /** Sent as `Authorization: Bearer <key>` (and as the `kiln.key.<key>` WebSocket subprotocol). */
  apiKey?: string;
  /**
   * PEM certificates to trust for a self-signed server. The platform `fetch` takes no
   * CA per request (a browser trusts the OS store; Node's fetch takes one only through
   * undici's `Agent`, a Node-only import): give `fetch` as well (e.g. a fetch with an
   * undici dispatcher), or run Node with `NODE_EXTRA_CA_CERTS=cert.pem`. Given alone it
   * is refused with an `InvalidArgumentError` rather than silently ignored.
   */
  ca?: string | string[];
  /** The fetch to use (default: the platform's `globalThis.fetch`). */
  fetch?: typeof fetch;
  /**
   * The WebSocket constructor for the changes feed, aggressive caching and data
   * subscriptions (default: `globalThis.WebSocket`; Node 20 has one only with
   * `--experimental-websocket`, Node >= 22 always: else pass e.g. `ws`'s).
   */
  WebSocket?: WebSocketConstructor;
  /** HTTP cache bound in bytes (default 64 MiB; 0 disables it). */
  cacheSizeBytes?: number;
  /** A session's request budget (default 30). */
  maxRequestsPerSession?: number;
  /** Per request, in ms (default 30,000). */
  timeoutMs?: number;
  /** How long to wait for a cluster to elect a leader, in ms (default 10,000). */
  failoverTimeoutMs?: number;
}

export interface RequestOptions {
  body?: string | Uint8Array | undefined;
  json?: unknown;
  headers?: Record<string, string> | undefined;
  params?: Record<string, string | number | boolean | undefined> | undefined;
}

/** An answer, as the store hands it on. */
export interface KilnResponse {
  status: number;
  headers: Headers;
  text: string;
  /** The node that answered (undefined for an answer from the aggressive cache). */
  node: string | undefined;
  /** `""` (the server sent the body), `"304"` (revalidated) or `"aggressive"`. */
  fromCache: "" | "304" | "aggressive";
  etag: string | undefined;
  json<T = unknown>(): T;
}

interface Raw {
  status: number;
  headers: Headers;
  text: string;
  node: string;
  opaqueRedirect: boolean;
}

/** The URL path of a document (slashes kept, except in an id holding `/attachments/`: every slash is then `%2F`). */
export function docPath(database: string, id: string): string {
  checkId(id);
  const keepSlashes = !id.includes("/attachments/");
  const enc = keepSlashes ? id.split("/").map(encodeURIComponent).join("/") : encodeURIComponent(id);
  return `/dbs/${encodeURIComponent(database)}/docs/${enc}`;
}

function checkId(id: unknown): asserts id is string {
  if (typeof id !== "string" || id.length === 0) {
    throw new InvalidArgumentError(`a document id is a non-empty string, not ${JSON.stringify(id)}`);
  }
}

export function stripQuotes(etag: string | null | undefined): string | undefined {
  if (etag === null || etag === undefined) return undefined;
  let e = etag.trim();
  if (e.startsWith("W/")) e = e.slice(2);
  if (e.length >= 2 && e.startsWith('"') && e.endsWith('"')) e = e.slice(1, -1);
  return e;
}

/** `document` with `@metadata.@expires` set (RFC 3339, UTC); the argument is not changed. */
export function withExpiry(document: Doc, expires: Date | undefined): Doc {
  if (expires === undefined) return document;
  if (!(expires instanceof Date) || Number.isNaN(expires.getTime())) {
    throw new InvalidArgumentError("expires must be a valid Date");
  }
  const meta = { ...((document["@metadata"] as Doc | undefined) ?? {}) };
  meta["@expires"] = expires.toISOString();
  return { ...document, "@metadata": meta };
}

function checkDocument(document: unknown): asserts document is Doc {
  if (document === null || typeof document !== "object" || Array.isArray(document)) {
    throw new InvalidArgumentError(`a document is a JSON object, not ${Array.isArray(document) ? "an array" : JSON.stringify(document)}`);
  }
}

export function makeResponse(raw: { status: number; headers: Headers; text: string }, node: string | undefined,
                             fromCache: "" | "304" | "aggressive", etag?: string): KilnResponse {
  return {
    status: raw.status, headers: raw.headers, text: raw.text, node, fromCache,
    etag: etag ?? stripQuotes(raw.headers.get("etag")),
    json<T>(): T {
      try {
        return JSON.parse(raw.text) as T;
      } catch (e) {
        throw new UnexpectedResponseError(`the answer is not JSON: ${raw.text.slice(0, 200)}`, { cause: e });
      }
    },
  };
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** A revision of a document, as `GET /revisions/docs/{id}` lists it. */
export interface Revision {
  etag: string;
  last_modified: string;
  replaced_at: string;
  deleted: boolean;
  key_id: string | null;
  document: Doc | null;
}

export interface AttachmentInfo {
  name: string;
  hash: string;
  size: number;
  content_type: string;
}

/** An attachment read as a stream: `body` is the bytes (a ReadableStream), `etag` its SHA-256. */
export interface AttachmentStream {
  status: number;
  body: ReadableStream<Uint8Array>;
  etag: string | undefined;
  contentType: string | null;
  /** The whole size (from Content-Range for a 206, else Content-Length). */
  size: number | undefined;
  headers: Headers;
}

export interface GetAttachmentOptions {
  /** `[start, end]` (end inclusive, or undefined for the rest): a 206 of that part. */
  range?: [number, number | undefined];
  /** With `range`: the attachment's etag (its SHA-256); if it changed, the whole new body comes (200). */
  ifRange?: string;
}

export class DocumentStore {
  readonly database: string;
  readonly apiKey: string | undefined;
  readonly maxRequestsPerSession: number;
  readonly timeoutMs: number;
  readonly failoverTimeoutMs: number;
  readonly cache: HttpCache;
  readonly stats = new CacheStats();
  /** The URL of the node that answered the store's last request (undefined after an aggressive-cache answer). */
  lastNode: string | undefined = undefined;
  /** @internal */ readonly view: ClusterView;
  /** @internal */ readonly aggressive = new AggressiveState();
  private readonly fetchImpl: typeof fetch;
  private readonly wsImpl: WebSocketConstructor | undefined;
  private readonly baseHeaders: Record<string, string>;
  private discovering: Promise<string> | undefined = undefined;
  private watcher: Changes | undefined = undefined;
  private aggressiveDepth: number[] = [];
  private closed = false;

  constructor(url: string | readonly string[], database: string, options: DocumentStoreOptions = {}) {
    const { urls, clustered } = normalizeUrls(url);
    if (typeof database !== "string" || database.length === 0) {
      throw new InvalidArgumentError(`a database name is a non-empty string, not ${JSON.stringify(database)}`);
    }
    this.view = new ClusterView(urls, clustered);
    this.database = database;
    this.apiKey = options.apiKey;
    this.maxRequestsPerSession = options.maxRequestsPerSession ?? 30;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.failoverTimeoutMs = options.failoverTimeoutMs ?? 10_000;
    const f = options.fetch ?? (globalThis as { fetch?: typeof fetch }).fetch;
    if (typeof f !== "function") throw new ClientError("no fetch: this platform has no global fetch; pass options.fetch");
    if (options.ca !== undefined && options.fetch === undefined) {
      throw new InvalidArgumentError(
        "options.ca needs options.fetch: the platform fetch takes no CA per request. Pass a fetch that trusts " +
        "the certificate (in Node, undici's fetch with new Agent({connect: {ca}})), or run Node with " +
        "NODE_EXTRA_CA_CERTS=<pem file>, or trust it in the OS/browser store");
    }
    this.fetchImpl = options.fetch ? options.fetch : (input, init) => f(input, init);
    this.wsImpl = options.WebSocket;
    this.cache = new HttpCache(options.cacheSizeBytes ?? 64 << 20);
    this.baseHeaders = { accept: "application/json" };
    if (options.apiKey) this.baseHeaders["authorization"] = `Bearer ${options.apiKey}`;
  }

  // --- nodes --------------------------------------------------------------------------

  /** The node reads (and the changes feed) go to. */
  get url(): string {
    return this.view.current;
  }

  get urls(): string[] {
    return [...this.view.urls];
  }

  /** The leader writes go to, once found (undefined before, and for a single server). */
  get leaderUrl(): string | undefined {
    return this.view.leader;
  }

  get clustered(): boolean {
    return this.view.clustered;
  }

  get dbPath(): string {
    return `/dbs/${encodeURIComponent(this.database)}`;
  }

  docPath(id: string): string {
    return docPath(this.database, id);
  }

  /** @internal */
  get authHeaders(): Record<string, string> {
    return this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {};
  }

  /** @internal The WebSocket constructor to use, or a clear error. */
  webSocketClass(): WebSocketConstructor {
    const ws = this.wsImpl ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (typeof ws !== "function") {
      throw new ClientError(
        "no WebSocket: this platform has no global WebSocket (Node 20 has one only with " +
        "--experimental-websocket; Node >= 22 always). Pass options.WebSocket (e.g. the `ws` package's).",
        { code: "no_websocket" });
    }
    return ws;
  }

  /** @internal The WebSocket subprotocols carrying the API key. */
  wsProtocols(extra: string[] = []): string[] {
    return this.apiKey ? [...extra, `kiln.key.${this.apiKey}`] : extra;
  }

  /** @internal */
  wsUrl(node: string, path: string): string {
    return node.replace(/^http/, "ws") + path;
  }

  // --- plumbing -----------------------------------------------------------------------

  private checkOpen(): void {
    if (this.closed) throw new StoreClosedError("the document store is closed");
  }

  private buildPath(path: string, params?: RequestOptions["params"]): string {
    if (!params) return path;
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== undefined) q.set(k, String(v));
    const s = q.toString();
    return s ? `${path}${path.includes("?") ? "&" : "?"}${s}` : path;
  }

  private async attempt(node: string, method: string, path: string, body: string | Uint8Array | undefined,
                        headers: Record<string, string>, timeoutMs = this.timeoutMs): Promise<Raw> {
    const r = await this.fetchImpl(node + path, {
      method, body: body as BodyInit | undefined,
      headers: { ...this.baseHeaders, ...headers },
      redirect: "manual",
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await r.text();
    this.stats.requests++;
    this.lastNode = node;
    return { status: r.status, headers: r.headers, text, node, opaqueRedirect: r.type === "opaqueredirect" };
  }

  /**
   * One HTTP request (to the leader for a write, in a cluster). Error answers are
   * returned, not thrown, except the failover's: a write that fails because of a
   * failover is sent again once, and throws when that fails too.
   */
  async send(method: string, path: string, opts: RequestOptions = {}): Promise<KilnResponse> {
    this.checkOpen();
    let body = opts.body;
    const headers = { ...(opts.headers ?? {}) };
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers["content-type"] = "application/json";
    }
    const full = this.buildPath(path, opts.params);
    const raw = isWrite(method, full)
      ? await this.sendWrite(method, full, body, headers)
      : await this.sendRead(method, full, body, headers);
    return makeResponse(raw, raw.node, "");
  }

  private async sendRead(method: string, path: string, body: string | Uint8Array | undefined,
                         headers: Record<string, string>): Promise<Raw> {
    const node = this.view.current;
    let first: unknown;
    try {
      return await this.attempt(node, method, path, body, headers);
    } catch (e) {
      first = e;
    }
    if (this.view.clustered) {
      // A read changes nothing: the other nodes are asked in turn, and the first that
      // answers is the one the store uses from now on.
      for (const other of this.view.nextReadNodes(node)) {
        let r: Raw;
        try {
          r = await this.attempt(other, method, path, body, headers);
        } catch {
          continue;
        }
        if (this.view.current === node) this.view.current = other;
        return r;
      }
    }
    const err = new ConnectionFailedError(`${method} ${node}${path}: ${describeFetchError(first)}`, { cause: first });
    err.node = node;
    throw err;
  }

  /** @internal The changes feed could not reach `node`: reads move on to the next node. */
  readNodeFailed(node: string): void {
    if (!this.view.clustered || this.view.current !== node) return;
    const others = this.view.nextReadNodes(node);
    if (others.length > 0) this.view.current = others[0]!;
  }

  /** @internal The node a write goes to (the leader, found with GET /cluster if unknown). */
  async writeNode(): Promise<string> {
    if (!this.view.clustered) return this.view.current;
    if (this.view.leader !== undefined) return this.view.leader;
    return this.discover();
  }

  private discover(hint?: string): Promise<string> {
    if (this.discovering === undefined) {
      this.discovering = this.doDiscover(hint).finally(() => {
        this.discovering = undefined;
      });
    }
    return this.discovering;
  }

  private async doDiscover(hint?: string): Promise<string> {
    const view = this.view;
    const deadline = performance.now() + this.failoverTimeoutMs;
    const probeTimeout = Math.min(this.timeoutMs, 2000);
    const answered: string[] = [];
    for (;;) {
      const claims: [number, string][] = [];
      for (const url of view.probeOrder(hint)) {
        let r: Raw;
        try {
          r = await this.attempt(url, "GET", "/cluster", undefined, {}, probeTimeout);
        } catch {
          continue;
        }
        answered.push(url);
        if (isNotClustered(r.status, r.text)) {
          view.clustered = false;
          view.leader = undefined;
          return view.current;
        }
        if (r.status >= 400 && r.status < 500 && ![404, 408, 429].includes(r.status)) {
          const err = errorFromResponse(r.status, r.text, r.headers);
          err.node = url;
          throw err;
        }
        if (r.status !== 200) continue;
        let status: unknown;
        try {
          status = JSON.parse(r.text);
        } catch {
          continue;
        }
        if (status === null || typeof status !== "object") continue;
        const claim = view.absorb(url, status as Record<string, unknown>);
        if (claim !== undefined) claims.push(claim);
      }
      if (claims.length > 0) {
        view.leader = ClusterView.choose(claims);
        return view.leader;
      }
      if (performance.now() >= deadline) throw noLeaderError(view, answered, this.failoverTimeoutMs);
      await sleep(PROBE_INTERVAL_MS);
    }
  }

  /** @internal `node` is not the leader (any more): found again before the next write. */
  forgetLeader(node: string): void {
    if (this.view.leader === node) this.view.leader = undefined;
  }

  private async leaderAfter(failed: string, hint: string | undefined): Promise<string> {
    const leader = this.view.leader;
    if (leader !== undefined && leader !== failed) return leader;
    this.view.leader = undefined;
    return this.discover(hint);
  }

  private async sendWrite(method: string, path: string, body: string | Uint8Array | undefined,
                          headers: Record<string, string>): Promise<Raw> {
    const node = await this.writeNode();
    let first: Failover;
    try {
      const r = await this.attempt(node, method, path, body, headers);
      const failed = failoverOfAnswer(node, r.status, r.text, r.headers, this.view, r.opaqueRedirect);
      if (failed === undefined) return r;
      first = failed;
      // Only a cluster's node answers so: a store given one URL finds it out here.
      this.view.clustered = true;
    } catch (e) {
      if (e instanceof KilnError) throw e;
      if (!this.view.clustered) {
        const err = new ConnectionFailedError(`${method} ${node}${path}: ${describeFetchError(e)}`, { cause: e });
        err.node = node;
        throw err;
      }
      first = failoverOfTransport(node, method, path, e);
    }
    const bodyText = typeof body === "string" ? body : undefined;
    if (first.maybeApplied && !resendCannotDuplicate(method, path, bodyText)) {
      this.forgetLeader(node);
      throw notRetried(method, path, first);
    }
    let leader: string;
    try {
      leader = await this.leaderAfter(node, first.hint);
    } catch (e) {
      if (e instanceof KilnError) e.message = `${e.message}; the write was not sent again (it failed: ${describeFailover(first)})`;
      throw e;
    }
    this.stats.failoverRetries++;
    let r: Raw;
    try {
      r = await this.attempt(leader, method, path, body, headers);
    } catch (e) {
      this.forgetLeader(leader);
      const err = new ConnectionFailedError(
        `${method} ${leader}${path}: ${describeFetchError(e)} (the one retry, after: ${describeFailover(first)})`, { cause: e });
      err.node = leader;
      throw err;
    }
    const ifMatch = Object.entries(headers).find(([k]) => k.toLowerCase() === "if-match")?.[1];
    const expected = ifMatch === undefined ? undefined : stripQuotes(ifMatch);
    const again = failoverOfAnswer(leader, r.status, r.text, r.headers, this.view, r.opaqueRedirect);
    if (again !== undefined) {
      this.forgetLeader(leader);
      throw afterRetry(method, path, expected, first, leader, again.error);
    }
    if (r.status >= 400) {
      throw afterRetry(method, path, expected, first, leader, errorFromResponse(r.status, r.text, r.headers));
    }
    return r;
  }

  /** Like {@link send}, throwing the typed error of an error answer (its `node` set). */
  async request(method: string, path: string, opts: RequestOptions = {}): Promise<KilnResponse> {
    const r = await this.send(method, path, opts);
    if (r.status >= 300 && r.status !== 304) {
      const err = errorFromResponse(r.status, r.text, r.headers);
      err.node = r.node;
      throw err;
    }
    return r;
  }

  /**
   * A GET (or a query POST) through the HTTP cache. `onRequest` is called before a
   * request is actually sent (a session counts it against its budget).
   * @internal
   */
  async cachedRequest(method: string, path: string, opts: { body?: string; onRequest?: () => void; isDocument?: boolean } = {}): Promise<KilnResponse> {
    this.checkOpen();
    const key = opts.body === undefined ? path : `${method} ${path}\n${opts.body}`;
    const useCache = this.cache.maxBytes > 0;
    const entry = useCache ? this.cache.get(key) : undefined;
    const duration = this.aggressiveDepth[this.aggressiveDepth.length - 1];
    if (duration !== undefined && entry !== undefined) {
      this.ensureWatcher();
      if (this.aggressive.canServe(key, entry, duration)) {
        this.stats.aggressiveHits++;
        this.lastNode = undefined;
        return makeResponse({ status: 200, headers: new Headers({ etag: `"${entry.etag}"` }), text: entry.text },
          undefined, "aggressive", entry.etag);
      }
    }
    const counter = this.aggressive.counter;
    const headers: Record<string, string> = {};
    if (entry !== undefined) headers["if-none-match"] = `"${entry.etag}"`;
    if (opts.body !== undefined) headers["content-type"] = "application/json";
    opts.onRequest?.();
    const r = await this.send(method, path, { body: opts.body, headers });
    if (r.status === 304 && entry !== undefined) {
      this.stats.notModified++;
      this.cache.revalidated(key, counter);
      return makeResponse({ status: 200, headers: r.headers, text: entry.text }, r.node, "304", entry.etag);
    }
    if (r.status === 200 && r.etag && useCache) {
      this.cache.put(key, r.etag, r.text, counter, opts.isDocument ?? false);
    } else if (entry !== undefined) {
      this.cache.remove(key);
    }
    if (r.status >= 300) {
      const err = errorFromResponse(r.status, r.text, r.headers);
      err.node = r.node;
      throw err;
    }
    return r;
  }

  /** Forgets the cached answer for a document (after this client wrote it). */
  invalidate(id: string): void {
    const p = this.docPath(id);
    this.cache.remove(p);
    this.aggressive.onChange(p);
  }

  // --- aggressive caching -------------------------------------------------------------

  /**
   * Until the returned scope is disposed, answers cached by the HTTP cache are given
   * without asking the server while the changes feed is connected and has announced
   * no change to them, for at most `durationMs` after the server last confirmed them.
   * A change announced by the feed invalidates at once; while the feed is down every
   * read is revalidated. JavaScript has no thread-local state: the scope covers every
   * read of this store while it is open (use a second store for reads that must not).
   */
  async aggressiveCaching(opts: { durationMs?: number; waitConnectedMs?: number } = {}): Promise<{ dispose(): void }> {
    const duration = opts.durationMs ?? 300_000;
    const w = this.ensureWatcher();
    const wait = opts.waitConnectedMs ?? 2000;
    if (!this.aggressive.connected && wait > 0) await w.waitConnected(wait);
    this.aggressiveDepth.push(duration);
    let done = false;
    const dispose = () => {
      if (done) return;
      done = true;
      const i = this.aggressiveDepth.lastIndexOf(duration);
      if (i >= 0) this.aggressiveDepth.splice(i, 1);
    };
    return { dispose };
  }

  /** Runs `fn` with aggressive caching on (see {@link aggressiveCaching}). */
  async withAggressiveCaching<T>(fn: () => Promise<T>, opts: { durationMs?: number; waitConnectedMs?: number } = {}): Promise<T> {
    const scope = await this.aggressiveCaching(opts);
    try {
      return await fn();
    } finally {
      scope.dispose();
    }
  }

  get aggressiveFeedConnected(): boolean {
    return this.aggressive.connected;
  }

  private ensureWatcher(): Changes {
    if (this.watcher === undefined) {
      const agg = this.aggressive;
      const w = new Changes(this, {
        onConnected: () => agg.onConnected(),
        onDisconnected: () => agg.onDisconnected(),
        buffer: 0,
      });
      w.forAll().subscribe((c) => agg.onChange(this.docPath(c.id)));
      this.watcher = w;
    }
    return this.watcher;
  }

  /** Waits for the aggressive-cache feed to be connected. */
  async waitFeed(timeoutMs = 5000): Promise<boolean> {
    return this.ensureWatcher().waitConnected(timeoutMs);
  }

  // --- the API --------------------------------------------------------------------------

  session(options: SessionOptions = {}): Session {
    this.checkOpen();
    return new Session(this, options);
  }

  /** A query outside any session (results not tracked, no request budget). */
  query(collection: string): Query;
  query(options: { collection?: string; index?: string }): Query;
  query(arg: string | { collection?: string; index?: string }): Query {
    const o = typeof arg === "string" ? { collection: arg } : arg;
    return new Query(this, undefined, o);
  }

  /** A raw query in the server's language, with `$name` parameters, outside any session. */
  rawQuery(text: string, params: Record<string, unknown> = {}): Query {
    return new Query(this, undefined, { raw: text, rawParams: params });
  }

  /** A changes connection (one WebSocket): `.forDocument(id)`, `.forPrefix(p)`, `.forCollection(c)`, `.forAll()`. */
  changes(options: ChangesOptions = {}): Changes {
    this.checkOpen();
    return new Changes(this, options);
  }

  /** A streaming bulk insert: `await bulk.store(doc, id)`, then `await bulk.close()`. */
  bulkInsert(options: BulkInsertOptions = {}): BulkInsert {
    this.checkOpen();
    return new BulkInsert(this, options);
  }

  async createDatabase(opts: { existOk?: boolean } = {}): Promise<void> {
    const existOk = opts.existOk ?? true;
    let r: KilnResponse;
    try {
      r = await this.send("PUT", this.dbPath);
    } catch (e) {
      if (existOk && e instanceof KilnError && (e as Partial<RetriedWrite>).retried && e.status === 409) return;
      throw e;
    }
    if (r.status === 409 && existOk) return;
    if (r.status >= 300) {
      const err = errorFromResponse(r.status, r.text, r.headers);
      err.node = r.node;
      throw err;
    }
  }

  async deleteDatabase(): Promise<void> {
    await this.request("DELETE", this.dbPath);
    this.cache.clear();
  }

  async databaseStats(): Promise<Doc> {
    return (await this.request("GET", this.dbPath)).json<Doc>();
  }

  // --- the server, listings and indexes ------------------------------------------------

  /**
   * `GET /whoami`: the key or certificate this store authenticates with, and its
   * clearance (`"operator"`, or the databases it may read, write or administer).
   * Without `--auth` on the server: `{authenticated: false, clearance: "operator"}`.
   */
  async whoami(): Promise<Caller> {
    return (await this.request("GET", "/whoami")).json<Caller>();
  }

  /**
   * `POST /admin/api-keys` (an operator's key): a new API key with `operator: true` or
   * `grants` (`"shop:read_write"`, `"reports-*:read"`...), or, with `certificatePem`, a
   * client certificate registered with them. The record, with `key` for a key: shown
   * this once. In a cluster it reaches every node through the log.
   */
  async createApiKey(
    name: string,
    opts: { operator?: boolean; grants?: string[]; certificatePem?: string } = {},
  ): Promise<ApiKeyRecord & { key?: string }> {
    const json: Record<string, unknown> = { name };
    if (opts.operator) json.operator = true;
    if (opts.grants?.length) json.grants = opts.grants;
    if (opts.certificatePem !== undefined) json.certificate_pem = opts.certificatePem;
    return (await this.request("POST", "/admin/api-keys", { json })).json<ApiKeyRecord & { key?: string }>();
  }

  /** `GET /admin/api-keys`: every key and registered certificate (never a secret or its hash). */
  async apiKeys(): Promise<ApiKeyRecord[]> {
    return (await this.request("GET", "/admin/api-keys")).json<{ keys: ApiKeyRecord[] }>().keys;
  }

  /** `DELETE /admin/api-keys/{id}`: refused from the next request (on every node of a cluster); NotFoundError if there is none. */
  async revokeApiKey(id: string): Promise<void> {
    await this.request("DELETE", `/admin/api-keys/${encodeURIComponent(id)}`);
  }

  /** The server's databases the caller may read (`GET /dbs`); the same whatever the store's database. */
  async databaseNames(): Promise<string[]> {
    return (await this.request("GET", "/dbs")).json<{ databases: string[] }>().databases;
  }

  /**
   * `GET /stats`: the server's figures and every database's (counters since the server
   * started: take differences for rates); the same whatever the store's database.
   */
  async serverStats(): Promise<ServerStats> {
    return (await this.request("GET", "/stats")).json<ServerStats>();
  }

  /**
   * `GET /cluster`: the cluster as the node in use ({@link url}) sees it. A server
   * started without `--cluster` answers with a `NotClusteredError`.
   */
  async clusterStatus(): Promise<ClusterStatus> {
    return (await this.request("GET", "/cluster")).json<ClusterStatus>();
  }

  /** The database's collections and how many documents each holds. */
  async collections(): Promise<CollectionInfo[]> {
    return (await this.request("GET", `${this.dbPath}/collections`)).json<{ collections: CollectionInfo[] }>().collections;
  }

  /**
   * One page of the database's documents (with `@metadata`): those whose id starts with
   * `prefix` (default: every one) in id order, or with `collection` a collection's in
   * etag order (oldest write first). `after` continues after the previous page: give
   * its `next`, which is null on the last page.
   */
  async listDocuments<T extends Doc = Doc>(opts: ListDocumentsOptions = {}): Promise<DocumentPage<T>> {
    const { prefix, collection, after, pageSize } = opts;
    if (prefix !== undefined && collection !== undefined) {
      throw new InvalidArgumentError("listDocuments() takes a prefix or a collection, not both");
    }
    if (pageSize !== undefined && (!Number.isInteger(pageSize) || pageSize < 1)) {
      throw new InvalidArgumentError(`pageSize must be a positive integer, not ${pageSize}`);
    }
    let r: KilnResponse;
    if (collection !== undefined) {
      if (typeof collection !== "string" || collection.length === 0) {
        throw new InvalidArgumentError(`a collection name is a non-empty string, not ${JSON.stringify(collection)}`);
      }
      r = await this.request("GET", `${this.dbPath}/collections/${encodeURIComponent(collection)}/docs`,
        { params: { after, page_size: pageSize } });
    } else {
      r = await this.request("GET", `${this.dbPath}/docs`, { params: { prefix, start_after: after, page_size: pageSize } });
    }
    const page = r.json<{ results: T[]; next?: string | null }>();
    return { results: page.results, next: page.next ?? null };
  }

  private indexPath(name: string): string {
    if (typeof name !== "string" || name.length === 0) {
      throw new InvalidArgumentError(`an index name is a non-empty string, not ${JSON.stringify(name)}`);
    }
    return `${this.dbPath}/indexes/${encodeURIComponent(name)}`;
  }

  /** The database's indexes (auto indexes included) with their state. */
  async indexes(): Promise<IndexInfo[]> {
    return (await this.request("GET", `${this.dbPath}/indexes`)).json<{ indexes: IndexInfo[] }>().indexes;
  }

  /** One index's definition and state (`IndexNotFoundError` if there is none). */
  async getIndex(name: string): Promise<IndexInfo> {
    return (await this.request("GET", this.indexPath(name))).json<IndexInfo>();
  }

  /**
   * Defines an index; the server fills it in the background (`stale` until it has
   * caught up). The same definition again changes nothing; another one under a name
   * in use is an `IndexExistsError`.
   */
  async defineIndex(name: string, definition: IndexDefinition): Promise<IndexInfo> {
    if (definition === null || typeof definition !== "object" || Array.isArray(definition)) {
      throw new InvalidArgumentError("an index definition is an object ({collection, fields} or {collection, group_by, aggregate})");
    }
    return (await this.request("PUT", this.indexPath(name), { json: definition })).json<IndexInfo>();
  }

  /** Rebuilds the index from scratch (empty at once, refilled in the background). */
  async resetIndex(name: string): Promise<IndexInfo> {
    return (await this.request("POST", `${this.indexPath(name)}/reset`)).json<IndexInfo>();
  }

  async deleteIndex(name: string): Promise<void> {
    await this.request("DELETE", this.indexPath(name));
  }

  /** One document (through the cache), or undefined; outside any session. */
  async get<T extends Doc = Doc>(id: string): Promise<T | undefined> {
    try {
      const r = await this.cachedRequest("GET", this.docPath(id), { isDocument: true });
      return r.json<T>();
    } catch (e) {
      if (e instanceof DocumentNotFoundError) return undefined;
      throw e;
    }
  }

  /**
   * Writes one document outside any session; returns its new etag. `ifMatch`: only if
   * the document has that etag; `ifNoneMatch: "*"`: only if there is no such document
   * (create-only). Either failing is a {@link ConcurrencyError}.
   */
  async put(id: string, document: Doc, opts: { ifMatch?: string; ifNoneMatch?: "*"; expires?: Date } = {}): Promise<string> {
    checkDocument(document);
    const headers: Record<string, string> = {};
    if (opts.ifMatch) headers["if-match"] = `"${opts.ifMatch}"`;
    if (opts.ifNoneMatch !== undefined) {
      if (opts.ifNoneMatch !== "*") throw new InvalidArgumentError(`ifNoneMatch takes only "*", not ${JSON.stringify(opts.ifNoneMatch)}`);
      if (opts.ifMatch) throw new InvalidArgumentError("ifMatch and ifNoneMatch exclude each other");
      headers["if-none-match"] = "*";
    }
    const r = await this.request("PUT", this.docPath(id), { json: withExpiry(document, opts.expires), headers });
    this.invalidate(id);
    return String(r.json<{ etag: string }>().etag);
  }

  /**
   * Merges `changes` into the document (a JSON merge patch, RFC 7396: `null` removes a
   * field), read and written in one transaction on the server; returns the new etag.
   */
  async patch(id: string, changes: Doc, opts: { ifMatch?: string } = {}): Promise<string> {
    checkDocument(changes);
    const headers: Record<string, string> = { "content-type": "application/merge-patch+json" };
    if (opts.ifMatch) headers["if-match"] = `"${opts.ifMatch}"`;
    const r = await this.request("PATCH", this.docPath(id), { body: JSON.stringify(changes), headers });
    this.invalidate(id);
    return String(r.json<{ etag: string }>().etag);
  }

  async delete(id: string, opts: { ifMatch?: string } = {}): Promise<void> {
    const headers: Record<string, string> = {};
    if (opts.ifMatch) headers["if-match"] = `"${opts.ifMatch}"`;
    await this.request("DELETE", this.docPath(id), { headers });
    this.invalidate(id);
  }

  /** `POST /dbs/{db}/batch`: one transaction, all or nothing. */
  async batch(ops: BatchOp[]): Promise<BatchResult[]> {
    if (!Array.isArray(ops)) throw new InvalidArgumentError("batch() takes an array of operations");
    const r = await this.request("POST", `${this.dbPath}/batch`, { json: { ops } });
    const results = r.json<{ results: BatchResult[] }>().results;
    for (const res of results) this.invalidate(res.id);
    return results;
  }

  // --- revisions ----------------------------------------------------------------------

  private revisionsPath(id: string): string {
    checkId(id);
    return `${this.dbPath}/revisions/docs/${id.split("/").map(encodeURIComponent).join("/")}`;
  }

  async revisionsConfig(): Promise<RevisionsConfig> {
    return (await this.request("GET", `${this.dbPath}/revisions/config`)).json<RevisionsConfig>();
  }

  /** Replaces the whole revisions configuration; returns it as stored. */
  async setRevisionsConfig(config: RevisionsConfig): Promise<RevisionsConfig> {
    return (await this.request("PUT", `${this.dbPath}/revisions/config`, { json: config })).json<RevisionsConfig>();
  }

  /** The document's previous versions, newest first (at most `limit`). */
  async revisions(id: string, opts: { limit?: number } = {}): Promise<Revision[]> {
    const out: Revision[] = [];
    for await (const rev of this.iterateRevisions(id)) {
      if (opts.limit !== undefined && out.length >= opts.limit) break;
      out.push(rev);
    }
    return out;
  }

  /** The document's revisions, newest first, page by page (continuation) as an async iterator. */
  async *iterateRevisions(id: string, pageSize = 100): AsyncGenerator<Revision> {
    let continuation: string | undefined;
    for (;;) {
      const page = (await this.request("GET", this.revisionsPath(id), { params: { limit: pageSize, continuation } }))
        .json<{ revisions: Revision[]; continuation: string | null }>();
      yield* page.revisions;
      if (!page.continuation) return;
      continuation = page.continuation;
    }
  }

  /** Writes the revision `etag` back as the document's new version; returns the new etag. */
  async revert(id: string, etag: string, opts: { ifMatch?: string } = {}): Promise<string> {
    checkId(id);
    const headers: Record<string, string> = {};
    if (opts.ifMatch) headers["if-match"] = `"${opts.ifMatch}"`;
    const path = `${this.dbPath}/revisions/revert/${id.split("/").map(encodeURIComponent).join("/")}`;
    const r = await this.request("POST", path, { headers, params: { etag } });
    this.invalidate(id);
    return String(r.json<{ etag: string }>().etag);
  }

  /** Removes every revision of the document; returns how many there were. */
  async purgeRevisions(id: string): Promise<number> {
    return Number((await this.request("DELETE", this.revisionsPath(id))).json<{ purged: number }>().purged);
  }

  // --- attachments ----------------------------------------------------------------------

  attachmentPath(id: string, name: string): string {
    if (typeof name !== "string" || name.length === 0 || name.includes("/")) {
      throw new InvalidArgumentError(`an attachment name is a non-empty string without '/', not ${JSON.stringify(name)}`);
    }
    return `${this.docPath(id)}/attachments/${encodeURIComponent(name)}`;
  }

  /**
   * Attaches `data` to the document as `name` (replacing one of that name): bytes, a
   * string, a Blob, or a ReadableStream of bytes streamed as it is read (never held
   * whole). With `ifMatch`, only if the document has that etag. A stream is sent
   * once (not retried on a failover: it cannot be read twice).
   */
  async putAttachment(id: string, name: string, data: Uint8Array | string | Blob | ReadableStream<Uint8Array>,
                      opts: { contentType?: string; ifMatch?: string } = {}): Promise<{ id: string; etag: string; attachment: AttachmentInfo }> {
    const path = this.attachmentPath(id, name);
    const headers: Record<string, string> = { "content-type": opts.contentType ?? "application/octet-stream" };
    if (opts.ifMatch) headers["if-match"] = `"${opts.ifMatch}"`;
    let r: KilnResponse;
    if (typeof data === "string" || data instanceof Uint8Array) {
      r = await this.request("PUT", path, { body: data, headers });
    } else {
      this.checkOpen();
      const node = await this.writeNode();
      let res: Response;
      try {
        res = await this.fetchImpl(node + path, {
          method: "PUT", body: data as BodyInit, headers: { ...this.baseHeaders, ...headers },
          redirect: "manual", signal: AbortSignal.timeout(this.timeoutMs),
          ...(data instanceof ReadableStream ? { duplex: "half" } : {}),
        } as RequestInit);
      } catch (e) {
        const err = new ConnectionFailedError(`PUT ${node}${path}: ${describeFetchError(e)}`, { cause: e });
        err.node = node;
        throw err;
      }
      this.stats.requests++;
      this.lastNode = node;
      const text = await res.text();
      if (res.status >= 300) {
        const err = errorFromResponse(res.status, text, res.headers);
        err.node = node;
        throw err;
      }
      r = makeResponse({ status: res.status, headers: res.headers, text }, node, "");
    }
    this.invalidate(id);
    return r.json();
  }

  /**
   * The attachment as a stream (`body`, a ReadableStream; read it or cancel it).
   * `range: [start, end]` asks for part of it (206); with `ifRange` (the etag a
   * previous read gave), the part only if the attachment is still those bytes, else
   * the whole new body (200): check `status`. Throws AttachmentNotFoundError.
   */
  async getAttachment(id: string, name: string, opts: GetAttachmentOptions = {}): Promise<AttachmentStream> {
    this.checkOpen();
    const path = this.attachmentPath(id, name);
    const headers: Record<string, string> = { ...this.authHeaders };
    if (opts.range !== undefined) {
      const [start, end] = opts.range;
      if (!Number.isInteger(start) || start < 0 || (end !== undefined && (!Number.isInteger(end) || end < start))) {
        throw new InvalidArgumentError(`a range is [start, end] with 0 <= start <= end, not ${JSON.stringify(opts.range)}`);
      }
      headers["range"] = `bytes=${start}-${end ?? ""}`;
      if (opts.ifRange !== undefined) headers["if-range"] = `"${stripQuotes(opts.ifRange)}"`;
    }
    const node = this.view.current;
    let res: Response;
    try {
      res = await this.fetchImpl(node + path, { headers, signal: AbortSignal.timeout(this.timeoutMs) });
    } catch (e) {
      const err = new ConnectionFailedError(`GET ${node}${path}: ${describeFetchError(e)}`, { cause: e });
      err.node = node;
      throw err;
    }
    this.stats.requests++;
    this.lastNode = node;
    if (res.status >= 300) {
      const err = errorFromResponse(res.status, await res.text(), res.headers);
      err.node = node;
      throw err;
    }
    if (res.status === 206 && opts.ifRange !== undefined && stripQuotes(res.headers.get("etag")) !== stripQuotes(opts.ifRange)) {
      // Kiln honours If-Range (a stale tag gets the whole body, 200); a server or
      // proxy that ignores it answers the range of the current bytes, which are not
      // the bytes the caller has the rest of. As RFC 9110 asks of If-Range, the
      // whole current body is given instead (a second request).
      await res.body?.cancel();
      return this.getAttachment(id, name, {});
    }
    const cr = res.headers.get("content-range");
    const total = cr ? Number(cr.split("/")[1]) : Number(res.headers.get("content-length") ?? NaN);
    return {
      status: res.status,
      body: res.body ?? new ReadableStream({ start: (c) => c.close() }),
      etag: stripQuotes(res.headers.get("etag")),
      contentType: res.headers.get("content-type"),
      size: Number.isFinite(total) ? total : undefined,
      headers: res.headers,
    };
  }

  /** The whole attachment in memory (for small ones; see {@link getAttachment}). */
  async attachmentBytes(id: string, name: string): Promise<Uint8Array> {
    const a = await this.getAttachment(id, name);
    return new Uint8Array(await new Response(a.body).arrayBuffer());
  }

  /** The document's attachments (`@metadata.@attachments`). */
  async attachments(id: string): Promise<AttachmentInfo[]> {
    const doc = await this.get(id);
    if (doc === undefined) throw new DocumentNotFoundError(`document ${JSON.stringify(id)} does not exist`);
    const meta = (doc["@metadata"] ?? {}) as Doc;
    return [...((meta["@attachments"] as AttachmentInfo[] | undefined) ?? [])];
  }

  /** Removes the attachment; returns the document's new etag. */
  async deleteAttachment(id: string, name: string, opts: { ifMatch?: string } = {}): Promise<string> {
    const headers: Record<string, string> = {};
    if (opts.ifMatch) headers["if-match"] = `"${opts.ifMatch}"`;
    const r = await this.request("DELETE", this.attachmentPath(id, name), { headers });
    this.invalidate(id);
    return String(r.json<{ etag: string }>().etag);
  }

  // --- data subscriptions -----------------------------------------------------------------

  /** Creates a data subscription (`query`: `from <collection> [where ...]`; `start`: beginning, now or an etag). */
  async createSubscription(name: string, query: string,
                           opts: { parameters?: Record<string, unknown>; start?: string } = {}): Promise<DataSubscription> {
    const body: Doc = { name, query, start: opts.start ?? "beginning" };
    if (opts.parameters) body["parameters"] = opts.parameters;
    await this.request("POST", `${this.dbPath}/subscriptions`, { json: body });
    return this.subscription(name);
  }

  /** The data subscription `name` (nothing is asked of the server). */
  subscription(name: string): DataSubscription {
    return new DataSubscription(this, name);
  }

  async subscriptions(): Promise<Doc[]> {
    return (await this.request("GET", `${this.dbPath}/subscriptions`)).json<{ subscriptions: Doc[] }>().subscriptions;
  }

  async deleteSubscription(name: string): Promise<void> {
    await this.subscription(name).delete();
  }

  // --- the rest ----------------------------------------------------------------------------

  /** @internal For BulkInsert and others: the fetch in use. */
  get fetchFn(): typeof fetch {
    return this.fetchImpl;
  }

  /** @internal */
  get headersForRequests(): Record<string, string> {
    return { ...this.baseHeaders };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    if (this.watcher !== undefined) {
      await this.watcher.close();
      this.watcher = undefined;
    }
    this.closed = true;
  }


  toString(): string {
    return `DocumentStore(${this.view.clustered ? JSON.stringify(this.view.urls) : this.url}, ${this.database})`;
  }
}

export interface BatchOp {
  op: "put" | "delete";
  id: string;
  document?: Doc;
  if_match?: string;
}

export interface BatchResult {
  id: string;
  etag?: string;
  [k: string]: unknown;
}

export interface RevisionsConfig {
  collections: Record<string, { max_revisions?: number; max_age_ms?: number | null }>;
}

/** The options of {@link DocumentStore.listDocuments}. */
export interface ListDocumentsOptions {
  /** Documents whose id starts with this, in id order (default: every document). */
  prefix?: string;
  /** A collection's documents instead, in etag order (oldest write first). */
  collection?: string;
  /** The previous page's `next`. */
  after?: string;
  /** Documents per page (server default 100, at most its `--max-page-size`). */
  pageSize?: number;
}

/** A page of {@link DocumentStore.listDocuments}: `next` continues it (null: the last page). */
export interface DocumentPage<T extends Doc = Doc> {
  results: T[];
  next: string | null;
}

export interface CollectionInfo {
  name: string;
  documents: number;
}

/** A field of an index: a path (`age`, `address.city`, `tags[]`) or the path with options. */
export type IndexField = string | {
  path: string;
  case_insensitive?: boolean;
  /** A full-text field (queried with `search(path, ...)`); an index's fields are all full-text or none. */
  search?: boolean;
  /** A full-text field's analyzer: standard (default), keyword, or a language (english, french, ...). */
  analyzer?: string;
};

/**
 * What `PUT /dbs/{db}/indexes/{name}` takes: a map or full-text index (`fields`, at
 * most 8), or a reduce index (`group_by` and `aggregate`: output name -> `count()`,
 * `sum(path)`, `avg(path)`, `min(path)`, `max(path)`). `collection` absent or null:
 * every document of the database.
 */
export interface IndexDefinition {
  collection?: string | null;
  fields?: IndexField[];
  group_by?: IndexField[];
  aggregate?: Record<string, string>;
}

/** An index and its state, as the server shows it. */
export interface IndexInfo {
  name: string;
  collection: string | null;
  fields: { path: string; case_insensitive?: boolean; search?: boolean; analyzer?: string }[];
  auto: boolean;
  last_indexed_etag: string | null;
  database_etag: string | null;
  /** Documents written since the index last caught up. */
  docs_behind: number;
  stale: boolean;
  entries: number;
  /** Documents that could not be indexed (a few in `error_samples`). */
  errors: number;
  error_samples: { id?: string; error?: string }[];
  batch_size: number;
  docs_per_sec: number;
  group_by?: { path: string; case_insensitive?: boolean }[];
  aggregate?: Record<string, string>;
}

/** One database's figures in {@link ServerStats} (counters since the server started). */
/** A grant of a clearance: a database name or a prefix pattern (`shop-*`, `*`). */
export interface DatabaseGrant {
  database: string;
  access: "read" | "read_write" | "admin";
}

/** An API key or registered client certificate (`GET /admin/api-keys`). */
export interface ApiKeyRecord {
  id: string;
  name: string;
  kind: "key" | "certificate";
  certificate_sha256: string | null;
  clearance: "operator" | { databases: DatabaseGrant[] };
  created_ms: number;
}

/** Who the store's key or certificate is (`GET /whoami`). */
export interface Caller {
  authenticated: boolean;
  key_id?: string;
  name?: string;
  kind?: "key" | "certificate";
  clearance: "operator" | { databases: DatabaseGrant[] };
}

/** The access `caller` has to database `db` (the highest grant that matches), or null. */
export function accessTo(caller: Caller, db: string): DatabaseGrant["access"] | null {
  if (caller.clearance === "operator") return "admin";
  const rank = { read: 1, read_write: 2, admin: 3 } as const;
  let best: DatabaseGrant["access"] | null = null;
  for (const g of caller.clearance.databases) {
    const matches = g.database.endsWith("*") ? db.startsWith(g.database.slice(0, -1)) : g.database === db;
    if (matches && (best === null || rank[g.access] > rank[best])) best = g.access;
  }
  return best;
}

export interface DatabaseFigures {
  name: string;
  documents: number;
  /** Its last etag sequence (every put and delete takes one). */
  documents_written: number;
  data_file_bytes: number;
  commits: number;
  commit_groups: number;
  commit_units: number;
  journal_writes: number;
  journal_bytes: number;
  journal_write_p50_us: number;
  journal_write_p99_us: number;
  data_syncs: number;
  data_sync_p99_us: number;
  pages_written_back: number;
  pages_unflushed: number;
  readers_open: number;
}

/** `GET /stats`. */
export interface ServerStats {
  uptime_seconds: number;
  connections_open: number;
  connections_total: number;
  ws_connections_open: number;
  /** Requests answered by status class: `{"2xx": n, "3xx": n, "4xx": n, "5xx": n}`. */
  http_requests_by_status: Record<string, number>;
  /** Null where /proc is missing. */
  resident_memory_bytes: number | null;
  databases: DatabaseFigures[];
}

/** A member of a cluster as `GET /cluster` shows it (`applied` and `lag` known for every member on the leader, for itself elsewhere). */
export interface ClusterMember {
  id: number;
  address: string;
  /** `leader`, `follower` or `learner`. */
  role: string;
  applied: number | null;
  lag: number | null;
}

/** `GET /cluster`: the cluster as one node sees it. */
export interface ClusterStatus {
  node_id: number;
  /** The leader's id, null while there is none. */
  leader: number | null;
  term: number;
  /** This node's role: `leader`, `follower`, `candidate` or `learner`. */
  state: string;
  last_log_index: number | null;
  last_applied: number | null;
  snapshot_index: number | null;
  purged_index: number | null;
  /** On a leader: whether a majority acknowledged it within the election timeout (null elsewhere). */
  has_quorum: boolean | null;
  quorum_ack_age_ms: number | null;
  /** Whether this node's storage waits for disk space (it names no leader meanwhile). */
  waiting_for_disk: boolean;
  members: ClusterMember[];
}
