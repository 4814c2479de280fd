//! Typed errors of the storage engine.
//!
//! `Io` always carries the file and, where one applies, the offset, so that an
//! operator reading a log knows which disk and which region misbehaved.
//! `Corrupted` is distinct from `Io`: the disk answered, but what it returned
//! failed a checksum or an invariant.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("I/O error on {path} at offset {offset:?} during {op}: {source}")]
    Io {
        path: PathBuf,
        offset: Option<u64>,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error("corruption detected in {path} ({location}): {what}")]
    Corrupted {
        path: PathBuf,
        location: String,
        what: String,
    },

    #[error(
        "journal gap: transactions {missing_from}..{missing_to} are missing or corrupt \
         (last valid record: txn {last_valid_txn}; a valid record for txn {found_txn} \
         follows in {path} at offset {offset}); acknowledged commits may have been lost. \
         Refusing to open. Set `Options::open_despite_journal_gap` to open with the \
         transactions up to {last_valid_txn} only"
    )]
    JournalGap {
        last_valid_txn: u64,
        missing_from: u64,
        missing_to: u64,
        found_txn: u64,
        path: PathBuf,
        offset: u64,
    },

    #[error("key of {len} bytes exceeds the limit of {max} bytes")]
    KeyTooLarge { len: usize, max: usize },

    #[error("empty keys are not allowed")]
    EmptyKey,

    #[error("value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge { len: usize, max: usize },

    #[error("transaction writes {bytes} bytes of pages; one transaction may write at most {max}: split it")]
    TransactionTooLarge { bytes: u64, max: u64 },

    #[error("tree name of {len} bytes is invalid (1..={max} bytes allowed)")]
    InvalidTreeName { len: usize, max: usize },

    #[error("tree {0:?} does not exist")]
    TreeNotFound(String),

    #[error("tree {0:?} already exists")]
    TreeExists(String),

    #[error(
        "the environment refuses further writes after an earlier failure ({0}); \
         close and reopen it to recover from the journal"
    )]
    Poisoned(String),

    #[error("environment at {path} is already open (lock held by another process or handle)")]
    Locked { path: PathBuf },

    #[error(
        "overloaded: {queued} units waiting, the oldest for {oldest_wait_ms} ms \
         (limits: {max_units} units, {max_delay_ms} ms); retry later"
    )]
    Overloaded {
        queued: usize,
        oldest_wait_ms: u64,
        max_units: usize,
        max_delay_ms: u64,
    },

    /// A unit of work given to `Env::submit` failed with an error of its own; its
    /// changes were rolled back.
    #[error("the unit of work failed: {0}")]
    UnitFailed(Box<dyn std::error::Error + Send + Sync>),

    #[error("the unit of work panicked: {0}; it was rolled back, the rest of its group commits")]
    UnitPanicked(String),

    #[error("the commit group failed: {0}")]
    GroupFailed(String),

    #[error("invalid option: {0}")]
    InvalidOption(String),

    #[error("data file {path} was created with {found}; this build expects {expected}")]
    Incompatible {
        path: PathBuf,
        found: String,
        expected: String,
    },
}

impl Error {
    pub(crate) fn io(
        path: impl Into<PathBuf>,
        offset: Option<u64>,
        op: &'static str,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            path: path.into(),
            offset,
            op,
            source,
        }
    }

    pub(crate) fn corrupted(
        path: impl Into<PathBuf>,
        location: impl Into<String>,
        what: impl Into<String>,
    ) -> Self {
        Error::Corrupted {
            path: path.into(),
            location: location.into(),
            what: what.into(),
        }
    }

    /// True if this error says the bytes on disk are wrong (as opposed to the disk failing).
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corrupted { .. } | Error::JournalGap { .. })
    }
}

/// The text of a caught panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}
