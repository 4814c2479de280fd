//! Where committed pages are read from: the table of pages that are journaled but
//! not yet written to the data file, else the memory map of the data file.
//!
//! Pages are copy-on-write: a page number is rewritten only after the transaction
//! that freed it is synced and no reader predates that transaction (see
//! `alloc/mod.rs`). So at any moment a page number has at most one unflushed version,
//! and the flusher's buffered writes never change bytes an open reader can see.

use crate::crypt::Cipher;
use crate::decrypted_cache::{DecryptedCache, Plain};
use crate::io::{MappedRegion, VfsFile};
use crate::page::{self, PageNo, PageRun, PAGE_SIZE};
use crate::seals::Seals;
use crate::{Error, Result};
use parking_lot::RwLock;
use std::cell::UnsafeCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) struct MapGen {
    region: Box<dyn MappedRegion>,
    pages: u64,
    /// One bit per page of this map: its on-disk version was verified (or written by
    /// us), so every page from disk has its checksum checked once per map generation,
    /// not per read. Kept per generation so a read tests a bit without taking a lock;
    /// a new generation starts from a copy of its predecessor's bits (a bit set in
    /// the old one meanwhile only costs one more verification).
    verified: Box<[AtomicU64]>,
}

impl MapGen {
    fn is_verified(&self, no: PageNo) -> bool {
        self.verified
            .get((no / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (no % 64)) != 0)
    }

    fn set_verified(&self, no: PageNo) {
        if let Some(w) = self.verified.get((no / 64) as usize) {
            w.fetch_or(1 << (no % 64), Ordering::Relaxed);
        }
    }

    /// Notes what a write of `run` at `no` by this process left on disk.
    fn note_written(&self, no: PageNo, run: &PageRun) {
        if run.is_bare() {
            self.clear_verified(no..no + run.page_count() as u64);
        } else {
            self.set_verified(no);
        }
    }

    /// Pages of a bare run are value bytes, never a verified page: should anything
    /// read one of them as a page, its header and checksum get checked.
    fn clear_verified(&self, pages: std::ops::Range<PageNo>) {
        for no in pages {
            if let Some(w) = self.verified.get((no / 64) as usize) {
                w.fetch_and(!(1 << (no % 64)), Ordering::Relaxed);
            }
        }
    }
}

/// A page asked for where a bare run (value bytes, no header) starts: only a damaged
/// pointer leads there. Pages from the data file are caught by `page::verify`; this
/// catches runs still in memory, whose value bytes could pass for a node's header.
pub(crate) fn bare_run_read_as_page(path: &Path, no: PageNo) -> Error {
    Error::corrupted(
        path,
        format!("page {no}"),
        format!("page {no} starts a bare value run, not a page (a damaged pointer)"),
    )
}

/// Keeps alive what a transaction has borrowed slices from: page runs taken from the
/// unflushed table and the map generations it read through. Slices handed out by a
/// transaction point into these, so they stay valid for the transaction's lifetime
/// even if the flusher moves on or the map is replaced.
#[derive(Default)]
pub(crate) struct Pins {
    runs: UnsafeCell<Vec<Arc<PageRun>>>,
    maps: UnsafeCell<Vec<Arc<MapGen>>>,
    /// An encrypted environment's pages this transaction read, decrypted, by page
    /// number (each run is wiped when its last holder lets go). A point read holds
    /// three or four: a short list searched in order, no hash table to build.
    decrypted: UnsafeCell<DecryptedList>,
    /// The same, once the list holds more than a few: by page number.
    decrypted_many: UnsafeCell<crate::fasthash::FastMap<PageNo, Arc<Plain>>>,
    /// Pages held in those two.
    decrypted_pages: std::cell::Cell<usize>,
}

type DecryptedList = smallvec::SmallVec<[(PageNo, Arc<Plain>); 8]>;

/// How many decrypted runs `Pins` keeps in its list before it indexes them.
const PINS_LISTED: usize = 16;

// SAFETY: Pins is only mutated through &self by the owning transaction, which is not
// Sync; moving it to another thread moves all of it.
unsafe impl Send for Pins {}

