//! The background flusher: applies journaled pages to the data file with buffered
//! writes, syncs the data file by bytes and by time, then records the synced
//! transaction in the double-buffered header and recycles journal files below it.
//!
//! Commits never wait for it, except when unflushed pages exceed the configured
//! memory bound (back-pressure instead of unbounded growth).

use crate::error::Latch;
use crate::header::{self, FileHeader};
use crate::io::Vfs;
use crate::journal::writer::JournalPos;
use crate::journal::JournalFiles;
use crate::page::{PageNo, PageRun, PAGE_SIZE};
use crate::stats::EngineCounters;
use crate::store::PageStore;
use crate::{Error, Failure, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeSet;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The readers' horizon, as the flusher sees it: a page freed by a commit newer than
/// the oldest reader's snapshot cannot be written over yet.
pub(crate) trait OldestReader: Send + Sync {
    fn oldest_reader(&self) -> u64;
}

/// What the flusher thread may touch.
#[derive(Clone)]
pub(crate) struct FlusherHandle {
    pub dir: PathBuf,
    pub vfs: Arc<dyn Vfs>,
    pub store: Arc<PageStore>,
    pub counters: Arc<EngineCounters>,
    pub journal_files: Arc<JournalFiles>,
    pub synced_txn_id: Arc<AtomicU64>,
    pub readers: Arc<dyn OldestReader>,
    pub latch: Arc<Latch>,
    pub flush_queue: Arc<FlushQueue>,
    pub backlog: Arc<Backlog>,
    /// `Options::sync_interval_ms`, `sync_after_bytes`, `prepare_journal_files_ahead`.
    pub sync_interval_ms: u64,
    pub sync_after_bytes: u64,
    pub prepare_journal_files_ahead: bool,
}

/// Bytes of pages committed but not yet written back (back-pressure on commits).
#[derive(Default)]
pub(crate) struct Backlog {
    unflushed_bytes: AtomicU64,
    flushed_signal: (Mutex<()>, Condvar),
}

impl Backlog {
    pub fn add(&self, bytes: u64) {
        self.unflushed_bytes.fetch_add(bytes, SeqCst);
    }
    pub fn bytes(&self) -> u64 {
        self.unflushed_bytes.load(SeqCst)
    }
    pub fn note_written_back(&self, bytes: u64) {
        self.unflushed_bytes.fetch_sub(bytes, SeqCst);
        let _g = self.flushed_signal.0.lock();
        self.flushed_signal.1.notify_all();
    }
    /// Waits for a write-back to finish, or `timeout`.
    pub fn wait(&self, timeout: Duration) {
        let mut g = self.flushed_signal.0.lock();
        self.flushed_signal.1.wait_for(&mut g, timeout);
    }
}

/// A durable commit, handed over for write-back.
pub(crate) struct Applied {
    pub txn_id: u64,
    pub catalog_root: PageNo,
    pub page_count: u64,
    pub pages: Vec<(PageNo, Arc<PageRun>)>,
    pub freed: Vec<PageNo>,
    pub end: JournalPos,
    /// The write buffer's active generation froze after this commit.
    pub froze: bool,
    /// This commit finished merging the frozen generation.
    pub merge_done: bool,
    /// Nothing is buffered after this commit.
    pub buffer_empty: bool,
}

/// A request that needs the flusher now, answered on the given channel.
pub(crate) enum FlushControl {
    /// Sync now and answer with the synced transaction id.
    Checkpoint(Sender<Result<u64>>),
    Shutdown(Sender<Result<u64>>),
}

/// Hand-off from committers to the flusher. Commits are only queued: the flusher
/// does nothing with one until a write-back window is full or a sync is due, so
/// waking it per commit (a futex wake and, on a VM, an inter-processor interrupt:
/// ~13% of a single committer's CPU) bought nothing. It is woken when a window's
/// worth is waiting, for control requests and for explicit nudges (back-pressure,
/// a journal file to prepare); otherwise it wakes on its sync timer.
pub(crate) struct FlushQueue {
    state: Mutex<FlushQueueState>,
    wake: Condvar,
    /// `Options::write_back_window_bytes`: commits are written back in windows of
    /// about this many bytes of pages. Pages superseded within a window are never
    /// written; each window's writes are handed to the OS at once so that the
    /// checkpoint's fsync finds little left to do.
    window_bytes: u64,
}

#[derive(Default)]
struct FlushQueueState {
    applied: Vec<Applied>,
    applied_bytes: u64,
    control: VecDeque<FlushControl>,
    /// Why nothing can be queued any more: the environment was closed, or the
    /// flusher thread returned or unwound (nothing queued would be written back).
    closed: Option<&'static str>,
}

/// What the flusher found when it woke.
struct FlushWork {
    applied: Vec<Applied>,
    control: Option<FlushControl>,
    timed_out: bool,
}

impl FlushQueue {
    pub fn new(window_bytes: u64) -> Self {
        FlushQueue {
            state: Mutex::new(FlushQueueState::default()),
            wake: Condvar::new(),
            window_bytes,
        }
    }

    /// Queues a durable commit for write-back.
    pub fn push_applied(&self, applied: Applied, wake_now: bool) -> Result<()> {
        let bytes: u64 = applied
            .pages
            .iter()
            .map(|(_, r)| r.bytes().len() as u64)
            .sum();
        let mut st = self.state.lock();
        if let Some(why) = st.closed {
            return Err(Error::Poisoned(Failure::internal("flusher", why)));
        }
        st.applied.push(applied);
        st.applied_bytes += bytes;
        let wake = wake_now || st.applied_bytes >= self.window_bytes;
        drop(st);
        if wake {
            // No system call unless the flusher is actually waiting.
            self.wake.notify_one();
        }
        Ok(())
    }

    pub fn push_control(&self, control: FlushControl) -> Result<()> {
        let mut st = self.state.lock();
        if let Some(why) = st.closed {
            return Err(Error::Poisoned(Failure::internal("flusher", why)));
        }
        st.control.push_back(control);
        drop(st);
        self.wake.notify_one();
        Ok(())
    }

    /// Wakes the flusher if it is waiting (back-pressure, a journal file wanted).
    pub fn nudge(&self) {
        self.wake.notify_one();
    }

    fn close(&self, why: &'static str) {
        let mut st = self.state.lock();
        st.closed.get_or_insert(why);
        // Anyone waiting for an answer gets a closed channel instead of a hang.
        st.control.clear();
    }

    /// Waits until a window's worth of commits or a control request is queued, or
    /// `timeout` passes, and takes what is there (commits before the request, so a
    /// checkpoint covers everything queued ahead of it).
    fn wait_for_work(&self, timeout: Duration) -> FlushWork {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        let mut timed_out = false;
        while st.control.is_empty() && st.applied_bytes < self.window_bytes {
            if self.wake.wait_until(&mut st, deadline).timed_out() {
                timed_out = true;
                break;
            }
            // A nudge with too little queued: hand over what there is anyway (the
            // caller may be waiting for room or for a journal file).
            if st.control.is_empty() && !st.applied.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                timed_out = true;
                break;
            }
        }
        st.applied_bytes = 0;
        FlushWork {
            applied: std::mem::take(&mut st.applied),
            control: st.control.pop_front(),
            timed_out,
        }
    }
}

