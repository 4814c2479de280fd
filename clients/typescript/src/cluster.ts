/**
 * A Kiln cluster as a store sees it, and the rules of its failover (the same rules as
 * the Python client's `cluster.py`). This module only decides; the store does the I/O.
 *
 * - A store given a list of URLs is in cluster mode: it asks `GET /cluster` for the
 *   leader and sends writes there; reads go to the node it is using (the first URL,
 *   until that one stops answering). A store given one URL (a string) goes into
 *   cluster mode when a server answers a write with a 307 `not_leader`.
 * - A write that fails because of a failover (connection refused or broken, a 307,
 *   a 503 `no_quorum` or `not_leader`) is sent again ONCE, unchanged (same body,
 *   same `If-Match`), to the leader found again. Nothing else is retried.
 * - If the first attempt may have been applied (sent and no answer, or an answer
 *   whose `outcome` is `"unknown"`), the write is resent only when resending cannot
 *   apply it twice (it names its document, or is conditional); a write that makes
 *   the server generate an id is not: {@link WriteOutcomeUnknownError}.
 */

import {
  ConnectionFailedError, type KilnError, NoQuorumError, RetryConflictError, RetryNotFoundError,
  WriteOutcomeUnknownError, errorFromResponse, InvalidArgumentError, NotFoundError,
} from "./errors.js";

/** Milliseconds between two rounds of `GET /cluster` while no node says it leads. */
export const PROBE_INTERVAL_MS = 50;

export function normalizeUrls(urls: string | readonly string[]): { urls: string[]; clustered: boolean } {
  let given: unknown[];
  let clustered: boolean;
  if (typeof urls === "string") {
    given = [urls];
    clustered = false;
  } else if (Array.isArray(urls)) {
    given = [...urls];
    clustered = true;
    if (given.length === 0) throw new InvalidArgumentError("no URL given");
  } else {
    throw new InvalidArgumentError(`url must be a string or an array of strings, not ${typeof urls}`);
  }
  const out: string[] = [];
  for (const u of given) {
    if (typeof u !== "string") throw new InvalidArgumentError(`a URL is a string, not ${typeof u}`);
    const trimmed = u.replace(/\/+$/, "");
    let parsed: URL;
    try {
      parsed = new URL(trimmed);
    } catch {
      throw new InvalidArgumentError(`not a URL: ${JSON.stringify(u)}`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new InvalidArgumentError(`url must start with http:// or https://, not ${JSON.stringify(u)}`);
    }
    if (parsed.pathname !== "/" && parsed.pathname !== "") {
      throw new InvalidArgumentError(`a node URL has no path (${JSON.stringify(u)}): give http://host:port`);
    }
    const norm = `${parsed.protocol}//${parsed.host}`;
    if (!out.includes(norm)) out.push(norm);
  }
  if (new Set(out.map((u) => new URL(u).protocol)).size > 1) {
    throw new InvalidArgumentError(`the URLs mix http and https: ${out.join(", ")}`);
  }
  return { urls: out, clustered };
}

/** Whether only the leader takes this request (PUT/POST/PATCH/DELETE, except queries and /cluster). */
export function isWrite(method: string, path: string): boolean {
  const p = path.split("?", 1)[0]!;
  return ["PUT", "POST", "PATCH", "DELETE"].includes(method.toUpperCase()) &&
    !p.startsWith("/cluster") && !p.endsWith("/queries");
}

/**
 * Whether sending a write a second time cannot apply it twice: a PUT or DELETE of a
 * named document, a merge patch (idempotent), a batch whose puts all name their ids.
 * A write that makes the server generate an id would make a second document.
 */
export function resendCannotDuplicate(method: string, path: string, body: string | undefined): boolean {
  const m = method.toUpperCase();
  const p = path.split("?", 1)[0]!;
  if (m === "DELETE" || m === "PATCH") return true;
  if (m === "PUT") return !p.endsWith("/");
  if (m === "POST" && p.endsWith("/batch")) {
    let ops: unknown;
    try {
      ops = (JSON.parse(body ?? "{}") as { ops?: unknown }).ops;
    } catch {
      return false;
    }
    if (!Array.isArray(ops)) return false;
    for (const op of ops) {
      if (op === null || typeof op !== "object") return false;
      const o = op as { op?: unknown; id?: unknown };
      if (o.op === "put" && (typeof o.id !== "string" || o.id.endsWith("/"))) return false;
    }
    return true;
  }
  return false;
}

/** Why a write's attempt failed because of a failover. */
export interface Failover {
  node: string;
  error: KilnError;
  /** Whether the attempt may have been applied (false: it certainly was not). */
  maybeApplied: boolean;
  /** The leader the answer named (a 307's Location, as a node URL). */
  hint: string | undefined;
}

export function describeFailover(f: Failover): string {
  return `${f.error.code}: ${f.error.message} (from ${f.node})`;
}

/**
 * The failover an answer reports (a 307 `not_leader`, an opaque redirect in a
 * browser, a 503 `no_quorum` or `not_leader`), or undefined for any other answer.
 */
export function failoverOfAnswer(node: string, status: number, text: string, headers: Headers,
                                 view: ClusterView, opaqueRedirect = false): Failover | undefined {
  if (opaqueRedirect) {
    // A browser hides a redirect's Location: the leader is found with GET /cluster.
    const err = errorFromResponse(307, '{"error":"not_leader","message":"redirected to the leader (an opaque redirect)"}');
    err.node = node;
    return { node, error: err, maybeApplied: false, hint: undefined };
  }
  if (status === 307 || status === 308) {
    const err = errorFromResponse(status, text, headers);
    if (err.code !== "not_leader" && !headers.get("location")) return undefined;
    err.node = node;
    // A follower's front door redirects before anything reaches the log.
    return { node, error: err, maybeApplied: false, hint: view.urlOfLocation(headers.get("location")) };
  }
  if (status === 503) {
    const err = errorFromResponse(status, text, headers);
    if (err.code !== "no_quorum" && err.code !== "not_leader") return undefined;
    err.node = node;
    const outcome = err.body["outcome"];
    let certain: boolean;
    if (typeof outcome === "string") {
      certain = outcome === "not_written";
    } else {
      // An older server that does not say: read the message (more careful if reworded).
      certain = err.code === "no_quorum" &&
        (err.message.includes("has no leader") || err.message.includes("within 0 ms"));
    }
    return { node, error: err, maybeApplied: !certain, hint: undefined };
  }
  return undefined;
}

/** Whether a fetch failure means the request never left (a refused connection, a name that does not resolve). */
export function connectionNotSent(e: unknown): boolean {
  let c: unknown = e;
  for (let i = 0; i < 4 && c !== null && typeof c === "object"; i++) {
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string" &&
        ["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT"].includes(code)) {
      return true;
    }
    c = (c as { cause?: unknown }).cause;
  }
  return false;
}

