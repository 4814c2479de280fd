/**
 * Errors: one class per error code the server sends.
 *
 * The server answers errors as `{"error": code, "message": text}` (plus
 * `current_etag` on a conflict). {@link errorFromResponse} turns such an answer into
 * the class registered for its code in {@link ERROR_CLASSES}; an unknown code falls
 * back to a class chosen by the HTTP status, so a newer server never breaks the
 * client. The codes come from the server's one list (`clients/error-codes.json`,
 * generated into `codes.ts`); a test fails when a code has no class here.
 */

import { SERVER_ERROR_CODES } from "./codes.js";

export type ErrorBody = Record<string, unknown>;

export interface KilnErrorOptions {
  code?: string | undefined;
  status?: number | undefined;
  body?: ErrorBody | undefined;
  cause?: unknown;
}

/** Base of every error this client throws. */
export class KilnError extends Error {
  static readonly code: string = "error";
  /** The server's error code (`document_not_found`, ...) or the client's own. */
  code: string;
  /** The HTTP status, when the server sent one. */
  status: number | undefined;
  /** The server's JSON error body (`request_id`, `current_etag`, `outcome`, ...). */
  body: ErrorBody;
  /** The URL of the node that answered (or could not be reached), when known. */
  node: string | undefined;

  constructor(message: string, options: KilnErrorOptions = {}) {
    super(message, options.cause !== undefined ? { cause: options.cause } : undefined);
    this.name = new.target.name;
    this.code = options.code ?? (new.target as unknown as { code: string }).code;
    this.status = options.status;
    this.body = { ...(options.body ?? {}) };
    this.node = undefined;
  }

  override toString(): string {
    return `${this.name}: ${this.status ? `${this.status} ` : ""}${this.code}: ${this.message}`;
  }
}

// --- client-side errors -------------------------------------------------------------

/** Thrown by the client itself, not sent by the server. */
export class ClientError extends KilnError {}

/** Bad input to a client call (a malformed URL, a field name the query language cannot hold, ...). */
export class InvalidArgumentError extends ClientError {
  static override readonly code: string = "invalid_argument";
}

/** A session made more requests than its budget (`maxRequests`, default 30). */
export class RequestBudgetExceededError extends ClientError {
  static override readonly code: string = "request_budget_exceeded";
}

export class SessionClosedError extends ClientError {
  static override readonly code: string = "session_closed";
}

export class StoreClosedError extends ClientError {
  static override readonly code: string = "store_closed";
}

/** The server could not be reached (refused, reset, TLS failure, timeout). */
export class ConnectionFailedError extends ClientError {
  static override readonly code: string = "connection_failed";
}

/** The server answered something that is not what the API says (not JSON, ...). */
export class UnexpectedResponseError extends ClientError {
  static override readonly code: string = "unexpected_response";
}

/**
 * A write failed during a failover after it was sent (the connection broke, or the
 * cluster answered `no_quorum` / `not_leader` with `outcome: "unknown"`), so it may or
 * may not have been applied, and it was not resent because resending could apply it
 * twice (the server generates its id). `outcome` is always `"unknown"`; `cause` is the
 * failure.
 */
export class WriteOutcomeUnknownError extends ClientError {
  static override readonly code: string = "write_outcome_unknown";
  readonly outcome = "unknown" as const;
}

/** A bulk insert stopped: `line` is the first line not written; every line before it was committed. */
export class BulkInsertError extends KilnError {
  static override readonly code: string = "bulk_insert_failed";
  line: number | undefined;
  acked: number;
  lastEtag: string | undefined;
  constructor(message: string, opts: KilnErrorOptions & { line?: number | undefined; acked: number; lastEtag?: string | undefined }) {
    super(message, opts);
    this.line = opts.line;
    this.acked = opts.acked;
    this.lastEtag = opts.lastEtag;
  }
}

/** More changes arrived than a changes iterator buffers (read faster or give a larger buffer). */
export class ChangesIteratorOverflowError extends ClientError {
  static override readonly code: string = "iterator_overflow";
}

