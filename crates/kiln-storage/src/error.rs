//! Typed errors of the storage engine.
//!
//! `Io` always carries the file and, where one applies, the offset, so that an
//! operator reading a log knows which disk and which region misbehaved.
//! `Corrupted` is distinct from `Io`: the disk answered, but what it returned
//! failed a checksum or an invariant.

use crate::journal::record::DecodeError;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;

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
        /// Why a journal record did not decode, where that is what was found.
        #[source]
        source: Option<Arc<DecodeError>>,
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

    /// The environment latched after a failure that may have lost or torn data the
    /// journal is needed for (a failed journal write, a failed data-file write or
    /// fsync, a bug): it refuses writes until it is closed and reopened, which
    /// replays the journal. The failure keeps its kind (`Failure::is_disk_full`).
    #[error(
        "the environment refuses further writes after an earlier failure ({0}); \
         close and reopen it to recover from the journal"
    )]
    Poisoned(Failure),

    /// An earlier operation of this transaction failed and it went on regardless:
    /// the transaction must be rolled back (the environment itself is fine).
    #[error("an earlier operation in this transaction failed: {0}")]
    TransactionBroken(String),

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

    /// The commit this unit of work was merged into failed; the cause keeps its kind.
    #[error("the commit group failed: {0}")]
    GroupFailed(Box<Error>),

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
            source: None,
        }
    }

    /// The journal record for `txn_id` at `offset` of `path` passed its checksum but
    /// does not decode.
    pub(crate) fn undecodable_record(
        path: impl Into<PathBuf>,
        offset: u64,
        txn_id: u64,
        source: DecodeError,
    ) -> Self {
        Error::Corrupted {
            path: path.into(),
            location: format!("offset {offset}"),
            what: format!("journal record for txn {txn_id}: {source}"),
            source: Some(Arc::new(source)),
        }
    }

    /// True if this error says the bytes on disk are wrong (as opposed to the disk failing).
    pub fn is_corruption(&self) -> bool {
        match self {
            Error::Corrupted { .. } | Error::JournalGap { .. } => true,
            Error::GroupFailed(e) => e.is_corruption(),
            _ => false,
        }
    }

    /// True if a file system refused space (ENOSPC, EDQUOT), directly or as the
    /// cause of a latch or of a failed commit group.
    pub fn is_disk_full(&self) -> bool {
        match self {
            Error::Io { source, .. } => io_is_disk_full(source),
            Error::Poisoned(f) => f.is_disk_full(),
            Error::GroupFailed(e) => e.is_disk_full(),
            _ => false,
        }
    }

    /// The latch this error reports, if it is one (directly or as a group's cause):
    /// the environment refuses writes until it is closed and reopened.
    pub fn latched(&self) -> Option<&Failure> {
        match self {
            Error::Poisoned(f) => Some(f),
            Error::GroupFailed(e) => e.latched(),
            _ => None,
        }
    }

    /// A copy of this error, for answering every unit of a failed commit group.
    /// I/O errors keep their OS error code (or kind); boxed unit errors become text.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::Io {
                path,
                offset,
                op,
                source,
            } => Error::Io {
                path: path.clone(),
                offset: *offset,
                op,
                source: copy_io_error(source),
            },
            Error::Corrupted {
                path,
                location,
                what,
                source,
            } => Error::Corrupted {
                path: path.clone(),
                location: location.clone(),
                what: what.clone(),
                source: source.clone(),
            },
            Error::JournalGap {
                last_valid_txn,
                missing_from,
                missing_to,
                found_txn,
                path,
                offset,
            } => Error::JournalGap {
                last_valid_txn: *last_valid_txn,
                missing_from: *missing_from,
                missing_to: *missing_to,
                found_txn: *found_txn,
                path: path.clone(),
                offset: *offset,
            },
            Error::KeyTooLarge { len, max } => Error::KeyTooLarge {
                len: *len,
                max: *max,
            },
            Error::EmptyKey => Error::EmptyKey,
            Error::ValueTooLarge { len, max } => Error::ValueTooLarge {
                len: *len,
                max: *max,
            },
            Error::TransactionTooLarge { bytes, max } => Error::TransactionTooLarge {
                bytes: *bytes,
                max: *max,
            },
            Error::InvalidTreeName { len, max } => Error::InvalidTreeName {
                len: *len,
                max: *max,
            },
            Error::TreeNotFound(n) => Error::TreeNotFound(n.clone()),
            Error::TreeExists(n) => Error::TreeExists(n.clone()),
            Error::Poisoned(f) => Error::Poisoned(f.clone()),
            Error::TransactionBroken(w) => Error::TransactionBroken(w.clone()),
            Error::Locked { path } => Error::Locked { path: path.clone() },
            Error::Overloaded {
                queued,
                oldest_wait_ms,
                max_units,
                max_delay_ms,
            } => Error::Overloaded {
                queued: *queued,
                oldest_wait_ms: *oldest_wait_ms,
                max_units: *max_units,
                max_delay_ms: *max_delay_ms,
            },
            Error::UnitFailed(e) => Error::UnitFailed(e.to_string().into()),
            Error::UnitPanicked(m) => Error::UnitPanicked(m.clone()),
            Error::GroupFailed(e) => Error::GroupFailed(Box::new(e.duplicate())),
            Error::InvalidOption(m) => Error::InvalidOption(m.clone()),
            Error::Incompatible {
                path,
                found,
                expected,
            } => Error::Incompatible {
                path: path.clone(),
                found: found.clone(),
                expected: expected.clone(),
            },
        }
    }
}

