//! The state an open environment shares between the callers' threads, the flusher
//! and the journal syncer, and the narrow handles those get instead of all of it.
//!
//! - `Shared`: everything, for `Env`, the transactions and the commit phases
//!   (`commit/`);
//! - `flusher::FlusherHandle`: what the flusher may touch (the data file, the journal files
//!   to prepare and recycle, the latch, the readers' horizon, back-pressure);
//! - `journal::sync::SyncHandle`: what the buffered-mode journal syncer may touch;
//! - the commit queue sees the environment through `commit::queue::Committer`.
//!
//! The handles are defined by their users (`flusher.rs`, `journal/sync.rs`), so
//! that those import nothing from here.

use crate::alloc::Allocator;
use crate::error::Latch;
use crate::flusher::{Backlog, FlushControl, FlushQueue, FlusherHandle, OldestReader};
use crate::io::Vfs;
use crate::journal::sync::SyncHandle;
use crate::journal::writer::{JournalEnd, JournalFiles, JournalWriter, RecordEncoder};
use crate::options::Options;
use crate::page::{self, PageNo};
use crate::stats::EngineCounters;
use crate::store::PageStore;
use crate::write_buffer::Gens;
use crate::{Error, Failure, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// The committed state a transaction starts from: the trees' pages, and the write
/// buffer's generations (filtered by `txn_id`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub txn_id: u64,
    pub catalog_root: PageNo,
    pub page_count: u64,
    pub gens: Gens,
}

/// State of the (single) in-memory writer. It may run ahead of what is durable:
/// `latest` includes commits whose journal write is still in flight.
pub(crate) struct WriterState {
    pub encoder: RecordEncoder,
    pub alloc: Allocator,
    pub latest: Snapshot,
    /// How far the merge of the frozen generation got (the last buffer key merged).
    pub merge_cursor: Option<Box<[u8]>>,
    /// Where the journal will be once every record encoded so far is written.
    pub journal_end: JournalEnd,
    /// Where transactions send their tree side to be merged ahead (`txn/ahead.rs`);
    /// `None` when the option is off or the environment is closing.
    // (The merge thread's handoff types live with the transaction code that drives
    // them, `txn/ahead.rs`, which itself reads this shared state: a circle kept on
    // purpose, since splitting the handoff from its only user would scatter one
    // protocol over two modules.)
    pub merge_jobs: Option<crate::txn::MergeJobSender>,
    /// Buffer writes of the last transaction sealed (whether to merge ahead).
    pub last_txn_buffer_writes: usize,
    /// Journal bytes encoded since the record that froze the last generation (at
    /// open, the journal from the replay start): the active generation freezes when this reaches twice
    /// `Options::write_buffer_bytes` too, so that the journal kept for replay
    /// stays bounded when overwrites of a few keys keep the buffer small.
    pub journal_bytes_since_freeze: u64,
}

/// The journal's write side: records are written strictly in transaction order.
pub(crate) struct JournalStage {
    pub writer: JournalWriter,
    /// The last transaction whose journal write finished (or failed).
    pub last_txn: u64,
}

struct SnapState {
    current: Snapshot,
    /// Open readers by snapshot txn id (a multiset).
    readers: BTreeMap<u64, usize>,
}

/// The published snapshot and the readers using snapshots.
pub(crate) struct Readers {
    snap: Mutex<SnapState>,
}

impl OldestReader for Readers {
    fn oldest_reader(&self) -> u64 {
        Readers::oldest_reader(self)
    }
}

impl Readers {
    pub fn new(current: Snapshot) -> Self {
        Readers {
            snap: Mutex::new(SnapState {
                current,
                readers: BTreeMap::new(),
            }),
        }
    }
    /// Registers a reader of the current snapshot and returns that snapshot.
    pub fn begin_read(&self) -> Snapshot {
        let mut s = self.snap.lock();
        let snap = s.current.clone();
        *s.readers.entry(snap.txn_id).or_insert(0) += 1;
        snap
    }
    pub fn end_read(&self, txn_id: u64) {
        let mut s = self.snap.lock();
        // Every `ReadTxn` registers in `begin_read` and ends once (its drop): a
        // reader ending unregistered would mean the horizon below lost one, and a
        // page it still reads could be reused.
        let Some(n) = s.readers.get_mut(&txn_id) else {
            debug_assert!(
                false,
                "a reader of snapshot {txn_id} ended without having begun"
            );
            return;
        };
        *n -= 1;
        if *n == 0 {
            s.readers.remove(&txn_id);
        }
    }
    /// Oldest snapshot any reader still uses (or the current one).
    pub fn oldest_reader(&self) -> u64 {
        let s = self.snap.lock();
        s.readers.keys().next().copied().unwrap_or(s.current.txn_id)
    }
    /// Makes `snap` the snapshot new readers start from (a commit is durable).
    pub fn publish(&self, snap: Snapshot) {
        let mut s = self.snap.lock();
        // Commits publish in journal-turn order (commit/finish.rs): a snapshot older
        // than the current one would make committed data disappear from new readers.
        assert!(
            snap.txn_id > s.current.txn_id,
            "snapshot of txn {} published after txn {}",
            snap.txn_id,
            s.current.txn_id
        );
        assert!(
            snap.page_count >= page::FIRST_DATA_PAGE,
            "snapshot of txn {} with {} pages, fewer than the file's header pages",
            snap.txn_id,
            snap.page_count
        );
        s.current = snap;
    }
    /// (current txn id, open readers, bytes in the write buffer) for `Stats`.
    pub fn figures(&self) -> (u64, u64, u64) {
        let s = self.snap.lock();
        (
            s.current.txn_id,
            s.readers.values().sum::<usize>() as u64,
            s.current.gens.bytes(),
        )
    }
}

