//! Errors as HTTP answers: a status, a stable code, a human message, as JSON
//! `{"error": code, "message": text}` (plus `current_etag` on a conflict).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_docs::{DocError, Etag};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// On a conflict: the document's current etag, also sent as the `ETag` header.
    pub current_etag: Option<Etag>,
    pub retry_after_s: Option<u32>,
    /// The database latched after a failure: it refuses writes until the server
    /// restarts (sent as `"needs_restart": true`).
    pub needs_restart: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            current_etag: None,
            retry_after_s: None,
            needs_restart: false,
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn body_json(&self) -> String {
        let mut v = serde_json::json!({"error": self.code, "message": self.message});
        if let Some(e) = self.current_etag {
            v["current_etag"] = e.to_string().into();
        }
        if self.needs_restart {
            v["needs_restart"] = true.into();
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
        resp
    }
}

impl From<DocError> for ApiError {
    fn from(e: DocError) -> ApiError {
        let (status, code) = status_and_code(&e);
        let needs_restart = latched(&e);
        let mut message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            // A server fault: the log has the whole story under an id the client sees.
            let id = format!("{:016x}", rand::random::<u64>());
            tracing::error!(error_id = %id, error = %e, "request failed inside the server");
            format!("{e} (error id {id}; the server log has the details)")
        } else {
            if status.is_server_error() {
                tracing::warn!(error = %e, code, "request failed");
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
            retry_after_s: (code == "overloaded").then_some(1),
            needs_restart,
        }
    }
}

/// True if the error reports a latched database (it needs a restart).
fn latched(e: &DocError) -> bool {
    match e {
        DocError::Storage(se) => se.latched().is_some(),
        DocError::BatchOpFailed { source, .. } => latched(source),
        _ => false,
    }
}

fn current_etag(e: &DocError) -> Option<Etag> {
    match e {
        DocError::Conflict { current, .. } => *current,
        DocError::BatchOpFailed { source, .. } => current_etag(source),
        _ => None,
    }
}

fn status_and_code(e: &DocError) -> (StatusCode, &'static str) {
    use kiln_storage::Error as E;
    use StatusCode as S;
    match e {
        DocError::DatabaseNotFound(_) => (S::NOT_FOUND, "database_not_found"),
        DocError::DatabaseExists(_) => (S::CONFLICT, "database_exists"),
        DocError::DatabaseBusy { .. } => (S::SERVICE_UNAVAILABLE, "database_busy"),
        DocError::InvalidDatabaseName { .. } => (S::BAD_REQUEST, "invalid_database_name"),
        DocError::InvalidId { .. } => (S::BAD_REQUEST, "invalid_id"),
        DocError::InvalidCollection { .. } => (S::BAD_REQUEST, "invalid_collection"),
        DocError::DocumentNotFound { .. } => (S::NOT_FOUND, "document_not_found"),
        DocError::Conflict { .. } => (S::CONFLICT, "conflict"),
        DocError::MalformedJson { .. } => (S::BAD_REQUEST, "malformed_json"),
        DocError::InvalidDocument(_) => (S::BAD_REQUEST, "invalid_document"),
        DocError::DocumentTooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "document_too_large"),
        DocError::BatchTooLong { .. } => (S::PAYLOAD_TOO_LARGE, "batch_too_long"),
        DocError::InvalidEtag(_) => (S::BAD_REQUEST, "invalid_etag"),
        DocError::EtagFromOtherIncarnation { .. } => (S::GONE, "etag_from_other_incarnation"),
        DocError::Overloaded { .. } => (S::SERVICE_UNAVAILABLE, "overloaded"),
        DocError::ShuttingDown => (S::SERVICE_UNAVAILABLE, "shutting_down"),
        DocError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "internal_error"),
        DocError::InvalidIndex(_) => (S::BAD_REQUEST, "invalid_index"),
        DocError::IndexNotFound(_) => (S::NOT_FOUND, "index_not_found"),
        DocError::IndexExists(_) => (S::CONFLICT, "index_exists"),
        DocError::InvalidQuery { .. } => (S::BAD_REQUEST, "invalid_query"),
        DocError::QueryTooExpensive(_) => (S::BAD_REQUEST, "query_too_expensive"),
        DocError::CorruptRecord { .. } => (S::INTERNAL_SERVER_ERROR, "corruption"),
        DocError::BackupChain { .. } => (S::BAD_REQUEST, "backup_chain_broken"),
        DocError::IncrementNotPossible(_) => (S::CONFLICT, "increment_not_possible"),
        DocError::RestorePoint(_) => (S::BAD_REQUEST, "invalid_restore_point"),
        // A directory of the data directory could not be made or removed.
        DocError::Io { source, .. } if is_disk_full(source) => {
            (S::INSUFFICIENT_STORAGE, "disk_full")
        }
        DocError::Io { .. } => (S::SERVICE_UNAVAILABLE, "io_error"),
        // A batch fails as its failing operation does; the message names the index.
        DocError::BatchOpFailed { source, .. } => status_and_code(source),
        DocError::Storage(E::Overloaded { .. }) => (S::SERVICE_UNAVAILABLE, "overloaded"),
        DocError::Storage(se) => storage_status_and_code(se),
        DocError::Backup(kiln_storage::BackupError::Storage(se)) => storage_status_and_code(se),
        // A backup sent to the restore endpoint that does not check out.
        DocError::Backup(
            kiln_storage::BackupError::Corrupt { .. }
            | kiln_storage::BackupError::Truncated { .. }
            | kiln_storage::BackupError::UnsupportedVersion(_),
        ) => (S::BAD_REQUEST, "backup_invalid"),
        DocError::Backup(kiln_storage::BackupError::Io { .. }) => {
            (S::BAD_REQUEST, "backup_read_failed")
        }
        _ => (S::INTERNAL_SERVER_ERROR, "internal_error"),
    }
}