impl Pins {
    fn pin_run(&self, run: Arc<PageRun>) -> &[u8] {
        // SAFETY: the transaction owning `self` is !Sync, so no concurrent access; the
        // vector only grows, and the returned slice points into the Arc's heap buffer,
        // which does not move when the vector reallocates and lives as long as `self`.
        unsafe {
            let runs = &mut *self.runs.get();
            runs.push(run);
            let last = runs.last().expect("just pushed");
            std::slice::from_raw_parts(last.bytes().as_ptr(), last.bytes().len())
        }
    }
    /// The run at page `no` this transaction decrypted before, if it did.
    fn decrypted(&self, no: PageNo) -> Option<&[u8]> {
        // SAFETY: as in pin_run; entries are removed only through `&mut self`
        // (`release_decrypted`), when no slice handed out can still be borrowed, and a
        // run's bytes live in the Arc's heap buffer, which a rehash does not move.
        unsafe {
            let listed = &*self.decrypted.get();
            let run = match listed.iter().find(|(n, _)| *n == no) {
                Some((_, run)) => Some(run),
                None if listed.len() >= PINS_LISTED => (*self.decrypted_many.get()).get(&no),
                None => None,
            };
            run.map(|run| {
                let bytes = run.0.bytes();
                std::slice::from_raw_parts(bytes.as_ptr(), bytes.len())
            })
        }
    }

    /// Pages of decrypted runs this transaction holds.
    pub(crate) fn decrypted_pages(&self) -> usize {
        self.decrypted_pages.get()
    }

    /// Lets go of every decrypted run: `&mut self`, so no slice of one is out.
    pub(crate) fn release_decrypted(&mut self) {
        self.decrypted.get_mut().clear();
        self.decrypted_many.get_mut().clear();
        self.decrypted_pages.set(0);
    }

    fn keep_decrypted(&self, no: PageNo, run: Arc<Plain>) -> &[u8] {
        self.decrypted_pages
            .set(self.decrypted_pages.get() + run.0.page_count());
        // SAFETY: as in `decrypted`; an entry, once there, is never replaced, so no
        // slice of it is left dangling.
        unsafe {
            let listed = &mut *self.decrypted.get();
            let kept = if listed.len() < PINS_LISTED {
                listed.push((no, run));
                &listed.last().expect("just pushed").1
            } else {
                (*self.decrypted_many.get()).entry(no).or_insert(run)
            };
            let bytes = kept.0.bytes();
            std::slice::from_raw_parts(bytes.as_ptr(), bytes.len())
        }
    }

    /// The last map generation this transaction pinned, if it covers page `no`: a
    /// snapshot's pages lie within the map of its time or a later one, and the file
    /// only grows, so an older mapping stays valid for the pages it covers.
    fn pinned_map_covering(&self, no: PageNo) -> Option<&MapGen> {
        // SAFETY: as in pin_run; the returned reference points into an Arc the vector
        // keeps alive for the life of `self`.
        unsafe {
            let maps = &*self.maps.get();
            maps.last()
                .filter(|m| no < m.pages)
                .map(|m| &*(Arc::as_ptr(m)))
        }
    }

    fn pin_map<'a>(&'a self, map: &Arc<MapGen>) -> &'a MapGen {
        // SAFETY: as in pin_run; a map generation is pinned once per change.
        unsafe {
            let maps = &mut *self.maps.get();
            if !maps.last().is_some_and(|m| Arc::ptr_eq(m, map)) {
                maps.push(map.clone());
            }
            let last = maps.last().expect("just pushed");
            &*(Arc::as_ptr(last))
        }
    }
}

/// The data file of a new environment, when `data_grow_step_bytes` is larger: a
/// database that stays small takes 1 MiB, not a whole step (64 MiB by default).
const FIRST_DATA_FILE_BYTES: u64 = 1 << 20;

/// The length the data file grows to from `cur` bytes when `needed` are wanted:
/// at least double while it is smaller than one step (a small database stays small,
/// a growing one reaches full steps after a few remaps), then whole steps of the
/// larger of `step_bytes` and an eighth of the file (few remaps for a large one).
/// Growth reserves the space the pages will take (fallocate), so write-back never
/// meets a full disk midway.
pub(crate) fn grow_target(cur: u64, needed: u64, step_bytes: u64) -> u64 {
    if cur < step_bytes {
        needed.max(
            cur.saturating_mul(2)
                .max(FIRST_DATA_FILE_BYTES)
                .min(step_bytes),
        )
    } else {
        let step = step_bytes.max(cur / 8);
        needed.div_ceil(step) * step
    }
}

