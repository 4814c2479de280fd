//! The journal's files: preallocated, named by sequence, shared between the writer
//! (which consumes them) and the flusher (which recycles them and prepares the next).

use super::{file_path, list_files};
use crate::io::{OpenMode, Vfs, VfsFile, DIRECT_IO_ALIGN};
use crate::stats::EngineCounters;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Journal files kept for reuse beyond the one the writer appends to (a file
/// prepared ahead counts). Every file below the synced point used to be kept: 6 files,
/// 340 MB beside 2.2 GB of data after a load of 1M documents (docs/benchmarks.md,
/// SPACE). Two cover a file switch and the next one prepared while the writer fills
/// the current; a writer outrunning the checkpoints creates more (zero-filled by the
/// flusher ahead of time), and they are removed again once synced.
pub(crate) const MAX_SPARE_FILES: usize = 2;

/// The size of the one journal file a clean close leaves (or less: never more
/// than `journal_file_size_bytes`): a closed database needs no journal to replay,
/// and the 2-3 files of 64 MiB it used to keep were 201 MB beside 1.6 GB of data
/// after a load of 1M documents (docs/benchmarks.md, SPACE). The next open writes
/// into it and has the flusher make full-size files ahead, as a new environment
/// does with a small first file.
pub(crate) const CLOSE_FILE_BYTES: u64 = 4 << 20;

/// Where a record ended: the position of the next one, and the chain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalPos {
    pub file_seq: u64,
    pub offset: u64,
    pub chain_checksum: u32,
}

impl JournalPos {
    /// Zeros: a position not known yet.
    pub const UNSET: JournalPos = JournalPos {
        file_seq: 0,
        offset: 0,
        chain_checksum: 0,
    };
}

/// The sizes of new journal files: a new environment's first, and every other.
#[derive(Clone, Copy, Debug)]
pub struct FileSizes {
    pub first: u64,
    pub full: u64,
}

impl FileSizes {
    /// The sizes `opts` asks for (`journal_file_size_bytes`, `journal_first_file_bytes`).
    pub fn of(opts: &crate::options::Options) -> Self {
        FileSizes {
            first: opts
                .journal_first_file_bytes
                .unwrap_or(opts.journal_file_size_bytes),
            full: opts.journal_file_size_bytes,
        }
    }
}

/// Files shared between the writer (which consumes them) and the flusher (which
/// recycles files wholly below the synced point and prepares the next one).
pub struct JournalFiles {
    pub dir: PathBuf,
    /// The size of every file but a new environment's first one.
    pub file_size_bytes: u64,
    /// The size of a new environment's first file (`Options::journal_first_file_bytes`).
    first_file_bytes: u64,
    vfs: Arc<dyn Vfs>,
    counters: Arc<EngineCounters>,
    state: Mutex<FilesState>,
    /// Serializes file creation and recycling between the writer and the flusher, so
    /// that both never build the same file at once.
    create_lock: Mutex<()>,
    /// Set when the writer moved to a new file or used half of it: the flusher should
    /// prepare the next one now, not at its next checkpoint (or the writer may have to
    /// create it on the commit path).
    pub(super) spare_wanted: AtomicBool,
    /// How many writer-side callers wait for a file (`ensure_file` with
    /// `Need::Now`: the commit preparing a switch and the journal writer may both).
    writers_waiting: AtomicUsize,
}

/// Who asks for a journal file: the writer, which waits for it, or the flusher,
/// preparing the next one ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    Now,
    Ahead,
}

/// Counts one waiting writer for its lifetime.
struct WriterWaiting<'a>(&'a AtomicUsize);

impl<'a> WriterWaiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Relaxed);
        WriterWaiting(count)
    }
}

impl Drop for WriterWaiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

struct FilesState {
    /// Every journal file on disk.
    existing: BTreeSet<u64>,
    /// A rename into the directory whose sync failed: the names may not be durable,
    /// so no file is handed out before a sync succeeds.
    dir_unsynced: bool,
    /// Files below the synced point: free to be renamed into a future sequence.
    recyclable: Vec<u64>,
    /// The file the writer appends to.
    current: u64,
}

impl JournalFiles {
    pub fn open(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        sizes: FileSizes,
        counters: Arc<EngineCounters>,
        current: u64,
    ) -> Result<Self> {
        let existing: BTreeSet<u64> = list_files(vfs.as_ref(), dir)?.into_iter().collect();
        // The names found may not be durable: a file renamed for reuse whose directory
        // sync failed (EIO), then the process restarted, keeps its new name until the
        // next power cut, which can give it back its old one with the acknowledged
        // records written into it since (seed 1239745692 of the simulator: txns
        // 157-166 lost, the journal ending cleanly at 156). Nothing is written into
        // them before this sync.
        vfs.sync_dir(dir)
            .map_err(|e| Error::io(dir, None, "fsync journal directory at open", e))?;
        Ok(JournalFiles {
            dir: dir.to_path_buf(),
            file_size_bytes: sizes.full,
            first_file_bytes: sizes.first.min(sizes.full),
            vfs,
            counters,
            state: Mutex::new(FilesState {
                existing,
                dir_unsynced: false,
                recyclable: Vec::new(),
                current,
            }),
            create_lock: Mutex::new(()),
            spare_wanted: AtomicBool::new(false),
            writers_waiting: AtomicUsize::new(0),
        })
    }