/// How a write-back or checkpoint failed.
enum FlushError {
    /// No space to grow the data file, or to write the free-page snapshot: nothing
    /// was written that recovery or an acknowledged commit depends on (the pages are
    /// still in memory and in the journal, the header did not move). Try again later.
    Stalled(Error),
    /// A write or fsync of the data file (or its header) failed: what is on disk is
    /// unknown, and a retried fsync may "succeed" after the kernel dropped the dirty
    /// pages. Latch; the journal replays on reopen.
    Fatal(Error),
}

impl From<Error> for FlushError {
    fn from(e: Error) -> Self {
        FlushError::Fatal(e)
    }
}

type FlushResult = std::result::Result<(), FlushError>;

/// Marks the queue closed however the flusher thread ends (a panic included).
struct GoneOnDrop(Arc<FlushQueue>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.close("the flusher thread has stopped");
    }
}

pub(crate) struct Flusher {
    env: FlusherHandle,
    /// Free pages as of the last applied transaction (pending ones included: after a
    /// crash no reader exists, so they are all free).
    free: BTreeSet<PageNo>,
    header: FileHeader,
    /// Commits received since the last checkpoint, not yet written back.
    batch: Vec<Applied>,
    batch_bytes: u64,
    /// Bytes written back since the last checkpoint.
    bytes_since_sync: u64,
    /// Metadata of the last commit written back.
    applied: Option<Box<Applied>>,
    last_sync: Instant,
    /// Where recovery would have to start, following the commits written back.
    replay_start: crate::journal::ReplayStart,
}

