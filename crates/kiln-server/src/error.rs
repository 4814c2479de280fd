//! Errors as HTTP answers: a status, a stable code, a human message, as JSON
//! `{"error": code, "message": text}` (plus `current_etag` on a conflict, and the
//! request's id, added where the answer leaves the server).
//!
//! [`ErrorCode`] is the one list of codes: the status of an answer comes from its
//! code, and `docs/openapi.yaml` lists the same codes (`tests/server/openapi_matches_server.rs`
//! compares them; `KILN_WRITE_OPENAPI=1` on that test rewrites the list from this enum).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_docs::{
    AttachmentError, BackupChainError, DatabaseError, DocumentError, IndexError, QueryError,
    RevisionError, SubscriptionError,
};
use kiln_docs::{DocError, Etag};

macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = $code:literal => $status:ident,)*) => {
        /// Every error code the server sends, with the status it is sent with.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as the JSON body's `error` carries it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            pub const fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }
        }
    };
}

error_codes! {
    // The request as a whole.
    /// No route has that path.
    NotFound = "not_found" => NOT_FOUND,
    /// The route does not take that method.
    MethodNotAllowed = "method_not_allowed" => METHOD_NOT_ALLOWED,
    /// No API key or client certificate, or a key that is not valid.
    Unauthorized = "unauthorized" => UNAUTHORIZED,
    /// The caller's key or certificate lacks the permission the route needs (the
    /// message names it).
    Forbidden = "forbidden" => FORBIDDEN,
    /// A request line or head that does not parse (or plain HTTP on the TLS port).
    BadRequest = "bad_request" => BAD_REQUEST,
    InvalidPath = "invalid_path" => BAD_REQUEST,
    InvalidHeader = "invalid_header" => BAD_REQUEST,
    /// An unknown, repeated or unparsable query parameter, or a query body that
    /// does not parse.
    InvalidQuery = "invalid_query" => BAD_REQUEST,
    InvalidPageSize = "invalid_page_size" => BAD_REQUEST,
    PageSizeTooLarge = "page_size_too_large" => BAD_REQUEST,
    InvalidWait = "invalid_wait" => BAD_REQUEST,
    InvalidPrecondition = "invalid_precondition" => BAD_REQUEST,
    InvalidEtag = "invalid_etag" => BAD_REQUEST,
    BodyTooLarge = "body_too_large" => PAYLOAD_TOO_LARGE,
    /// A PATCH body in a format other than a JSON merge patch.
    UnsupportedMediaType = "unsupported_media_type" => UNSUPPORTED_MEDIA_TYPE,
    BodyReadFailed = "body_read_failed" => BAD_REQUEST,
    RequestTimeout = "request_timeout" => REQUEST_TIMEOUT,
    TooManyConnections = "too_many_connections" => TOO_MANY_REQUESTS,
    // Databases and documents.
    DatabaseNotFound = "database_not_found" => NOT_FOUND,
    DatabaseExists = "database_exists" => CONFLICT,
    DatabaseBusy = "database_busy" => SERVICE_UNAVAILABLE,
    InvalidDatabaseName = "invalid_database_name" => BAD_REQUEST,
    InvalidId = "invalid_id" => BAD_REQUEST,
    InvalidCollection = "invalid_collection" => BAD_REQUEST,
    DocumentNotFound = "document_not_found" => NOT_FOUND,
    Conflict = "conflict" => CONFLICT,
    MalformedJson = "malformed_json" => BAD_REQUEST,
    InvalidDocument = "invalid_document" => BAD_REQUEST,
    DocumentTooLarge = "document_too_large" => PAYLOAD_TOO_LARGE,
    BatchTooLong = "batch_too_long" => PAYLOAD_TOO_LARGE,
    /// A value or transaction over the engine's own limits.
    TooLarge = "too_large" => PAYLOAD_TOO_LARGE,
    EtagFromOtherIncarnation = "etag_from_other_incarnation" => GONE,
    // Indexes and queries.
    InvalidIndex = "invalid_index" => BAD_REQUEST,
    IndexNotFound = "index_not_found" => NOT_FOUND,
    IndexExists = "index_exists" => CONFLICT,
    QueryTooExpensive = "query_too_expensive" => BAD_REQUEST,
    // Revisions.
    InvalidRevisionsConfig = "invalid_revisions_config" => BAD_REQUEST,
    /// The document has no revision with that etag (never had, trimmed or purged).
    RevisionNotFound = "revision_not_found" => NOT_FOUND,
    // Attachments.
    /// A bad attachment name or content type, or a document's `@attachments`
    /// entry naming bytes the database does not hold.
    InvalidAttachment = "invalid_attachment" => BAD_REQUEST,
    AttachmentNotFound = "attachment_not_found" => NOT_FOUND,
    /// A Range outside the attachment (the answer carries `Content-Range: bytes */size`).
    RangeNotSatisfiable = "range_not_satisfiable" => RANGE_NOT_SATISFIABLE,
    /// An upload over `kiln serve --max-attachment-bytes`.
    AttachmentTooLarge = "attachment_too_large" => PAYLOAD_TOO_LARGE,
    // Data subscriptions.
    InvalidSubscription = "invalid_subscription" => BAD_REQUEST,
    SubscriptionNotFound = "subscription_not_found" => NOT_FOUND,
    SubscriptionExists = "subscription_exists" => CONFLICT,
    /// Another worker holds the subscription (a worker connected with
    /// `strategy=if_free`).
    SubscriptionBusy = "subscription_busy" => CONFLICT,
    // Backup and restore.
    BackupChainBroken = "backup_chain_broken" => BAD_REQUEST,
    IncrementNotPossible = "increment_not_possible" => CONFLICT,
    InvalidRestorePoint = "invalid_restore_point" => BAD_REQUEST,
    BackupInvalid = "backup_invalid" => BAD_REQUEST,
    BackupReadFailed = "backup_read_failed" => BAD_REQUEST,
    // A cluster.
    /// A write sent to a follower: 307 with the leader's URL in `Location`.
    NotLeader = "not_leader" => SERVICE_UNAVAILABLE,
    /// No leader, or no majority acknowledged in time: the write was not accepted.
    NoQuorum = "no_quorum" => SERVICE_UNAVAILABLE,
    ClusterError = "cluster_error" => SERVICE_UNAVAILABLE,
    NotClustered = "not_clustered" => NOT_FOUND,
    // The changes feed's WebSocket: `{"type": "error", "code": ...}` messages, never an
    // HTTP answer (the status is the family a client files them under).
    /// A binary frame: the feed takes JSON text frames.
    UnsupportedFrame = "unsupported" => BAD_REQUEST,
    /// A text frame that is not a message the feed knows.
    InvalidMessage = "invalid_message" => BAD_REQUEST,
    /// More subscriptions on one connection than the server allows.
    TooManySubscriptions = "too_many_subscriptions" => BAD_REQUEST,
    /// The feed could not read the changes it was to send (the subscription ends).
    ChangesReadFailed = "read_failed" => INTERNAL_SERVER_ERROR,
    // The server's state.
    Overloaded = "overloaded" => SERVICE_UNAVAILABLE,
    ShuttingDown = "shutting_down" => SERVICE_UNAVAILABLE,
    /// The disk is full: the file is named in the message.
    DiskFull = "disk_full" => INSUFFICIENT_STORAGE,
    IoError = "io_error" => SERVICE_UNAVAILABLE,
    /// The database latched after a failed write: it needs a restart.
    DatabaseFailed = "database_failed" => SERVICE_UNAVAILABLE,
    Corruption = "corruption" => INTERNAL_SERVER_ERROR,
    StorageError = "storage_error" => INTERNAL_SERVER_ERROR,
    InternalError = "internal_error" => INTERNAL_SERVER_ERROR,
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    /// On a conflict: the document's current etag, also sent as the `ETag` header.
    pub current_etag: Option<Etag>,
    pub retry_after_s: Option<u32>,
    /// The database latched after a failure: it refuses writes until the server
    /// restarts (sent as `"needs_restart": true`).
    pub needs_restart: bool,
    /// On a 405: the methods the resource takes (the `Allow` header).
    pub allow: Option<&'static str>,
    /// On a cluster's refusal of a write (`no_quorum`, `not_leader`): whether it
    /// was surely not written (`"not_written"`) or may still be committed
    /// (`"unknown"`: it entered the leader's log, then no majority answered in
    /// time), sent as `"outcome"`.
    pub outcome: Option<&'static str>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status: code.status(),
            code,
            message: message.into(),
            current_etag: None,
            retry_after_s: None,
            needs_restart: false,
            allow: None,
            outcome: None,
        }
    }

    pub fn body_json(&self) -> String {
        let mut v = serde_json::json!({"error": self.code.as_str(), "message": self.message});
        if let Some(e) = self.current_etag {
            v["current_etag"] = e.to_string().into();
        }
        if self.needs_restart {
            v["needs_restart"] = true.into();
        }
        if let Some(outcome) = self.outcome {
            v["outcome"] = outcome.into();
        }
        v.to_string()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, self.body_json()).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(e) = self.current_etag {
            if let Ok(v) = HeaderValue::from_str(&format!("\"{e}\"")) {
                h.insert(header::ETAG, v);
            }
        }
        if let Some(s) = self.retry_after_s {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if let Some(methods) = self.allow {
            h.insert(header::ALLOW, HeaderValue::from_static(methods));
        }
        resp
    }
}