export function describeFetchError(e: unknown): string {
  const parts: string[] = [];
  let c: unknown = e;
  for (let i = 0; i < 4 && c !== null && c !== undefined; i++) {
    if (typeof c === "object") {
      const o = c as { message?: unknown; code?: unknown; cause?: unknown };
      parts.push(`${typeof o.message === "string" ? o.message : String(c)}${typeof o.code === "string" ? ` (${o.code})` : ""}`);
      c = o.cause;
    } else {
      parts.push(String(c));
      break;
    }
  }
  return parts.join(": ");
}

/** A broken or refused connection as a failover: a refused one was never sent. */
export function failoverOfTransport(node: string, method: string, path: string, e: unknown): Failover {
  const err = new ConnectionFailedError(`${method} ${node}${path}: ${describeFetchError(e)}`, { cause: e });
  err.node = node;
  return { node, error: err, maybeApplied: !connectionNotSent(e), hint: undefined };
}

/** The error for a write whose first attempt may have been applied and that is not resent. */
export function notRetried(method: string, path: string, first: Failover): KilnError {
  const err = new WriteOutcomeUnknownError(
    `${method} ${path}: the write failed during a failover after it was sent (${describeFailover(first)}): ` +
    "it may or may not have been applied (outcome unknown), and it was not sent again because a second " +
    "attempt would create a second document (the server generates its id). Look for it before writing it again.",
    { cause: first.error, body: { outcome: "unknown" } });
  err.node = first.node;
  return err;
}

/**
 * The error for the refused second attempt of a write: a RetryConflictError /
 * RetryNotFoundError when the first attempt may have been applied and explains the
 * refusal, else the server's error (naming the first failure).
 */
export function afterRetry(method: string, path: string, ifMatch: string | undefined, first: Failover,
                           node: string, err: KilnError): KilnError {
  err.node = node;
  const explained = err.status === 409 || err.status === 412 ||
    (err.status === 404 && (method.toUpperCase() === "DELETE" || err.code === "document_not_found"));
  if (!first.maybeApplied || !explained) {
    err.message = `${err.message} (a retry after: ${describeFailover(first)})`;
    return err;
  }
  const message = `${method} ${path}: the first attempt failed during a failover (${describeFailover(first)}); ` +
    `it was sent again once, unchanged, to ${node}, which refused it: ${err.code}: ${err.message}. ` +
    "The first attempt may have been applied: read the document again before deciding what to do.";
  let out: RetryConflictError | RetryNotFoundError;
  if (err.status === 404) {
    out = new RetryNotFoundError(message, { code: err.code, status: err.status, body: err.body });
  } else {
    const current = (err as { currentEtag?: unknown }).currentEtag;
    out = new RetryConflictError(message, {
      code: err.code, status: err.status, body: err.body, id: docIdOf(path),
      expectedEtag: ifMatch, currentEtag: typeof current === "string" ? current : undefined,
    });
  }
  out.firstError = first.error;
  out.retryError = err;
  out.node = node;
  return out;
}