/// The engine's failures keep their kind: a full disk is 507 whatever wrapped it (a
/// failed commit group, a latch); a database that latched after a failed write is
/// 503 `database_failed` until the server restarts; a corruption or a bug is 500
/// (with an id in the log); never a client error.
fn storage_status_and_code(e: &kiln_storage::Error) -> (StatusCode, &'static str) {
    use kiln_storage::Error as E;
    use StatusCode as S;
    match e {
        // A unit merged into a commit that failed: it fails as the commit did.
        E::GroupFailed(cause) => storage_status_and_code(cause),
        E::Overloaded { .. } => (S::SERVICE_UNAVAILABLE, "overloaded"),
        E::KeyTooLarge { .. } => (S::BAD_REQUEST, "invalid_id"),
        E::ValueTooLarge { .. } | E::TransactionTooLarge { .. } => {
            (S::PAYLOAD_TOO_LARGE, "too_large")
        }
        e if e.is_disk_full() => (S::INSUFFICIENT_STORAGE, "disk_full"),
        // A latch after a bug (a panic in the commit path) is a server fault.
        E::Poisoned(f) if f.kind() == kiln_storage::FailureKind::Internal => {
            (S::INTERNAL_SERVER_ERROR, "internal_error")
        }
        // After a failed write the database refuses writes until it is reopened (the
        // journal then decides what was committed): say so instead of a bare 500.
        E::Poisoned(_) => (S::SERVICE_UNAVAILABLE, "database_failed"),
        E::Io { .. } => (S::SERVICE_UNAVAILABLE, "io_error"),
        e if e.is_corruption() => (S::INTERNAL_SERVER_ERROR, "corruption"),
        _ => (S::INTERNAL_SERVER_ERROR, "storage_error"),
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
        assert_eq!((e.status.as_u16(), e.code), (507, "disk_full"));
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
            (latched.status.as_u16(), latched.code),
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
            (latched_full.status.as_u16(), latched_full.code),
            (507, "disk_full")
        );
        assert!(latched_full.needs_restart);
        assert!(latched_full.message.contains("data.kiln"));
        // A unit of a commit group that failed for lack of space (the other writes
        // merged into the same commit): 507 as well, not a 500 `storage_error`.
        let group = ApiError::from(DocError::Storage(kiln_storage::Error::GroupFailed(
            Box::new(io(libc::EDQUOT)),
        )));
        assert_eq!((group.status.as_u16(), group.code), (507, "disk_full"));
        assert!(!group.needs_restart);
        // A group failing after a latch: as the latch.
        let group_latched = ApiError::from(DocError::Storage(kiln_storage::Error::GroupFailed(
            Box::new(kiln_storage::Error::Poisoned(
                kiln_storage::Failure::from_error("journal write failed", &io(libc::EIO)),
            )),
        )));
        assert_eq!(
            (group_latched.status.as_u16(), group_latched.code),
            (503, "database_failed")
        );
        assert!(group_latched.needs_restart);
        // An I/O error that latched nothing (a journal file could not be created).
        let plain = ApiError::from(DocError::Storage(io(libc::EIO)));
        assert_eq!((plain.status.as_u16(), plain.code), (503, "io_error"));
        assert!(!plain.needs_restart);
        // A bug: 500 with an id that the log has too.
        for bug in [
            DocError::Internal("a write lost its result".into()),
            DocError::Storage(kiln_storage::Error::Poisoned(
                kiln_storage::Failure::internal("preparing a commit panicked", "boom"),
            )),
        ] {
            let e = ApiError::from(bug);
            assert_eq!((e.status.as_u16(), e.code), (500, "internal_error"));
            assert!(e.message.contains("error id"), "{}", e.message);
        }
        let conflict_in_batch = ApiError::from(DocError::BatchOpFailed {
            index: 3,
            source: Box::new(DocError::Conflict {
                id: "a".into(),
                current: Some(kiln_docs::Etag {
                    incarnation: 1,
                    sequence: 2,
                }),
                why: "stale".into(),
            }),
        });
        assert_eq!(
            (conflict_in_batch.status.as_u16(), conflict_in_batch.code),
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