impl Flusher {
    pub fn new(
        env: FlusherHandle,
        header: FileHeader,
        free: BTreeSet<PageNo>,
        replay_start: crate::journal::ReplayStart,
        // The state recovery replayed without syncing it: the first checkpoint's.
        unsynced_replay: Option<Box<Applied>>,
    ) -> Self {
        Flusher {
            replay_start,
            env,
            free,
            header,
            batch: Vec::new(),
            batch_bytes: 0,
            bytes_since_sync: 0,
            applied: unsynced_replay,
            last_sync: Instant::now(),
        }
    }

    pub fn run(mut self) {
        let _gone = GoneOnDrop(self.env.flush_queue.clone());
        let interval = Duration::from_millis(self.env.sync_interval_ms.max(1));
        // Buffered durability's journal syncs run on their own thread
        // (`journal/sync.rs`), so that a long write-back cannot delay them.
        loop {
            let wait = interval.saturating_sub(self.last_sync.elapsed());
            if self.env.prepare_journal_files_ahead && self.env.latch.poison_reason().is_none() {
                prepare_spare_if_wanted(&self.env.journal_files);
            }
            let work = self
                .env
                .flush_queue
                .wait_for_work(wait.max(Duration::from_millis(1)));
            let got_commits = !work.applied.is_empty();
            for a in work.applied {
                self.batch_bytes += a
                    .pages
                    .iter()
                    .map(|(_, r)| r.bytes().len() as u64)
                    .sum::<u64>();
                self.batch.push(a);
                if self.batch_bytes >= self.env.flush_queue.window_bytes {
                    let r = self.write_back_batch();
                    self.record_failure(r);
                }
            }
            match work.control {
                Some(FlushControl::Checkpoint(reply)) => {
                    let _ = reply.send(self.checkpoint_or_failure());
                }
                Some(FlushControl::Shutdown(reply)) => {
                    let result = self.checkpoint_or_failure();
                    if result.is_ok() {
                        if let Err(e) = self.trim_tail_at_close() {
                            // Not lost: the file only stays longer than it needs.
                            tracing::warn!(error = %e, "could not trim the data file's free tail at close");
                        }
                        if let Err(e) = self.fresh_journal_at_close() {
                            // Not lost either: the journal files only take space.
                            tracing::warn!(error = %e, "could not cut the journal at close");
                        }
                    }
                    self.env.flush_queue.close("the environment is closed");
                    let _ = reply.send(result);
                    return;
                }
                None => {
                    // Sync by bytes, and by time even under a steady stream of commits.
                    let due = self.bytes_since_sync + self.batch_bytes >= self.env.sync_after_bytes
                        || self.last_sync.elapsed() >= interval;
                    if work.timed_out || (got_commits && due) {
                        let r = self.checkpoint();
                        self.record_failure(r);
                    }
                }
            }
        }
    }

    fn checkpoint_or_failure(&mut self) -> Result<u64> {
        if let Some(why) = self.env.latch.poison_reason() {
            return Err(Error::Poisoned(why));
        }
        let r = self.checkpoint();
        self.note_outcome(r).map(|()| self.header.synced_txn_id)
    }

    fn record_failure(&mut self, r: FlushResult) {
        let _ = self.note_outcome(r);
    }

    /// After a failed write or fsync the data file's state is unknown (the kernel may
    /// have dropped the dirty pages): stop, and make the environment refuse writes.
    /// The journal still holds everything; reopening replays it. A stall (no space
    /// to grow the data file) only waits: the next attempt may succeed.
    fn note_outcome(&mut self, r: FlushResult) -> Result<()> {
        match r {
            Ok(()) => {
                if self.env.latch.stalled().is_some() {
                    tracing::info!("write-back resumed: the data file could grow again");
                    self.env.latch.set_stalled(None);
                }
                Ok(())
            }
            Err(FlushError::Stalled(e)) => {
                if self.env.latch.stalled().is_none() {
                    tracing::warn!(error = %e, "write-back waits for disk space; commits go on while the journal has room, and the flusher retries");
                }
                self.env
                    .latch
                    .set_stalled(Some(Failure::from_error("write-back waits for space", &e)));
                Err(e)
            }
            Err(FlushError::Fatal(e)) => {
                tracing::error!(error = %e, "flusher failed; the environment now refuses writes until reopened");
                let failure = Failure::from_error("background flush failed", &e);
                self.env.latch.poison(failure.clone());
                Err(Error::Poisoned(failure))
            }
        }
    }

