//! The environment: a data file, a journal, one writer and many readers.

use crate::alloc::Allocator;
use crate::flusher::{self, Applied, FlushControl, FlushQueue, Flusher};
use crate::header::{self, FileHeader};
use crate::io::{OpenMode, Vfs};
use crate::journal::record::{JournalPage, RecordInput};
use crate::recovery::{create::{create_environment, load_header}, replay, JournalTail};
use crate::journal::writer::{
    Durability, JournalEnd, JournalFiles, JournalPos, JournalWriter, PreparedRecord, RecordEncoder,
};
use crate::page::{self, PageNo, PageRun};
use crate::commit::queue::{CommitQueue, QueueStats};
use crate::stats::{EngineCounters, Stats};
use crate::store::PageStore;
use crate::txn::{ReadTxn, Snapshot, WriteTxn};
pub use crate::options::Options;
use crate::{Error, Failure, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
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
/// What a commit does to the write buffer: generations after it, merge position to
/// keep, record flags (`Shared::buffer_step`).
type BufferStep = (crate::write_buffer::Gens, Option<Box<[u8]>>, u8);
/// Keys of the frozen write-buffer generation merged per commit, at least.
const MIN_MERGE_SLICE_KEYS: usize = 256;
/// Keys merged per commit when the whole buffer must go (close, check).
const FORCED_MERGE_SLICE_KEYS: usize = 1 << 16;

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
}

/// The journal's write side: records are written strictly in transaction order.
struct JournalStage {
    writer: JournalWriter,
    /// The last transaction whose journal write finished (or failed).
    last_txn: u64,
}

/// A commit whose record is encoded and whose pages are in place, waiting for its
/// journal write.
pub(crate) struct PendingCommit {
    record: PreparedRecord,
    applied: Applied,
    gens: crate::write_buffer::Gens,
}

struct SnapState {
    current: Snapshot,
    /// Open readers by snapshot txn id (a multiset).
    readers: BTreeMap<u64, usize>,
}

pub(crate) struct Shared {
    pub dir: PathBuf,
    pub opts: Options,
    pub vfs: Arc<dyn Vfs>,
    pub store: PageStore,
    pub counters: Arc<EngineCounters>,
    pub journal_files: Arc<JournalFiles>,
    pub synced_txn_id: AtomicU64,
    snap: Mutex<SnapState>,
    writer: Mutex<WriterState>,
    journal: Mutex<JournalStage>,
    journal_turn: Condvar,
    /// (free, pending, total) pages, refreshed under the writer lock.
    alloc_summary: Mutex<(u64, u64, u64)>,
    pub(crate) queue: CommitQueue,
    poisoned: Mutex<Option<Failure>>,
    /// Set while the flusher cannot write back because the data file cannot grow
    /// (no space): nothing is lost (the journal holds it all), and it retries.
    stalled: Mutex<Option<Failure>>,
    pub(crate) flush_queue: FlushQueue,
    unflushed_bytes: AtomicU64,
    flushed_signal: (Mutex<()>, Condvar),
}

impl Shared {
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
    pub fn end_read(&self, txn_id: u64) {
        let mut s = self.snap.lock();
        if let Some(n) = s.readers.get_mut(&txn_id) {
            *n -= 1;
            if *n == 0 {
                s.readers.remove(&txn_id);
            }
        }
    }
    pub fn note_written_back(&self, bytes: u64) {
        self.unflushed_bytes.fetch_sub(bytes, SeqCst);
        let _g = self.flushed_signal.0.lock();
        self.flushed_signal.1.notify_all();
    }

    /// Oldest snapshot any reader still uses (or the current one).
    pub(crate) fn oldest_reader(&self) -> u64 {
        let s = self.snap.lock();
        s.readers.keys().next().copied().unwrap_or(s.current.txn_id)
    }

    fn wait_for_flusher_room(&self) -> Result<()> {
        while self.unflushed_bytes.load(SeqCst) > self.opts.max_unflushed_bytes {
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
            let mut g = self.flushed_signal.0.lock();
            self.flushed_signal
                .1
                .wait_for(&mut g, Duration::from_millis(10));
        }
        Ok(())
    }

