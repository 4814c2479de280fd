//! Appends records to the journal and makes each durable before returning.

use super::record::{self, RecordInput};
use super::{file_path, list_files};
use crate::io::{OpenMode, Vfs, VfsFile, DIRECT_IO_ALIGN};
use crate::page::PageRun;
use crate::stats::EngineCounters;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// Where a record ended: the position of the next one, and the chain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalPos {
    pub file_seq: u64,
    pub offset: u64,
    pub chain_checksum: u32,
}

/// Files shared between the writer (which consumes them) and the flusher (which
/// recycles files wholly below the synced point and prepares the next one).
pub struct JournalFiles {
    pub dir: PathBuf,
    pub file_size_bytes: u64,
    vfs: Arc<dyn Vfs>,
    counters: Arc<EngineCounters>,
    state: Mutex<FilesState>,
    /// Serializes file creation and recycling between the writer and the flusher, so
    /// that both never build the same file at once.
    create_lock: Mutex<()>,
    /// Set when the writer moved to a new file or used half of it: the flusher should
    /// prepare the next one now, not at its next checkpoint (or the writer may have to
    /// create it on the commit path).
    spare_wanted: std::sync::atomic::AtomicBool,
}

struct FilesState {
    /// Every journal file on disk.
    existing: BTreeSet<u64>,
    /// Files below the synced point: free to be renamed into a future sequence.
    recyclable: Vec<u64>,
    /// The file the writer appends to.
    current: u64,
}