    /// Writes the batch back to the data file. A page written by one commit of the
    /// batch and freed by a *later* one is skipped when no open reader can still see
    /// that version: the checkpoint that follows is at the end of the batch, where it
    /// is dead, so its bytes are never needed on disk. If an older reader can see it,
    /// it is written like any other page (its number cannot be reused while that
    /// reader lives), so that the memory copy can go: a long reader must cost data-file
    /// writes, not memory that grows with every commit made while it is open.
    /// "Later" matters: a page allocated and freed inside one transaction is listed
    /// as freed by it yet reusable at once, so an earlier free says nothing about a
    /// later write of the same page number.
    fn write_back_batch(&mut self) -> FlushResult {
        let batch = std::mem::take(&mut self.batch);
        let batch_bytes = std::mem::take(&mut self.batch_bytes);
        if batch.is_empty() || self.env.latch.poison_reason().is_some() {
            return Ok(());
        }
        // Grow the data file for the whole batch before writing any of it: if there
        // is no space, nothing is written and the batch waits for the next attempt
        // (its pages stay readable in memory, and the journal holds them).
        if let Err(e) = self.env.store.ensure_mapped(end_page(&batch)) {
            self.batch = batch;
            self.batch_bytes = batch_bytes;
            return Err(if e.is_disk_full() {
                FlushError::Stalled(e)
            } else {
                FlushError::Fatal(e)
            });
        }
        let dead = DeadVersions::of(&batch, self.env.readers.oldest_reader());
        let mut prev = self
            .applied
            .as_ref()
            .map_or(self.header.synced_txn_id, |p| p.txn_id);
        let mut written_pages = 0;
        let (mut lowest, mut highest) = (u64::MAX, 0);
        for (i, a) in batch.into_iter().enumerate() {
            assert!(
                a.txn_id > prev,
                "flusher got txn {} after {prev}: transaction ids must increase",
                a.txn_id
            );
            prev = a.txn_id;
            for (no, run) in &a.pages {
                let n = run.page_count() as u64;
                if !dead.is_dead(*no, i) {
                    self.env
                        .store
                        .write_back(*no, run, a.txn_id, a.page_count)?;
                    written_pages += n;
                    lowest = lowest.min(*no);
                    highest = highest.max(*no + n);
                }
                for p in *no..*no + n {
                    self.free.remove(&p);
                }
            }
            self.free.extend(a.freed.iter().copied());
            self.replay_start
                .note(a.txn_id, a.end, a.froze, a.merge_done, a.buffer_empty);
            // Keep only the metadata; the page buffers can go.
            self.applied = Some(Box::new(Applied {
                pages: Vec::new(),
                freed: Vec::new(),
                ..a
            }));
        }
        self.env
            .counters
            .pages_written_back
            .fetch_add(written_pages, Relaxed);
        self.env.backlog.note_written_back(batch_bytes);
        self.bytes_since_sync += written_pages * PAGE_SIZE as u64;
        if highest > lowest {
            self.env.store.write_back_range(lowest, highest - lowest);
        }
        Ok(())
    }

    /// What a checkpoint of `a` may assume: its replay start is not past it, and
    /// its catalog root is not in the free-page snapshot (one lookup).
    fn check_checkpoint(&self, a: &Applied) {
        let at = |p: JournalPos| (p.file_seq, p.offset);
        let start = &self.replay_start;
        assert!(
            start.txn_id <= a.txn_id && at(start.pos) <= at(a.end),
            "checkpoint of txn {} (journal file {} offset {}) with its replay start past it: txn {} (file {} offset {})",
            a.txn_id,
            a.end.file_seq,
            a.end.offset,
            start.txn_id,
            start.pos.file_seq,
            start.pos.offset
        );
        // A free page is never referenced.
        assert!(
            a.catalog_root == 0 || !self.free.contains(&a.catalog_root),
            "checkpoint of txn {}: its catalog root, page {}, is in the free-page snapshot",
            a.txn_id,
            a.catalog_root
        );
    }