    /// Starts the write transaction, waiting while another one is open.
    pub(crate) fn begin_write_txn(&self) -> Result<WriteTxn<'_>> {
        if let Some(why) = self.poison_reason() {
            return Err(Error::Poisoned(why));
        }
        let mut w = self.writer.lock();
        let horizon = self.oldest_reader().min(self.synced_txn_id.load(SeqCst));
        let store = &self.store;
        w.alloc.release(horizon, |pages| store.forget(pages));
        *self.alloc_summary.lock() = (
            w.alloc.free.len() as u64,
            w.alloc.pending_len(),
            w.alloc.page_count,
        );
        // Built on the latest commit, which may still be waiting for its journal write.
        let base = w.latest.clone();
        Ok(WriteTxn {
            env: self,
            writer: Some(w),
            txn_id: base.txn_id + 1,
            catalog_root: base.catalog_root,
            base,
            pins: Default::default(),
            dirty: Default::default(),
            sources: Default::default(),
            freed_committed: Vec::new(),
            local_free: Vec::new(),
            taken_from_free: Vec::new(),
            undo: Vec::new(),
            logical: Default::default(),
            tree_last_key: Default::default(),
            trees_named: 0,
            force_merge: false,
            trees: Default::default(),
            dropped: Vec::new(),
            broken: None,
            savepoint: None,
            dirty_bytes_written: 0,
        })
    }

    /// Commits a write transaction: `prepare_commit`, then `finish_commit`.
    pub(crate) fn commit(&self, txn: &mut WriteTxn) -> Result<u64> {
        let prepared =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.prepare_commit(txn)))
                .unwrap_or_else(|panic| {
                    // Half-done commit state cannot be trusted: latch, then let the panic
                    // continue to the caller.
                    self.poison(Failure::internal(
                        "preparing a commit panicked",
                        crate::error::panic_message(&*panic),
                    ));
                    std::panic::resume_unwind(panic)
                });
        match prepared? {
            Some(pending) => self.finish_commit(pending),
            None => self.wait_durable(txn.base.txn_id).map(|_| txn.base.txn_id),
        }
    }

    /// Phase 1, under the writer lock: catalog update, sealing, encoding the record
    /// (which fixes its place in the journal chain), and making the pages readable for
    /// the next transaction. Readers cannot reach them yet: the snapshot they start
    /// from moves only in phase 2. Releases the writer lock, so the next transaction
    /// can run while this one's journal write is in flight. `None` if nothing changed.
    pub(crate) fn prepare_commit(&self, txn: &mut WriteTxn) -> Result<Option<PendingCommit>> {
        if !txn.has_changes() {
            txn.rollback();
            return Ok(None);
        }
        if let Some(why) = self.poison_reason() {
            return Err(Error::Poisoned(why));
        }
        self.wait_for_flusher_room()?;
        let (gens, merge_cursor, buffer_flags) = self.buffer_step(txn)?;
        txn.mutate(|t| t.update_catalog())?;
        let sealed = txn.seal_dirty();
        let pages: Vec<(PageNo, Arc<PageRun>)> =
            sealed.into_iter().map(|(n, r)| (n, Arc::new(r))).collect();
        let mut freed = txn.freed_committed.clone();
        freed.extend_from_slice(&txn.local_free);
        // An upper bound of the record body: page bytes, image headers, freed list.
        let page_bytes: usize = pages
            .iter()
            .map(|(_, r)| r.bytes().len() + 64)
            .sum::<usize>()
            + (txn.freed_committed.len() + txn.local_free.len()) * 8
            + txn.logical.encoded_len();
        if page_bytes > crate::journal::record::MAX_RECORD_BODY {
            txn.rollback();
            return Err(Error::TransactionTooLarge {
                bytes: page_bytes as u64,
                max: crate::journal::record::MAX_RECORD_BODY as u64,
            });
        }
        let mut w = txn.writer.take().expect("writer guard held until commit");
        let sourced: Result<Vec<JournalPage>> = pages
            .iter()
            .map(|(no, run)| {
                let source = match txn.sources.get(no) {
                    Some(s) => Some((*s, crate::btree::PageSource::page(&*txn, *s)?)),
                    None => None,
                };
                Ok(JournalPage {
                    no: *no,
                    run,
                    source,
                })
            })
            .collect();
        let journal_pages = match sourced {
            Ok(j) => j,
            Err(e) => {
                txn.writer = Some(w);
                txn.rollback();
                return Err(e);
            }
        };
        assert_eq!(
            txn.txn_id,
            w.latest.txn_id + 1,
            "transaction ids must increase by one"
        );
        let page_count = w.alloc.page_count;
        let chain_before = w.encoder.chain_checksum();
        let record = w.encoder.encode(RecordInput {
            txn_id: txn.txn_id,
            nonce: 0,
            prev_checksum: 0,
            catalog_root: txn.catalog_root,
            page_count,
            freed: &freed,
            pages: &journal_pages,
            logical: &txn.logical,
            buffer_flags,
        });
        drop(journal_pages);
        // The journal file this record goes to must exist before the point of no
        // return: creating one can fail for lack of space, and then only this commit
        // fails, with nothing of it written (later commits are built on this one once
        // it passes that point, so a failure after it latches).
        match w
            .journal_end
            .advance(record.journal_len() as u64, &self.journal_files)
        {
            Ok(end) => w.journal_end = end,
            Err(e) => {
                w.encoder.rewind_chain(chain_before);
                txn.writer = Some(w);
                txn.rollback();
                return Err(e);
            }
        }
        // The point of no return: the buffer writes are part of the commit now.
        txn.undo.clear();
        txn.logical.clear();
        w.merge_cursor = merge_cursor;
        self.store.publish(&pages);
        let bytes: u64 = pages.iter().map(|(_, r)| r.bytes().len() as u64).sum();
        self.unflushed_bytes.fetch_add(bytes, SeqCst);
        w.alloc
            .add_pending(txn.txn_id, std::mem::take(&mut txn.freed_committed));
        w.alloc.free.extend(txn.local_free.drain(..));
        *self.alloc_summary.lock() = (
            w.alloc.free.len() as u64,
            w.alloc.pending_len(),
            w.alloc.page_count,
        );
        w.latest = Snapshot {
            txn_id: txn.txn_id,
            catalog_root: txn.catalog_root,
            page_count: w.alloc.page_count,
            gens: gens.clone(),
        };
        let applied = Applied {
            txn_id: txn.txn_id,
            catalog_root: txn.catalog_root,
            page_count: w.latest.page_count,
            pages,
            freed,
            froze: buffer_flags & crate::journal::record::FLAG_FREEZE != 0,
            merge_done: buffer_flags & crate::journal::record::FLAG_MERGE_DONE != 0,
            buffer_empty: gens.is_empty(),
            end: JournalPos {
                file_seq: 0,
                offset: 0,
                chain_checksum: 0,
            },
        };
        drop(w);
        Ok(Some(PendingCommit {
            record,
            applied,
            gens,
        }))
    }

    /// The write buffer's part of a commit, before its catalog update: merges the
    /// next slice of the frozen generation into the trees, and decides whether the
    /// active generation freezes. Returns the generations after the commit, the
    /// merge position to keep if it commits, and the record's buffer flags.
    fn buffer_step(&self, txn: &mut WriteTxn) -> Result<BufferStep> {
        use crate::journal::record::{FLAG_FREEZE, FLAG_MERGE_DONE};
        let mut gens = txn.base.gens.clone();
        let mut cursor = txn
            .writer
            .as_ref()
            .expect("writer guard held until commit")
            .merge_cursor
            .clone();
        let threshold = self.opts.write_buffer_bytes;
        if gens.frozen.is_some() {
            // Merge faster than commits fill the active generation, so it is done
            // before that one is due to freeze; much faster once it is overdue.
            let mut limit = (2 * txn.undo.len()).max(MIN_MERGE_SLICE_KEYS);
            if txn.force_merge {
                limit = FORCED_MERGE_SLICE_KEYS;
            } else if gens.active.bytes() > threshold {
                limit *= 8;
            }
            let done = txn.mutate(|t| t.merge_slice(&mut cursor, limit))?;
            if done {
                gens.frozen = None;
                return Ok((gens, None, FLAG_MERGE_DONE));
            }
            return Ok((gens, cursor, 0));
        }
        let full = gens.active.bytes() >= threshold || txn.force_merge;
        if full && !gens.active.is_empty() {
            // This transaction's own entries are in the generation that freezes.
            gens.frozen = Some(std::mem::take(&mut gens.active));
            return Ok((gens, None, FLAG_FREEZE));
        }
        Ok((gens, cursor, 0))
    }

    /// Phase 2: waits for this transaction's turn, writes its record durably, then
    /// publishes the snapshot and hands the pages to the flusher. A failed write
    /// latches the environment; transactions prepared after it then fail too, since
    /// they were built on it.
    pub(crate) fn finish_commit(&self, pending: PendingCommit) -> Result<u64> {
        let PendingCommit {
            record,
            mut applied,
            gens,
        } = pending;
        let txn_id = applied.txn_id;
        assert_eq!(
            record.txn_id, txn_id,
            "record and commit disagree on the transaction id"
        );
        let mut j = self.journal.lock();
        while j.last_txn + 1 != txn_id {
            self.journal_turn.wait(&mut j);
        }
        let written = match self.poison_reason() {
            Some(why) => Err(Error::Poisoned(why)),
            // A panic here must still pass the turn on below, or every later commit
            // would wait for this one forever.
            None => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| j.writer.write(&record)))
                    .unwrap_or_else(|panic| {
                        Err(Error::Poisoned(Failure::internal(
                            "the journal write panicked",
                            crate::error::panic_message(&*panic),
                        )))
                    })
            }
        };
        let result = match written {
            Ok(end) => {
                applied.end = end;
                self.snap.lock().current = Snapshot {
                    txn_id,
                    catalog_root: applied.catalog_root,
                    page_count: applied.page_count,
                    gens,
                };
                self.counters.commits.fetch_add(1, Relaxed);
                if applied.froze {
                    self.counters.write_buffer_freezes.fetch_add(1, Relaxed);
                }
                if applied.merge_done {
                    self.counters.write_buffer_merges.fetch_add(1, Relaxed);
                }
                // A journal file to prepare is the one thing that cannot wait for
                // the flusher's next window.
                let wake_now = self.journal_files.spare_wanted();
                if let Err(e) = self.flush_queue.push_applied(Box::new(applied), wake_now) {
                    // The commit is durable and visible: report it as committed, but no
                    // further commits can be written back, so latch.
                    self.poison(Failure::from_error(
                        "cannot hand commits to the flusher",
                        &e,
                    ));
                }
                Ok(txn_id)
            }
            Err(e) => {
                // What reached the disk is unknown: latch, so that only a reopen (which
                // reads the journal back) decides what was committed; and say so.
                let failure = Failure::from_error("journal write failed", &e);
                self.poison(failure.clone());
                Err(Error::Poisoned(failure))
            }
        };
        j.last_txn = txn_id;
        drop(j);
        self.journal_turn.notify_all();
        result
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