    pub fn count(&self) -> u64 {
        self.state.lock().existing.len() as u64
    }

    /// Called after a checkpoint: files before `resume_seq` hold only synced records.
    pub fn release_below(&self, resume_seq: u64) {
        let mut st = self.state.lock();
        // The synced point and the replay start are at or before the writer's position.
        assert!(
            resume_seq <= st.current,
            "journal files below {resume_seq} released for reuse while the writer appends to file {}",
            st.current
        );
        let below: Vec<u64> = st.existing.range(..resume_seq).copied().collect();
        for seq in below {
            if !st.recyclable.contains(&seq) {
                st.recyclable.push(seq);
            }
        }
        // Spares beyond `MAX_SPARE_FILES` (counting a file prepared ahead) are
        // removed, oldest first: they hold only synced records, so recovery never
        // reads them, and a crash that brings a name back only leaves a file below
        // the replay start, recyclable again at open.
        let current = st.current;
        let ahead = st.existing.range(current + 1..).count();
        let keep = MAX_SPARE_FILES.saturating_sub(ahead);
        st.recyclable.sort_unstable();
        let excess = st.recyclable.len().saturating_sub(keep);
        let removed: Vec<u64> = st.recyclable.drain(..excess).collect();
        for seq in &removed {
            st.existing.remove(seq);
        }
        drop(st);
        for seq in removed {
            let path = file_path(&self.dir, seq);
            if self.vfs.remove_file(&path).is_err() {
                // Still there: keep it for reuse (removal is only about disk space).
                let mut st = self.state.lock();
                st.existing.insert(seq);
                st.recyclable.push(seq);
            }
        }
    }

    /// A clean close's first journal step (the header names `current` and nothing is
    /// left to replay): removes every other journal file (spares below it, files
    /// prepared ahead), then, if `current` is larger than `CLOSE_FILE_BYTES`, makes
    /// file `current + 1` of that size (zero-filled, synced, renamed, directory
    /// synced) and returns its number. The caller moves both header copies to its
    /// start, then calls `finish_fresh_file_at_close`. A crash at any point: the
    /// removed files hold only synced records (or zeros), and the file a durable
    /// header names exists (`current` until the header moves, then the new one).
    pub(crate) fn fresh_file_at_close(&self, current: u64) -> Result<Option<u64>> {
        let _creating = self.create_lock.lock();
        let others: Vec<u64> = {
            let mut st = self.state.lock();
            if st.current != current || st.dir_unsynced {
                return Ok(None);
            }
            st.recyclable.clear();
            let others = st
                .existing
                .iter()
                .copied()
                .filter(|&s| s != current)
                .collect();
            st.existing.retain(|&s| s == current);
            others
        };
        for seq in others {
            let path = file_path(&self.dir, seq);
            self.vfs
                .remove_file(&path)
                .map_err(|e| Error::io(&path, None, "remove spare journal file at close", e))?;
        }
        let path = file_path(&self.dir, current);
        let size = self
            .vfs
            .open(&path, OpenMode::default())
            .and_then(|f| f.len())
            .map_err(|e| Error::io(&path, None, "stat journal file at close", e))?;
        let small = CLOSE_FILE_BYTES.min(self.file_size_bytes);
        if size <= small {
            return Ok(None);
        }
        let next = current + 1;
        self.create_file(next, file_path(&self.dir, next), small, Need::Now)?;
        Ok(Some(next))
    }

    /// A clean close's last journal step, once both header copies name `new`'s
    /// start: `new` is the current file and `old` is removed (a crash before the
    /// removal leaves a file below the header's, recyclable at open).
    pub(crate) fn finish_fresh_file_at_close(&self, old: u64, new: u64) -> Result<()> {
        {
            let mut st = self.state.lock();
            st.current = new;
            st.existing.remove(&old);
        }
        let path = file_path(&self.dir, old);
        self.vfs
            .remove_file(&path)
            .map_err(|e| Error::io(&path, None, "remove old journal file at close", e))
    }

    /// Makes sure the file after the current one exists, so that switching files is
    /// never slowed by creating one. Recycles an old file when possible (its blocks
    /// are already written, which makes O_DSYNC writes into it cheapest); otherwise
    /// creates one and fills it with zeros once.
    pub fn prepare_next(&self) -> Result<()> {
        self.spare_wanted.store(false, Relaxed);
        let next = self.state.lock().current + 1;
        self.ensure_file(next, Need::Ahead).map(|_| ())
    }

