/**
 * Bulk insert: NDJSON streamed to `POST /dbs/{db}/bulk` as one request whose body is
 * a ReadableStream, while the server's acks (`{"acked": n, "last_etag": e}`, one per
 * committed batch) are read from the answer as they arrive. `store()` resolves once
 * the document is queued; it waits while more than `maxPendingBytes` are queued and
 * not yet taken by the connection, so the client never holds more than a few MiB
 * whatever the count.
 *
 * Node's fetch (undici) streams the upload and the answer at once. A browser's fetch
 * streams an upload only over HTTP/2 (Chrome) and gives the answer only after the
 * upload: the acks then arrive at the end; the memory bound holds either way.
 */

import { BulkInsertError, ConnectionFailedError, InvalidArgumentError, type KilnError, errorFromResponse, makeError, StoreClosedError } from "./errors.js";
import { describeFetchError } from "./cluster.js";
import { collectionPrefix } from "./session.js";
import type { Doc, DocumentStore } from "./store.js";

export interface BulkInsertOptions {
  /** Bytes of NDJSON per HTTP chunk (default 64 KiB; at most 1,024 lines per chunk). */
  chunkBytes?: number;
  /** Queued bytes at most before store() waits (default 4 MiB). */
  maxPendingBytes?: number;
  /** Called for each ack as it arrives: (documents committed so far, the last etag). */
  onAck?: (acked: number, lastEtag: string | undefined) => void;
  /** How long close() waits for the final answer (default 60 s). */
  timeoutMs?: number;
}

/**
 * The server parses a whole chunk into the batch it is filling before checking the
 * batch's bound, so a chunk of many small lines could overshoot `--max-batch-ops`:
 * 1,024 lines per chunk at most keeps it below (as the Python client does).
 */
const MAX_LINES_PER_CHUNK = 1024;

/** Bytes queued between two turns given to the event loop (see flush()). */
const YIELD_EVERY_BYTES = 512 << 10;

export class BulkInsert {
  readonly chunkBytes: number;
  readonly maxPendingBytes: number;
  readonly timeoutMs: number;
  onAck: ((acked: number, lastEtag: string | undefined) => void) | undefined;
  /** Documents the server has committed (follows the acks). */
  acked = 0;
  lastEtag: string | undefined = undefined;
  /** Documents given to store(). */
  stored = 0;
  /** Acks received (not counting the final answer). */
  acks = 0;
  done = false;
  error: KilnError | undefined = undefined;
  /** The most bytes that were ever queued and not yet taken by the connection. */
  peakPendingBytes = 0;

  private readonly store_: DocumentStore;
  private readonly enc = new TextEncoder();
  private lines: string[] = [];
  private lineBytes = 0;
  private queue: Uint8Array[] = [];
  private pendingBytes = 0;
  private sinceYield = 0;
  private closing = false;
  private closed = false;
  private wakePull: (() => void) | undefined;
  private wakeProducer: (() => void) | undefined;
  private readonly finished: Promise<void>;
  private readonly abortCtl = new AbortController();

  constructor(store: DocumentStore, options: BulkInsertOptions = {}) {
    this.store_ = store;
    this.chunkBytes = options.chunkBytes ?? 64 << 10;
    this.maxPendingBytes = options.maxPendingBytes ?? 4 << 20;
    this.timeoutMs = options.timeoutMs ?? 60_000;
    this.onAck = options.onAck;
    this.finished = this.run().catch((e: unknown) => {
      this.error ??= e instanceof Error && "code" in e ? (e as KilnError)
        : new ConnectionFailedError(`bulk insert: ${describeFetchError(e)}`, { cause: e });
    }).finally(() => {
      // Nothing more will be taken: wake a producer waiting for room.
      this.wakeProducer?.();
      this.wakeProducer = undefined;
    });
  }

  // --- the caller's side -----------------------------------------------------------------

  /**
   * Queues one document; `id` undefined (or ending in `/`) lets the server generate
   * one under the document's `@metadata.@collection`. Resolves when it is queued
   * (waiting while the queue is full); throws the bulk insert's error once it failed.
   */
  async store(document: Doc, id?: string): Promise<void> {
    if (this.error !== undefined) throw this.error;
    if (this.closing) throw new StoreClosedError("the bulk insert is closed", { code: "bulk_closed" });
    if (document === null || typeof document !== "object" || Array.isArray(document)) {
      throw new InvalidArgumentError(`bulk insert: a document is a JSON object, not ${JSON.stringify(document)}`);
    }
    const line = JSON.stringify({ id: id ?? collectionPrefix(document), document });
    this.lines.push(line);
    this.lineBytes += line.length + 1;
    this.stored++;
    if (this.lineBytes >= this.chunkBytes || this.lines.length >= MAX_LINES_PER_CHUNK) await this.flush();
  }