impl JournalFiles {
    pub fn open(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        file_size_bytes: u64,
        counters: Arc<EngineCounters>,
        current: u64,
    ) -> Result<Self> {
        let existing: BTreeSet<u64> = list_files(vfs.as_ref(), dir)?.into_iter().collect();
        Ok(JournalFiles {
            dir: dir.to_path_buf(),
            file_size_bytes,
            vfs,
            counters,
            state: Mutex::new(FilesState {
                existing,
                recyclable: Vec::new(),
                current,
            }),
            create_lock: Mutex::new(()),
            spare_wanted: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn count(&self) -> u64 {
        self.state.lock().existing.len() as u64
    }

    /// Called after a checkpoint: files before `resume_seq` hold only synced records.
    pub fn release_below(&self, resume_seq: u64) {
        let mut st = self.state.lock();
        let below: Vec<u64> = st.existing.range(..resume_seq).copied().collect();
        for seq in below {
            if !st.recyclable.contains(&seq) {
                st.recyclable.push(seq);
            }
        }
    }

    /// Makes sure the file after the current one exists, so that switching files is
    /// never slowed by creating one. Recycles an old file when possible (its blocks
    /// are already written, which makes O_DSYNC writes into it cheapest); otherwise
    /// creates one and fills it with zeros once.
    pub fn prepare_next(&self) -> Result<()> {
        self.spare_wanted.store(false, Relaxed);
        let next = self.state.lock().current + 1;
        self.ensure_file(next, self.file_size_bytes, true)
            .map(|_| ())
    }

    /// Returns the path of file `seq`, creating or recycling it if needed, with at
    /// least `min_size` bytes allocated. `zero_fill` makes new files cheaper to write
    /// later at the price of writing them once now.
    pub(crate) fn ensure_file(&self, seq: u64, min_size: u64, zero_fill: bool) -> Result<PathBuf> {
        let path = file_path(&self.dir, seq);
        let _creating = self.create_lock.lock();
        let mut st = self.state.lock();
        if st.existing.contains(&seq) {
            return Ok(path);
        }
        if let Some(old) = st.recyclable.pop() {
            let from = file_path(&self.dir, old);
            self.vfs
                .rename(&from, &path)
                .map_err(|e| Error::io(&from, None, "rename journal file for reuse", e))?;
            self.sync_dir()?;
            st.existing.remove(&old);
            st.existing.insert(seq);
            self.counters.journal_files_recycled.fetch_add(1, Relaxed);
            return Ok(path);
        }
        drop(st);
        // Create under a temporary name, fill, sync, then rename: a crash never leaves a
        // half-made file under a journal name.
        let tmp = self.dir.join(format!("journal-{seq:016}.tmp"));
        let mode = OpenMode {
            create: true,
            write: true,
            ..Default::default()
        };
        let file = self
            .vfs
            .open(&tmp, mode)
            .map_err(|e| Error::io(&tmp, None, "create journal file", e))?;
        if let Err(e) = self.fill_new_file(file.as_ref(), &tmp, min_size, zero_fill) {
            // Give back whatever space the half-made file holds (a full disk is the
            // usual cause): nothing refers to it.
            drop(file);
            let _ = self.vfs.remove_file(&tmp);
            return Err(e);
        }
        drop(file);
        self.vfs
            .rename(&tmp, &path)
            .map_err(|e| Error::io(&tmp, None, "rename new journal file", e))?;
        self.sync_dir()?;
        self.counters.journal_files_created.fetch_add(1, Relaxed);
        self.state.lock().existing.insert(seq);
        Ok(path)
    }

    /// Sizes, fills and syncs a new journal file under its temporary name.
    fn fill_new_file(
        &self,
        file: &dyn VfsFile,
        tmp: &Path,
        min_size: u64,
        zero_fill: bool,
    ) -> Result<()> {
        // A leftover from a crash may be longer or hold anything: start from empty.
        file.set_len(0)
            .map_err(|e| Error::io(tmp, None, "truncate journal file", e))?;
        file.allocate(0, min_size)
            .map_err(|e| Error::io(tmp, Some(0), "preallocate journal file", e))?;
        if zero_fill {
            let zeros = vec![0u8; 1 << 20];
            let mut off = 0;
            while off < min_size {
                let n = zeros.len().min((min_size - off) as usize);
                file.write_all_at(&zeros[..n], off)
                    .map_err(|e| Error::io(tmp, Some(off), "zero-fill journal file", e))?;
                off += n as u64;
            }
        }
        file.sync_all()
            .map_err(|e| Error::io(tmp, None, "fsync journal file", e))
    }

    /// Makes sure journal file `seq` exists (prepared, recycled or created now) with
    /// room for a record of `record_len` bytes at its start, and returns its size.
    /// Used before a commit's point of no return: if this fails (no space for a new
    /// file), nothing of the commit is written and only it fails.
    pub(crate) fn reserve(&self, seq: u64, record_len: u64) -> Result<u64> {
        if !self.exists(seq) {
            // Not prepared (or being prepared right now): this commit waits for it.
            self.counters.journal_switch_waits.fetch_add(1, Relaxed);
        }
        let path = self.ensure_file(seq, self.file_size_bytes, true)?;
        let mode = OpenMode {
            write: true,
            ..Default::default()
        };
        let file = self
            .vfs
            .open(&path, mode)
            .map_err(|e| Error::io(&path, None, "open journal file", e))?;
        let size = file
            .len()
            .map_err(|e| Error::io(&path, None, "stat journal file", e))?;
        if size >= record_len {
            return Ok(size);
        }
        // A record larger than a journal file (a huge value): grow this file for it.
        let target = record_len.div_ceil(DIRECT_IO_ALIGN as u64) * DIRECT_IO_ALIGN as u64;
        file.allocate(0, target)
            .map_err(|e| Error::io(&path, Some(0), "grow journal file", e))?;
        file.sync_all()
            .map_err(|e| Error::io(&path, None, "fsync journal file", e))?;
        Ok(target)
    }

    fn sync_dir(&self) -> Result<()> {
        self.vfs
            .sync_dir(&self.dir)
            .map_err(|e| Error::io(&self.dir, None, "fsync journal directory", e))
    }

    /// Makes the current journal file durable (background sync in buffered mode;
    /// files left behind were synced when the writer moved on).
    pub fn sync_current(&self) -> Result<()> {
        let seq = self.state.lock().current;
        let path = file_path(&self.dir, seq);
        let f = match self.vfs.open(&path, OpenMode::default()) {
            Ok(f) => f,
            // The sync runs on its own thread: between reading `current` and the open,
            // the writer may have moved on (syncing this file as it left it) and a
            // checkpoint may have recycled it under another name. Only a file that is
            // still current and missing is an error.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound && self.state.lock().current != seq =>
            {
                return Ok(())
            }
            Err(e) => return Err(Error::io(&path, None, "open journal file", e)),
        };
        f.sync_data()
            .map_err(|e| Error::io(&path, None, "fdatasync journal", e))
    }

    /// Whether journal file `seq` is on disk, ready to be written.
    fn exists(&self, seq: u64) -> bool {
        self.state.lock().existing.contains(&seq)
    }

    /// True once after the writer moved to a new file or used half of it (until the
    /// flusher prepares the next one).
    pub fn spare_wanted(&self) -> bool {
        self.spare_wanted.load(Relaxed)
    }

    fn set_current(&self, seq: u64) {
        self.state.lock().current = seq;
    }
}

struct OpenJournal {
    seq: u64,
    path: PathBuf,
    file: Box<dyn VfsFile>,
    size: u64,
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

/// A record encoded and placed in the chain, waiting for its journal write.
pub struct PreparedRecord {
    pub txn_id: u64,
    buf: PageRun,
    len: usize,
    checksum: u32,
    /// Body bytes with full page images, with diffs, and after compression.
    pub full_image_body_len: usize,
    pub raw_body_len: usize,
    pub stored_body_len: usize,
}

/// Places records in the chain. Used under the writer lock, so records are chained
/// in commit order while their journal writes may still be in flight.
pub struct RecordEncoder {
    chain_checksum: u32,
    nonce: u64,
    compress: bool,
    /// LZ4 output, reused from record to record.
    compress_scratch: Vec<u8>,
}

impl PreparedRecord {
    /// Bytes this record takes in the journal (padded).
    pub fn journal_len(&self) -> usize {
        self.len
    }
}

impl RecordEncoder {
    pub fn new(chain_checksum: u32, compress: bool) -> Self {
        RecordEncoder {
            chain_checksum,
            nonce: rand::random(),
            compress,
            compress_scratch: Vec::new(),
        }
    }

    /// The chain value the next record links to.
    pub fn chain_checksum(&self) -> u32 {
        self.chain_checksum
    }

    /// Takes back records encoded after the chain stood at `chain_checksum` (their
    /// commit failed before its point of no return).
    pub fn rewind_chain(&mut self, chain_checksum: u32) {
        self.chain_checksum = chain_checksum;
    }

    pub fn encode(&mut self, mut input: RecordInput) -> PreparedRecord {
        input.nonce = self.nonce;
        input.prev_checksum = self.chain_checksum;
        let mut buf = PageRun::scratch(1);
        let scratch = self.compress.then_some(&mut self.compress_scratch);
        let enc = record::encode(&input, &mut buf, scratch);
        self.chain_checksum = enc.checksum;
        PreparedRecord {
            txn_id: input.txn_id,
            buf,
            len: enc.padded_len,
            checksum: enc.checksum,
            full_image_body_len: enc.full_image_body_len,
            raw_body_len: enc.raw_body_len,
            stored_body_len: enc.stored_body_len,
        }
    }
}

/// Where the next record will go once every record encoded so far is written (the
/// journal writer's position, projected past the records still in flight). Kept
/// under the writer lock, so that a commit makes sure the journal file it needs
/// exists before its point of no return.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JournalEnd {
    seq: u64,
    offset: u64,
    size: u64,
}

impl JournalEnd {
    /// The position after a record of `len` bytes, switching files the way
    /// `JournalWriter::write` will, with the next file made ready (`reserve`).
    pub fn advance(&self, len: u64, files: &JournalFiles) -> Result<JournalEnd> {
        let mut end = *self;
        if end.offset + len > end.size {
            let seq = end.seq + 1;
            end = JournalEnd {
                seq,
                offset: 0,
                size: files.reserve(seq, len)?,
            };
        }
        end.offset += len;
        Ok(end)
    }
}

/// Writes prepared records, in order, to the journal files.
pub struct JournalWriter {
    vfs: Arc<dyn Vfs>,
    files: Arc<JournalFiles>,
    counters: Arc<EngineCounters>,
    current: OpenJournal,
    offset: u64,
    direct_io: bool,
    durability: Durability,
    /// Test-only canary: skip making journal writes durable.
    pub(crate) unsafe_skip_durability: bool,
}

impl JournalWriter {
    pub fn open(
        vfs: Arc<dyn Vfs>,
        files: Arc<JournalFiles>,
        counters: Arc<EngineCounters>,
        pos: JournalPos,
        direct_io: bool,
        durability: Durability,
    ) -> Result<Self> {
        let path = files.ensure_file(pos.file_seq, files.file_size_bytes, true)?;
        files.set_current(pos.file_seq);
        let buffered = durability != Durability::Immediate;
        let (file, direct_io) =
            open_journal_file(vfs.as_ref(), &path, direct_io, buffered, &counters)?;
        let size = file
            .len()
            .map_err(|e| Error::io(&path, None, "stat journal file", e))?;
        counters.journal_direct_io_active.store(direct_io, Relaxed);
        if pos.offset >= size / 2 {
            files.spare_wanted.store(true, Relaxed);
        }
        Ok(JournalWriter {
            vfs,
            files,
            counters,
            current: OpenJournal {
                seq: pos.file_seq,
                path,
                file,
                size,
            },
            offset: pos.offset,
            direct_io,
            durability,
            unsafe_skip_durability: false,
        })
    }

    /// Where the next record goes (see `JournalEnd`).
    pub(crate) fn end(&self) -> JournalEnd {
        JournalEnd {
            seq: self.current.seq,
            offset: self.offset,
            size: self.current.size,
        }
    }

    fn note_direct_io(&self) {
        self.counters
            .journal_direct_io_active
            .store(self.direct_io, Relaxed);
    }

    /// Test-only canary: journal writes become plain buffered writes with no sync,
    /// i.e. not durable against power loss. A crash suite must catch this.
    pub(crate) fn disable_durability_for_tests(&mut self) -> Result<()> {
        self.unsafe_skip_durability = true;
        let mode = OpenMode {
            write: true,
            ..Default::default()
        };
        self.current.file = self
            .vfs
            .open(&self.current.path, mode)
            .map_err(|e| Error::io(&self.current.path, None, "open journal file", e))?;
        self.direct_io = false;
        self.note_direct_io();
        Ok(())
    }

    fn skips_sync(&self) -> bool {
        self.unsafe_skip_durability || self.durability != Durability::Immediate
    }

    /// Writes one record (records must come in chain order) and returns once it is
    /// durable (or, in buffered mode, written to the OS). On error nothing is
    /// acknowledged; the environment latches, since what reached the disk is unknown.
    pub fn write(&mut self, rec: &PreparedRecord) -> Result<JournalPos> {
        self.note_direct_io();
        if self.offset + rec.len as u64 > self.current.size {
            self.switch_file(rec.len as u64)?;
        }
        let start = Instant::now();
        self.write_durable(&rec.buf.bytes()[..rec.len])?;
        self.counters.journal_write_latency.record(start.elapsed());
        self.counters.journal_writes.fetch_add(1, Relaxed);
        self.counters
            .journal_bytes
            .fetch_add(rec.len as u64, Relaxed);
        self.counters
            .journal_body_bytes_full_images
            .fetch_add(rec.full_image_body_len as u64, Relaxed);
        self.counters
            .journal_body_bytes_raw
            .fetch_add(rec.raw_body_len as u64, Relaxed);
        self.counters
            .journal_body_bytes_stored
            .fetch_add(rec.stored_body_len as u64, Relaxed);
        let half = self.current.size / 2;
        if self.offset < half && self.offset + rec.len as u64 >= half {
            // Half of this file is used: have the flusher make the next one ready
            // now. Asking only at a switch (or a checkpoint) left the first switch
            // after open to create and zero-fill a file on the commit path.
            self.files.spare_wanted.store(true, Relaxed);
        }
        self.offset += rec.len as u64;
        Ok(JournalPos {
            file_seq: self.current.seq,
            offset: self.offset,
            chain_checksum: rec.checksum,
        })
    }

    fn write_durable(&mut self, bytes: &[u8]) -> Result<()> {
        let off = self.offset;
        match self.current.file.write_all_at(bytes, off) {
            Err(e) if self.direct_io && e.raw_os_error() == Some(libc::EINVAL) => {
                // The file system accepted O_DIRECT at open but refuses the write.
                self.fall_back_to_buffered()?;
                return self.write_durable(bytes);
            }
            Err(e) => {
                return Err(Error::io(
                    &self.current.path,
                    Some(off),
                    "write journal record",
                    e,
                ))
            }
            Ok(()) => {}
        }
        if !self.direct_io && !self.skips_sync() {
            self.current
                .file
                .sync_data()
                .map_err(|e| Error::io(&self.current.path, Some(off), "fdatasync journal", e))?;
        }
        Ok(())
    }

    fn fall_back_to_buffered(&mut self) -> Result<()> {
        let (file, _) = open_journal_file(
            self.vfs.as_ref(),
            &self.current.path,
            false,
            false,
            &self.counters,
        )?;
        note_fallback(
            &self.counters,
            &self.current.path,
            "write refused with EINVAL",
        );
        self.current.file = file;
        self.direct_io = false;
        Ok(())
    }

    fn switch_file(&mut self, record_len: u64) -> Result<()> {
        let next = self.current.seq + 1;
        if !self.files.exists(next) {
            // Not prepared (or being prepared right now): this commit waits for it.
            self.counters.journal_switch_waits.fetch_add(1, Relaxed);
        }
        let path = self
            .files
            .ensure_file(next, self.files.file_size_bytes, true)?;
        if self.durability != Durability::Immediate && !self.unsafe_skip_durability {
            // Buffered mode: the background sync only looks at the current file, so
            // make the one we leave durable now.
            self.current
                .file
                .sync_data()
                .map_err(|e| Error::io(&self.current.path, None, "fdatasync journal", e))?;
        }
        let (file, direct) = open_journal_file(
            self.vfs.as_ref(),
            &path,
            self.direct_io && !self.unsafe_skip_durability,
            self.skips_sync(),
            &self.counters,
        )?;
        let mut size = file
            .len()
            .map_err(|e| Error::io(&path, None, "stat journal file", e))?;
        if size < record_len {
            // A record larger than a journal file (a huge value): grow this file for it.
            let target = record_len.div_ceil(DIRECT_IO_ALIGN as u64) * DIRECT_IO_ALIGN as u64;
            file.allocate(0, target)
                .map_err(|e| Error::io(&path, Some(0), "grow journal file", e))?;
            file.sync_all()
                .map_err(|e| Error::io(&path, None, "fsync journal file", e))?;
            size = target;
        }
        self.direct_io = direct;
        self.current = OpenJournal {
            seq: next,
            path,
            file,
            size,
        };
        self.offset = 0;
        self.files.set_current(next);
        self.files.spare_wanted.store(true, Relaxed);
        Ok(())
    }
}

fn note_fallback(counters: &EngineCounters, path: &Path, why: &str) {
    if !counters.journal_direct_io_fallback.swap(true, Relaxed) {
        tracing::warn!(
            path = %path.display(),
            "journal: O_DIRECT unavailable ({why}); falling back to buffered writes + fdatasync"
        );
    }
}

fn open_journal_file(
    vfs: &dyn Vfs,
    path: &Path,
    direct: bool,
    buffered: bool,
    counters: &EngineCounters,
) -> Result<(Box<dyn VfsFile>, bool)> {
    if direct && !buffered {
        let mode = OpenMode {
            write: true,
            direct: true,
            dsync: true,
            ..Default::default()
        };
        match vfs.open(path, mode) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                note_fallback(counters, path, "open refused with EINVAL")
            }
            Err(e) => return Err(Error::io(path, None, "open journal file", e)),
        }
    }
    let mode = OpenMode {
        write: true,
        ..Default::default()
    };
    let f = vfs
        .open(path, mode)
        .map_err(|e| Error::io(path, None, "open journal file", e))?;
    Ok((f, false))
}