    /// At close, after the last checkpoint: cuts the data file's tail of free pages
    /// and its preallocated growth step, so a closed database takes what it holds
    /// (docs/benchmarks.md, SPACE). The free tail leaves the page count in both
    /// header copies first (each written and synced, so whichever one recovery
    /// picks has no page past the cut and no free page there in its free-page
    /// snapshot), and only then is the file shortened: a crash at any point leaves
    /// a header whose tree lies wholly inside the file. Only when nothing is left
    /// to replay (the journal's records are all in the data file): replay writes
    /// page images where their own commits put them. At close only: no reader or
    /// writer exists then, and the file does not shrink under a running workload
    /// only to grow again by a step.
    fn trim_tail_at_close(&mut self) -> Result<()> {
        let h = &self.header;
        if self.env.latch.poison_reason().is_some()
            || (h.replay_from_file_seq, h.replay_from_offset)
                != (h.journal_file_seq, h.journal_offset)
        {
            return Ok(());
        }
        let mut count = h.page_count;
        while count > crate::page::FIRST_DATA_PAGE && self.free.remove(&(count - 1)) {
            count -= 1;
        }
        if count < h.page_count {
            let freelist = header::encode_freelist(self.free.iter().copied());
            for _ in 0..2 {
                let next = FileHeader {
                    sequence: self.header.sequence + 1,
                    page_count: count,
                    freelist_checksum: crc32c::crc32c(&freelist),
                    freelist_len: freelist.len() as u64,
                    ..self.header.clone()
                };
                write_header(&self.env, &next, &freelist)?;
                self.header = next;
            }
        }
        self.env.store.truncate_to(count)
    }

    /// At close, after the last checkpoint and the trim: leaves one small journal
    /// file (`journal::CLOSE_FILE_BYTES`) instead of the live one of up to 64 MiB
    /// and its spares (docs/benchmarks.md, SPACE). Only when nothing is left to
    /// replay. Order, so that a crash anywhere opens with every commit: spares are
    /// removed (they hold only synced records); a new empty file after the live one
    /// is made durable; both header copies move to its start (same synced txn and
    /// chain value: the next record continues the chain there); only then is the
    /// old live file removed. Until the first header copy is durable, the header on
    /// disk names the old file, which still exists; after it, the new one.
    fn fresh_journal_at_close(&mut self) -> Result<()> {
        let h = &self.header;
        if self.env.latch.poison_reason().is_some()
            || (h.replay_from_file_seq, h.replay_from_offset)
                != (h.journal_file_seq, h.journal_offset)
            || h.replay_from_txn_id != h.synced_txn_id
        {
            return Ok(());
        }
        let old = h.journal_file_seq;
        let Some(new) = self.env.journal_files.fresh_file_at_close(old)? else {
            return Ok(());
        };
        let freelist = header::encode_freelist(self.free.iter().copied());
        for _ in 0..2 {
            let mut next = FileHeader {
                sequence: self.header.sequence + 1,
                journal_file_seq: new,
                journal_offset: 0,
                freelist_checksum: crc32c::crc32c(&freelist),
                freelist_len: freelist.len() as u64,
                ..self.header.clone()
            };
            next.replay_from_file_seq = new;
            next.replay_from_offset = 0;
            write_header(&self.env, &next, &freelist)?;
            self.header = next;
        }
        self.env.journal_files.finish_fresh_file_at_close(old, new)
    }