/// True for the OS errors that mean "no space": ENOSPC, and EDQUOT (a quota).
pub fn io_is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == std::io::ErrorKind::StorageFull
}

fn copy_io_error(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}

/// What kind of failure latched an environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// The file system refused space (ENOSPC, EDQUOT) where a retry is not safe
    /// (a journal write, a data-file write or fsync).
    DiskFull,
    /// Any other I/O error.
    Io,
    /// A bug or an unexpected state (a panic, a corruption found while writing, a
    /// background thread that stopped).
    Internal,
}

/// Why an environment latched: the kind, the file and operation where known, and the
/// text of the error, so that later refusals still tell a full disk from a failing
/// one and name the file.
///
/// Boxed: inline it was 120 bytes, which made every `Error` (and every error that
/// wraps one, such as the document layer's) as large, in each `Result` on the way up.
#[derive(Clone)]
pub struct Failure(Box<FailureParts>);

#[derive(Clone)]
struct FailureParts {
    kind: FailureKind,
    context: String,
    path: Option<PathBuf>,
    offset: Option<u64>,
    op: Option<&'static str>,
    os_error: Option<i32>,
    detail: String,
}

impl Failure {
    /// From the error that caused it; `context` says what the engine was doing
    /// ("journal write failed", "background flush failed").
    pub fn from_error(context: impl Into<String>, e: &Error) -> Failure {
        let context = context.into();
        match e {
            Error::Io {
                path,
                offset,
                op,
                source,
            } => Failure::new(FailureParts {
                kind: if io_is_disk_full(source) {
                    FailureKind::DiskFull
                } else {
                    FailureKind::Io
                },
                context,
                path: Some(path.clone()),
                offset: *offset,
                op: Some(op),
                os_error: source.raw_os_error(),
                detail: e.to_string(),
            }),
            Error::Poisoned(f) => f.clone(),
            Error::GroupFailed(inner) => Failure::from_error(context, inner),
            other => Failure::new(FailureParts {
                kind: FailureKind::Internal,
                context,
                path: None,
                offset: None,
                op: None,
                os_error: None,
                detail: other.to_string(),
            }),
        }
    }

    /// A failure that is not an I/O error (a panic, a stopped thread).
    pub fn internal(context: impl Into<String>, detail: impl Into<String>) -> Failure {
        Failure::new(FailureParts {
            kind: FailureKind::Internal,
            context: context.into(),
            path: None,
            offset: None,
            op: None,
            os_error: None,
            detail: detail.into(),
        })
    }

    fn new(parts: FailureParts) -> Failure {
        Failure(Box::new(parts))
    }

    pub fn kind(&self) -> FailureKind {
        self.0.kind
    }
    pub fn is_disk_full(&self) -> bool {
        self.0.kind == FailureKind::DiskFull
    }
    /// The file whose operation failed, where known.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.0.path.as_deref()
    }
    pub fn offset(&self) -> Option<u64> {
        self.0.offset
    }
    /// The operation that failed ("write journal record", "fsync data file"...).
    pub fn op(&self) -> Option<&'static str> {
        self.0.op
    }
    pub fn os_error(&self) -> Option<i32> {
        self.0.os_error
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0.context, self.0.detail)
    }
}

/// Written out so that the box does not show: the output is what deriving it gave
/// when the fields were inline.
impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &*self.0;
        f.debug_struct("Failure")
            .field("kind", &p.kind)
            .field("context", &p.context)
            .field("path", &p.path)
            .field("offset", &p.offset)
            .field("op", &p.op)
            .field("os_error", &p.os_error)
            .field("detail", &p.detail)
            .finish()
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

/// Why the environment refuses writes (the latch), and why write-back is stalled.
#[derive(Default)]
pub(crate) struct Latch {
    poisoned: Mutex<Option<Failure>>,
    /// Set while the flusher cannot write back because the data file cannot grow
    /// (no space): nothing is lost (the journal holds it all), and it retries.
    stalled: Mutex<Option<Failure>>,
}

impl Latch {
    /// Latches the environment: it refuses writes until reopened. The first
    /// failure is the one reported.
    pub fn poison(&self, why: Failure) {
        self.poisoned.lock().get_or_insert(why);
    }
    pub fn poison_reason(&self) -> Option<Failure> {
        self.poisoned.lock().clone()
    }
    /// The flusher could not write back for lack of space (`None` clears it).
    pub fn set_stalled(&self, why: Option<Failure>) {
        *self.stalled.lock() = why;
    }
    pub fn stalled(&self) -> Option<Failure> {
        self.stalled.lock().clone()
    }
}