    /// Returns the path of file `seq`, creating or recycling it if needed; a new file
    /// gets the size now wanted (`Options::journal_first_file_bytes` for the first),
    /// zero-filled once now so that durable writes into it need no allocation later.
    pub(crate) fn ensure_file(&self, seq: u64, need: Need) -> Result<PathBuf> {
        let path = file_path(&self.dir, seq);
        {
            // Ready (the usual case): no need to queue behind a file being made.
            let st = self.state.lock();
            if st.existing.contains(&seq) && !st.dir_unsynced {
                return Ok(path);
            }
        }
        // While the writer waits here, a file being made ahead is cut short.
        let _waiting = (need == Need::Now).then(|| WriterWaiting::new(&self.writers_waiting));
        let _creating = self.create_lock.lock();
        let mut st = self.state.lock();
        if st.dir_unsynced {
            self.sync_dir()?;
            st.dir_unsynced = false;
        }
        if st.existing.contains(&seq) {
            return Ok(path);
        }
        // A new environment's first file is small; every later one (and every file
        // of an environment reopened: files exist) is full size.
        let new_size = if st.existing.is_empty() {
            self.first_file_bytes
        } else {
            self.file_size_bytes
        };
        // (A recycled file keeps its size, small or full: a smaller file only means
        // one more switch per round of the files.)
        if let Some(old) = st.recyclable.pop() {
            return self.recycle_file(&mut st, old, seq, path);
        }
        drop(st);
        self.create_file(seq, path, new_size, need)
    }

    /// Renames spent file `old` to be file `seq`, and syncs the directory.
    fn recycle_file(
        &self,
        st: &mut FilesState,
        old: u64,
        seq: u64,
        path: PathBuf,
    ) -> Result<PathBuf> {
        let from = file_path(&self.dir, old);
        if let Err(e) = self.vfs.rename(&from, &path) {
            st.recyclable.push(old);
            return Err(Error::io(&from, None, "rename journal file for reuse", e));
        }
        // The file has its new name now, durable or not: the state says so, and
        // records go into it only once the directory sync has succeeded.
        st.existing.remove(&old);
        st.existing.insert(seq);
        self.counters.journal_files_recycled.fetch_add(1, Relaxed);
        if let Err(e) = self.sync_dir() {
            st.dir_unsynced = true;
            return Err(e);
        }
        Ok(path)
    }