/// The document model's own errors (an id, an etag, a patch, an attachment name
/// checked before any database is reached) answer as the layer's do.
impl From<DocumentError> for ApiError {
    fn from(e: DocumentError) -> ApiError {
        ApiError::from(DocError::from(e))
    }
}

impl From<AttachmentError> for ApiError {
    fn from(e: AttachmentError) -> ApiError {
        ApiError::from(DocError::from(e))
    }
}

impl From<DocError> for ApiError {
    fn from(e: DocError) -> ApiError {
        let code = error_code(&e);
        let status = code.status();
        let needs_restart = latched(&e);
        let mut message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            // A server fault: the log has the whole story under an id the client sees.
            let id = format!("{:016x}", rand::random::<u64>());
            tracing::error!(error_id = %id, error = %e, "request failed inside the server");
            format!("{e} (error id {id}; the server log has the details)")
        } else {
            if status.is_server_error() {
                tracing::warn!(error = %e, code = code.as_str(), "request failed");
            }
            e.to_string()
        };
        if needs_restart {
            message.push_str("; restarting the server does that");
        }
        ApiError {
            status,
            code,
            message,
            current_etag: current_etag(&e),
            retry_after_s: (code == ErrorCode::Overloaded).then_some(1),
            needs_restart,
            allow: None,
            outcome: None,
        }
    }
}

