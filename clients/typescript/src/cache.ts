/**
 * The HTTP cache: answers by URL (or by URL and body, for queries) with their ETag,
 * bounded by bytes, least recently used first out. A cached answer is revalidated
 * with `If-None-Match`; a 304 costs no body. In aggressive mode an answer is given
 * from the cache without a request while the changes feed is connected and has said
 * nothing about it since it was validated.
 */

export interface CacheEntry {
  etag: string;
  text: string;
  /** When the server last confirmed it (performance.now() ms). */
  validatedAt: number;
  /** The change counter captured before the request that confirmed it. */
  validatedCounter: number;
  /** A single document's URL (a change names it), else a query or a listing. */
  isDocument: boolean;
  size: number;
}

export class CacheStats {
  /** Requests actually sent over HTTP (any method, any status). */
  requests = 0;
  /** GETs and queries answered 304 (the cached body was used). */
  notModified = 0;
  /** Answers given from the cache without a request (aggressive mode). */
  aggressiveHits = 0;
  /** Cached answers dropped to stay under the byte bound. */
  evictions = 0;
  /** Writes sent a second time after a failover (each one at most once). */
  failoverRetries = 0;
}

export class HttpCache {
  readonly maxBytes: number;
  private entries = new Map<string, CacheEntry>();
  private bytes = 0;
  evictions = 0;

  constructor(maxBytes = 64 << 20) {
    this.maxBytes = maxBytes;
  }

  get size(): number {
    return this.entries.size;
  }

  get sizeBytes(): number {
    return this.bytes;
  }

  has(key: string): boolean {
    return this.entries.has(key);
  }

  get(key: string): CacheEntry | undefined {
    const e = this.entries.get(key);
    if (e !== undefined) {
      // A Map iterates in insertion order: re-inserting makes it the most recent.
      this.entries.delete(key);
      this.entries.set(key, e);
    }
    return e;
  }

  put(key: string, etag: string, text: string, counter: number, isDocument: boolean): void {
    this.remove(key);
    // UTF-16 code units x 2 is what a JS string holds in memory (at most).
    const size = text.length * 2 + etag.length * 2 + key.length * 2 + 64;
    if (size > this.maxBytes) return;
    this.entries.set(key, { etag, text, validatedAt: performance.now(), validatedCounter: counter, isDocument, size });
    this.bytes += size;
    while (this.bytes > this.maxBytes && this.entries.size > 0) {
      const oldest = this.entries.keys().next().value as string;
      this.remove(oldest);
      this.evictions++;
    }
  }

  /** A 304 confirmed the entry: fresh as of `counter`. */
  revalidated(key: string, counter: number): void {
    const e = this.entries.get(key);
    if (e !== undefined) {
      e.validatedAt = performance.now();
      e.validatedCounter = Math.max(e.validatedCounter, counter);
    }
  }

  remove(key: string): void {
    const old = this.entries.get(key);
    if (old !== undefined) {
      this.entries.delete(key);
      this.bytes -= old.size;
    }
  }

  clear(): void {
    this.entries.clear();
    this.bytes = 0;
  }
}

/**
 * What the changes feed said, as counters. Every notification bumps a counter; an
 * entry remembers the counter as it was just before the request that validated it.
 * It may be served without a request while the feed is connected and was connected
 * before the entry was validated, no change to its document (for a document) or no
 * change at all (for a query or a listing) was announced since, and it is younger
 * than the aggressive duration.
 */
export class AggressiveState {
  static readonly MAX_TRACKED_KEYS = 50_000;
  counter = 0;
  connected = false;
  private connectedAt = 0;
  private anyChange = 0;
  private floor = 0;
  private byKey = new Map<string, number>();

  onConnected(): void {
    this.counter++;
    this.connectedAt = this.counter;
    this.connected = true;
  }

  onDisconnected(): void {
    this.counter++;
    this.connected = false;
  }

  onChange(key: string | undefined): void {
    this.counter++;
    this.anyChange = this.counter;
    if (key !== undefined) {
      if (this.byKey.size >= AggressiveState.MAX_TRACKED_KEYS) {
        this.byKey.clear();
        this.floor = this.counter;
      }
      this.byKey.set(key, this.counter);
    }
  }

  canServe(key: string, entry: CacheEntry, durationMs: number): boolean {
    if (!this.connected) return false;
    const v = entry.validatedCounter;
    if (v < this.connectedAt || v < this.floor) return false;
    if (entry.isDocument) {
      if (v < (this.byKey.get(key) ?? 0)) return false;
    } else if (v < this.anyChange) {
      return false;
    }
    return performance.now() - entry.validatedAt <= durationMs;
  }
}
