//! `kiln-storage`: Kiln's embeddable transactional storage engine.
//!
//! - B+trees over 8 KiB copy-on-write pages in one memory-mapped data file;
//!   several named trees per environment; cursors both ways; overflow runs for
//!   large values.
//! - One writer, any number of readers; a reader's snapshot never changes and never
//!   blocks a commit.
//! - Commit = one durable journal write (O_DIRECT|O_DSYNC into preallocated files);
//!   a background flusher writes pages back to the data file, syncs it, and records
//!   the synced point in a double-buffered header; recovery replays the journal.
//!
//! ```no_run
//! use kiln_storage::{Env, Options};
//! let env = Env::open("./kiln-data", Options::default())?;
//! let mut w = env.begin_write()?;
//! w.ensure_tree("users")?;
//! w.put("users", b"ada", b"lovelace")?;
//! w.commit()?; // durable when this returns
//! let r = env.begin_read()?;
//! assert_eq!(r.get("users", b"ada")?, Some(&b"lovelace"[..]));
//! # Ok::<(), kiln_storage::Error>(())
//! ```

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

mod alloc;
pub mod backup;
pub mod btree;
pub mod check;
mod commit;
pub mod crypt;
mod decrypted_cache;
mod env;
mod error;
mod fasthash;
mod flusher;
mod header;
pub mod io;
pub mod journal;
mod options;
pub mod page;
mod prefetch;
mod recovery;
mod seals;
mod shared;
mod stats;
mod store;
mod txn;
mod write_buffer;

pub use backup::{BackupError, BackupOptions, BackupSummary, ContainerWriter, RestoreOptions};
pub use btree::cursor::Entry;
pub use commit::{QueueLimits, QueueStats};
pub use crypt::MasterKey;
pub use env::{Env, Options, RecoveryReport, DATA_FILE};
pub use error::{
    io_is_disk_full, Error, ErrorKind, Failure, FailureKind, ForeignFiles, Limit, Result,
};
pub use journal::record::DecodeError;
pub use journal::writer::Durability;
pub use options::{MergeAhead, ReadAhead};
pub use page::{MAX_KEY_SIZE, MAX_VALUE_SIZE, PAGE_SIZE};
pub use recovery::JournalTail;
pub use stats::{LatencySummary, Stats};
pub use txn::{ReadTxn, WriteTxn, MAX_TREE_NAME};
pub use write_buffer::Cursor;