/** The server ended a data subscription's worker: deleted (4004) or taken over (4009). */
export class SubscriptionClosedError extends KilnError {
  static override readonly code: string = "subscription_closed";
  closeCode: number;
  constructor(message: string, closeCode: number) {
    super(message);
    this.closeCode = closeCode;
  }
}

// --- server errors by status family -------------------------------------------------

/** 400: the request is malformed. */
export class BadRequestError extends KilnError {}
/** 401 `unauthorized`: no API key, or one the server does not know. */
export class AuthenticationError extends KilnError { static override readonly code: string = "unauthorized"; }
/**
 * 403 `forbidden`: the key or certificate lacks the permission the request needs (the
 * message names it: `read`, `read_write` or `admin` of a database, or `operator`).
 * Nothing was changed; retrying with the same key will not help.
 */
export class ForbiddenError extends KilnError { static override readonly code: string = "forbidden"; }
/** 404. */
export class NotFoundError extends KilnError {}
export class MethodNotAllowedError extends KilnError { static override readonly code: string = "method_not_allowed"; }
/** 415 `unsupported_media_type`: e.g. a JSON Patch sent to PATCH (which takes a merge patch). */
export class UnsupportedMediaTypeError extends KilnError { static override readonly code: string = "unsupported_media_type"; }
export class RequestTimeoutError extends KilnError { static override readonly code: string = "request_timeout"; }
/** 409. */
export class ConflictError extends KilnError {}
/** 410. */
export class GoneError extends KilnError {}
/** 413. */
export class PayloadTooLargeError extends KilnError {}
/** 416 `range_not_satisfiable`: a byte range starting past the attachment's end. */
export class RangeNotSatisfiableError extends KilnError { static override readonly code: string = "range_not_satisfiable"; }
/** 429 `too_many_connections`. */
export class TooManyConnectionsError extends KilnError { static override readonly code: string = "too_many_connections"; }
/** 500: a fault inside the server (the message carries an error id for its log). */
export class ServerError extends KilnError {}
/** 501. */
export class NotImplementedError extends KilnError {}
/** 503: try again later. */
export class ServiceUnavailableError extends KilnError {
  /** Seconds from `Retry-After`, when the server sent one. */
  get retryAfter(): number | undefined {
    const v = this.body["_retry_after"];
    return v === undefined || v === null ? undefined : Number(v);
  }
}
/** 507. */
export class InsufficientStorageError extends KilnError {}

// --- one class per code ---------------------------------------------------------------

