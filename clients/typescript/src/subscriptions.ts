/**
 * Data subscriptions: a named, durable cursor on the server over a collection
 * (`from orders where total > 100`), read by one worker at a time.
 *
 * `store.subscription("name").run(handler)` connects a worker
 * (`/dbs/{db}/subscriptions/{name}/ws`), awaits `handler(batch)` for each batch and
 * acknowledges the batch when it resolves. The server moves the subscription's
 * position only on that acknowledgment, so a worker that dies (or whose handler
 * throws) gets the same batch again: at least once, in etag order.
 */

import {
  type KilnError, SubscriptionBusyError, SubscriptionClosedError, makeError, InvalidArgumentError, UnexpectedResponseError,
} from "./errors.js";
import type { Doc, DocumentStore } from "./store.js";

/** Close codes of the server (docs/http-api.md). */
export const CLOSE_DELETED = 4004;
export const CLOSE_TAKEN_OVER = 4009;
/** A cluster's node that stopped leading: the worker connects to the leader. */
export const CLOSE_NOT_LEADER = 4307;

export interface SubscriptionBatch {
  number: number;
  /** Each with its `@metadata` (`@etag` included), in etag order. */
  documents: Doc[];
  /** Where the position moves when it is acknowledged. */
  lastEtag: string;
  after: string | null;
}

export interface RunOptions {
  /** 1 to 10,000 documents per batch (server default 1,024). */
  batchSize?: number;
  /** `"wait"` (default) while another worker holds it, `"take_over"`, or `"if_free"`. */
  strategy?: "wait" | "take_over" | "if_free";
  /** Return after this many acknowledged batches (the last acknowledgment confirmed). */
  maxBatches?: number;
  /** Open lost connections again (default true). */
  reconnect?: boolean;
  reconnectDelayMs?: number;
  maxReconnectDelayMs?: number;
  /** Aborting it makes run() return after the batch in hand. */
  signal?: AbortSignal;
}

type Event = { kind: "open" } | { kind: "message"; data: string } | { kind: "close"; code: number; reason: string; opened: boolean };

export class DataSubscription {
  readonly name: string;
  /** Connections opened by run() (1 for the first). */
  connections = 0;
  /** Batches acknowledged by run(). */
  batches = 0;
  private readonly store: DocumentStore;
  private stopCtl: AbortController | undefined = undefined;

  constructor(store: DocumentStore, name: string) {
    if (typeof name !== "string" || !/^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/.test(name)) {
      throw new InvalidArgumentError(
        `invalid subscription name ${JSON.stringify(name)}: 1 to 128 ASCII letters, digits, '-', '_', '.', not starting with '.'`);
    }
    this.store = store;
    this.name = name;
  }

  get path(): string {
    return `${this.store.dbPath}/subscriptions/${encodeURIComponent(this.name)}`;
  }

  /** `{name, query, collection, position, connected, ...}`. */
  async info(): Promise<Doc> {
    return (await this.store.request("GET", this.path)).json<Doc>();
  }

  async delete(): Promise<void> {
    await this.store.request("DELETE", this.path);
  }

  /** Makes run() return after the batch in hand. */
  stop(): void {
    this.stopCtl?.abort();
  }

