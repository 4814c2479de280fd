//! The journal's files: preallocated, named by sequence, shared between the writer
//! (which consumes them) and the flusher (which recycles them and prepares the next).

use super::{file_path, list_files};
use crate::io::{OpenMode, Vfs, VfsFile, DIRECT_IO_ALIGN};
use crate::stats::EngineCounters;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

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
    pub(super) spare_wanted: std::sync::atomic::AtomicBool,
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
                file.write_all_at(zeros.get(..n).unwrap_or(&zeros), off)
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
    pub(super) fn exists(&self, seq: u64) -> bool {
        self.state.lock().existing.contains(&seq)
    }

    /// True once after the writer moved to a new file or used half of it (until the
    /// flusher prepares the next one).
    pub fn spare_wanted(&self) -> bool {
        self.spare_wanted.load(Relaxed)
    }

    pub(super) fn set_current(&self, seq: u64) {
        self.state.lock().current = seq;
    }
}
