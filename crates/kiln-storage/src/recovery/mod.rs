//! Opening an environment: `scan` reads the journal back (torn tails, gaps),
//! `replay` applies what it finds to the data file and the write buffer, `create`
//! makes a new environment or reads an existing one's file header, `open` puts them
//! together (everything `Env::open` does before starting its threads).

pub(crate) mod create;
pub(crate) mod open;
pub(crate) mod replay;
pub(crate) mod scan;

pub use scan::JournalTail;

/// The data file's name in the environment directory.
pub const DATA_FILE: &str = "data.kiln";
/// Locked while the environment is open.
pub const LOCK_FILE: &str = "kiln.lock";

/// What happened while opening: useful to tests and operators.
#[derive(Debug, Clone)]
pub struct RecoveryReport {
    pub synced_txn_id: u64,
    pub records_replayed: u64,
    /// Merged values that replayed page images named by buffer key, filled from the
    /// write buffer rebuilt by the same replay (patched images, design/storage.md §2.4).
    pub merged_values_filled: u64,
    pub last_txn_id: u64,
    pub tail: JournalTail,
    pub gap_records_discarded: u64,
}
