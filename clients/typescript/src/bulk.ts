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
 * upload: the acks then arrive at the end.
 *
 * Segments: Node 20's fetch keeps every chunk of a streamed request body until the
 * request ends (measured: a 60 MB upload held 60 MB of ArrayBuffers until its
 * answer). So the documents go in consecutive requests of at most `segmentBytes`
 * (8 MiB) each, one after the other; each request's batches commit as they would in
 * one, ids are the caller's or generated per line, and `acked` / the line number of
 * an error count from the first document of the whole insert.
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
  /** Bytes of NDJSON per request at most (default 8 MiB; see "Segments" above). */
  segmentBytes?: number;
  /**
   * Send each segment as one ordinary body (at most `segmentBytes` held) instead of a
   * stream: for a fetch that cannot stream a request body (a browser over HTTP/1.1,
   * which refuses a ReadableStream body). Acks then come at the end of each segment.
   */
  bufferSegments?: boolean;
}

/**
 * The server parses a whole chunk into the batch it is filling before checking the
 * batch's bound, so a chunk of many small lines could overshoot `--max-batch-ops`:
 * 1,024 lines per chunk at most keeps it below (as the Python client does).
 */
const MAX_LINES_PER_CHUNK = 1024;

/** Bytes queued between two turns given to the event loop (see flush()). */
const YIELD_EVERY_BYTES = 512 << 10;