export class InvalidDatabaseNameError extends BadRequestError { static override readonly code: string = "invalid_database_name"; }
export class InvalidIdError extends BadRequestError { static override readonly code: string = "invalid_id"; }
export class InvalidCollectionError extends BadRequestError { static override readonly code: string = "invalid_collection"; }
export class MalformedJsonError extends BadRequestError { static override readonly code: string = "malformed_json"; }
export class InvalidDocumentError extends BadRequestError { static override readonly code: string = "invalid_document"; }
export class InvalidEtagError extends BadRequestError { static override readonly code: string = "invalid_etag"; }
export class InvalidPreconditionError extends BadRequestError { static override readonly code: string = "invalid_precondition"; }
/** `invalid_query`: a bad query-string parameter, or a query the language rejects (line and column in the message). */
export class InvalidQueryError extends BadRequestError { static override readonly code: string = "invalid_query"; }
export class InvalidIndexError extends BadRequestError { static override readonly code: string = "invalid_index"; }
/** `query_too_expensive`: a query no index narrows over more documents than `--max-scan-docs`. */
export class QueryTooExpensiveError extends BadRequestError { static override readonly code: string = "query_too_expensive"; }
export class IndexNotFoundError extends NotFoundError { static override readonly code: string = "index_not_found"; }
export class IndexExistsError extends ConflictError { static override readonly code: string = "index_exists"; }
export class InvalidRevisionsConfigError extends BadRequestError { static override readonly code: string = "invalid_revisions_config"; }
export class RevisionNotFoundError extends NotFoundError { static override readonly code: string = "revision_not_found"; }
export class InvalidAttachmentError extends BadRequestError { static override readonly code: string = "invalid_attachment"; }
export class AttachmentNotFoundError extends NotFoundError { static override readonly code: string = "attachment_not_found"; }
export class InvalidSubscriptionError extends BadRequestError { static override readonly code: string = "invalid_subscription"; }
export class SubscriptionNotFoundError extends NotFoundError { static override readonly code: string = "subscription_not_found"; }
export class SubscriptionExistsError extends ConflictError { static override readonly code: string = "subscription_exists"; }
/** `subscription_busy`: another worker holds the data subscription (`strategy: "if_free"`). */
export class SubscriptionBusyError extends ConflictError { static override readonly code: string = "subscription_busy"; }
/** `bad_request`: a request head the server cannot parse, or plain HTTP to its TLS port. */
export class MalformedRequestError extends BadRequestError { static override readonly code: string = "bad_request"; }
export class InvalidPathError extends BadRequestError { static override readonly code: string = "invalid_path"; }
export class InvalidHeaderError extends BadRequestError { static override readonly code: string = "invalid_header"; }
export class InvalidPageSizeError extends BadRequestError { static override readonly code: string = "invalid_page_size"; }
export class PageSizeTooLargeError extends BadRequestError { static override readonly code: string = "page_size_too_large"; }
export class InvalidWaitError extends BadRequestError { static override readonly code: string = "invalid_wait"; }
export class BodyReadFailedError extends BadRequestError { static override readonly code: string = "body_read_failed"; }
/** Changes feed: the server could not read a message the client sent. */
export class InvalidMessageError extends BadRequestError { static override readonly code: string = "invalid_message"; }
/** Changes feed: a binary frame. */
export class UnsupportedMessageError extends BadRequestError { static override readonly code: string = "unsupported"; }
export class TooManySubscriptionsError extends BadRequestError { static override readonly code: string = "too_many_subscriptions"; }
/** Changes feed: the server could not read the change log for a backlog. */
export class ChangesReadFailedError extends ServerError { static override readonly code: string = "read_failed"; }
/** `not_found`: the server has no such route. */
export class RouteNotFoundError extends NotFoundError { static override readonly code: string = "not_found"; }
export class DatabaseNotFoundError extends NotFoundError { static override readonly code: string = "database_not_found"; }
export class DocumentNotFoundError extends NotFoundError { static override readonly code: string = "document_not_found"; }
export class DatabaseExistsError extends ConflictError { static override readonly code: string = "database_exists"; }

/**
 * `conflict`: an `If-Match` (or create-only) condition failed. `id` names the
 * document, `expectedEtag` the etag the client sent (undefined for a create-only
 * write), `currentEtag` the server's (undefined when the document does not exist).
 */
export class ConcurrencyError extends ConflictError {
  static override readonly code: string = "conflict";
  id: string | undefined;
  expectedEtag: string | undefined;
  currentEtag: string | undefined;
  constructor(message: string, opts: KilnErrorOptions & { id?: string | undefined; expectedEtag?: string | undefined; currentEtag?: string | undefined } = {}) {
    super(message, opts);
    this.id = opts.id;
    this.expectedEtag = opts.expectedEtag;
    const cur = opts.currentEtag ?? opts.body?.["current_etag"];
    this.currentEtag = typeof cur === "string" ? cur : undefined;
  }
}

/** What a resent write's error carries: how the first attempt failed, and the second one's answer. */
export interface RetriedWrite {
  readonly retried: true;
  firstError: KilnError | undefined;
  retryError: KilnError | undefined;
}

/**
 * A write resent once after a failover was refused with a conflict: its condition
 * no longer holds, most likely because the first attempt was applied before its
 * answer was lost. Read the document again before deciding what to do.
 */
export class RetryConflictError extends ConcurrencyError implements RetriedWrite {
  readonly retried = true as const;
  firstError: KilnError | undefined = undefined;
  retryError: KilnError | undefined = undefined;
}

/** A delete resent after a failover found nothing to delete: the first attempt most likely deleted it. */
export class RetryNotFoundError extends NotFoundError implements RetriedWrite {
  readonly retried = true as const;
  firstError: KilnError | undefined = undefined;
  retryError: KilnError | undefined = undefined;
}

