//! The environment: a data file, a journal, one writer and many readers.
//!
//! The facade: `open` (recovery/ does the work, this starts the threads),
//! `begin_read`/`begin_write`, `submit` (commit/), `sync`, `stats`, `check`, `close`.

use crate::commit::queue::{CommitQueue, QueueStats};
use crate::flusher::{FlushControl, Flusher};
use crate::journal::writer::Durability;
pub use crate::options::Options;
use crate::page::{self, PageNo};
use crate::recovery::open;
use crate::shared::Shared;
use crate::stats::Stats;
use crate::txn::{ReadTxn, WriteTxn};
use crate::{Error, Failure, Result};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use crate::recovery::{RecoveryReport, DATA_FILE};
/// An open storage environment. Share it between threads by reference (or `Arc`).
pub struct Env {
    shared: Arc<Shared>,
    /// Merges units of work from many callers (`submit`) into one transaction.
    queue: CommitQueue,
    flusher: Option<JoinHandle<()>>,
    /// Merges the write buffer ahead of commits (`Options::merge_ahead`).
    merge_thread: Option<JoinHandle<()>>,
    /// `Durability::Buffered` only: syncs the journal every `sync_interval_ms`.
    journal_syncer: Option<crate::journal::sync::JournalSyncer>,
    _lock: Box<dyn Send + Sync>,
}

impl Env {
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<Env> {
        Self::open_with_report(dir, opts).map(|(e, _)| e)
    }

    /// Whether this environment seals its pages and journal (`crypt.rs`).
    pub fn is_encrypted(&self) -> bool {
        self.shared.store.cipher().is_some()
    }

    /// The master key an encrypted environment was opened with.
    pub fn master_key(&self) -> Option<&crate::MasterKey> {
        self.shared.opts.encryption.as_ref()
    }

    /// An encrypted environment's key for `purpose` (files the layers above keep
    /// beside it, such as attachment blobs), derived from its data key: the same on
    /// every open, unchanged by a change of master key. `None` if not encrypted.
    pub fn derived_key(&self, purpose: &str) -> Option<crate::crypt::SealingKey> {
        self.shared
            .store
            .cipher()
            .map(|c| crate::crypt::derived_key(c, purpose))
    }

    pub fn open_with_report(dir: impl AsRef<Path>, opts: Options) -> Result<(Env, RecoveryReport)> {
        let dir = dir.as_ref().to_path_buf();
        // Lock, create or read the header, replay the journal (recovery/open.rs).
        let open::Opened {
            shared,
            lock,
            header,
            free,
            replay_start,
            report,
            unsynced_replay,
        } = open::open(&dir, opts)?;
        let fl = Flusher::new(
            shared.flusher_handle(),
            header,
            free,
            replay_start,
            unsynced_replay,
        );
        let handle = std::thread::Builder::new()
            .name("kiln-flusher".into())
            .spawn(move || fl.run())
            .map_err(|e| Error::io(&dir, None, "spawn flusher thread", e))?;
        let mut env = Env {
            shared,
            queue: CommitQueue::default(),
            flusher: Some(handle),
            merge_thread: None,
            journal_syncer: None,
            _lock: lock,
        };
        if env.shared.opts.merge_ahead != crate::MergeAhead::Off {
            let (jobs, receiver) = mpsc::channel();
            let shared = env.shared.clone();
            // On failure `env` drops here, which stops the flusher cleanly.
            env.merge_thread = Some(
                std::thread::Builder::new()
                    .name("kiln-merge".into())
                    .spawn(move || crate::txn::run_merge_thread(shared, receiver))
                    .map_err(|e| Error::io(&dir, None, "spawn merge thread", e))?,
            );
            env.shared.writer.lock().merge_jobs = Some(jobs);
        }
        if let Durability::Buffered { sync_interval_ms } = env.shared.opts.durability {
            let interval = Duration::from_millis(sync_interval_ms.max(1));
            // On failure `env` drops here, which stops the flusher cleanly.
            env.journal_syncer = Some(
                crate::journal::sync::JournalSyncer::start(env.shared.sync_handle(), interval)
                    .map_err(|e| Error::io(&dir, None, "spawn journal sync thread", e))?,
            );
        }
        Ok((env, report))
    }