function docIdOf(path: string): string | undefined {
  const p = path.split("?", 1)[0]!;
  const i = p.indexOf("/docs/");
  if (!p.startsWith("/dbs/") || i < 0) return undefined;
  try {
    return decodeURIComponent(p.slice(i + 6));
  } catch {
    return undefined;
  }
}

interface ClusterStatus {
  node_id?: unknown;
  state?: unknown;
  leader?: unknown;
  term?: unknown;
  members?: unknown;
}

/** Whether a leader's GET /cluster shows it has heard from a majority (a new leader refuses writes until then). */
function heardFromMajority(status: ClusterStatus): boolean {
  const members = Array.isArray(status.members)
    ? status.members.filter((m): m is Record<string, unknown> => m !== null && typeof m === "object")
    : [];
  if (members.length === 0 || !members.every((m) => "applied" in m)) return true;
  const known = members.filter((m) => m["applied"] !== null && m["applied"] !== undefined).length;
  return known * 2 > members.length;
}

/** The nodes a store knows and which of them it uses. */
export class ClusterView {
  readonly urls: string[];
  readonly scheme: string;
  clustered: boolean;
  /** The node reads go to. */
  current: string;
  /** The leader writes go to (undefined: not known, or not a cluster). */
  leader: string | undefined = undefined;
  /** Node URLs named by GET /cluster that the store was not given. */
  learned: string[] = [];
  byId = new Map<number, string>();

  constructor(urls: string[], clustered: boolean) {
    this.urls = [...urls];
    this.scheme = new URL(urls[0]!).protocol.replace(":", "");
    this.clustered = clustered;
    this.current = urls[0]!;
  }

  urlOfAddress(address: string): string {
    return `${this.scheme}://${address}`;
  }

  /** The node a 307's Location names (the server writes http://; the store keeps its own scheme). */
  urlOfLocation(location: string | null | undefined): string | undefined {
    if (!location) return undefined;
    try {
      const u = new URL(location);
      return u.host ? this.urlOfAddress(u.host) : undefined;
    } catch {
      return undefined;
    }
  }

  nodes(): string[] {
    return [...this.urls, ...this.learned.filter((u) => !this.urls.includes(u))];
  }

  probeOrder(hint?: string): string[] {
    const order: string[] = [];
    for (const u of [...(hint ? [hint] : []), this.current, ...this.nodes()]) {
      if (!order.includes(u)) order.push(u);
    }
    return order;
  }

  /** Records what GET /cluster at `url` answered; `[term, url]` when that node says it leads. */
  absorb(url: string, status: ClusterStatus): [number, string] | undefined {
    const nodeId = status.node_id;
    if (typeof nodeId === "number" && !this.byId.has(nodeId)) this.byId.set(nodeId, url);
    if (Array.isArray(status.members)) {
      for (const m of status.members as unknown[]) {
        if (m === null || typeof m !== "object") continue;
        const mm = m as { id?: unknown; address?: unknown };
        if (typeof mm.address !== "string") continue;
        const known = typeof mm.id === "number" ? this.byId.get(mm.id) : undefined;
        const u = known ?? this.urlOfAddress(mm.address);
        if (!this.urls.includes(u) && !this.learned.includes(u)) this.learned.push(u);
      }
    }
    if (status.state === "leader" && nodeId !== undefined && nodeId !== null && status.leader === nodeId &&
        heardFromMajority(status)) {
      return [typeof status.term === "number" ? status.term : 0, url];
    }
    return undefined;
  }

  /** The leader among the nodes that say they lead: the one of the highest term. */
  static choose(claims: [number, string][]): string {
    const best = Math.max(...claims.map(([t]) => t));
    return claims.find(([t]) => t === best)![1];
  }

  /** The other nodes to read from after `failed` did not answer, in order. */
  nextReadNodes(failed: string): string[] {
    let nodes = this.nodes();
    const i = nodes.indexOf(failed);
    if (i >= 0) nodes = [...nodes.slice(i + 1), ...nodes.slice(0, i)];
    return nodes.filter((u) => u !== failed);
  }
}

export function noLeaderError(view: ClusterView, answered: string[], waitedMs: number): KilnError {
  let err: KilnError;
  if (answered.length === 0) {
    err = new ConnectionFailedError(
      `no node of the cluster answered GET /cluster within ${waitedMs} ms (asked: ${view.nodes().join(", ")})`);
  } else {
    err = new NoQuorumError(
      `no node said it leads the cluster within ${waitedMs} ms (asked: ${view.nodes().join(", ")}; ` +
      `answered: ${[...new Set(answered)].join(", ")})`);
  }
  err.node = answered[answered.length - 1];
  return err;
}

/** GET /cluster answered by a server that is not in a cluster (or has no such route). */
export function isNotClustered(status: number, text: string): boolean {
  if (status !== 404) return false;
  return errorFromResponse(status, text) instanceof NotFoundError;
}