  private async flush(): Promise<void> {
    if (this.lines.length === 0) return;
    const data = this.enc.encode(this.lines.join("\n") + "\n");
    this.lines = [];
    this.lineBytes = 0;
    while (this.pendingBytes > 0 && this.pendingBytes + data.length > this.maxPendingBytes && this.error === undefined && !this.done) {
      await new Promise<void>((r) => { this.wakeProducer = r; });
    }
    if (this.error !== undefined) throw this.error;
    this.queue.push(data);
    this.pendingBytes += data.length;
    this.peakPendingBytes = Math.max(this.peakPendingBytes, this.pendingBytes);
    this.wakePull?.();
    this.wakePull = undefined;
    // The upload can run on microtasks alone (the connection takes chunks as fast as
    // they come) and starve the reading of the answer: give the event loop a turn
    // now and then, so that acks are read (and reported) while the upload goes on.
    this.sinceYield += data.length;
    if (this.sinceYield >= YIELD_EVERY_BYTES) {
      this.sinceYield = 0;
      await new Promise<void>((r) => setTimeout(r, 0));
    }
  }

  /** Sends the rest and waits for the server's final answer; throws BulkInsertError if it stopped at a bad line. */
  async close(): Promise<void> {
    if (this.closed) {
      if (this.error !== undefined) throw this.error;
      return;
    }
    this.closed = true;
    if (!this.closing) {
      try {
        await this.flush();
      } catch {
        // the error is thrown below
      }
      this.closing = true;
      this.wakePull?.();
      this.wakePull = undefined;
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<void>((resolve) => {
      timer = setTimeout(() => {
        this.error ??= new ConnectionFailedError(`no final answer from the bulk insert within ${this.timeoutMs} ms`);
        this.abortCtl.abort();
        resolve();
      }, this.timeoutMs);
    });
    await Promise.race([this.finished, timeout]);
    clearTimeout(timer);
    if (this.error === undefined && !this.done) {
      this.error = new ConnectionFailedError("the bulk insert connection closed before the final answer");
    }
    if (this.error !== undefined) throw this.error;
  }

  /** Stops at once: the batches not acknowledged may or may not be committed, never part of one. */
  async abort(): Promise<void> {
    this.closing = true;
    this.closed = true;
    this.abortCtl.abort();
    this.wakePull?.();
    await this.finished;
  }


  // --- the connection ---------------------------------------------------------------------

  private body(): ReadableStream<Uint8Array> {
    return new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        for (;;) {
          const chunk = this.queue.shift();
          if (chunk !== undefined) {
            this.pendingBytes -= chunk.length;
            controller.enqueue(chunk);
            this.wakeProducer?.();
            this.wakeProducer = undefined;
            return;
          }
          if (this.closing || this.error !== undefined || this.done) {
            controller.close();
            return;
          }
          await new Promise<void>((r) => { this.wakePull = r; });
        }
      },
    }, { highWaterMark: 0 });
  }

  private async run(): Promise<void> {
    const store = this.store_;
    const node = await store.writeNode();
    const url = `${node}${store.dbPath}/bulk`;
    let res: Response;
    try {
      res = await store.fetchFn(url, {
        method: "POST",
        body: this.body(),
        headers: { ...store.headersForRequests, "content-type": "application/x-ndjson", accept: "application/x-ndjson" },
        signal: this.abortCtl.signal,
        duplex: "half",
        redirect: "manual",
      } as RequestInit);
    } catch (e) {
      const err = new ConnectionFailedError(`bulk insert: POST ${url}: ${describeFetchError(e)}`, { cause: e });
      err.node = node;
      throw err;
    }
    store.stats.requests++;
    if (res.status !== 200) {
      const err = errorFromResponse(res.status, await res.text(), res.headers);
      err.node = node;
      this.error = err;
      return;
    }
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += value;
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line) this.onLine(JSON.parse(line) as Record<string, unknown>);
      }
    }
    if (buf.trim()) this.onLine(JSON.parse(buf) as Record<string, unknown>);
    // The answer is complete: nothing more will be read from the queue.
    this.queue = [];
    this.pendingBytes = 0;
    this.wakePull?.();
  }

  private onLine(line: Record<string, unknown>): void {
    if ("error" in line) {
      const code = String(line["error"]);
      const cause = makeError(code, String(line["message"] ?? ""));
      if (typeof line["acked"] === "number") this.acked = line["acked"];
      if (typeof line["last_etag"] === "string") this.lastEtag = line["last_etag"];
      const lineNo = typeof line["line"] === "number" ? line["line"] : undefined;
      this.error = new BulkInsertError(
        `bulk insert stopped at line ${lineNo}: ${code}: ${String(line["message"] ?? "")} (${this.acked} documents before it committed)`,
        { code, line: lineNo, acked: this.acked, lastEtag: this.lastEtag, cause, body: line });
      return;
    }
    if (typeof line["acked"] === "number") {
      this.acked = line["acked"];
      this.lastEtag = typeof line["last_etag"] === "string" ? line["last_etag"] : this.lastEtag;
      if (!line["done"]) {
        this.acks++;
        this.onAck?.(this.acked, this.lastEtag);
      }
    }
    if (line["done"]) this.done = true;
  }
}