/// True if the error reports a latched database (it needs a restart).
fn latched(e: &DocError) -> bool {
    match e {
        DocError::Storage(se) => se.latched().is_some(),
        DocError::Database(DatabaseError::BatchOpFailed { source, .. }) => latched(source),
        _ => false,
    }
}

pub(crate) fn current_etag(e: &DocError) -> Option<Etag> {
    match e {
        DocError::Document(DocumentError::Conflict { current, .. }) => *current,
        DocError::Database(DatabaseError::BatchOpFailed { source, .. }) => current_etag(source),
        _ => None,
    }
}

pub(crate) fn error_code(e: &DocError) -> ErrorCode {
    use ErrorCode as C;
    match e {
        DocError::Document(e) => document_code(e),
        DocError::Database(e) => database_code(e),
        DocError::Index(e) => match e {
            IndexError::Invalid(_) => C::InvalidIndex,
            IndexError::NotFound(_) => C::IndexNotFound,
            IndexError::Exists(_) => C::IndexExists,
            _ => C::InternalError,
        },
        DocError::Query(e) => match e {
            QueryError::Invalid { .. } => C::InvalidQuery,
            QueryError::TooExpensive(_) => C::QueryTooExpensive,
            _ => C::InternalError,
        },
        DocError::Revision(e) => match e {
            RevisionError::InvalidConfig(_) => C::InvalidRevisionsConfig,
            RevisionError::NotFound { .. } => C::RevisionNotFound,
            _ => C::InternalError,
        },
        DocError::Attachment(e) => match e {
            AttachmentError::Invalid(_) => C::InvalidAttachment,
            AttachmentError::NotFound { .. } => C::AttachmentNotFound,
            _ => C::InternalError,
        },
        DocError::Subscription(e) => match e {
            SubscriptionError::Invalid(_) => C::InvalidSubscription,
            SubscriptionError::NotFound(_) => C::SubscriptionNotFound,
            SubscriptionError::Exists(_) => C::SubscriptionExists,
            // A taken-over worker's acknowledgment: another worker holds it now.
            SubscriptionError::Busy(_) | SubscriptionError::LeaseLost(_) => C::SubscriptionBusy,
            _ => C::InternalError,
        },
        DocError::BackupChain(e) => match e {
            BackupChainError::Broken { .. } => C::BackupChainBroken,
            BackupChainError::IncrementNotPossible(_) => C::IncrementNotPossible,
            BackupChainError::RestorePoint(_) => C::InvalidRestorePoint,
            _ => C::InternalError,
        },
        DocError::Internal(_) => C::InternalError,
        // A directory of the data directory could not be made or removed.
        DocError::Io { source, .. } if is_disk_full(source) => C::DiskFull,
        DocError::Io { .. } => C::IoError,
        DocError::Storage(se) => storage_error_code(se),
        DocError::Backup(kiln_storage::BackupError::Storage(se)) => storage_error_code(se),
        // A backup sent to the restore endpoint that does not check out.
        DocError::Backup(
            kiln_storage::BackupError::Corrupt { .. }
            | kiln_storage::BackupError::Truncated { .. }
            | kiln_storage::BackupError::UnsupportedVersion(_),
        ) => C::BackupInvalid,
        DocError::Backup(kiln_storage::BackupError::Io { .. }) => C::BackupReadFailed,
        _ => C::InternalError,
    }
}

