/**
 * kiln-client: the TypeScript client of the Kiln document server.
 *
 * ```ts
 * import { DocumentStore } from "kiln-client";
 * const store = new DocumentStore("http://127.0.0.1:8080", "shop");
 * const s = store.session();
 * s.store({ name: "Ada", age: 36 }, "users/ada");
 * await s.saveChanges();
 * ```
 */

export * from "./errors.js";
export { SERVER_ERROR_CODES } from "./codes.js";
export {
  DocumentStore, docPath, stripQuotes, withExpiry, accessTo, type Caller, type DatabaseGrant, type ApiKeyRecord,
  type DocumentStoreOptions, type Doc, type KilnResponse, type RequestOptions, type BatchOp, type BatchResult,
  type Revision, type RevisionsConfig, type AttachmentInfo, type AttachmentStream, type GetAttachmentOptions,
  type WebSocketConstructor, type ListDocumentsOptions, type DocumentPage, type CollectionInfo, type IndexField,
  type IndexDefinition, type IndexInfo, type ServerStats, type DatabaseFigures, type ClusterStatus, type ClusterMember,
} from "./store.js";
export { Session, type SessionOptions } from "./session.js";
export { Query, checkField, quoteString, type QueryResult, type AggregateFunction } from "./query.js";
export { BulkInsert, type BulkInsertOptions } from "./bulk.js";
export { Changes, ChangesSubscription, type Change, type ChangesOptions } from "./changes.js";
export { DataSubscription, type SubscriptionBatch, type RunOptions, CLOSE_DELETED, CLOSE_TAKEN_OVER, CLOSE_NOT_LEADER } from "./subscriptions.js";
export { HttpCache, CacheStats, AggressiveState } from "./cache.js";
export {
  ClusterView, isWrite, resendCannotDuplicate, normalizeUrls, failoverOfAnswer, type Failover,
} from "./cluster.js";

export const VERSION = "0.1.0";