interface Segment {
  bytes: number;
  lines: number;
  acked: number;
  /** What was taken into this segment's body (kept until its answer: see segment()). */
  chunks: Uint8Array[];
  generates: boolean;
}

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
  /** Requests (segments) sent so far. */
  segments = 0;
  readonly segmentBytes: number;
  readonly bufferSegments: boolean;

  private readonly store_: DocumentStore;
  private readonly enc = new TextEncoder();
  private lines: string[] = [];
  private lineBytes = 0;
  /** A line of the chunk being filled has the server generate its id. */
  private chunkGenerates = false;
  private queue: { data: Uint8Array; lines: number; generates: boolean }[] = [];
  /** Committed documents and lines sent, in the segments before the current one. */
  private ackedBefore = 0;
  private linesBefore = 0;
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
    this.segmentBytes = options.segmentBytes ?? 8 << 20;
    this.bufferSegments = options.bufferSegments ?? false;
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
    const lineId = id ?? collectionPrefix(document);
    if (lineId.endsWith("/")) this.chunkGenerates = true;
    const line = JSON.stringify({ id: lineId, document });
    this.lines.push(line);
    this.lineBytes += line.length + 1;
    this.stored++;
    if (this.lineBytes >= this.chunkBytes || this.lines.length >= MAX_LINES_PER_CHUNK) await this.flush();
  }

  private async flush(): Promise<void> {
    if (this.lines.length === 0) return;
    const data = this.enc.encode(this.lines.join("\n") + "\n");
    const lines = this.lines.length;
    const generates = this.chunkGenerates;
    this.chunkGenerates = false;
    this.lines = [];
    this.lineBytes = 0;
    while (this.pendingBytes > 0 && this.pendingBytes + data.length > this.maxPendingBytes && this.error === undefined && !this.done) {
      await new Promise<void>((r) => { this.wakeProducer = r; });
    }
    if (this.error !== undefined) throw this.error;
    this.queue.push({ data, lines, generates });
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
    this.stopped = true;
    this.abortCtl.abort();
    this.wakePull?.();
    await this.finished;
  }


  // --- the connection ---------------------------------------------------------------------

  /** One segment's body: queued chunks until `segmentBytes` were taken, or the end. */
  private body(seg: Segment): ReadableStream<Uint8Array> {
    let cancelled = false;
    return new ReadableStream<Uint8Array>({
      // A failed request cancels its body: a pull waiting for data must then take
      // nothing more from the queue (it belongs to the next request).
      cancel: () => { cancelled = true; },
      pull: async (controller) => {
        for (;;) {
          if (cancelled) return;
          if (seg.bytes >= this.segmentBytes || this.error !== undefined || this.stopped) {
            controller.close();
            return;
          }
          const item = this.queue.shift();
          if (item !== undefined) {
            this.pendingBytes -= item.data.length;
            seg.bytes += item.data.length;
            seg.lines += item.lines;
            seg.chunks.push(item.data);
            seg.generates ||= item.generates;
            controller.enqueue(item.data);
            this.wakeProducer?.();
            this.wakeProducer = undefined;
            return;
          }
          if (this.closing) {
            controller.close();
            return;
          }
          await new Promise<void>((r) => { this.wakePull = r; });
        }
      },
    }, { highWaterMark: 0 });
  }

  private stopped = false;

  /** A segment's chunks as one body (bufferSegments). */
  private async collect(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    let n = 0;
    const reader = stream.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      parts.push(value);
      n += value.length;
    }
    const out = new Uint8Array(n);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  private async run(): Promise<void> {
    // The first request goes out at once (a missing database is known early); the
    // next ones when there is more to send.
    for (let first = true; ; first = false) {
      if (!first) {
        while (this.queue.length === 0 && !this.closing && this.error === undefined && !this.stopped) {
          await new Promise<void>((r) => { this.wakePull = r; });
        }
        if (this.queue.length === 0 || this.error !== undefined || this.stopped) break;
      }
      const seg: Segment = { bytes: 0, lines: 0, acked: 0, chunks: [], generates: false };
      await this.segment(seg);
      if (this.error !== undefined) return;
      this.ackedBefore += seg.acked;
      this.linesBefore += seg.lines;
      seg.chunks = [];
      if (this.closing && this.queue.length === 0) break;
    }
    this.done = this.error === undefined && !this.stopped;
  }

  /**
   * Sends one segment. The server stops reading at a bad line and answers with the
   * error; the upload still going on then fails (EPIPE) and fetch may reject before
   * that answer is read. So a segment whose answer was lost is sent again once, as one
   * ordinary body, when that cannot duplicate anything (every line names its id: a
   * document written again is the same document); its answer names the bad line.
   */
  private async segment(seg: Segment): Promise<void> {
    try {
      await this.attemptSegment(seg, this.bufferSegments ? await this.collect(this.body(seg)) : this.body(seg));
    } catch (e) {
      if (!(e instanceof ConnectionFailedError) || this.stopped || this.bufferSegments || seg.chunks.length === 0) throw e;
      if (seg.generates) {
        throw new ConnectionFailedError(
          `${e.message}; the ${seg.lines} lines of that request (from line ${this.linesBefore + 1}) may or may not ` +
          "be committed, and were not sent again because some have the server generate their ids (a second " +
          "attempt would create second documents)", { cause: e });
      }
      const whole = new Uint8Array(seg.bytes);
      let at = 0;
      for (const c of seg.chunks) {
        whole.set(c, at);
        at += c.length;
      }
      seg.acked = 0;
      await this.attemptSegment(seg, whole);
    }
  }

  private async attemptSegment(seg: Segment, body: ReadableStream<Uint8Array> | Uint8Array): Promise<void> {
    const store = this.store_;
    const node = await store.writeNode();
    const url = `${node}${store.dbPath}/bulk`;
    let res: Response;
    this.segments++;
    const lost = (e: unknown) => {
      const err = new ConnectionFailedError(
        `bulk insert: POST ${url}: ${describeFetchError(e)} (${this.acked} documents committed before it)`, { cause: e });
      err.node = node;
      return err;
    };
    try {
      res = await store.fetchFn(url, {
        method: "POST",
        body,
        headers: { ...store.headersForRequests, "content-type": "application/x-ndjson", accept: "application/x-ndjson" },
        signal: this.abortCtl.signal,
        ...(body instanceof Uint8Array ? {} : { duplex: "half" }),
        redirect: "manual",
      } as RequestInit);
    } catch (e) {
      throw lost(e);
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
    let segDone = false;
    const handle = (text: string) => {
      const line = JSON.parse(text) as Record<string, unknown>;
      if (this.onLine(line, seg)) segDone = true;
    };
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        buf += value;
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (line) handle(line);
        }
      }
    } catch (e) {
      if (segDone || this.error !== undefined) return;
      throw lost(e);
    }
    if (buf.trim()) handle(buf);
    if (!segDone && this.error === undefined && !this.stopped) {
      throw lost(new Error("the connection closed before the final answer"));
    }
  }

  /** One line of a segment's answer; true for its final line. */
  private onLine(line: Record<string, unknown>, seg: { acked: number }): boolean {
    if ("error" in line) {
      const code = String(line["error"]);
      const cause = makeError(code, String(line["message"] ?? ""));
      if (typeof line["acked"] === "number") seg.acked = line["acked"];
      this.acked = this.ackedBefore + seg.acked;
      if (typeof line["last_etag"] === "string") this.lastEtag = line["last_etag"];
      const lineNo = typeof line["line"] === "number" ? this.linesBefore + line["line"] : undefined;
      this.error = new BulkInsertError(
        `bulk insert stopped at line ${lineNo}: ${code}: ${String(line["message"] ?? "")} (${this.acked} documents before it committed)`,
        { code, line: lineNo, acked: this.acked, lastEtag: this.lastEtag, cause, body: line });
      return true;
    }
    if (typeof line["acked"] === "number") {
      seg.acked = line["acked"];
      this.acked = this.ackedBefore + seg.acked;
      this.lastEtag = typeof line["last_etag"] === "string" ? line["last_etag"] : this.lastEtag;
      if (!line["done"]) {
        this.acks++;
        this.onAck?.(this.acked, this.lastEtag);
      }
    }
    return Boolean(line["done"]);
  }
}