/// What the flusher hands the disk at once when writing back, and how many such
/// pieces may be under way (`write_back_range`).
pub(crate) const WRITE_BACK_CHUNK_BYTES: u64 = 4 << 20;
pub(crate) const WRITE_BACK_CHUNKS_IN_FLIGHT: usize = 2;

pub(crate) struct PageStore {
    pub path: PathBuf,
    pub file: Box<dyn VfsFile>,
    map: RwLock<Arc<MapGen>>,
    unflushed: RwLock<crate::fasthash::FastMap<PageNo, Arc<PageRun>>>,
    /// The table's length, stored under its write lock: a read that sees 0 skips the
    /// table's lock. Sound because a snapshot's pages were published before the
    /// snapshot existed, and an entry leaves the table only once its bytes are in the
    /// data file (`write_back`) or no snapshot can reach it (`forget`).
    unflushed_count: AtomicUsize,
    grow_step_bytes: u64,
    /// Whether merges of the write buffer read their leaves ahead (`prefetch.rs`).
    pub read_ahead: crate::prefetch::FaultWindow,
    /// An encrypted environment's seal file and cipher: pages are sealed on their
    /// way to the data file and opened into memory when read.
    seals: Option<Seals>,
    /// Pages opened once and shared by the transactions that read them (see
    /// `decrypted_cache.rs`): the hot ones are not decrypted again and again.
    decrypted: DecryptedCache,
}

impl PageStore {
    pub fn open(
        path: &Path,
        file: Box<dyn VfsFile>,
        grow_step_bytes: u64,
        read_ahead: crate::ReadAhead,
        seals: Option<Seals>,
        decrypted_cache_bytes: u64,
    ) -> Result<Self> {
        let len = file
            .len()
            .map_err(|e| Error::io(path, None, "stat data file", e))?;
        let map = Self::map_file(path, file.as_ref(), len, None)?;
        Ok(PageStore {
            path: path.to_path_buf(),
            file,
            map: RwLock::new(map),
            unflushed: RwLock::new(Default::default()),
            unflushed_count: AtomicUsize::new(0),
            grow_step_bytes,
            read_ahead: crate::prefetch::FaultWindow::new(read_ahead),
            seals,
            decrypted: DecryptedCache::new(decrypted_cache_bytes),
        })
    }

    /// Maps the file's first `len` bytes; the verified bits start as `previous`'s.
    fn map_file(
        path: &Path,
        file: &dyn VfsFile,
        len: u64,
        previous: Option<&MapGen>,
    ) -> Result<Arc<MapGen>> {
        let region = file
            .map(len)
            .map_err(|e| Error::io(path, None, "memory-map data file", e))?;
        let pages = len / PAGE_SIZE as u64;
        let verified: Box<[AtomicU64]> = (0..pages.div_ceil(64) as usize)
            .map(|i| {
                let old = previous
                    .and_then(|p| p.verified.get(i))
                    .map_or(0, |w| w.load(Ordering::Relaxed));
                AtomicU64::new(old)
            })
            .collect();
        Ok(Arc::new(MapGen {
            region,
            pages,
            verified,
        }))
    }

    /// Starts reading the pages `runs` (first page, pages) of the data file in the
    /// background: a scan is about to read them in order, and the map is advised
    /// random access (`io/os.rs`), so they would otherwise come one fault at a time
    /// (a cold sequential read of 1 GiB through such a map: 11 s against 1.1 s with
    /// read-around, on the VM measured). Pages outside the current map are skipped.
    pub fn prefetch(&self, runs: &[(PageNo, u64)]) {
        let map = self.map.read().clone();
        for &(no, pages) in runs {
            let end = no.saturating_add(pages).min(map.pages);
            if no >= end {
                continue;
            }
            if let (Ok(start), Ok(len)) = (
                usize::try_from(no * PAGE_SIZE as u64),
                usize::try_from((end - no) * PAGE_SIZE as u64),
            ) {
                map.region.will_need(start, len);
            }
        }
    }

    /// The cipher of an encrypted environment.
    pub fn cipher(&self) -> Option<&Cipher> {
        self.seals.as_ref().map(|s| s.cipher().as_ref())
    }