    /// Makes file `seq` of `new_size` bytes: created under a temporary name,
    /// filled, synced, then renamed, so that a crash never leaves a half-made file
    /// under a journal name.
    fn create_file(&self, seq: u64, path: PathBuf, new_size: u64, need: Need) -> Result<PathBuf> {
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
        if let Err(e) = self.fill_new_file(file.as_ref(), &tmp, new_size, need) {
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
        self.counters.journal_files_created.fetch_add(1, Relaxed);
        let mut st = self.state.lock();
        st.existing.insert(seq);
        if let Err(e) = self.sync_dir() {
            st.dir_unsynced = true;
            return Err(e);
        }
        Ok(path)
    }

    /// Sizes, fills and syncs a new journal file under its temporary name. A file
    /// made ahead is cut short (to the zeros written so far, at least a MiB) if the
    /// writer comes to wait for it: a shorter file now rather than a commit waiting
    /// for 64 MiB of zeros (the next spare is asked for as soon as the writer moves
    /// into this one).
    fn fill_new_file(&self, file: &dyn VfsFile, tmp: &Path, size: u64, need: Need) -> Result<()> {
        // A leftover from a crash may be longer or hold anything: start from empty.
        file.set_len(0)
            .map_err(|e| Error::io(tmp, None, "truncate journal file", e))?;
        file.allocate(0, size)
            .map_err(|e| Error::io(tmp, Some(0), "preallocate journal file", e))?;
        let stop = (need == Need::Ahead).then_some(&self.writers_waiting);
        let filled = self.zero_fill(file, tmp, size, stop)?;
        if filled < size {
            file.set_len(filled)
                .map_err(|e| Error::io(tmp, Some(filled), "cut journal file short", e))?;
            self.counters.journal_files_cut_short.fetch_add(1, Relaxed);
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
    fn zero_fill(
        &self,
        file: &dyn VfsFile,
        tmp: &Path,
        len: u64,
        stop: Option<&AtomicUsize>,
    ) -> Result<u64> {
        let direct_mode = OpenMode {
            write: true,
            direct: true,
            ..Default::default()
        };
        write_zeros(file, self.vfs.open(tmp, direct_mode).ok(), tmp, len, stop)
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
        let path = self.ensure_file(seq, Need::Now)?;
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

/// Writes zeros over `[0, len)` of `tmp`, a MiB at a time, through `direct` (an
/// O_DIRECT handle) while it takes them, else through `file`. Stops early, after at
/// least a MiB, once `stop` counts a waiting writer; returns how many bytes it filled.
fn write_zeros(
    file: &dyn VfsFile,
    mut direct: Option<Box<dyn VfsFile>>,
    tmp: &Path,
    len: u64,
    stop: Option<&AtomicUsize>,
) -> Result<u64> {
    const CHUNK_PAGES: usize = (1 << 20) / crate::page::PAGE_SIZE;
    let zeros = crate::page::PageRun::zeroed(CHUNK_PAGES);
    let zeros = zeros.bytes();
    let mut off = 0;
    while off < len {
        if off > 0 && stop.is_some_and(|s| s.load(Relaxed) > 0) {
            return Ok(off);
        }
        let n = zeros.len().min((len - off) as usize);
        let chunk = zeros.get(..n).unwrap_or(zeros);
        // The tail of an unaligned length goes through the buffered handle.
        if let Some(d) = direct
            .as_ref()
            .filter(|_| n.is_multiple_of(DIRECT_IO_ALIGN))
        {
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
    Ok(off)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::OsVfs;

    /// Creates journal file 1 of 3 MiB in `dir`; returns its path.
    fn create_one(dir: &Path) -> PathBuf {
        let files = JournalFiles::open(
            Arc::new(OsVfs),
            dir,
            FileSizes {
                first: 3 << 20,
                full: 3 << 20,
            },
            Arc::new(EngineCounters::default()),
            0,
        )
        .expect("open journal files");
        let path = files.ensure_file(1, Need::Now).expect("create file 1");
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), 3 << 20);
        path
    }

    /// Pages of `path` in the page cache (mincore over a map of it).
    fn cached_pages(path: &Path) -> usize {
        let file = std::fs::File::open(path).expect("open");
        // SAFETY: a read-only map of a file nothing else changes during the test.
        let map = unsafe { memmap2::Mmap::map(&file) }.expect("map");
        let page = 4096;
        let mut resident = vec![0u8; map.len().div_ceil(page)];
        // SAFETY: `resident` has one byte per page of the mapped range.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr() as *mut libc::c_void,
                map.len(),
                resident.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        resident.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// Whether `dir`'s file system takes an O_DIRECT write (probed in a subdirectory
    /// of its own: the journal directory must hold journal files only).
    fn direct_io_works_in(dir: &Path) -> bool {
        let probe_dir = dir.join("probe");
        std::fs::create_dir(&probe_dir).expect("mkdir");
        let mode = OpenMode {
            create: true,
            write: true,
            direct: true,
            ..Default::default()
        };
        let block = crate::page::PageRun::zeroed(1);
        let works = OsVfs
            .open(&probe_dir.join("probe"), mode)
            .is_ok_and(|f| f.write_all_at(block.bytes(), 0).is_ok());
        std::fs::remove_dir_all(&probe_dir).expect("rm probe");
        works
    }

    #[test]
    fn a_new_file_is_zero_filled_through_o_direct_where_the_file_system_takes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        if !direct_io_works_in(dir.path()) {
            eprintln!("skipped: the temporary directory's file system refuses O_DIRECT");
            return;
        }
        let path = create_one(dir.path());
        // Buffered zeros would all be in the page cache after the fsync.
        assert_eq!(cached_pages(&path), 0, "zeros went through the page cache");
    }

    /// A handle that took O_DIRECT at open and refuses every write with EINVAL, as
    /// some file systems do.
    struct RefusesWrites;

    impl VfsFile for RefusesWrites {
        fn read_exact_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
            Err(std::io::ErrorKind::Unsupported.into())
        }
        fn write_all_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(libc::EINVAL))
        }
        fn sync_data(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn sync_all(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn len(&self) -> std::io::Result<u64> {
            Ok(0)
        }
        fn set_len(&self, _: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn allocate(&self, _: u64, _: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn map(&self, _: u64) -> std::io::Result<Box<dyn crate::io::MappedRegion>> {
            Err(std::io::ErrorKind::Unsupported.into())
        }
    }

    #[test]
    fn zeros_refused_by_the_direct_handle_go_through_the_buffered_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal-0000000000000001.tmp");
        let mode = OpenMode {
            create: true,
            write: true,
            ..Default::default()
        };
        let file = OsVfs.open(&path, mode).expect("create");
        write_zeros(
            file.as_ref(),
            Some(Box::new(RefusesWrites)),
            &path,
            3 << 20,
            None,
        )
        .expect("zero-fill falls back");
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), 3 << 20);
        assert_eq!(
            cached_pages(&path),
            3 << 20 >> 12,
            "every page written buffered"
        );
    }
}
