/**
 * The changes feed over one WebSocket (`GET /dbs/{db}/changes/ws`).
 *
 * Each subscription remembers the etag of the last change it saw. When the
 * connection drops (the server restarted, the network failed, or the server closed
 * it with 4008 as a slow consumer) the client reconnects with backoff and subscribes
 * again from that etag, so no change is missed or repeated. A subscription is an
 * async iterator (`for await (const c of sub)`), or takes callbacks.
 */

import { ChangesIteratorOverflowError, type KilnError, makeError } from "./errors.js";
import type { DocumentStore } from "./store.js";

export interface Change {
  id: string;
  etag: string;
  /** `"put"` or `"delete"`. */
  change: "put" | "delete";
  collection: string | undefined;
  /** The subscription it came through. */
  sub: string;
}

export interface ChangesOptions {
  reconnectDelayMs?: number;
  maxReconnectDelayMs?: number;
  /**
   * Changes a subscription keeps for its iterator (next(), for await) at most before
   * the iterator reports an overflow (default 10,000); 0: callbacks only, nothing kept.
   */
  buffer?: number;
  onConnected?: () => void;
  onDisconnected?: () => void;
  onError?: (e: KilnError) => void;
}

/** A promise-based flag: set, clear, and wait for it (with a timeout). */
class Flag {
  private value = false;
  private waiters: (() => void)[] = [];
  get isSet(): boolean { return this.value; }
  set(): void {
    this.value = true;
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }
  clear(): void { this.value = false; }
  wait(timeoutMs: number): Promise<boolean> {
    if (this.value) return Promise.resolve(true);
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.waiters = this.waiters.filter((f) => f !== done);
        resolve(false);
      }, timeoutMs);
      const done = () => { clearTimeout(t); resolve(true); };
      this.waiters.push(done);
    });
  }
}

function seq(etag: string): number {
  const n = Number(etag.split("-", 1)[0]);
  return Number.isFinite(n) ? n : -1;
}

/** One filter on a changes connection. */
export class ChangesSubscription implements AsyncIterable<Change> {
  readonly name: string;
  readonly filter: Record<string, string>;
  /** The etag to resume from (the last change seen, or where it went live). */
  resumeEtag: string | undefined;
  received = 0;
  closed = false;
  /** @internal */ readonly subscribed = new Flag();
  /** @internal */ readonly caughtUp = new Flag();
  private callbacks: ((c: Change) => void)[] = [];
  private queue: Change[] = [];
  private overflowed = false;
  private waiter: (() => void) | undefined;
  private readonly changes: Changes;
  private readonly buffer: number;

  constructor(changes: Changes, name: string, filter: Record<string, string>, since: string | undefined, buffer: number) {
    this.changes = changes;
    this.name = name;
    this.filter = filter;
    this.resumeEtag = since;
    this.buffer = buffer;
  }

  /** Calls `callback` for every change (a callback that throws does not stop the feed). */
  subscribe(callback: (c: Change) => void): this {
    this.callbacks.push(callback);
    return this;
  }

  /** @internal */
  deliver(c: Change): void {
    this.resumeEtag = c.etag;
    this.received++;
    for (const cb of this.callbacks) {
      try {
        cb(c);
      } catch (e) {
        queueMicrotask(() => { throw e; });
      }
    }
    if (this.buffer === 0) return; // callbacks only
    if (this.queue.length >= this.buffer) {
      this.overflowed = true;
      return;
    }
    this.queue.push(c);
    this.wake();
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }

  /** The next change, or undefined after `timeoutMs` (or once closed). */
  async next(timeoutMs?: number): Promise<Change | undefined> {
    for (;;) {
      const c = this.queue.shift();
      if (c !== undefined) return c;
      if (this.overflowed) {
        throw new ChangesIteratorOverflowError(
          "more changes arrived than the iterator buffer holds; read faster, use a callback, or pass a larger buffer");
      }
      if (this.closed) return undefined;
      const got = await new Promise<boolean>((resolve) => {
        const t = timeoutMs === undefined ? undefined : setTimeout(() => { this.waiter = undefined; resolve(false); }, timeoutMs);
        this.waiter = () => { if (t !== undefined) clearTimeout(t); resolve(true); };
      });
      if (!got) return undefined;
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Change> {
    for (;;) {
      const c = await this.next();
      if (c === undefined) return;
      yield c;
    }
  }

  /** Resolves true once the server confirmed the subscription (on the current connection). */
  waitSubscribed(timeoutMs = 5000): Promise<boolean> {
    return this.subscribed.wait(timeoutMs);
  }

  /** Resolves true once the backlog since `since` has been delivered. */
  waitCaughtUp(timeoutMs = 5000): Promise<boolean> {
    return this.caughtUp.wait(timeoutMs);
  }

  close(): void {
    this.changes.unsubscribe(this);
    this.wake();
  }
}

/** A changes connection of a DocumentStore: one WebSocket, reconnecting by itself. */
export class Changes {
  readonly reconnectDelayMs: number;
  readonly maxReconnectDelayMs: number;
  /** Connections opened (1 for the first). */
  connections = 0;
  lastClose: string | undefined = undefined;
  errors: KilnError[] = [];
  private readonly store: DocumentStore;
  private readonly opts: ChangesOptions;
  private subs = new Map<string, ChangesSubscription>();
  private ws: WebSocket | undefined = undefined;
  private readonly connectedFlag = new Flag();
  private closedFlag = false;
  private nextSub = 0;
  private delay: number;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private closeWaiters: (() => void)[] = [];

  constructor(store: DocumentStore, options: ChangesOptions = {}) {
    this.store = store;
    this.opts = options;
    this.reconnectDelayMs = options.reconnectDelayMs ?? 100;
    this.maxReconnectDelayMs = options.maxReconnectDelayMs ?? 5000;
    this.delay = this.reconnectDelayMs;
    store.webSocketClass(); // fails now, clearly, when there is no WebSocket
    queueMicrotask(() => this.connect());
  }

  get connected(): boolean {
    return this.connectedFlag.isSet;
  }

  waitConnected(timeoutMs = 5000): Promise<boolean> {
    return this.connectedFlag.wait(timeoutMs);
  }

  // --- subscriptions ------------------------------------------------------------------

  private add(filter: Record<string, string>, since: string | undefined): ChangesSubscription {
    const sub = new ChangesSubscription(this, `s${++this.nextSub}`, filter, since, this.opts.buffer ?? 10_000);
    this.subs.set(sub.name, sub);
    if (this.ws !== undefined && this.ws.readyState === 1) this.sendSubscribe(this.ws, sub);
    return sub;
  }

  forDocument(id: string, since?: string): ChangesSubscription { return this.add({ id }, since); }
  forPrefix(prefix: string, since?: string): ChangesSubscription { return this.add({ prefix }, since); }
  forCollection(collection: string, since?: string): ChangesSubscription { return this.add({ collection }, since); }
  /** Every change of the database; from `since` (an etag) if given, else live. */
  forAll(since?: string): ChangesSubscription { return this.add({}, since); }

  /** @internal */
  unsubscribe(sub: ChangesSubscription): void {
    sub.closed = true;
    this.subs.delete(sub.name);
    if (this.ws !== undefined && this.ws.readyState === 1) {
      try {
        this.ws.send(JSON.stringify({ op: "unsubscribe", sub: sub.name }));
      } catch {
        // the connection is going away
      }
    }
  }

  private sendSubscribe(ws: WebSocket, sub: ChangesSubscription): void {
    const msg: Record<string, string> = { op: "subscribe", sub: sub.name, ...sub.filter };
    if (sub.resumeEtag !== undefined) msg["since"] = sub.resumeEtag;
    try {
      ws.send(JSON.stringify(msg));
    } catch {
      // the close handler reconnects
    }
  }

  // --- the connection -----------------------------------------------------------------

  /** Closes the WebSocket as a failure would (it then reconnects and resumes). */
  dropConnection(): void {
    this.ws?.close(4000, "dropped by the client");
  }

  async close(): Promise<void> {
    if (this.closedFlag) return;
    this.closedFlag = true;
    if (this.timer !== undefined) clearTimeout(this.timer);
    for (const s of this.subs.values()) {
      s.closed = true;
      s.close();
    }
    const ws = this.ws;
    if (ws !== undefined && ws.readyState !== 3) {
      const gone = new Promise<void>((r) => this.closeWaiters.push(r));
      ws.close(1000, "client closing");
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([gone, new Promise((r) => { timer = setTimeout(r, 1000); })]);
      clearTimeout(timer);
    }
  }


  private connect(): void {
    if (this.closedFlag) return;
    const node = this.store.url;
    const WS = this.store.webSocketClass();
    let ws: WebSocket;
    try {
      // kiln.changes.v1 is the one the server selects; offered with the key's
      // subprotocol, a WebSocket fails the handshake unless one is selected.
      ws = new WS(this.store.wsUrl(node, `${this.store.dbPath}/changes/ws`), this.store.wsProtocols(["kiln.changes.v1"]));
    } catch (e) {
      this.lastClose = `connect failed: ${String(e)}`;
      this.schedule();
      return;
    }
    this.ws = ws;
    let opened = false;
    ws.addEventListener("open", () => {
      opened = true;
      this.connections++;
      for (const sub of this.subs.values()) this.sendSubscribe(ws, sub);
      if (this.subs.size === 0) this.setConnected();
    });
    ws.addEventListener("message", (ev: MessageEvent) => {
      if (this.closedFlag) return;
      try {
        this.onMessage(JSON.parse(String(ev.data)) as Record<string, unknown>);
      } catch (e) {
        this.lastClose = `bad message: ${String(e)}`;
      }
    });
    let ended = false;
    const onEnd = (how: string) => {
      // Some WebSockets (Node 20's undici one, on a refused connection) fire "error"
      // and never "close": whichever comes first ends this connection, once.
      if (ended) return;
      ended = true;
      this.lastClose = how;
      if (this.ws === ws) this.ws = undefined;
      const was = this.connectedFlag.isSet;
      this.connectedFlag.clear();
      for (const s of this.subs.values()) {
        s.subscribed.clear();
        s.caughtUp.clear();
      }
      if (was) this.opts.onDisconnected?.();
      if (!opened) this.store.readNodeFailed(node);
      else this.delay = this.reconnectDelayMs;
      const w = this.closeWaiters;
      this.closeWaiters = [];
      for (const f of w) f();
      this.schedule();
    };
    ws.addEventListener("close", (ev: CloseEvent) => onEnd(`${ev.code} ${ev.reason}`));
    ws.addEventListener("error", () => {
      if (!opened) {
        onEnd("connect failed");
        try {
          ws.close();
        } catch {
          // not open
        }
      }
      // once open, a close event follows an error
    });
  }

  private schedule(): void {
    if (this.closedFlag) return;
    const d = this.delay;
    this.delay = Math.min(this.delay * 2, this.maxReconnectDelayMs);
    this.timer = setTimeout(() => this.connect(), d);
  }

  private setConnected(): void {
    if (!this.connectedFlag.isSet) {
      // The callback first: whoever waits must find the aggressive cache connected.
      this.opts.onConnected?.();
      this.connectedFlag.set();
    }
  }

  private onMessage(msg: Record<string, unknown>): void {
    const kind = msg["type"];
    const sub = this.subs.get(String(msg["sub"] ?? ""));
    if (kind === "change") {
      sub?.deliver({
        id: String(msg["id"]), etag: String(msg["etag"]), change: msg["change"] as "put" | "delete",
        collection: typeof msg["collection"] === "string" ? msg["collection"] : undefined, sub: String(msg["sub"]),
      });
    } else if (kind === "subscribed") {
      if (sub === undefined) return;
      // Live from here: a reconnection resumes from this point.
      if (sub.resumeEtag === undefined && typeof msg["last_etag"] === "string") sub.resumeEtag = msg["last_etag"];
      sub.subscribed.set();
      if ([...this.subs.values()].every((s) => s.subscribed.isSet)) this.setConnected();
    } else if (kind === "caught_up") {
      if (sub === undefined) return;
      const e = msg["last_etag"];
      if (typeof e === "string" && e && (sub.resumeEtag === undefined || seq(e) > seq(sub.resumeEtag))) sub.resumeEtag = e;
      sub.caughtUp.set();
    } else if (kind === "error") {
      const err = makeError(typeof msg["code"] === "string" ? msg["code"] : undefined, String(msg["message"] ?? ""));
      this.errors.push(err);
      this.opts.onError?.(err);
    }
    // heartbeats and "unsubscribed" need nothing
  }
}