  /**
   * Awaits `handler(batch)` for every batch, acknowledging each when it resolves,
   * until stop() (or `signal`), `maxBatches`, or the server ends the worker
   * (SubscriptionClosedError: deleted 4004, taken over 4009). A handler that throws
   * ends run() with its error and the batch unacknowledged (the next worker gets it
   * again). Lost connections are opened again unless `reconnect` is false.
   */
  async run(handler: (batch: SubscriptionBatch) => unknown | Promise<unknown>, opts: RunOptions = {}): Promise<void> {
    const strategy = opts.strategy ?? "wait";
    if (!["wait", "take_over", "if_free"].includes(strategy)) {
      throw new InvalidArgumentError(`strategy is wait, take_over or if_free, not ${JSON.stringify(strategy)}`);
    }
    const WS = this.store.webSocketClass();
    const ctl = new AbortController();
    this.stopCtl = ctl;
    const onOuterAbort = () => ctl.abort();
    opts.signal?.addEventListener("abort", onOuterAbort);
    const reconnect = opts.reconnect ?? true;
    const baseDelay = opts.reconnectDelayMs ?? 100;
    const maxDelay = opts.maxReconnectDelayMs ?? 5000;
    let delay = baseDelay;
    let done = 0;
    try {
      while (!ctl.signal.aborted) {
        let q = `strategy=${strategy}`;
        if (opts.batchSize !== undefined) q += `&batch_size=${Math.trunc(opts.batchSize)}`;
        // In a cluster the leader serves workers (and commits their acknowledgments).
        let node: string;
        try {
          node = this.store.clustered ? await this.store.writeNode() : this.store.url;
        } catch (e) {
          if (!reconnect) throw e;
          await this.pause(delay, ctl.signal);
          delay = Math.min(delay * 2, maxDelay);
          continue;
        }
        const url = this.store.wsUrl(node, `${this.path}/ws?${q}`);
        const ws = new WS(url, this.store.wsProtocols(["kiln.subscription.v1"]));
        const events: Event[] = [];
        let wake: (() => void) | undefined;
        let opened = false;
        const push = (e: Event) => { events.push(e); wake?.(); wake = undefined; };
        ws.addEventListener("open", () => { opened = true; push({ kind: "open" }); });
        ws.addEventListener("message", (ev: MessageEvent) => push({ kind: "message", data: String(ev.data) }));
        ws.addEventListener("close", (ev: CloseEvent) => push({ kind: "close", code: ev.code, reason: ev.reason, opened }));
        // Node 20's WebSocket fires only "error" for a refused connection: a close too.
        ws.addEventListener("error", () => { if (!opened) push({ kind: "close", code: 1006, reason: "connect failed", opened: false }); });
        const onAbort = () => wake?.();
        ctl.signal.addEventListener("abort", onAbort);
        const nextEvent = async (): Promise<Event | undefined> => {
          while (events.length === 0) {
            if (ctl.signal.aborted) return undefined;
            await new Promise<void>((r) => { wake = r; });
          }
          return events.shift();
        };
        let lostReason: string | undefined;
        try {
          for (;;) {
            const ev = await nextEvent();
            if (ev === undefined) return; // stopped
            if (ev.kind === "open") {
              this.connections++;
              continue;
            }
            if (ev.kind === "close") {
              if (ev.code === CLOSE_TAKEN_OVER || ev.code === CLOSE_DELETED) {
                throw new SubscriptionClosedError(`subscription ${JSON.stringify(this.name)}: ${ev.reason}`, ev.code);
              }
              if (!ev.opened) await this.refusedUpgrade(strategy);
              // Not the leader (a 307 refuses the upgrade; 4307 once it stops
              // leading) or gone: the leader is found again before the next try.
              if (this.store.clustered) this.store.forgetLeader(node);
              if (ev.code === CLOSE_NOT_LEADER) delay = baseDelay;
              lostReason = `${ev.code} ${ev.reason}`;
              break;
            }
            let msg: Record<string, unknown>;
            try {
              msg = JSON.parse(ev.data) as Record<string, unknown>;
            } catch (e) {
              throw new UnexpectedResponseError(`subscription message is not JSON: ${ev.data.slice(0, 200)}`, { cause: e });
            }
            const kind = msg["type"];
            if (kind === "batch") {
              const batch: SubscriptionBatch = {
                number: Number(msg["batch"]), documents: (msg["documents"] as Doc[]) ?? [],
                lastEtag: String(msg["last_etag"]), after: (msg["after"] as string | null | undefined) ?? null,
              };
              await handler(batch);
              ws.send(JSON.stringify({ op: "ack", batch: batch.number }));
              this.batches++;
              done++;
              delay = baseDelay;
              if (opts.maxBatches !== undefined && done >= opts.maxBatches) {
                await this.waitAcknowledged(nextEvent, batch.number);
                return;
              }
            } else if (kind === "error") {
              throw makeError(typeof msg["code"] === "string" ? msg["code"] : undefined, String(msg["message"] ?? ""));
            }
            // subscribed, waiting, acknowledged, heartbeat: nothing to do
          }
        } finally {
          ctl.signal.removeEventListener("abort", onAbort);
          if (ws.readyState === 0 || ws.readyState === 1) {
            try {
              ws.close(1000, "worker done");
            } catch {
              // already closing
            }
          }
        }
        if (!reconnect) throw makeError("connection_failed", `subscription connection lost: ${lostReason}`);
        await this.pause(delay, ctl.signal);
        delay = Math.min(delay * 2, maxDelay);
      }
    } finally {
      opts.signal?.removeEventListener("abort", onOuterAbort);
      if (this.stopCtl === ctl) this.stopCtl = undefined;
    }
  }

  private pause(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise<void>((r) => {
      const t = setTimeout(r, ms);
      signal.addEventListener("abort", () => { clearTimeout(t); r(); }, { once: true });
    });
  }

  /**
   * A WebSocket cannot show the HTTP answer that refused its upgrade (a browser
   * hides it): the subscription's state says why, as a typed error (404 not found,
   * busy under if_free); anything else is a lost connection, tried again.
   */
  private async refusedUpgrade(strategy: string): Promise<void> {
    let info: Doc;
    try {
      info = await this.info(); // throws SubscriptionNotFoundError, 401...
    } catch (e) {
      // A refusal waiting will not change (4xx; 501 of an older server) ends run().
      const status = e instanceof Error && "status" in e ? (e as KilnError).status : undefined;
      if (status !== undefined && (status < 500 || status === 501)) throw e;
      return;
    }
    if (strategy === "if_free" && info["connected"] === true) {
      throw new SubscriptionBusyError(`subscription ${JSON.stringify(this.name)} is held by another worker`, { status: 409 });
    }
  }

  private async waitAcknowledged(nextEvent: () => Promise<Event | undefined>, number: number, timeoutMs = 5000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (performance.now() < deadline) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const ev = await Promise.race([
        nextEvent(),
        new Promise<undefined>((r) => { timer = setTimeout(() => r(undefined), Math.max(0, deadline - performance.now())); }),
      ]);
      clearTimeout(timer);
      if (ev === undefined || ev.kind === "close") return;
      if (ev.kind !== "message") continue;
      const msg = JSON.parse(ev.data) as Record<string, unknown>;
      if (msg["type"] === "acknowledged" && msg["batch"] === number) return;
      if (msg["type"] === "error") throw makeError(msg["code"] as string | undefined, String(msg["message"] ?? ""));
    }
  }
}
