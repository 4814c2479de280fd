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

    /// An earlier operation of this transaction failed (the source) and it went on
    /// regardless: the transaction must be rolled back. The environment itself is
    /// fine unless that failure says otherwise (`kind` is the failure's kind).
    #[error("an earlier operation in this transaction failed: {0}")]
    TransactionBroken(#[source] Arc<Error>),

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

    /// The commit this unit of work was merged into failed: the cause, shared by every
    /// unit of the group (`kind` is the cause's kind).
    #[error("the commit group failed: {0}")]
    GroupFailed(#[source] Arc<Error>),

    #[error("invalid option: {0}")]
    InvalidOption(String),

    /// A new environment (its directory has no data file yet) found another
    /// environment's journal where its own goes: opening would take those records
    /// for its own.
    #[error(
        "{found} but {dir} has no data file: the journal belongs to another \
         environment; move it away or choose another journal_dir"
    )]
    ForeignJournal { found: ForeignFiles, dir: PathBuf },

    /// The engine's API was used in a way it does not allow (what, and by whom): a bug
    /// in the caller.
    #[error("misuse of the storage API: {0}")]
    Misuse(&'static str),

    /// An encrypted environment opened without its key or with another, a key given
    /// to one created without encryption, or sealed bytes that fail to open.
    #[error("encryption: {path}: {what}")]
    Encryption { path: PathBuf, what: String },

    #[error("data file {path} was created with {found}; this build expects {expected}")]
    Incompatible {
        path: PathBuf,
        found: String,
        expected: String,
    },
}

/// What a new environment found of another environment's journal
/// (`Error::ForeignJournal`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForeignFiles {
    /// The first journal file, holding records.
    #[error("{0} holds journal records")]
    Records(PathBuf),
    /// Journal files after the first, in this directory.
    #[error("journal directory {dir} already holds journal files ({files} of them)")]
    Files { dir: PathBuf, files: usize },
}

/// What kind of failure an [`Error`] is: what the layers above map it from (to an
/// HTTP status, a retry, a restart), without matching every variant. It sees through
/// the wrappers that only say where a failure surfaced (`GroupFailed`,
/// `TransactionBroken`): their kind is their cause's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A file system refused space (ENOSPC, EDQUOT); the environment did not latch.
    DiskFull,
    /// Any other I/O error; the environment did not latch.
    Io,
    /// Bytes on disk failed a checksum or an invariant, or the journal has a gap.
    Corruption,
    /// The environment latched after a failure (`cause`: a full disk, an I/O error, a
    /// bug): it refuses writes until it is closed and reopened.
    Latched {
        cause: FailureKind,
    },
    /// The commit queue is over its limits: retry later.
    Overloaded,
    /// A key, a value or a transaction over the engine's limits.
    TooLarge {
        what: Limit,
    },
    /// A key, tree name or option the engine does not accept.
    InvalidInput,
    TreeNotFound,
    TreeExists,
    /// Another process or handle has the environment open.
    Locked,
    /// Files this environment cannot use: a data file of another format, or another
    /// environment's journal.
    Incompatible,
    /// The caller's unit of work failed with an error of its own, or panicked.
    UnitFailed,
    /// The API was used in a way it does not allow (a bug in the caller).
    Misuse,
    /// The environment's encryption key is missing, wrong, or was given to an
    /// environment without encryption.
    Encryption,
}

