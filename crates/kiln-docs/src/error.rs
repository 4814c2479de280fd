//! Typed errors of the document layer. The server maps each variant to an HTTP
//! status and a stable error code.

pub use crate::model::error::{AttachmentError, DocumentError};

pub type Result<T, E = DocError> = std::result::Result<T, E>;

/// Every error of the document layer: one variant per concern, each holding that
/// concern's own enum, plus what is below every concern (storage, files, bugs).
/// Displays as the inner error does, so a message reads the same at every level.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DocError {
    #[error(transparent)]
    Document(#[from] DocumentError),

    #[error(transparent)]
    Database(#[from] DatabaseError),

    #[error(transparent)]
    Index(#[from] IndexError),

    #[error(transparent)]
    Query(#[from] QueryError),

    #[error(transparent)]
    Subscription(#[from] SubscriptionError),

    #[error(transparent)]
    Attachment(#[from] AttachmentError),

    #[error(transparent)]
    Revision(#[from] RevisionError),

    #[error(transparent)]
    BackupChain(#[from] BackupChainError),

    /// A bug: something that must not happen did. Never the client's fault.
    #[error("internal error: {0}")]
    Internal(String),

    /// A value of this layer did not encode as JSON (a bug, as `Internal`: what is
    /// encoded is made of strings, numbers and JSON values). `what` names the value.
    #[error("internal error: {what} did not encode as JSON: {source}")]
    EncodeJson {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    #[error("I/O error on {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    Storage(#[from] kiln_storage::Error),

    #[error("backup: {0}")]
    Backup(#[from] kiln_storage::BackupError),
}

/// A database as a whole: its existence, its data directory, its write queue and
/// its batches.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatabaseError {
    #[error("database {0:?} does not exist")]
    NotFound(String),

    #[error("database {0:?} already exists")]
    Exists(String),

    /// Another process (named by `holder`, from the lock file) has the data
    /// directory open.
    #[error("the data directory {} is in use by {holder}: stop it first, or reach it over HTTP (--url)", dir.display())]
    DataDirLocked {
        dir: std::path::PathBuf,
        holder: String,
    },

    #[error("database {name:?} is still in use after {waited_ms} ms; try again")]
    Busy { name: String, waited_ms: u64 },

    #[error("the store is shutting down")]
    ShuttingDown,

    #[error("overloaded: {queued} writes are waiting; retry later")]
    Overloaded { queued: usize },

    /// An etag handed out by an earlier database of the same name (deleted and created
    /// again): a reader must start over from the beginning.
    #[error(
        "etag {etag:?} belongs to an earlier database named {database:?}; start over without it"
    )]
    EtagFromOtherIncarnation { etag: String, database: String },

    #[error("batch of {len} operations exceeds the limit of {max}")]
    BatchTooLong { len: usize, max: usize },

    #[error("batch operation {index} failed, nothing in the batch was applied: {source}")]
    BatchOpFailed {
        index: usize,
        #[source]
        source: Box<DocError>,
    },
}

/// Index definitions and the full-text indexes behind them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    #[error("invalid index definition: {0}")]
    Invalid(String),

    #[error("index {0:?} does not exist")]
    NotFound(String),

    #[error("index {0:?} already exists with another definition; delete it first")]
    Exists(String),

    /// A full-text index (tantivy) failed: which directory and why.
    #[error("full-text index: {0}")]
    Search(String),
}

/// Queries: their text and their cost.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// A query that does not parse or cannot run; `line` and `column` (1-based) point
    /// at the offending text, 0 when the error is about the query as a whole (then
    /// the message gives no position).
    #[error("invalid query{}: {message}", crate::model::error::at_position(*line, *column))]
    Invalid {
        line: usize,
        column: usize,
        message: String,
    },

    /// A query that would read more than the limit allows (no index narrows it).
    #[error("query too expensive: {0}")]
    TooExpensive(String),
}

/// Data subscriptions and the leases of their workers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubscriptionError {
    /// A subscription's name, start or options that are not valid (its query's
    /// errors are `QueryError::Invalid`).
    #[error("invalid subscription: {0}")]
    Invalid(String),

    #[error("subscription {0:?} does not exist")]
    NotFound(String),

    #[error("subscription {0:?} already exists; delete it first")]
    Exists(String),

    /// Another worker holds the subscription (asked for only if it was free).
    #[error("subscription {0:?} is held by another worker")]
    Busy(String),

    /// The worker's lease was revoked (another worker took the subscription over,
    /// or it was deleted): its acknowledgment moved nothing.
    #[error("subscription {0:?} was taken over or deleted: this worker no longer holds it")]
    LeaseLost(String),
}

/// Document revisions: their configuration and the revisions kept.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RevisionError {
    #[error("invalid revisions configuration: {0}")]
    InvalidConfig(String),

    /// The document has no revision with that etag (never had, or it was trimmed
    /// or purged).
    #[error("document {id:?} has no revision {etag}")]
    NotFound { id: String, etag: String },
}

/// The backups given to a backup, a restore or a verify, as a chain (the files'
/// own decoding errors are `kiln_storage::BackupError`, in `DocError::Backup`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupChainError {
    /// Backups that do not form one chain (a gap, the wrong base, the wrong order,
    /// another database); `part` names the input.
    #[error("backup chain is broken at {part}, byte offset {offset}: {what}")]
    Broken {
        part: String,
        offset: u64,
        what: String,
    },

    /// An incremental backup that cannot be taken (no chain, another chain, a base
    /// whose history was trimmed): a full backup is needed.
    #[error("incremental backup not possible: {0}")]
    IncrementNotPossible(String),

    /// A restore point that the backups given cannot reach exactly.
    #[error("restore point: {0}")]
    RestorePoint(String),
}

impl DocError {
    /// From a serde_json error, keeping its position apart from its message.
    pub fn malformed_json(e: &serde_json::Error) -> Self {
        DocError::Document(DocumentError::malformed_json(e))
    }

    /// For `map_err` on a `serde_json` encoding of `what`.
    pub(crate) fn encode_json(what: &'static str) -> impl FnOnce(serde_json::Error) -> Self {
        move |source| DocError::EncodeJson { what, source }
    }

    pub(crate) fn io(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        DocError::Io {
            path: path.into(),
            source,
        }
    }

    /// Errors an operation reports before its first write (see `apply_put`).
    pub(crate) fn leaves_transaction_untouched(&self) -> bool {
        match self {
            // A merge patch's result is checked inside the unit (`WriteOp::Patch`):
            // `Invalid` here comes only from a document's checks, before any write.
            DocError::Document(e) => matches!(
                e,
                DocumentError::Conflict { .. }
                    | DocumentError::NotFound { .. }
                    | DocumentError::TooLarge { .. }
                    | DocumentError::InvalidId { .. }
                    | DocumentError::InvalidCollection { .. }
                    | DocumentError::Invalid(_)
                    | DocumentError::InvalidExpires { .. }
            ),
            // Raised by `attachments::settle`, before any write.
            DocError::Attachment(
                AttachmentError::Invalid(_) | AttachmentError::NotFound { .. },
            ) => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoding_failure_keeps_its_cause_and_says_what_it_was() {
        // Maps with keys other than strings do not encode as JSON.
        let map = std::collections::BTreeMap::from([(vec![1u8], 1u8)]);
        let e = serde_json::to_vec(&map)
            .map_err(DocError::encode_json("a test value"))
            .unwrap_err();
        let cause = std::error::Error::source(&e).expect("the serde_json error is kept");
        assert!(cause.is::<serde_json::Error>());
        assert_eq!(
            e.to_string(),
            format!("internal error: a test value did not encode as JSON: {cause}")
        );
    }
}