    fn checkpoint(&mut self) -> FlushResult {
        self.last_sync = Instant::now();
        // After a failure the data file's state is unknown: a retried fsync may
        // "succeed" after the kernel dropped the dirty pages. Never claim a sync then.
        if self.env.latch.poison_reason().is_some() {
            return Ok(());
        }
        self.write_back_batch()?;
        let Some(a) = self.applied.as_ref() else {
            return Ok(());
        };
        if a.txn_id <= self.header.synced_txn_id {
            return Ok(());
        }
        self.check_checkpoint(a);
        let shared = self.env.clone();
        let start = Instant::now();
        shared.store.sync()?;
        shared.counters.data_sync_latency.record(start.elapsed());
        shared.counters.data_syncs.fetch_add(1, Relaxed);
        let freelist = header::encode_freelist(self.free.iter().copied());
        let mut next = FileHeader {
            sequence: self.header.sequence + 1,
            synced_txn_id: a.txn_id,
            catalog_root: a.catalog_root,
            page_count: a.page_count,
            journal_file_seq: a.end.file_seq,
            journal_offset: a.end.offset,
            journal_chain_checksum: a.end.chain_checksum,
            freelist_checksum: crc32c::crc32c(&freelist),
            freelist_len: freelist.len() as u64,
            ..FileHeader::default()
        };
        next.set_replay_start(&self.replay_start);
        // The snapshot goes to the slot of the older header copy, which the current
        // one does not use: if it cannot be written for lack of space, nothing moved,
        // and the next checkpoint writes it again.
        header::write_freelist(shared.vfs.as_ref(), &shared.dir, next.slot(), &freelist).map_err(
            |e| {
                if e.is_disk_full() {
                    FlushError::Stalled(e)
                } else {
                    FlushError::Fatal(e)
                }
            },
        )?;
        write_header_page(&shared, &next)?;
        self.header = next;
        self.bytes_since_sync = 0;
        shared
            .synced_txn_id
            .store(self.header.synced_txn_id, SeqCst);
        shared.counters.checkpoints.fetch_add(1, Relaxed);
        shared.journal_files.release_below(
            self.header
                .journal_file_seq
                .min(self.header.replay_from_file_seq),
        );
        // Only when the writer asked (its file half used, or just switched): a spare
        // made at every checkpoint gave each new database a second zero-filled
        // journal file at its first checkpoint, 64 MiB of disk that a database whose
        // first file never fills half never uses.
        prepare_spare_if_wanted(&shared.journal_files);
        Ok(())
    }
}

/// Makes the next journal file ready if the writer has asked for it.
fn prepare_spare_if_wanted(files: &JournalFiles) {
    if files.spare_wanted() {
        if let Err(e) = files.prepare_next() {
            // Not fatal: the writer creates the file itself when it needs it.
            tracing::warn!(error = %e, "could not prepare the next journal file");
        }
    }
}

/// Writes the free-page snapshot and the header copy for `h`'s slot, durably.
pub(crate) fn write_header(shared: &FlusherHandle, h: &FileHeader, freelist: &[u8]) -> Result<()> {
    header::write_freelist(shared.vfs.as_ref(), &shared.dir, h.slot(), freelist)?;
    write_header_page(shared, h)
}

/// Writes the header copy for `h`'s slot (its free-page snapshot written before), durably.
fn write_header_page(shared: &FlusherHandle, h: &FileHeader) -> Result<()> {
    let offset = h.slot() * PAGE_SIZE as u64;
    shared
        .store
        .file
        .write_all_at(&h.encode(), offset)
        .map_err(|e| Error::io(&shared.store.path, Some(offset), "write file header", e))?;
    let start = Instant::now();
    shared.store.sync()?;
    shared.counters.data_sync_latency.record(start.elapsed());
    shared.counters.data_syncs.fetch_add(1, Relaxed);
    Ok(())
}

/// The page after the last one a batch writes: how far the data file must reach.
fn end_page(batch: &[Applied]) -> PageNo {
    batch
        .iter()
        .flat_map(|a| a.pages.iter())
        .map(|(no, run)| no + run.page_count() as u64)
        .max()
        .unwrap_or(0)
}

/// Which page versions of a batch no reader will ever read: those a later commit
/// of the batch freed, when no open reader is older than that commit. Readers
/// only start at durable commits, all at or past the batch's last one: a reader
/// that starts later sees none of its dead versions.
struct DeadVersions {
    /// The index in the batch of the last commit that freed each page.
    last_freed_at: crate::fasthash::FastMap<PageNo, usize>,
    txn_ids: Vec<u64>,
    oldest_reader: u64,
}

impl DeadVersions {
    fn of(batch: &[Applied], oldest_reader: u64) -> DeadVersions {
        let mut last_freed_at: crate::fasthash::FastMap<PageNo, usize> = Default::default();
        for (i, a) in batch.iter().enumerate() {
            for p in &a.freed {
                last_freed_at.insert(*p, i);
            }
        }
        DeadVersions {
            last_freed_at,
            txn_ids: batch.iter().map(|a| a.txn_id).collect(),
            oldest_reader,
        }
    }

    /// Whether the version of page `no` written by the batch's `i`-th commit is dead.
    fn is_dead(&self, no: PageNo, i: usize) -> bool {
        self.last_freed_at.get(&no).is_some_and(|&j| {
            j > i
                && self
                    .txn_ids
                    .get(j)
                    .is_some_and(|&t| t <= self.oldest_reader)
        })
    }
}