    pub fn cipher_arc(&self) -> Option<Arc<Cipher>> {
        self.seals.as_ref().map(|s| s.cipher().clone())
    }

    /// Returns the bytes of committed page `no` (the whole run for overflow pages).
    pub fn page<'a>(&self, no: PageNo, pins: &'a Pins) -> Result<&'a [u8]> {
        // The read path takes no lock when nothing is waiting for write-back and the
        // transaction's map covers the page (W5's random gets: three lock
        // acquisitions per page visited before).
        if self.unflushed_count.load(Ordering::Acquire) != 0 {
            if let Some(run) = self.unflushed.read().get(&no) {
                if run.is_bare() {
                    return Err(bare_run_read_as_page(&self.path, no));
                }
                return Ok(pins.pin_run(run.clone()));
            }
        }
        if let Some(seals) = &self.seals {
            return self.sealed_run(seals, no, None, pins);
        }
        if let Some(map) = pins.pinned_map_covering(no) {
            // An overflow run may reach past that map's end: then the current map
            // (a run past the end of that one is corruption, reported from there).
            if let Ok(page) = self.page_from_map(no, map) {
                return Ok(page);
            }
        }
        let map = pins.pin_map(&self.map.read());
        self.page_from_map(no, map)
    }

    /// Returns the `pages` pages of the bare run at `no` (see `page::VALUE_BARE_RUN`),
    /// unverified: a bare run has no header, and its checksum is in the leaf cell
    /// that points here, which the caller checks.
    pub fn bare_run<'a>(&self, no: PageNo, pages: u64, pins: &'a Pins) -> Result<&'a [u8]> {
        if self.unflushed_count.load(Ordering::Acquire) != 0 {
            if let Some(run) = self.unflushed.read().get(&no) {
                return Ok(pins.pin_run(run.clone()));
            }
        }
        if let Some(seals) = &self.seals {
            return self.sealed_run(seals, no, Some(pages), pins);
        }
        let in_map = |map: &'a MapGen| -> Result<&'a [u8]> {
            let end = no
                .checked_add(pages)
                .filter(|&end| no >= page::FIRST_DATA_PAGE && end <= map.pages);
            let range = end.and_then(|end| {
                let (start, end) = (usize::try_from(no).ok()?, usize::try_from(end).ok()?);
                map.region.bytes().get(start * PAGE_SIZE..end * PAGE_SIZE)
            });
            range.ok_or_else(|| {
                Error::corrupted(
                    &self.path,
                    format!("page {no}"),
                    format!(
                        "bare run of {pages} pages at page {no} lies outside the data file's {} pages",
                        map.pages
                    ),
                )
            })
        };
        if let Some(map) = pins.pinned_map_covering(no) {
            if let Ok(run) = in_map(map) {
                return Ok(run);
            }
        }
        in_map(pins.pin_map(&self.map.read()))
    }

    /// An encrypted environment's run at page `no`, opened from the map into the
    /// transaction's memory (once per transaction): a page, or the bare run of
    /// `bare_pages` pages.
    fn sealed_run<'a>(
        &self,
        seals: &Seals,
        no: PageNo,
        bare_pages: Option<u64>,
        pins: &'a Pins,
    ) -> Result<&'a [u8]> {
        if let Some(run) = pins.decrypted(no) {
            return Ok(run);
        }
        if let Some(run) = self.decrypted.get(no) {
            let expected = bare_pages.map_or(!run.0.is_bare(), |n| {
                run.0.is_bare() && run.0.page_count() as u64 == n
            });
            if expected {
                return Ok(pins.keep_decrypted(no, run));
            }
            // A damaged pointer: the checks below say what it points at.
        }
        let slot = seals.slot(no)?;
        slot.check_read_as(no, bare_pages, &self.path)?;
        let end = no
            .checked_add(slot.run_pages as u64)
            .filter(|_| no >= page::FIRST_DATA_PAGE);
        let in_map = |map: &MapGen| -> Option<std::ops::Range<usize>> {
            let end = end.filter(|&end| end <= map.pages)?;
            Some(usize::try_from(no).ok()? * PAGE_SIZE..usize::try_from(end).ok()? * PAGE_SIZE)
        };
        let map = match pins.pinned_map_covering(no) {
            Some(map) if in_map(map).is_some() => map,
            _ => pins.pin_map(&self.map.read()),
        };
        let sealed_bytes = in_map(map)
            .and_then(|range| map.region.bytes().get(range))
            .ok_or_else(|| {
                Error::corrupted(
                    &self.path,
                    format!("page {no}"),
                    format!(
                        "run of {} pages at page {no} lies outside the data file's {} pages",
                        slot.run_pages, map.pages
                    ),
                )
            })?;
        let run = Arc::new(Plain(seals.open_run(
            no,
            &slot,
            sealed_bytes,
            &self.path,
        )?));
        self.decrypted.insert(no, &run);
        Ok(pins.keep_decrypted(no, run))
    }

    fn page_from_map<'a>(&self, no: PageNo, map: &'a MapGen) -> Result<&'a [u8]> {
        if no < page::FIRST_DATA_PAGE || no >= map.pages {
            return Err(Error::corrupted(
                &self.path,
                format!("page {no}"),
                format!(
                    "reference to page {no}, outside the data file's {} pages",
                    map.pages
                ),
            ));
        }
        let bytes = map.region.bytes();
        let start = no as usize * PAGE_SIZE;
        let outside = || {
            Error::corrupted(
                &self.path,
                format!("page {no}"),
                format!("page {no} lies past the end of the mapped data file"),
            )
        };
        let first = bytes.get(start..start + PAGE_SIZE).ok_or_else(outside)?;
        // The header read next is usually a cache miss, and the search that follows
        // reads the slot array behind it (a leaf of W3's data: ~45 slots, up to byte
        // ~130): asking for the slot array's next two lines now overlaps their misses
        // with the header's. W5's random gets, isolated: +7-14 % (alternated).
        for line in [64, 128] {
            if let Some(rest) = first.get(line..) {
                page::prefetch(rest);
            }
        }
        let run_len = if page::hdr::kind(first) == page::KIND_OVERFLOW {
            let run = page::hdr::run_pages(first) as u64;
            if run == 0 || no + run > map.pages {
                return Err(Error::corrupted(
                    &self.path,
                    format!("page {no}"),
                    format!("overflow run of {run} pages runs past the end of the file"),
                ));
            }
            run as usize * PAGE_SIZE
        } else {
            PAGE_SIZE
        };
        let run = bytes.get(start..start + run_len).ok_or_else(outside)?;
        if !map.is_verified(no) {
            page::verify(run, no, &self.path)?;
            map.set_verified(no);
        }
        Ok(run)
    }

    /// Reads one page with pread (recovery: sees what `write_raw` wrote, no map needed).
    pub fn read_page(&self, no: PageNo) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; PAGE_SIZE];
        let offset = no * PAGE_SIZE as u64;
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| Error::io(&self.path, Some(offset), "read data page", e))?;
        if let Some(seals) = &self.seals {
            let slot = seals.slot(no)?;
            slot.check_read_as(no, None, &self.path)?;
            if slot.run_pages != 1 {
                // A diff's source is a single page; an overflow run is never one.
                return Err(Error::corrupted(
                    &self.path,
                    format!("page {no}"),
                    format!("page {no} was read as a single page, and its seal says it starts a run of {} pages", slot.run_pages),
                ));
            }
            // Wiped when dropped, once copied out.
            let plain = Plain(seals.open_run(no, &slot, &buf, &self.path)?);
            buf.copy_from_slice(plain.0.bytes());
        }
        Ok(buf)
    }

    /// Writes `run` at page `no` of the data file (buffered): sealed first in an
    /// encrypted environment.
    fn write_run(&self, no: PageNo, run: &PageRun) -> Result<()> {
        let offset = no * PAGE_SIZE as u64;
        let sealed;
        let bytes = match &self.seals {
            Some(seals) => {
                // Before any reader can look past the unflushed table for these
                // pages (the caller takes them out of it after this returns).
                self.decrypted.invalidate(no, run.page_count() as u64);
                sealed = seals.seal(no, run)?;
                sealed.bytes()
            }
            None => run.bytes(),
        };
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| Error::io(&self.path, Some(offset), "write data page", e))
    }

    /// Publishes pages of a durable commit so readers of later snapshots find them.
    pub fn publish(&self, pages: &[(PageNo, Arc<PageRun>)]) {
        let mut table = self.unflushed.write();
        for (no, run) in pages {
            table.insert(*no, run.clone());
        }
        self.unflushed_count.store(table.len(), Ordering::Release);
    }

    /// Drops table entries of pages that no snapshot can reach any more (pages the
    /// flusher skipped because they were superseded before being synced).
    pub fn forget(&self, pages: &[PageNo]) {
        let mut table = self.unflushed.write();
        for p in pages {
            table.remove(p);
        }
        self.unflushed_count.store(table.len(), Ordering::Release);
    }

    pub fn unflushed_len(&self) -> usize {
        self.unflushed.read().len()
    }

    /// Checks, before `run` is written at page `no`, what the code guarantees: its
    /// pages are data pages (never the file header's) of the state it belongs to,
    /// which has `page_count` pages, and a run with a page header is the page it is
    /// written to, and the version of transaction `txn_id` when that is known.
    fn check_write(&self, no: PageNo, run: &PageRun, page_count: u64, txn_id: Option<u64>) {
        let pages = run.page_count() as u64;
        assert!(
            no >= page::FIRST_DATA_PAGE && no + pages <= page_count,
            "writing {pages} pages at page {no} of {}: outside the data pages {}..{page_count}",
            self.path.display(),
            page::FIRST_DATA_PAGE
        );
        if !run.is_bare() {
            let b = run.bytes();
            let (claimed_no, claimed_txn) = (page::hdr::page_no(b), page::hdr::txn_id(b));
            assert!(
                claimed_no == no && txn_id.is_none_or(|t| t == claimed_txn),
                "writing page {no} of txn {txn_id:?} to {}: the page says it is page {claimed_no} of txn {claimed_txn}",
                self.path.display()
            );
        }
    }

    /// Writes a run of transaction `txn_id` (whose state has `page_count` pages) to
    /// the data file (buffered) and retires it from the table.
    pub fn write_back(
        &self,
        no: PageNo,
        run: &Arc<PageRun>,
        txn_id: u64,
        page_count: u64,
    ) -> Result<()> {
        self.check_write(no, run, page_count, Some(txn_id));
        let end_page = no + run.page_count() as u64;
        self.ensure_mapped(end_page)?;
        self.write_run(no, run)?;
        self.map.read().note_written(no, run);
        let mut table = self.unflushed.write();
        if table.get(&no).is_some_and(|cur| Arc::ptr_eq(cur, run)) {
            table.remove(&no);
        }
        self.unflushed_count.store(table.len(), Ordering::Release);
        Ok(())
    }

    /// Writes raw page bytes during recovery (no table involved): a page image of a
    /// record whose state has `page_count` pages, decoded (page number in bounds) and
    /// verified (header names the page) before.
    pub fn write_raw(&self, no: PageNo, run: &PageRun, page_count: u64) -> Result<()> {
        self.check_write(no, run, page_count, None);
        let end_page = no + run.page_count() as u64;
        self.ensure_mapped(end_page)?;
        self.write_run(no, run)?;
        self.map.read().note_written(no, run);
        Ok(())
    }

    /// Grows the file (preallocated, in large steps) and the map to cover `pages`.
    pub fn ensure_mapped(&self, pages: u64) -> Result<()> {
        if self.map.read().pages >= pages {
            return Ok(());
        }
        let mut map = self.map.write();
        if map.pages >= pages {
            return Ok(());
        }
        let cur = self
            .file
            .len()
            .map_err(|e| Error::io(&self.path, None, "stat data file", e))?;
        let needed = pages * PAGE_SIZE as u64;
        if cur < needed {
            let target = grow_target(cur, needed, self.grow_step_bytes);
            let grown = match self.file.allocate(cur, target - cur) {
                // A full step does not fit: what is needed now may.
                Err(e) if crate::error::io_is_disk_full(&e) && target > needed => {
                    self.file.allocate(cur, needed - cur)
                }
                r => r,
            };
            grown.map_err(|e| Error::io(&self.path, Some(cur), "preallocate data file", e))?;
        }
        if let Some(seals) = &self.seals {
            seals.reserve(pages.max(self.file_len()? / PAGE_SIZE as u64))?;
        }
        let len = self
            .file
            .len()
            .map_err(|e| Error::io(&self.path, None, "stat data file", e))?;
        *map = Self::map_file(&self.path, self.file.as_ref(), len, Some(&map))?;
        Ok(())
    }

    /// Writes pages [first, first+count) from the page cache to the disk, a chunk of
    /// `WRITE_BACK_CHUNK_BYTES` at a time with at most `WRITE_BACK_CHUNKS_IN_FLIGHT`
    /// under way (the flusher waits for the oldest before starting another), so that
    /// the next checkpoint's fsync finds little left. A hint: failures here are
    /// ignored, the checkpoint's fsync reports real errors.
    ///
    /// Why bounded: on a disk without FUA every durable journal write ends with a
    /// cache flush, which waits for every write in flight. Handing a whole window
    /// (up to 128 MiB) to the disk at once made the journal writes behind it take
    /// 5–20 ms. Why more than one piece: waiting for each before the next starts
    /// cost bulk inserts the gain (README, "Round 2, fifth pass").
    pub fn write_back_range(&self, first: PageNo, count: u64) {
        let chunk_pages = (WRITE_BACK_CHUNK_BYTES / PAGE_SIZE as u64).max(1);
        let end = first + count;
        let mut in_flight = std::collections::VecDeque::new();
        let mut next = first;
        while next < end {
            let n = chunk_pages.min(end - next);
            let range = (next * PAGE_SIZE as u64, n * PAGE_SIZE as u64);
            if in_flight.len() == WRITE_BACK_CHUNKS_IN_FLIGHT {
                if let Some((off, len)) = in_flight.pop_front() {
                    let _ = self.file.wait_written_back(off, len);
                }
            }
            let _ = self.file.write_back(range.0, range.1);
            in_flight.push_back(range);
            next += n;
        }
        for (off, len) in in_flight {
            let _ = self.file.wait_written_back(off, len);
        }
    }

    pub fn sync(&self) -> Result<()> {
        if let Some(seals) = &self.seals {
            seals.sync()?;
        }
        self.file
            .sync_data()
            .map_err(|e| Error::io(&self.path, None, "fsync data file", e))
    }

    /// Shortens the file to `pages` pages if it is longer, and maps what is left.
    /// For a closing environment only (`Flusher::trim_tail_at_close`): a reader
    /// through an older map of the cut pages would fault.
    pub fn truncate_to(&self, pages: u64) -> Result<()> {
        let mut map = self.map.write();
        let len = pages * PAGE_SIZE as u64;
        let cur = self.file_len()?;
        if cur <= len {
            return Ok(());
        }
        self.file
            .set_len(len)
            .map_err(|e| Error::io(&self.path, Some(len), "truncate data file's free tail", e))?;
        self.sync()?;
        *map = Self::map_file(&self.path, self.file.as_ref(), len, Some(&map))?;
        Ok(())
    }

    pub fn file_len(&self) -> Result<u64> {
        self.file
            .len()
            .map_err(|e| Error::io(&self.path, None, "stat data file", e))
    }
}