export class EtagFromOtherIncarnationError extends GoneError { static override readonly code: string = "etag_from_other_incarnation"; }
export class DocumentTooLargeError extends PayloadTooLargeError { static override readonly code: string = "document_too_large"; }
export class BatchTooLongError extends PayloadTooLargeError { static override readonly code: string = "batch_too_long"; }
export class BodyTooLargeError extends PayloadTooLargeError { static override readonly code: string = "body_too_large"; }
export class AttachmentTooLargeError extends PayloadTooLargeError { static override readonly code: string = "attachment_too_large"; }
/** `too_large`: a value or transaction beyond the storage engine's limits. */
export class TooLargeError extends PayloadTooLargeError { static override readonly code: string = "too_large"; }
export class InternalServerError extends ServerError { static override readonly code: string = "internal_error"; }
export class CorruptionError extends ServerError { static override readonly code: string = "corruption"; }
export class StorageError extends ServerError { static override readonly code: string = "storage_error"; }
export class DatabaseBusyError extends ServiceUnavailableError { static override readonly code: string = "database_busy"; }
/** 503 `overloaded` with `Retry-After`. */
export class OverloadedError extends ServiceUnavailableError { static override readonly code: string = "overloaded"; }
export class ShuttingDownError extends ServiceUnavailableError { static override readonly code: string = "shutting_down"; }
export class IoError extends ServiceUnavailableError { static override readonly code: string = "io_error"; }
/** 503 `database_failed`: the database refuses writes until the server restarts. */
export class DatabaseFailedError extends ServiceUnavailableError { static override readonly code: string = "database_failed"; }

/**
 * `not_leader`: a follower got a write (307, `Location` the same path on the leader),
 * or leadership moved while the write waited (503). A store resends it once to the
 * leader by itself.
 */
export class NotLeaderError extends ServiceUnavailableError {
  static override readonly code: string = "not_leader";
  get leaderUrl(): string | undefined {
    const v = this.body["_location"];
    return typeof v === "string" ? v : undefined;
  }
  /** `"not_written"`, `"unknown"`, or undefined from a server that does not say. */
  get outcome(): string | undefined {
    const v = this.body["outcome"];
    return typeof v === "string" ? v : undefined;
  }
}

/** `no_quorum`: no leader, or a leader without a majority; `outcome` says whether the write surely did not happen. */
export class NoQuorumError extends ServiceUnavailableError {
  static override readonly code: string = "no_quorum";
  /** `"not_written"` (refused before the leader logged it), `"unknown"` (it may still commit), or undefined. */
  get outcome(): string | undefined {
    const v = this.body["outcome"];
    return typeof v === "string" ? v : undefined;
  }
}
export class ClusterError extends ServiceUnavailableError { static override readonly code: string = "cluster_error"; }
/** `not_clustered`: `GET /cluster` on a server started without `--cluster`. */
export class NotClusteredError extends NotFoundError { static override readonly code: string = "not_clustered"; }
export class DiskFullError extends InsufficientStorageError { static override readonly code: string = "disk_full"; }
export class BackupInvalidError extends BadRequestError { static override readonly code: string = "backup_invalid"; }
export class BackupReadFailedError extends BadRequestError { static override readonly code: string = "backup_read_failed"; }
export class BackupChainBrokenError extends BadRequestError { static override readonly code: string = "backup_chain_broken"; }
export class InvalidRestorePointError extends BadRequestError { static override readonly code: string = "invalid_restore_point"; }
export class IncrementNotPossibleError extends ConflictError { static override readonly code: string = "increment_not_possible"; }

type ErrorClass = (new (message: string, options?: KilnErrorOptions) => KilnError) & { readonly code: string };