fn document_code(e: &DocumentError) -> ErrorCode {
    use ErrorCode as C;
    match e {
        DocumentError::NotFound { .. } => C::DocumentNotFound,
        DocumentError::Conflict { .. } => C::Conflict,
        DocumentError::InvalidId { .. } => C::InvalidId,
        DocumentError::InvalidCollection { .. } => C::InvalidCollection,
        DocumentError::InvalidDatabaseName { .. } => C::InvalidDatabaseName,
        DocumentError::MalformedJson { .. } => C::MalformedJson,
        // An `@expires` that is not an RFC 3339 time: the message says what it is.
        DocumentError::Invalid(_) | DocumentError::InvalidExpires { .. } => C::InvalidDocument,
        DocumentError::TooLarge { .. } => C::DocumentTooLarge,
        DocumentError::InvalidEtag(_) => C::InvalidEtag,
        DocumentError::Corrupt { .. } => C::Corruption,
        _ => C::InternalError,
    }
}

fn database_code(e: &DatabaseError) -> ErrorCode {
    use ErrorCode as C;
    match e {
        DatabaseError::NotFound(_) => C::DatabaseNotFound,
        DatabaseError::Exists(_) => C::DatabaseExists,
        DatabaseError::Busy { .. } => C::DatabaseBusy,
        DatabaseError::ShuttingDown => C::ShuttingDown,
        DatabaseError::Overloaded { .. } => C::Overloaded,
        DatabaseError::EtagFromOtherIncarnation { .. } => C::EtagFromOtherIncarnation,
        DatabaseError::BatchTooLong { .. } => C::BatchTooLong,
        // A batch fails as its failing operation does; the message names the index.
        DatabaseError::BatchOpFailed { source, .. } => error_code(source),
        _ => C::InternalError,
    }
}

/// The engine's failures keep their kind: a full disk is 507 whatever wrapped it (a
/// failed commit group, a latch); a database that latched after a failed write is
/// 503 `database_failed` until the server restarts; a corruption or a bug is 500
/// (with an id in the log); never a client error.
fn storage_error_code(e: &kiln_storage::Error) -> ErrorCode {
    use kiln_storage::{ErrorKind as K, FailureKind as F, Limit};
    use ErrorCode as C;
    // By the engine's own classification (which sees through a failed commit group
    // and a broken transaction to their cause), not by its variants.
    match e.kind() {
        K::Overloaded => C::Overloaded,
        K::TooLarge { what: Limit::Key } => C::InvalidId,
        K::TooLarge { .. } => C::TooLarge,
        // A full disk is 507 whatever wrapped it (a failed group, a latch).
        K::DiskFull | K::Latched { cause: F::DiskFull } => C::DiskFull,
        // A latch after a bug (a panic in the commit path) is a server fault.
        K::Latched { cause: F::Internal } => C::InternalError,
        // After a failed write the database refuses writes until it is reopened (the
        // journal then decides what was committed): say so instead of a bare 500.
        K::Latched { .. } => C::DatabaseFailed,
        K::Io => C::IoError,
        K::Corruption => C::Corruption,
        _ => C::StorageError,
    }
}