    /// Starts a read-only snapshot of the last commit.
    pub fn begin_read(&self) -> Result<ReadTxn<'_>> {
        let snap = self.shared.readers.begin_read();
        Ok(ReadTxn::new(&self.shared, snap))
    }

    /// Whether read-ahead is on now (`Options::read_ahead`: always, never, or while
    /// reads have been faulting): a caller that must look keys up before it can say
    /// what to read ahead skips that work when this is false.
    pub fn reading_ahead(&self) -> bool {
        self.shared.store.read_ahead.is_open()
    }

    /// `ReadTxn::read_ahead` on a snapshot of the last commit, taken only while reads
    /// have been faulting (`Options::read_ahead`): in memory this costs no snapshot.
    pub fn read_ahead<'k>(
        &self,
        tree: &str,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<usize> {
        if !self.shared.store.read_ahead.is_open() {
            return Ok(0);
        }
        self.begin_read()?.read_ahead(tree, keys)
    }

    /// Starts the write transaction, waiting while another one is open.
    pub fn begin_write(&self) -> Result<WriteTxn<'_>> {
        WriteTxn::begin(&self.shared)
    }

    /// Submits a unit of work to the commit queue and blocks until it is durable.
    /// Units from many threads are merged: run back to back in one write transaction
    /// and committed with one journal write. If the unit returns an error or panics,
    /// only it is rolled back and its error is returned; the rest of its group
    /// commits. Fails fast with `Error::Overloaded` when the queue is over its limits.
    ///
    pub fn submit<T, F>(&self, unit: F) -> Result<T>
    where
        F: for<'a, 'e> FnOnce(&'a mut WriteTxn<'e>) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.submit_with(unit)
    }

    /// `submit` for a unit whose error type is the caller's own (`E`, any type a
    /// storage error converts into): a unit that fails with, say, a document error
    /// gets that error back as it was (no boxing into a storage error), and a failure
    /// of the engine (the group's journal write, a latch) arrives as
    /// `E::from(storage error)`, keeping its kind.
    pub fn submit_with<T, E, F>(&self, unit: F) -> std::result::Result<T, E>
    where
        F: for<'a, 'e> FnOnce(&'a mut WriteTxn<'e>) -> std::result::Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        // The unit runs on whichever thread leads its group; its outcome is left in a
        // slot the submitter reads once `submit` has returned (after the unit ran), and
        // the queue only needs to know whether to keep the unit's writes. A one-slot
        // mpsc channel here cost ~0.4 us of CPU per commit and 3-5 % of W6 at 8 and 64
        // threads (measured A/B); the slot is one allocation.
        let slot: Arc<Mutex<Option<std::result::Result<T, E>>>> = Arc::new(Mutex::new(None));
        let unit_slot = slot.clone();
        let queued = self.queue.submit(
            &*self.shared,
            Box::new(move |txn| {
                let result = unit(txn);
                let failed = result.is_err();
                *unit_slot.lock() = Some(result);
                if failed {
                    Err(Error::UnitFailed(
                        "the unit returned an error of its own".into(),
                    ))
                } else {
                    Ok(())
                }
            }),
        );
        let result = slot.lock().take();
        match (queued, result) {
            // Committed, with the unit's value.
            (Ok(_), Some(Ok(value))) => Ok(value),
            // The unit's own error: it alone was rolled back.
            (_, Some(Err(own))) => Err(own),
            // The engine failed the unit or its group (a value it made is void).
            (Err(e), _) => Err(E::from(e)),
            (Ok(_), None) => Err(E::from(Error::UnitFailed(
                "the unit reported success but left no result".into(),
            ))),
        }
    }

    /// Why the environment latched, if it did: it then refuses writes until it is
    /// closed and reopened (the journal decides what was committed). A failure that
    /// can be retried safely (no space to grow the data file or to create a journal
    /// file) does not latch: see `write_back_stalled`.
    pub fn failure(&self) -> Option<Failure> {
        self.shared.poison_reason()
    }

    /// Set while the flusher cannot write pages back because the data file cannot
    /// grow (no space). Nothing is lost: the journal holds every commit, commits go
    /// on while the journal has room, and the flusher retries (every
    /// `sync_interval_ms`, and when a commit needs room); cleared once it succeeds.
    pub fn write_back_stalled(&self) -> Option<Failure> {
        self.shared.stalled()
    }

    /// Figures of the commit queue.
    pub fn queue_stats(&self) -> QueueStats {
        self.queue.stats()
    }

    /// Forces the flusher to write back and sync everything committed so far.
    /// Returns the synced transaction id.
    pub fn sync(&self) -> Result<u64> {
        let (tx, rx) = mpsc::channel();
        self.shared
            .flush_queue
            .push_control(FlushControl::Checkpoint(tx))?;
        rx.recv().map_err(|_| {
            Error::Poisoned(Failure::internal("sync", "the flusher thread has stopped"))
        })?
    }

    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        // As of the last commit or transaction start: never waits for the writer
        // (stats may be called while holding a write transaction).
        let (free, pending, page_count) = *self.shared.alloc_summary.lock();
        let (last, readers, buffer_bytes) = self.shared.readers.figures();
        Stats {
            last_txn_id: last,
            synced_txn_id: self.shared.synced_txn_id.load(SeqCst),
            commits: c.commits.load(Relaxed),
            aborts: c.aborts.load(Relaxed),
            journal_writes: c.journal_writes.load(Relaxed),
            journal_bytes: c.journal_bytes.load(Relaxed),
            journal_body_bytes_full_images: c.journal_body_bytes_full_images.load(Relaxed),
            journal_body_bytes_raw: c.journal_body_bytes_raw.load(Relaxed),
            journal_body_bytes_stored: c.journal_body_bytes_stored.load(Relaxed),
            journal_referenced_value_bytes: c.journal_referenced_value_bytes.load(Relaxed),
            journal_write_latency: c.journal_write_latency.summary(),
            journal_files: self.shared.journal_files.count(),
            journal_files_created: c.journal_files_created.load(Relaxed),
            journal_files_recycled: c.journal_files_recycled.load(Relaxed),
            journal_files_cut_short: c.journal_files_cut_short.load(Relaxed),
            journal_switch_waits: c.journal_switch_waits.load(Relaxed),
            journal_direct_io_fallback: c.journal_direct_io_fallback.load(Relaxed),
            journal_direct_io: c.journal_direct_io_active.load(Relaxed),
            data_syncs: c.data_syncs.load(Relaxed),
            data_sync_latency: c.data_sync_latency.summary(),
            buffered_journal_sync_latency: c.buffered_journal_sync_latency.summary(),
            pages_written_back: c.pages_written_back.load(Relaxed),
            checkpoints: c.checkpoints.load(Relaxed),
            records_replayed_on_open: c.records_replayed_on_open.load(Relaxed),
            pages_total: page_count,
            pages_free: free,
            pages_pending_free: pending,
            pages_in_use: page_count.saturating_sub(free + pending + page::FIRST_DATA_PAGE),
            pages_unflushed: self.shared.store.unflushed_len() as u64,
            readers_open: readers,
            commit_queue: self.queue.stats(),
            data_file_bytes: self.shared.store.file_len().unwrap_or(0),
            write_buffer_bytes: buffer_bytes,
            write_buffer_freezes: c.write_buffer_freezes.load(Relaxed),
            write_buffer_merges: c.write_buffer_merges.load(Relaxed),
            write_buffer_keys_merged_ahead: c.write_buffer_keys_merged_ahead.load(Relaxed),
            batches_read_ahead: self.shared.store.read_ahead.batches(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.shared.dir
    }

    /// Flushes, syncs and closes. Dropping the environment does the same but can
    /// only log a failure.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    /// Merges the whole write buffer into the trees (commits of merge slices), so
    /// that a reopen has nothing to replay and `check` sees every entry in a tree.
    fn merge_write_buffer(&self) -> Result<()> {
        loop {
            if crate::txn::lock_writer(&self.shared).latest.gens.is_empty() {
                return Ok(());
            }
            let mut txn = WriteTxn::begin(&self.shared)?;
            txn.set_force_merge();
            txn.commit()?;
        }
    }

    /// Moves tree pages from the data file's tail into free pages lower down
    /// (`WriteTxn::relocate_tail`), in transactions of at most
    /// `RELOCATE_PAGES_PER_TXN` new pages, each followed by a checkpoint (the pages
    /// freed before it become reusable only then), so that the close's trim of the
    /// free tail cuts them. Before it, the data file of a closed database held ~9%
    /// free pages: copies the close's merge put at the end (docs/benchmarks.md,
    /// SPACE). Ordinary copy-on-write commits: nothing new for a crash.
    fn relocate_tail_at_close(&self) -> Result<()> {
        const RELOCATE_PAGES_PER_TXN: u64 = 4096;
        const MAX_ROUNDS: usize = 64;
        for _ in 0..MAX_ROUNDS {
            // The pages the last commits freed become reusable.
            self.sync()?;
            let mut txn = WriteTxn::begin(&self.shared)?;
            // Every page at or past the cutoff could live below it, with some free
            // pages to spare: moving a leaf also copies its parent, which needs a
            // free page below the cutoff too (with none to spare, the last page to
            // move would wait for one forever). The spare is what may stay free:
            // 1/1024 of the live pages, at least 32.
            let cutoff = {
                let alloc = txn.alloc();
                let live = alloc.page_count - alloc.free.len() as u64;
                live + (live / 1024).max(32)
            };
            let copied = txn.relocate_tail(cutoff, RELOCATE_PAGES_PER_TXN)?;
            if copied == 0 {
                txn.abort();
                return Ok(());
            }
            txn.commit()?;
        }
        Ok(())
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.flusher.is_some() && self.shared.poison_reason().is_none() {
            if let Err(e) = self.merge_write_buffer() {
                // Not lost: the journal still holds the buffered entries.
                tracing::warn!(error = %e, "merging the write buffer at close failed; the next open replays it");
            }
        }
        self.stop_merge_thread();
        if self.flusher.is_some() && self.shared.poison_reason().is_none() {
            if let Err(e) = self.relocate_tail_at_close() {
                // Not lost: the relocation's commits are ordinary ones; only the
                // file stays longer than it needs.
                tracing::warn!(error = %e, "moving pages from the data file's tail at close failed");
            }
        }
        let result = self.stop_flusher();
        // The flusher's last checkpoint made everything applied durable; the
        // buffered-mode journal sync has nothing left to protect, unless that
        // checkpoint failed: then the journal is all there is, so sync it once more.
        if let Some(mut syncer) = self.journal_syncer.take() {
            syncer.stop();
            if result.is_err() {
                if let Err(e) = self.shared.journal_files.sync_current() {
                    tracing::error!(error = %e, "final journal sync at close failed");
                }
            }
        }
        result
    }

    /// Ends the merge thread: dropping the job sender ends its loop. (A transaction
    /// that leaked its trees to it still holds the writer lock: the lock waits.)
    fn stop_merge_thread(&mut self) {
        let Some(handle) = self.merge_thread.take() else {
            return;
        };
        crate::txn::lock_writer(&self.shared).merge_jobs = None;
        if handle.join().is_err() {
            tracing::error!("the merge thread panicked");
        }
    }

    fn stop_flusher(&mut self) -> Result<()> {
        let Some(handle) = self.flusher.take() else {
            return Ok(());
        };
        let (tx, rx) = mpsc::channel();
        let sent = self
            .shared
            .flush_queue
            .push_control(FlushControl::Shutdown(tx));
        let result = match sent {
            Ok(()) => rx
                .recv()
                .map_err(|_| {
                    Error::Poisoned(Failure::internal("close", "the flusher thread has stopped"))
                })
                .and_then(|r| r.map(|_| ())),
            Err(e) => Err(e),
        };
        let _ = handle.join();
        result
    }

    #[doc(hidden)]
    /// Test-only canary: makes journal writes non-durable. A crash suite that still
    /// passes with this set proves nothing.
    pub fn unsafe_disable_journal_durability_for_tests(&self) -> Result<()> {
        self.shared
            .journal
            .lock()
            .writer
            .disable_durability_for_tests()
    }

    /// Walks every tree and page of the current state and reports problems. Holds
    /// the writer lock meanwhile, so the free list and the snapshot agree.
    pub fn check(&self) -> Result<crate::check::CheckReport> {
        // `check` reads trees and pages: buffered entries must be in them first.
        self.merge_write_buffer()?;
        let w = crate::txn::lock_writer(&self.shared);
        // The free list includes commits still in flight: let them become visible.
        self.shared.wait_journal_idle(w.latest.txn_id);
        if let Some(why) = self.shared.poison_reason() {
            // The in-memory free list includes commits that never became durable.
            return Err(Error::Poisoned(why));
        }
        let mut free: BTreeSet<PageNo> = w.alloc.free.iter().collect();
        free.extend(w.alloc.pending_pages());
        let txn = self.begin_read()?;
        let report = crate::check::run(&txn, &free);
        drop(txn);
        drop(w);
        report
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "closing the environment failed; the journal will be replayed on the next open");
        }
    }
}