pub(crate) struct Shared {
    pub dir: PathBuf,
    pub opts: Options,
    pub vfs: Arc<dyn Vfs>,
    pub store: Arc<PageStore>,
    pub counters: Arc<EngineCounters>,
    pub journal_files: Arc<JournalFiles>,
    pub synced_txn_id: Arc<AtomicU64>,
    pub readers: Arc<Readers>,
    /// A transaction lent to the merge thread with the writer lock, waiting for the
    /// next `begin` (`txn/ahead.rs`). Anything else wanting the writer lock goes
    /// through `txn::lock_writer`. Declared before `writer`, so dropped before it: a
    /// side still in its channel refers to the lock.
    pub merge_ahead_pending: Mutex<Option<crate::txn::LentToMergeThread>>,
    /// Threads in `txn::acquire_writer` (a commit does not lend the lock past them).
    pub writer_waiters: std::sync::atomic::AtomicUsize,
    pub writer: Mutex<WriterState>,
    pub journal: Mutex<JournalStage>,
    pub journal_turn: Condvar,
    /// (free, pending, total) pages, refreshed under the writer lock.
    pub alloc_summary: Mutex<(u64, u64, u64)>,
    pub latch: Arc<Latch>,
    pub flush_queue: Arc<FlushQueue>,
    pub backlog: Arc<Backlog>,
}

impl Shared {
    pub fn flusher_handle(&self) -> FlusherHandle {
        FlusherHandle {
            dir: self.dir.clone(),
            vfs: self.vfs.clone(),
            store: self.store.clone(),
            counters: self.counters.clone(),
            journal_files: self.journal_files.clone(),
            synced_txn_id: self.synced_txn_id.clone(),
            readers: self.readers.clone(),
            latch: self.latch.clone(),
            flush_queue: self.flush_queue.clone(),
            backlog: self.backlog.clone(),
            sync_interval_ms: self.opts.sync_interval_ms,
            sync_after_bytes: self.opts.sync_after_bytes,
            prepare_journal_files_ahead: self.opts.prepare_journal_files_ahead,
        }
    }

    pub fn sync_handle(&self) -> SyncHandle {
        SyncHandle {
            journal_files: self.journal_files.clone(),
            counters: self.counters.clone(),
            latch: self.latch.clone(),
        }
    }

    pub fn poison(&self, why: Failure) {
        self.latch.poison(why);
    }
    pub fn poison_reason(&self) -> Option<Failure> {
        self.latch.poison_reason()
    }
    pub fn stalled(&self) -> Option<Failure> {
        self.latch.stalled()
    }
    pub fn end_read(&self, txn_id: u64) {
        self.readers.end_read(txn_id);
    }

    /// Refreshes the allocator figures `Env::stats` reports (under the writer lock).
    pub fn note_alloc(&self, alloc: &Allocator) {
        *self.alloc_summary.lock() = (
            alloc.free.len() as u64,
            alloc.pending_len(),
            alloc.page_count,
        );
    }

    /// Back-pressure: waits while more than `max_unflushed_bytes` are not written back.
    pub fn wait_for_flusher_room(&self) -> Result<()> {
        while self.backlog.bytes() > self.opts.max_unflushed_bytes {
            if let Some(why) = self.poison_reason() {
                return Err(Error::Poisoned(why));
            }
            if self.stalled().is_some() {
                // The flusher cannot grow the data file: have it try once more now
                // (space may be back), and fail this commit (nothing of it written)
                // if it still cannot, instead of waiting for room that never comes.
                let (tx, rx) = mpsc::channel();
                self.flush_queue
                    .push_control(FlushControl::Checkpoint(tx))?;
                match rx.recv() {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        return Err(Error::Poisoned(Failure::internal(
                            "waiting for the flusher",
                            "the flusher thread has stopped",
                        )))
                    }
                }
            }
            self.flush_queue.nudge();
            self.backlog.wait(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Waits until transaction `txn_id` is durable (or the environment failed, in
    /// which case it may never be).
    pub(crate) fn wait_durable(&self, txn_id: u64) -> Result<()> {
        self.wait_journal_idle(txn_id);
        match self.poison_reason() {
            Some(why) => Err(Error::Poisoned(why)),
            None => Ok(()),
        }
    }

    /// Waits until every prepared commit has finished its journal write.
    pub(crate) fn wait_journal_idle(&self, latest: u64) {
        let mut j = self.journal.lock();
        while j.last_txn < latest {
            self.journal_turn.wait(&mut j);
        }
    }
}