const CODE_CLASSES: ErrorClass[] = [
  AuthenticationError, ForbiddenError, MethodNotAllowedError, UnsupportedMediaTypeError, RequestTimeoutError,
  TooManyConnectionsError, InvalidDatabaseNameError, InvalidIdError, InvalidCollectionError,
  MalformedJsonError, InvalidDocumentError, InvalidEtagError, InvalidPreconditionError,
  InvalidQueryError, MalformedRequestError, InvalidPathError, InvalidHeaderError,
  InvalidPageSizeError, PageSizeTooLargeError, InvalidWaitError, BodyReadFailedError,
  InvalidMessageError, UnsupportedMessageError, TooManySubscriptionsError, ChangesReadFailedError,
  RouteNotFoundError, DatabaseNotFoundError, DocumentNotFoundError, DatabaseExistsError,
  ConcurrencyError, EtagFromOtherIncarnationError, DocumentTooLargeError, BatchTooLongError,
  BodyTooLargeError, TooLargeError, InternalServerError, CorruptionError, BackupInvalidError,
  BackupReadFailedError, BackupChainBrokenError, InvalidRestorePointError, IncrementNotPossibleError,
  StorageError, DatabaseBusyError, OverloadedError, ShuttingDownError, IoError, DatabaseFailedError,
  DiskFullError, InvalidIndexError, QueryTooExpensiveError, IndexNotFoundError, IndexExistsError,
  InvalidRevisionsConfigError, RevisionNotFoundError, InvalidAttachmentError, AttachmentNotFoundError,
  RangeNotSatisfiableError, AttachmentTooLargeError, InvalidSubscriptionError, SubscriptionNotFoundError,
  SubscriptionExistsError, SubscriptionBusyError, NotLeaderError, NoQuorumError, ClusterError,
  NotClusteredError,
];

/** Every error code the server sends, mapped to its class. */
export const ERROR_CLASSES: Readonly<Record<string, ErrorClass>> = Object.freeze(
  Object.fromEntries(CODE_CLASSES.map((c) => [c.code, c])),
);

/** The class an unknown code falls back to, by HTTP status. */
export const STATUS_CLASSES: Readonly<Record<number, ErrorClass>> = Object.freeze({
  400: BadRequestError as ErrorClass, 401: AuthenticationError, 403: ForbiddenError, 404: NotFoundError as ErrorClass,
  405: MethodNotAllowedError, 408: RequestTimeoutError, 409: ConflictError as ErrorClass,
  410: GoneError as ErrorClass, 413: PayloadTooLargeError as ErrorClass, 415: UnsupportedMediaTypeError,
  416: RangeNotSatisfiableError, 429: TooManyConnectionsError, 500: ServerError as ErrorClass,
  501: NotImplementedError as ErrorClass, 503: ServiceUnavailableError as ErrorClass,
  507: InsufficientStorageError as ErrorClass,
});

export function errorClass(code: string | undefined, status: number | undefined): ErrorClass {
  if (code !== undefined && Object.prototype.hasOwnProperty.call(ERROR_CLASSES, code)) {
    return ERROR_CLASSES[code]!;
  }
  // A WebSocket message's code comes without an HTTP status: the server's list has it.
  if (status === undefined && code !== undefined && code in SERVER_ERROR_CODES) {
    status = SERVER_ERROR_CODES[code];
  }
  if (status !== undefined && STATUS_CLASSES[status] !== undefined) return STATUS_CLASSES[status]!;
  if (status !== undefined && status >= 500) return ServerError as ErrorClass;
  return KilnError as unknown as ErrorClass;
}

export function makeError(code: string | undefined, message: string, status?: number, body?: ErrorBody): KilnError {
  const cls = errorClass(code, status);
  return new cls(message, { code: code ?? cls.code, status, body });
}

/** The error for an error answer (any status >= 300 that is not what was asked for). */
export function errorFromResponse(status: number, content: Uint8Array | string, headers?: Headers): KilnError {
  const text = typeof content === "string" ? content : new TextDecoder().decode(content);
  let body: ErrorBody = {};
  try {
    const parsed: unknown = text ? JSON.parse(text) : {};
    if (parsed !== null && typeof parsed === "object" && !Array.isArray(parsed)) body = parsed as ErrorBody;
  } catch {
    // not JSON: the text is the message
  }
  const code = typeof body["error"] === "string" ? (body["error"] as string) : undefined;
  let message = typeof body["message"] === "string" ? (body["message"] as string) : "";
  if (!message) message = text.slice(0, 500) || `HTTP ${status}`;
  const retryAfter = headers?.get("retry-after");
  if (retryAfter) body["_retry_after"] = retryAfter;
  const location = headers?.get("location");
  if (location) body["_location"] = location;
  return makeError(code, message, status, body);
}