/// Which limit `ErrorKind::TooLarge` is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    Key,
    Value,
    Transaction,
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

    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Io { source, .. } if io_is_disk_full(source) => ErrorKind::DiskFull,
            Error::Io { .. } => ErrorKind::Io,
            Error::Corrupted { .. } | Error::JournalGap { .. } => ErrorKind::Corruption,
            Error::KeyTooLarge { .. } => ErrorKind::TooLarge { what: Limit::Key },
            Error::ValueTooLarge { .. } => ErrorKind::TooLarge { what: Limit::Value },
            Error::TransactionTooLarge { .. } => ErrorKind::TooLarge {
                what: Limit::Transaction,
            },
            Error::EmptyKey | Error::InvalidTreeName { .. } | Error::InvalidOption(_) => {
                ErrorKind::InvalidInput
            }
            Error::TreeNotFound(_) => ErrorKind::TreeNotFound,
            Error::TreeExists(_) => ErrorKind::TreeExists,
            Error::Poisoned(f) => ErrorKind::Latched { cause: f.kind() },
            Error::TransactionBroken(cause) | Error::GroupFailed(cause) => cause.kind(),
            Error::Locked { .. } => ErrorKind::Locked,
            Error::Overloaded { .. } => ErrorKind::Overloaded,
            Error::UnitFailed(_) | Error::UnitPanicked(_) => ErrorKind::UnitFailed,
            Error::ForeignJournal { .. } | Error::Incompatible { .. } => ErrorKind::Incompatible,
            Error::Misuse(_) => ErrorKind::Misuse,
            Error::Encryption { .. } => ErrorKind::Encryption,
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

    /// A second, owned copy of this error, for the one place where an error has two
    /// owners at once: an operation that fails inside a write transaction returns its
    /// error to its caller, and the transaction keeps it too, as the source of the
    /// `TransactionBroken` every later operation gets. (A failure with several
    /// recipients is otherwise shared, in an `Arc`: `GroupFailed`.) `Error` cannot be
    /// `Clone`: an `io::Error` cannot be cloned (the copy keeps its OS error code, or
    /// its kind and text), nor a unit's boxed error (it becomes text; a mutation never
    /// fails with one). Every other field is cloned.
    #[rustfmt::skip]
    pub(crate) fn copy(&self) -> Error {
        use Error as E;
        match self {
            E::Io { path, offset, op, source } => E::io(path, *offset, op, copy_io_error(source)),
            E::UnitFailed(e) => E::UnitFailed(e.to_string().into()),
            E::Corrupted { path, location, what, source } => E::Corrupted {
                path: path.clone(), location: location.clone(), what: what.clone(), source: source.clone(),
            },
            E::JournalGap { last_valid_txn, missing_from, missing_to, found_txn, path, offset } => E::JournalGap {
                last_valid_txn: *last_valid_txn, missing_from: *missing_from, missing_to: *missing_to,
                found_txn: *found_txn, path: path.clone(), offset: *offset,
            },
            E::KeyTooLarge { len, max } => E::KeyTooLarge { len: *len, max: *max },
            E::EmptyKey => E::EmptyKey,
            E::ValueTooLarge { len, max } => E::ValueTooLarge { len: *len, max: *max },
            E::TransactionTooLarge { bytes, max } => E::TransactionTooLarge { bytes: *bytes, max: *max },
            E::InvalidTreeName { len, max } => E::InvalidTreeName { len: *len, max: *max },
            E::TreeNotFound(name) => E::TreeNotFound(name.clone()),
            E::TreeExists(name) => E::TreeExists(name.clone()),
            E::Poisoned(f) => E::Poisoned(f.clone()),
            E::TransactionBroken(cause) => E::TransactionBroken(cause.clone()),
            E::Locked { path } => E::Locked { path: path.clone() },
            E::Overloaded { queued, oldest_wait_ms, max_units, max_delay_ms } => E::Overloaded {
                queued: *queued, oldest_wait_ms: *oldest_wait_ms, max_units: *max_units, max_delay_ms: *max_delay_ms,
            },
            E::UnitPanicked(m) => E::UnitPanicked(m.clone()),
            E::GroupFailed(cause) => E::GroupFailed(cause.clone()),
            E::InvalidOption(m) => E::InvalidOption(m.clone()),
            E::ForeignJournal { found, dir } => E::ForeignJournal { found: found.clone(), dir: dir.clone() },
            E::Misuse(what) => E::Misuse(what),
            E::Encryption { path, what } => E::Encryption { path: path.clone(), what: what.clone() },
            E::Incompatible { path, found, expected } => E::Incompatible {
                path: path.clone(), found: found.clone(), expected: expected.clone(),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn io(code: i32) -> Error {
        Error::io(
            "/data/journal/journal-1.log",
            Some(4096),
            "write journal record",
            std::io::Error::from_raw_os_error(code),
        )
    }

    fn latch(e: &Error) -> Error {
        Error::Poisoned(Failure::from_error("journal write failed", e))
    }

    /// One error of every variant, with the kind it must report.
    fn every_variant() -> Vec<(Error, ErrorKind)> {
        use ErrorKind as K;
        let decode = DecodeError::CatalogRootOutside {
            root: 10,
            page_count: 10,
        };
        vec![
            (io(libc::ENOSPC), K::DiskFull),
            (io(libc::EDQUOT), K::DiskFull),
            (io(libc::EIO), K::Io),
            (
                Error::corrupted("/data/data.kiln", "page 7", "bad checksum"),
                K::Corruption,
            ),
            (
                Error::undecodable_record("/j/journal-1.log", 8192, 5, decode),
                K::Corruption,
            ),
            (
                Error::JournalGap {
                    last_valid_txn: 4,
                    missing_from: 5,
                    missing_to: 6,
                    found_txn: 7,
                    path: "/j/journal-1.log".into(),
                    offset: 0,
                },
                K::Corruption,
            ),
            (
                Error::KeyTooLarge { len: 9, max: 8 },
                K::TooLarge { what: Limit::Key },
            ),
            (
                Error::ValueTooLarge { len: 9, max: 8 },
                K::TooLarge { what: Limit::Value },
            ),
            (
                Error::TransactionTooLarge { bytes: 9, max: 8 },
                K::TooLarge {
                    what: Limit::Transaction,
                },
            ),
            (Error::EmptyKey, K::InvalidInput),
            (Error::InvalidTreeName { len: 0, max: 8 }, K::InvalidInput),
            (Error::InvalidOption("x".into()), K::InvalidInput),
            (Error::TreeNotFound("t".into()), K::TreeNotFound),
            (Error::TreeExists("t".into()), K::TreeExists),
            (
                latch(&io(libc::ENOSPC)),
                K::Latched {
                    cause: FailureKind::DiskFull,
                },
            ),
            (
                latch(&io(libc::EIO)),
                K::Latched {
                    cause: FailureKind::Io,
                },
            ),
            (
                Error::Poisoned(Failure::internal("preparing a commit panicked", "boom")),
                K::Latched {
                    cause: FailureKind::Internal,
                },
            ),
            (Error::Locked { path: "/d".into() }, K::Locked),
            (
                Error::Overloaded {
                    queued: 1,
                    oldest_wait_ms: 2,
                    max_units: 1,
                    max_delay_ms: 1,
                },
                K::Overloaded,
            ),
            (Error::UnitFailed("refused".into()), K::UnitFailed),
            (Error::UnitPanicked("boom".into()), K::UnitFailed),
            (
                Error::ForeignJournal {
                    found: ForeignFiles::Files {
                        dir: "/j".into(),
                        files: 2,
                    },
                    dir: "/d".into(),
                },
                K::Incompatible,
            ),
            (
                Error::Incompatible {
                    path: "/d/data.kiln".into(),
                    found: "format 1".into(),
                    expected: "format 2".into(),
                },
                K::Incompatible,
            ),
            (Error::Misuse("end_tree outside a tree"), K::Misuse),
        ]
    }

    #[test]
    fn every_error_has_its_kind_and_wrappers_report_their_causes() {
        for (e, kind) in every_variant() {
            assert_eq!(e.kind(), kind, "{e}");
            // A failed group and a broken transaction are what their cause is, however
            // deep, and keep it as their source.
            let cause_text = e.to_string();
            let group = Error::GroupFailed(Arc::new(e));
            assert_eq!(group.kind(), kind, "{group}");
            let broken = Error::TransactionBroken(Arc::new(group));
            assert_eq!(broken.kind(), kind, "{broken}");
            let group_of_broken = Error::GroupFailed(Arc::new(broken));
            assert_eq!(group_of_broken.kind(), kind);
            let mut chain = Vec::new();
            let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&group_of_broken);
            while let Some(e) = next {
                chain.push(e.to_string());
                next = e.source();
            }
            assert!(chain.len() >= 4, "{chain:?}");
            assert_eq!(
                chain[3], cause_text,
                "the cause is the source of its wrappers"
            );
        }
    }

    /// `kind` agrees with the older predicates where they look (they do not look
    /// through a broken transaction: the server's mapping relied on that).
    #[test]
    fn kind_agrees_with_is_disk_full_is_corruption_and_latched() {
        for (e, kind) in every_variant() {
            let e = Error::GroupFailed(Arc::new(e));
            let full = matches!(
                kind,
                ErrorKind::DiskFull
                    | ErrorKind::Latched {
                        cause: FailureKind::DiskFull
                    }
            );
            assert_eq!(e.is_disk_full(), full, "{e}");
            assert_eq!(e.is_corruption(), kind == ErrorKind::Corruption, "{e}");
            assert_eq!(
                e.latched().is_some(),
                matches!(kind, ErrorKind::Latched { .. }),
                "{e}"
            );
        }
    }

    /// The copy a broken transaction keeps reads as the original, is of its kind, and
    /// an I/O error keeps its OS error code.
    #[test]
    fn a_copy_reads_as_the_original() {
        for (e, kind) in every_variant() {
            let copy = e.copy();
            assert_eq!(copy.to_string(), e.to_string());
            assert_eq!(copy.kind(), kind);
            assert_eq!(
                copy.source().map(|s| s.to_string()),
                e.source().map(|s| s.to_string()),
                "{e}"
            );
        }
        match io(libc::ENOSPC).copy() {
            Error::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::ENOSPC)),
            other => panic!("{other}"),
        }
    }

    /// A journal record that does not decode names the file and the record's offset,
    /// and keeps the decoder's error (what, and where in the body) as its source.
    #[test]
    fn an_undecodable_record_keeps_the_decode_error() {
        let e = Error::undecodable_record(
            "/j/journal-0000000000000001.log",
            8192,
            5,
            DecodeError::TrailingBytes { at: 100, count: 3 },
        );
        let text = e.to_string();
        assert!(
            text.contains("journal-0000000000000001.log")
                && text.contains("offset 8192")
                && text.contains("journal record for txn 5")
                && text.contains("3 unexplained bytes at byte 100"),
            "{text}"
        );
        let source = e.source().expect("the decode error");
        assert_eq!(
            source.to_string(),
            "3 unexplained bytes at byte 100, after the page images"
        );
        // (Shared, so that a copy of the error costs no copy of it.)
        let source = source.downcast_ref::<Arc<DecodeError>>().map(|d| &**d);
        assert!(matches!(
            source,
            Some(DecodeError::TrailingBytes { at: 100, count: 3 })
        ));
    }

    /// Another environment's journal and API misuse are no longer "invalid options":
    /// each says what it is, naming the file or directory.
    #[test]
    fn a_foreign_journal_names_its_files() {
        let records = Error::ForeignJournal {
            found: ForeignFiles::Records("/j/journal-0000000000000001.log".into()),
            dir: "/data".into(),
        }
        .to_string();
        assert!(
            records.starts_with(
                "/j/journal-0000000000000001.log holds journal records but /data has no data file"
            ) && records.contains("belongs to another environment"),
            "{records}"
        );
        let files = Error::ForeignJournal {
            found: ForeignFiles::Files {
                dir: "/j".into(),
                files: 3,
            },
            dir: "/data".into(),
        }
        .to_string();
        assert!(
            files.starts_with(
                "journal directory /j already holds journal files (3 of them) but /data"
            ),
            "{files}"
        );
    }
}
