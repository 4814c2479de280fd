//! The environment: a data file, a journal, one writer and many readers.

use crate::alloc::Allocator;
use crate::commit::queue::{CommitQueue, QueueStats};
use crate::error::Latch;
use crate::flusher::Backlog;
use crate::flusher::{self, FlushControl, FlushQueue, Flusher};
use crate::header::{self, FileHeader};
use crate::io::OpenMode;
use crate::journal::writer::{Durability, JournalFiles, JournalWriter, RecordEncoder};
pub use crate::options::Options;
use crate::page::{self, PageNo};
use crate::recovery::{
    create::{create_environment, load_header},
    replay, JournalTail,
};
use crate::shared::{JournalStage, Readers, Shared, Snapshot, WriterState};
use crate::stats::{EngineCounters, Stats};
use crate::store::PageStore;
use crate::txn::{ReadTxn, WriteTxn};
use crate::{Error, Failure, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub const DATA_FILE: &str = "data.kiln";
pub const LOCK_FILE: &str = "kiln.lock";
/// An open storage environment. Share it between threads by reference (or `Arc`).
pub struct Env {
    shared: Arc<Shared>,
    /// Merges units of work from many callers (`submit`) into one transaction.
    queue: CommitQueue,
    flusher: Option<JoinHandle<()>>,
    /// `Durability::Buffered` only: syncs the journal every `sync_interval_ms`.
    journal_syncer: Option<crate::journal::sync::JournalSyncer>,
    _lock: Box<dyn Send + Sync>,
}

/// What happened while opening: useful to tests and operators.
#[derive(Debug, Clone)]
pub struct RecoveryReport {
    pub synced_txn_id: u64,
    pub records_replayed: u64,
    pub last_txn_id: u64,
    pub tail: JournalTail,
    pub gap_records_discarded: u64,
}

impl Env {
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<Env> {
        Self::open_with_report(dir, opts).map(|(e, _)| e)
    }

    pub fn open_with_report(dir: impl AsRef<Path>, opts: Options) -> Result<(Env, RecoveryReport)> {
        opts.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let vfs = opts.vfs.clone();
        let journal_dir = opts
            .journal_dir
            .clone()
            .unwrap_or_else(|| dir.join("journal"));
        vfs.create_dir_all(&dir)
            .map_err(|e| Error::io(&dir, None, "create data directory", e))?;
        let same = |a: &Path, b: &Path| {
            a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
        };
        if same(&journal_dir, &dir) {
            return Err(Error::InvalidOption(
                "journal_dir must not be the data directory itself".into(),
            ));
        }
        let lock_path = dir.join(LOCK_FILE);
        let lock = vfs
            .lock_exclusive(&lock_path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => Error::Locked { path: dir.clone() },
                _ => Error::io(&lock_path, None, "lock environment", e),
            })?;
        let data_path = dir.join(DATA_FILE);
        let counters = Arc::new(EngineCounters::default());
        let header = if vfs.exists(&data_path) {
            if !vfs.exists(&journal_dir) {
                return Err(Error::corrupted(
                    &journal_dir,
                    "journal directory",
                    "missing while the data file exists (is the journal volume mounted?)",
                ));
            }
            load_header(vfs.as_ref(), &data_path)?
        } else {
            create_environment(
                vfs.clone(),
                &dir,
                &journal_dir,
                &data_path,
                &opts,
                counters.clone(),
            )?
        };
        let data_file = vfs
            .open(
                &data_path,
                OpenMode {
                    write: true,
                    ..Default::default()
                },
            )
            .map_err(|e| Error::io(&data_path, None, "open data file", e))?;
        let store = PageStore::open(&data_path, data_file, opts.data_grow_step_bytes)?;
        // What we read may be only in the OS's cache: a header whose fsync failed before
        // a process restart is visible but not durable, and trusting it (reusing the
        // pages its transactions freed, skipping their replay) would leave the journal
        // unable to rebuild them after a later power loss. Make it durable now, or fail.
        store.sync()?;
        let free: BTreeSet<PageNo> = header::read_freelist(vfs.as_ref(), &dir, &header)?
            .into_iter()
            .collect();

        // Replay the journal into the data file (recovery/replay.rs).
        let replayed = replay::replay(
            vfs.as_ref(),
            &journal_dir,
            &data_path,
            &header,
            &store,
            free,
            &opts,
        )?;
        counters
            .records_replayed_on_open
            .store(replayed.physical_records, Relaxed);
        let replay::Replayed {
            catalog_root,
            page_count,
            free,
            gens,
            replay_start,
            outcome,
            physical_records,
        } = replayed;
        let journal_files = Arc::new(JournalFiles::open(
            vfs.clone(),
            &journal_dir,
            opts.journal_file_size_bytes,
            counters.clone(),
            outcome.end.file_seq,
        )?);

        let mut shared_header = FileHeader {
            sequence: header.sequence,
            synced_txn_id: outcome.last_txn_id,
            catalog_root,
            page_count,
            journal_file_seq: outcome.end.file_seq,
            journal_offset: outcome.end.offset,
            journal_chain_checksum: outcome.end.chain_checksum,
            ..FileHeader::default()
        };
        shared_header.set_replay_start(&replay_start);
        let journal = JournalWriter::open(
            vfs.clone(),
            journal_files.clone(),
            counters.clone(),
            outcome.end,
            opts.journal_direct_io,
            opts.durability,
        )?;
        let snap = Snapshot {
            txn_id: outcome.last_txn_id,
            catalog_root,
            page_count,
            gens,
        };
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            opts: opts.clone(),
            vfs: vfs.clone(),
            store: Arc::new(store),
            counters,
            journal_files,
            synced_txn_id: Arc::new(AtomicU64::new(outcome.last_txn_id)),
            readers: Arc::new(Readers::new(snap.clone())),
            writer: Mutex::new(WriterState {
                encoder: RecordEncoder::new(outcome.end.chain_checksum, opts.journal_compression),
                alloc: Allocator::new(page_count, free.iter().copied()),
                latest: snap.clone(),
                merge_cursor: None,
                journal_end: journal.end(),
            }),
            journal: Mutex::new(JournalStage {
                writer: journal,
                last_txn: outcome.last_txn_id,
            }),
            journal_turn: Condvar::new(),
            alloc_summary: Mutex::new((free.len() as u64, 0, page_count)),
            latch: Arc::new(Latch::default()),
            flush_queue: Arc::new(FlushQueue::new(opts.write_back_window_bytes)),
            backlog: Arc::new(Backlog::default()),
        });
        // Make the replayed state the synced point, so the journal before it is free.
        let header = if physical_records > 0 || outcome.tail != JournalTail::Clean {
            shared.store.sync()?;
            let freelist = header::encode_freelist(free.iter().copied());
            let h = FileHeader {
                sequence: header.sequence + 1,
                freelist_checksum: crc32c::crc32c(&freelist),
                freelist_len: freelist.len() as u64,
                ..shared_header
            };
            flusher::write_header(&shared.flusher_handle(), &h, &freelist)?;
            h
        } else {
            FileHeader {
                freelist_checksum: header.freelist_checksum,
                freelist_len: header.freelist_len,
                ..shared_header
            }
        };
        shared
            .journal_files
            .release_below(header.journal_file_seq.min(header.replay_from_file_seq));
        let report = RecoveryReport {
            synced_txn_id: outcome.last_txn_id - physical_records,
            records_replayed: physical_records,
            last_txn_id: outcome.last_txn_id,
            tail: outcome.tail.clone(),
            gap_records_discarded: outcome.gap_records_discarded,
        };
        let fl = Flusher::new(shared.flusher_handle(), header, free, replay_start);
        let handle = std::thread::Builder::new()
            .name("kiln-flusher".into())
            .spawn(move || fl.run())
            .map_err(|e| Error::io(&dir, None, "spawn flusher thread", e))?;
        let mut env = Env {
            shared,
            queue: CommitQueue::default(),
            flusher: Some(handle),
            journal_syncer: None,
            _lock: lock,
        };
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

    /// Starts the write transaction, waiting while another one is open.
    pub fn begin_write(&self) -> Result<WriteTxn<'_>> {
        WriteTxn::begin(&self.shared)
    }

    /// Submits a unit of work to the commit queue and blocks until it is durable.
    /// Units from many threads are merged: run back to back in one write transaction
    /// and committed with one journal write. If the unit returns an error or panics,
    /// only it is rolled back and its error is returned; the rest of its group
    /// commits. Fails fast with `Error::Overloaded` when the queue is over its limits.
    pub fn submit<T, F>(&self, unit: F) -> Result<T>
    where
        F: for<'a, 'e> FnOnce(&'a mut WriteTxn<'e>) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let out = Arc::new(Mutex::new(None));
        let slot = out.clone();
        self.queue.submit(
            &*self.shared,
            Box::new(move |txn| {
                let value = unit(txn)?;
                *slot.lock() = Some(value);
                Ok(())
            }),
        )?;
        let value = out.lock().take();
        value
            .ok_or_else(|| Error::UnitFailed("the unit reported success but left no result".into()))
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
            journal_write_latency: c.journal_write_latency.summary(),
            journal_files: self.shared.journal_files.count(),
            journal_files_created: c.journal_files_created.load(Relaxed),
            journal_files_recycled: c.journal_files_recycled.load(Relaxed),
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
            if self.shared.writer.lock().latest.gens.is_empty() {
                return Ok(());
            }
            let mut txn = WriteTxn::begin(&self.shared)?;
            txn.set_force_merge();
            txn.commit()?;
        }
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.flusher.is_some() && self.shared.poison_reason().is_none() {
            if let Err(e) = self.merge_write_buffer() {
                // Not lost: the journal still holds the buffered entries.
                tracing::warn!(error = %e, "merging the write buffer at close failed; the next open replays it");
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
        let w = self.shared.writer.lock();
        // The free list includes commits still in flight: let them become visible.
        self.shared.wait_journal_idle(w.latest.txn_id);
        if let Some(why) = self.shared.poison_reason() {
            // The in-memory free list includes commits that never became durable.
            return Err(Error::Poisoned(why));
        }
        let mut free: BTreeSet<PageNo> = w.alloc.free.clone();
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
