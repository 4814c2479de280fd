//! How an environment is opened (`Options`) and the checks `Env::open` makes of them.
//!
//! The types of the options (`QueueLimits`, `Durability`, `MergeAhead`) are defined
//! here and re-exported where they are used (`commit`, `journal::writer`), so that
//! this module imports only `io` and `page`: it is read by nearly every other module,
//! and importing `commit` or `journal` from here closed import circles (options ->
//! commit -> txn -> options; options -> journal -> write_buffer -> txn -> options).

use crate::io::{OsVfs, Vfs};
use crate::page::PAGE_SIZE;
use crate::{Error, Result};
use std::path::PathBuf;
use std::sync::Arc;

/// How an environment is opened. `Default` is fully durable.
#[derive(Clone)]
pub struct Options {
    /// Where journal files go; default `<dir>/journal`. May be on another volume.
    pub journal_dir: Option<PathBuf>,
    /// Size of each preallocated journal file, once the environment has written
    /// enough: see `journal_first_file_bytes`.
    pub journal_file_size_bytes: u64,
    /// Size of a new environment's first journal file, if smaller than
    /// `journal_file_size_bytes` (`None`: full size). Every file made after it is
    /// full size; the small one, once recyclable, is reused like any other (one more
    /// switch per round of the files). An environment that stays small (under half this much journal) then
    /// holds that much journal rather than a full file: what a server of many small
    /// databases wants (the document layer uses 4 MiB). The price, for one that writes
    /// more: the full-size files are zero-filled while it writes its first ~128 MiB of
    /// journal instead of one at open (W2, 127 MB of journal in 0.6 s: -10 %; README,
    /// "Round 2, thirteenth pass"), hence not the engine's default.
    pub journal_first_file_bytes: Option<u64>,
    /// The data file grows in steps of at least this many bytes.
    pub data_grow_step_bytes: u64,
    /// The flusher syncs the data file at least this often while there is work...
    pub sync_interval_ms: u64,
    /// ...and whenever this many bytes were written back since the last sync.
    pub sync_after_bytes: u64,
    /// Commits wait when pages not yet written back exceed this (back-pressure).
    pub max_unflushed_bytes: u64,
    /// The flusher writes pages back in windows of about this many bytes of commits
    /// (or when a sync is due, whichever comes first). A page rewritten by a later
    /// commit of the same window is written once: a larger window writes less (W3,
    /// 1M random puts: 867k pages written back with 8 MiB windows, 460k with 128
    /// MiB) and holds up to that much more memory. At most half of
    /// `max_unflushed_bytes`, so commits never wait on a window filling up.
    pub write_back_window_bytes: u64,
    /// Write the journal with O_DIRECT|O_DSYNC (falls back by itself where refused).
    pub journal_direct_io: bool,
    /// When a commit is acknowledged: `Immediate` (default, durable) or `Buffered`.
    pub durability: Durability,
    /// The flusher prepares the next journal file as soon as the writer moves to a new
    /// one or has used half of its file (default), instead of only at checkpoints
    /// after that, so that a commit never waits for a file to be created. Simulation
    /// tests turn it off to keep all background I/O at points they choose
    /// (determinism).
    pub prepare_journal_files_ahead: bool,
    /// Bounds of the commit queue (`Env::submit`).
    pub queue_limits: QueueLimits,
    /// Compress journal records with LZ4 when that makes them smaller.
    pub journal_compression: bool,
    /// With `journal_compression`: compress a record only when the disk time its
    /// sampled saving is worth (measured per byte on this journal) exceeds the CPU
    /// time compressing takes (measured too); on a fast disk that is rarely. Off:
    /// whenever a sample shrinks by a fifth, whatever the timing (the simulation,
    /// which must write the same bytes on every run of a seed).
    pub journal_compression_adaptive: bool,
    /// Open even if the journal shows that transactions were lost in the middle,
    /// keeping only those before the hole. Off by default: that situation means
    /// acknowledged commits are gone, and an operator should decide.
    pub open_despite_journal_gap: bool,
    /// The write buffer (docs/design/storage.md, "The write buffer"): puts and deletes whose
    /// key and value together are at most `write_buffer_max_entry_bytes` are
    /// journaled as logical entries and kept in memory, and reach the trees in key
    /// order, merged a slice per commit once this many bytes are buffered. Bounds
    /// the memory held (about twice this) and the journal kept for replay: a
    /// generation also freezes once twice this much journal was written since the
    /// last freeze (small commits of a few keys written over and over pad their
    /// records far past what the buffer holds), so about four times this. 0 turns
    /// buffering off: every write goes into its tree at once.
    pub write_buffer_bytes: u64,
    /// See `write_buffer_bytes`; larger puts go into their tree at once.
    pub write_buffer_max_entry_bytes: usize,
    /// Whether the frozen generation's merge runs on a second thread while a write
    /// transaction is still putting, instead of all of it at commit
    /// (docs/design/storage.md §13, "Merging ahead").
    pub merge_ahead: MergeAhead,
    /// Whether a merge slice asks for the leaves it will write ahead of writing
    /// them, and `ReadTxn::read_ahead` for the leaves of the keys it is given
    /// (`prefetch.rs`): past RAM, their reads then go to the disk together instead
    /// of one fault at a time.
    pub read_ahead: ReadAhead,
    /// Encryption at rest (`crypt.rs`): with a master key, a new environment gets a
    /// data key of its own wrapped by it, and every page and journal record is
    /// sealed; an existing environment must be opened with a key exactly when it
    /// was created with one.
    pub encryption: Option<crate::crypt::MasterKey>,
    /// With encryption: bytes of decrypted pages kept for every transaction to
    /// share (`decrypted_cache.rs`); 0 decrypts every page per transaction.
    pub decrypted_cache_bytes: u64,
    /// The file system seam (tests substitute a fault-injecting one).
    pub vfs: Arc<dyn Vfs>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            journal_dir: None,
            journal_file_size_bytes: 64 << 20,
            journal_first_file_bytes: None,
            data_grow_step_bytes: 64 << 20,
            sync_interval_ms: 1000,
            sync_after_bytes: 64 << 20,
            max_unflushed_bytes: 512 << 20,
            write_back_window_bytes: 128 << 20,
            journal_direct_io: true,
            durability: Durability::Immediate,
            journal_compression: true,
            journal_compression_adaptive: true,
            queue_limits: QueueLimits::default(),
            prepare_journal_files_ahead: true,
            open_despite_journal_gap: false,
            write_buffer_bytes: 32 << 20,
            write_buffer_max_entry_bytes: 2048,
            merge_ahead: MergeAhead::WhileOpen,
            read_ahead: ReadAhead::WhileFaulting,
            encryption: None,
            decrypted_cache_bytes: 64 << 20,
            vfs: Arc::new(OsVfs),
        }
    }
}

