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
            self.zero_fill(file, tmp, min_size)?;
        }
        file.sync_all()
            .map_err(|e| Error::io(tmp, None, "fsync journal file", e))
    }

    /// Writes zeros over `[0, len)`, through an O_DIRECT handle where the file system
    /// takes one, a MiB at a time.
    ///
    /// Why O_DIRECT: buffered zeros reach the disk all at once at the fsync that
    /// follows (64 MiB), and on a disk without FUA the commits' journal writes, each
    /// ending with a cache flush, then waited behind them: 18–28 ms per new file in a
    /// random fill (README, "Round 2, fifth pass"). Direct writes of a MiB keep at
    /// most that much in flight, and leave the page cache alone.
    fn zero_fill(&self, file: &dyn VfsFile, tmp: &Path, len: u64) -> Result<()> {
        const CHUNK_PAGES: usize = (1 << 20) / crate::page::PAGE_SIZE;
        let zeros = crate::page::PageRun::zeroed(CHUNK_PAGES);
        let zeros = zeros.bytes();
        let direct_mode = OpenMode {
            write: true,
            direct: true,
            ..Default::default()
        };
        let mut direct = self.vfs.open(tmp, direct_mode).ok();
        let mut off = 0;
        while off < len {
            let n = zeros.len().min((len - off) as usize);
            let chunk = zeros.get(..n).unwrap_or(zeros);
            // The tail of an unaligned length goes through the buffered handle.
            if let Some(d) = direct.as_ref().filter(|_| n % DIRECT_IO_ALIGN == 0) {
                match d.write_all_at(chunk, off) {
                    Ok(()) => {
                        off += n as u64;
                        continue;
                    }
                    // Took O_DIRECT at open but refuses the write: buffered from here.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => direct = None,
                    Err(e) => return Err(Error::io(tmp, Some(off), "zero-fill journal file", e)),
                }
            }
            file.write_all_at(chunk, off)
                .map_err(|e| Error::io(tmp, Some(off), "zero-fill journal file", e))?;
            off += n as u64;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{MappedRegion, OsVfs};
    use std::io;
    use std::sync::atomic::AtomicU64;

    /// Counts the bytes written to journal files through direct and buffered
    /// handles, and can refuse O_DIRECT as some file systems do.
    #[derive(Default)]
    struct Tally {
        refuse_direct: bool,
        direct_bytes: AtomicU64,
        buffered_bytes: AtomicU64,
    }

    struct TallyVfs(Arc<Tally>);

    struct TallyFile {
        inner: Box<dyn VfsFile>,
        direct: bool,
        tally: Arc<Tally>,
    }

    impl VfsFile for TallyFile {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.inner.read_exact_at(buf, offset)
        }
        fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.inner.write_all_at(buf, offset)?;
            let counter = if self.direct {
                &self.tally.direct_bytes
            } else {
                &self.tally.buffered_bytes
            };
            counter.fetch_add(buf.len() as u64, Relaxed);
            Ok(())
        }
        fn sync_data(&self) -> io::Result<()> {
            self.inner.sync_data()
        }
        fn sync_all(&self) -> io::Result<()> {
            self.inner.sync_all()
        }
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }
        fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
            self.inner.allocate(offset, len)
        }
        fn map(&self, len: u64) -> io::Result<Box<dyn MappedRegion>> {
            self.inner.map(len)
        }
    }

    impl Vfs for TallyVfs {
        fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
            if mode.direct && self.0.refuse_direct {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            Ok(Box::new(TallyFile {
                inner: OsVfs.open(path, mode)?,
                direct: mode.direct,
                tally: self.0.clone(),
            }))
        }
        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            OsVfs.create_dir_all(path)
        }
        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            OsVfs.sync_dir(dir)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            OsVfs.rename(from, to)
        }
        fn remove_file(&self, path: &Path) -> io::Result<()> {
            OsVfs.remove_file(path)
        }
        fn exists(&self, path: &Path) -> bool {
            OsVfs.exists(path)
        }
        fn list_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
            OsVfs.list_dir(dir)
        }
        fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>> {
            OsVfs.lock_exclusive(path)
        }
    }

    /// Creates a 3 MiB journal file; returns the tally and the file's length.
    fn create_one(refuse_direct: bool) -> (Arc<Tally>, u64, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let tally = Arc::new(Tally {
            refuse_direct,
            ..Tally::default()
        });
        let files = JournalFiles::open(
            Arc::new(TallyVfs(tally.clone())),
            dir.path(),
            3 << 20,
            Arc::new(EngineCounters::default()),
            0,
        )
        .expect("open journal files");
        let path = files.ensure_file(1, 3 << 20, true).expect("create file 1");
        let len = std::fs::metadata(&path).expect("stat").len();
        (tally, len, dir)
    }

    fn direct_io_works_in(dir: &Path) -> bool {
        let mode = OpenMode {
            create: true,
            write: true,
            direct: true,
            ..Default::default()
        };
        let Ok(f) = OsVfs.open(&dir.join("probe"), mode) else {
            return false;
        };
        let block = crate::page::PageRun::zeroed(1);
        f.write_all_at(block.bytes(), 0).is_ok()
    }

    #[test]
    fn a_new_file_is_zero_filled_through_o_direct_where_the_file_system_takes_it() {
        let (tally, len, dir) = create_one(false);
        assert_eq!(len, 3 << 20);
        let written = tally.direct_bytes.load(Relaxed) + tally.buffered_bytes.load(Relaxed);
        assert_eq!(written, 3 << 20, "every byte of the file is written once");
        if direct_io_works_in(dir.path()) {
            assert_eq!(
                tally.direct_bytes.load(Relaxed),
                3 << 20,
                "zeros go through the O_DIRECT handle, not the page cache"
            );
        }
    }

    #[test]
    fn a_file_system_without_o_direct_gets_buffered_zeros() {
        let (tally, len, _dir) = create_one(true);
        assert_eq!(len, 3 << 20);
        assert_eq!(tally.direct_bytes.load(Relaxed), 0);
        assert_eq!(tally.buffered_bytes.load(Relaxed), 3 << 20);
    }
}