fn is_disk_full(e: &std::io::Error) -> bool {
    kiln_storage::io_is_disk_full(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_failures_get_their_own_codes() {
        let full = DocError::Storage(kiln_storage::Error::Io {
            path: "/data/journal/journal-1.log".into(),
            offset: Some(4096),
            op: "write",
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        });
        let e = ApiError::from(full);
        assert_eq!((e.status.as_u16(), e.code.as_str()), (507, "disk_full"));
        assert!(e.message.contains("journal-1.log"), "{}", e.message);
        let io = |code| kiln_storage::Error::Io {
            path: "/data/dbs/a/data.kiln".into(),
            offset: Some(8192),
            op: "fsync data file",
            source: std::io::Error::from_raw_os_error(code),
        };
        // A latch after an I/O error: 503, says a restart is needed.
        let latched = ApiError::from(DocError::Storage(kiln_storage::Error::Poisoned(
            kiln_storage::Failure::from_error("background flush failed", &io(libc::EIO)),
        )));
        assert_eq!(
            (latched.status.as_u16(), latched.code.as_str()),
            (503, "database_failed")
        );
        assert!(latched.message.contains("data.kiln"), "{}", latched.message);
        assert!(
            latched.message.contains("restarting the server"),
            "{}",
            latched.message
        );
        assert!(latched.body_json().contains("\"needs_restart\":true"));
        // A latch after a full disk keeps its kind: 507, names the file, needs a restart.
        let latched_full = ApiError::from(DocError::Storage(kiln_storage::Error::Poisoned(
            kiln_storage::Failure::from_error("journal write failed", &io(libc::ENOSPC)),
        )));
        assert_eq!(
            (latched_full.status.as_u16(), latched_full.code.as_str()),
            (507, "disk_full")
        );
        assert!(latched_full.needs_restart);
        assert!(latched_full.message.contains("data.kiln"));
        // A unit of a commit group that failed for lack of space (the other writes
        // merged into the same commit): 507 as well, not a 500 `storage_error`.
        let group = ApiError::from(DocError::Storage(kiln_storage::Error::GroupFailed(
            std::sync::Arc::new(io(libc::EDQUOT)),
        )));
        assert_eq!(
            (group.status.as_u16(), group.code.as_str()),
            (507, "disk_full")
        );
        assert!(!group.needs_restart);
        // A group failing after a latch: as the latch.
        let group_latched = ApiError::from(DocError::Storage(kiln_storage::Error::GroupFailed(
            std::sync::Arc::new(kiln_storage::Error::Poisoned(
                kiln_storage::Failure::from_error("journal write failed", &io(libc::EIO)),
            )),
        )));
        assert_eq!(
            (group_latched.status.as_u16(), group_latched.code.as_str()),
            (503, "database_failed")
        );
        assert!(group_latched.needs_restart);
        // An I/O error that latched nothing (a journal file could not be created).
        let plain = ApiError::from(DocError::Storage(io(libc::EIO)));
        assert_eq!(
            (plain.status.as_u16(), plain.code.as_str()),
            (503, "io_error")
        );
        assert!(!plain.needs_restart);
        // A bug: 500 with an id that the log has too.
        for bug in [
            DocError::Internal("a write lost its result".into()),
            DocError::Storage(kiln_storage::Error::Poisoned(
                kiln_storage::Failure::internal("preparing a commit panicked", "boom"),
            )),
        ] {
            let e = ApiError::from(bug);
            assert_eq!(
                (e.status.as_u16(), e.code.as_str()),
                (500, "internal_error")
            );
            assert!(e.message.contains("error id"), "{}", e.message);
        }
        let conflict_in_batch = ApiError::from(DocError::Database(DatabaseError::BatchOpFailed {
            index: 3,
            source: Box::new(DocError::Document(DocumentError::Conflict {
                id: "a".into(),
                current: Some(kiln_docs::Etag {
                    incarnation: 1,
                    sequence: 2,
                }),
                why: "stale".into(),
            })),
        }));
        assert_eq!(
            (
                conflict_in_batch.status.as_u16(),
                conflict_in_batch.code.as_str()
            ),
            (409, "conflict")
        );
        assert!(
            conflict_in_batch.message.contains("operation 3"),
            "{}",
            conflict_in_batch.message
        );
        assert!(conflict_in_batch.current_etag.is_some());
    }
}