/// An open storage environment. Share it between threads by reference (or `Arc`).
pub struct Env {
    shared: Arc<Shared>,
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
            store,
            counters,
            journal_files,
            synced_txn_id: AtomicU64::new(outcome.last_txn_id),
            snap: Mutex::new(SnapState {
                current: snap.clone(),
                readers: BTreeMap::new(),
            }),
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
            queue: CommitQueue::default(),
            poisoned: Mutex::new(None),
            stalled: Mutex::new(None),
            flush_queue: FlushQueue::new(opts.write_back_window_bytes),
            unflushed_bytes: AtomicU64::new(0),
            flushed_signal: (Mutex::new(()), Condvar::new()),
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
            flusher::write_header(&shared, &h, &freelist)?;
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
        let fl = Flusher::new(shared.clone(), header, free, replay_start);
        let handle = std::thread::Builder::new()
            .name("kiln-flusher".into())
            .spawn(move || fl.run())
            .map_err(|e| Error::io(&dir, None, "spawn flusher thread", e))?;
        let mut env = Env {
            shared,
            flusher: Some(handle),
            journal_syncer: None,
            _lock: lock,
        };
        if let Durability::Buffered { sync_interval_ms } = env.shared.opts.durability {
            let interval = Duration::from_millis(sync_interval_ms.max(1));
            // On failure `env` drops here, which stops the flusher cleanly.
            env.journal_syncer = Some(
                crate::journal::sync::JournalSyncer::start(env.shared.clone(), interval)
                    .map_err(|e| Error::io(&dir, None, "spawn journal sync thread", e))?,
            );
        }
        Ok((env, report))
    }

    /// Starts a read-only snapshot of the last commit.
    pub fn begin_read(&self) -> Result<ReadTxn<'_>> {
        let mut s = self.shared.snap.lock();
        let snap = s.current.clone();
        *s.readers.entry(snap.txn_id).or_insert(0) += 1;
        drop(s);
        Ok(ReadTxn::new(&self.shared, snap))
    }

    /// Starts the write transaction, waiting while another one is open.
    pub fn begin_write(&self) -> Result<WriteTxn<'_>> {
        self.shared.begin_write_txn()
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
        self.shared.submit_unit(Box::new(move |txn| {
            let value = unit(txn)?;
            *slot.lock() = Some(value);
            Ok(())
        }))?;
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
        self.shared.queue.stats()
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
        let (last, readers, buffer_bytes) = {
            let s = self.shared.snap.lock();
            (
                s.current.txn_id,
                s.readers.values().sum::<usize>() as u64,
                s.current.gens.bytes(),
            )
        };
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
            commit_queue: self.shared.queue.stats(),
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
            let mut txn = self.shared.begin_write_txn()?;
            txn.force_merge = true;
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