impl Options {
    /// Checks the options as `Env::open` does, without opening anything.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidOption(m.to_string()));
        if self.write_buffer_max_entry_bytes > 64 << 10 {
            return bad("write_buffer_max_entry_bytes must be at most 64 KiB");
        }
        if self.journal_file_size_bytes < 1 << 20
            || !self.journal_file_size_bytes.is_multiple_of(4096)
        {
            return bad("journal_file_size_bytes must be a multiple of 4096 and at least 1 MiB");
        }
        if self
            .journal_first_file_bytes
            .is_some_and(|b| b < 64 << 10 || !b.is_multiple_of(4096))
        {
            return bad("journal_first_file_bytes must be a multiple of 4096 and at least 64 KiB");
        }
        if self.data_grow_step_bytes < PAGE_SIZE as u64
            || !self.data_grow_step_bytes.is_multiple_of(PAGE_SIZE as u64)
        {
            return bad("data_grow_step_bytes must be a positive multiple of the page size");
        }
        if self.max_unflushed_bytes < 32 << 20 {
            return bad("max_unflushed_bytes must be at least 32 MiB");
        }
        if self.write_back_window_bytes < 1 << 20
            || self.write_back_window_bytes > self.max_unflushed_bytes / 2
        {
            // A window that cannot fill before back-pressure starts would stall
            // commits until the sync timer fires.
            return bad(
                "write_back_window_bytes must be at least 1 MiB and at most half of max_unflushed_bytes",
            );
        }
        Ok(())
    }
}

/// How the write buffer's merge uses a second thread (`Options::merge_ahead`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeAhead {
    /// Every slice is merged at commit, on the committing thread.
    Off,
    /// A commit of a transaction begun with `Env::begin_write` that made at least 32
    /// buffer writes, with a frozen generation still to merge, lends the next
    /// transaction's trees to the merge thread, which merges keys until that
    /// transaction needs them back: a tree write, a savepoint, the commit. What the
    /// thread merged counts toward the commit's slice. Queued commits (`Env::submit`)
    /// adopt a lent transaction but do not lend.
    WhileOpen,
    /// As `WhileOpen`, but the thread merges exactly this many keys per transaction
    /// (fewer if the generation ends) and the transaction waits for all of them, so
    /// that what a commit holds does not depend on thread timing (the simulator).
    ExactKeys(usize),
}

/// When batches of keys read their leaves ahead (`Options::read_ahead`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadAhead {
    /// While the thread that merges has taken major page faults in the last 10 s:
    /// past RAM, not in memory, where it would only cost a descent and a system
    /// call per leaf.
    #[default]
    WhileFaulting,
    /// For every slice (tests, and data known to be past memory).
    Always,
    /// Never: each leaf not in memory is read when the merge reaches it.
    Never,
}

/// Limits of the commit queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// Submissions fail with `Overloaded` when this many units are waiting...
    pub max_queued_units: usize,
    /// ...or when the oldest waiting unit has waited this long.
    pub max_queue_delay_ms: u64,
    /// Upper bounds of one group.
    pub max_group_units: usize,
    pub max_group_bytes: usize,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            max_queued_units: 100_000,
            max_queue_delay_ms: 2_000,
            max_group_units: 4096,
            max_group_bytes: 32 << 20,
        }
    }
}

/// When a commit is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Acknowledged = durable: the journal write is O_DIRECT|O_DSYNC (or followed by
    /// fdatasync). Never loses an acknowledged commit.
    #[default]
    Immediate,
    /// Acknowledged once written to the OS; the journal is synced in the background
    /// every `sync_interval_ms`. A power loss (not a process crash) can lose the
    /// commits of up to that interval. Recovery after such a loss may find records
    /// missing in the middle: an environment used this way opens despite a journal gap.
    Buffered { sync_interval_ms: u64 },
}