#[cfg(test)]
mod tests {
    use super::grow_target;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_data_file_doubles_up_to_a_step_then_grows_by_steps() {
        let step = 64 * MIB;
        // Doubling from the first size while below a step, whatever little is needed.
        assert_eq!(grow_target(MIB, MIB + 8192, step), 2 * MIB);
        assert_eq!(grow_target(2 * MIB, 2 * MIB + 8192, step), 4 * MIB);
        assert_eq!(grow_target(32 * MIB, 33 * MIB, step), 64 * MIB);
        // A write-back batch needing more than double gets what it needs.
        assert_eq!(grow_target(MIB, 129 * MIB, step), 129 * MIB);
        // Past one step: whole steps, or an eighth of a large file.
        assert_eq!(grow_target(64 * MIB, 65 * MIB, step), 128 * MIB);
        assert_eq!(grow_target(129 * MIB, 130 * MIB, step), 192 * MIB);
        assert_eq!(grow_target(1024 * MIB, 1025 * MIB, step), 1152 * MIB);
        // A step smaller than the first size: steps from the start.
        assert_eq!(grow_target(8192 * 2, 8192 * 3, 8192), 8192 * 3);
        // A new data file (`recovery/create.rs`): the first size, or one step if smaller.
        assert_eq!(grow_target(0, 2 * 8192, step), MIB);
        assert_eq!(grow_target(0, 2 * 8192, 8192), 2 * 8192);
    }
}
