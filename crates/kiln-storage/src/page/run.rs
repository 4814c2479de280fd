//! Page buffers: `PageRun`, one or more contiguous 8 KiB pages in one allocation
//! aligned for O_DIRECT, recycled through a small pool (every commit copies pages).

use super::*;

/// One 8 KiB page, aligned for O_DIRECT.
#[derive(Clone)]
#[repr(C, align(4096))]
pub struct AlignedPage(pub [u8; PAGE_SIZE]);

/// A run of one or more contiguous pages in one aligned allocation. Ordinary pages
/// are runs of one; large values live in overflow runs.
#[derive(Clone)]
pub struct PageRun {
    pages: Vec<AlignedPage>,
    /// A bare run (`VALUE_BARE_RUN`): value bytes without a page header, so it is
    /// neither sealed nor verified as a page; its checksum is in the leaf cell.
    bare: bool,
}

/// Recycled page buffers of 1..=POOLED_RUN_PAGES pages. Every commit copies pages
/// (copy-on-write) and builds a record; taking buffers from here instead of the
/// allocator avoids fresh memory, whose page faults cost more than the copies.
const POOLED_RUN_PAGES: usize = 4;
const POOL_MAX_BYTES: usize = 64 << 20;
static POOL: parking_lot::Mutex<[Vec<Vec<AlignedPage>>; POOLED_RUN_PAGES]> =
    parking_lot::Mutex::new([Vec::new(), Vec::new(), Vec::new(), Vec::new()]);

// Bounds: `1 <= page_count <= POOLED_RUN_PAGES`, checked just above.
#[allow(clippy::indexing_slicing)]
fn pool_take(page_count: usize) -> Option<Vec<AlignedPage>> {
    if page_count == 0 || page_count > POOLED_RUN_PAGES {
        return None;
    }
    POOL.lock()[page_count - 1].pop()
}

impl Drop for PageRun {
    // Bounds: `1 <= n <= POOLED_RUN_PAGES`, checked just above.
    #[allow(clippy::indexing_slicing)]
    fn drop(&mut self) {
        let n = self.pages.len();
        if n == 0 || n > POOLED_RUN_PAGES || self.pages.capacity() != n {
            return;
        }
        let mut pool = POOL.lock();
        let slot = &mut pool[n - 1];
        if (slot.len() + 1) * n * PAGE_SIZE <= POOL_MAX_BYTES / POOLED_RUN_PAGES {
            slot.push(std::mem::take(&mut self.pages));
        }
    }
}

impl PageRun {
    /// A buffer whose bytes are unspecified (recycled): for callers that overwrite
    /// every byte they later read.
    pub fn scratch(page_count: usize) -> Self {
        let count = page_count.max(1);
        match pool_take(count) {
            Some(pages) => PageRun { pages, bare: false },
            None => PageRun::zeroed(count),
        }
    }

    pub fn zeroed(page_count: usize) -> Self {
        let count = page_count.max(1);
        if let Some(mut pages) = pool_take(count) {
            for p in &mut pages {
                p.0.fill(0);
            }
            return PageRun { pages, bare: false };
        }
        PageRun {
            pages: vec![AlignedPage([0; PAGE_SIZE]); count],
            bare: false,
        }
    }
    // Bounds: the run has `count` pages, `count * PAGE_SIZE >= bytes.len()`.
    #[allow(clippy::indexing_slicing)]
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let count = bytes.len().div_ceil(PAGE_SIZE).max(1);
        if bytes.len() != count * PAGE_SIZE {
            let mut run = PageRun::zeroed(count);
            run.bytes_mut()[..bytes.len()].copy_from_slice(bytes);
            return run;
        }
        if let Some(pages) = pool_take(count) {
            let mut run = PageRun { pages, bare: false };
            run.bytes_mut().copy_from_slice(bytes);
            return run;
        }
        // Whole pages (the common case: copy-on-write of a page): copy without zeroing.
        let mut pages: Vec<AlignedPage> = Vec::with_capacity(count);
        // SAFETY: the capacity holds `count` pages = bytes.len() bytes; every byte is
        // written by the copy before set_len, and AlignedPage is plain bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                pages.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            );
            pages.set_len(count);
        }
        PageRun { pages, bare: false }
    }

    /// A run of `page_count` pages with `head` at its start, `tail` at its end and
    /// zeros between: a journal image as stored (the zeros of a page are left out).
    /// Every byte is written once: zeroing the run first and copying over it was a
    /// fifth of recovery's reading thread after 1 GiB of large values.
    /// `head.len() + tail.len()` must not exceed the run (the caller checks it; this
    /// asserts it).
    pub fn from_head_tail(page_count: usize, head: &[u8], tail: &[u8]) -> Self {
        let count = page_count.max(1);
        let total = count * PAGE_SIZE;
        assert!(
            head.len() + tail.len() <= total,
            "image parts of {} + {} bytes exceed a run of {count} pages",
            head.len(),
            tail.len()
        );
        let mut pages = pool_take(count).unwrap_or_else(|| Vec::with_capacity(count));
        let gap = total - head.len() - tail.len();
        // SAFETY: the buffer holds `count` pages (pooled with that length, or that
        // capacity); head, zeros and tail together write each of its `total` bytes
        // once, in bounds by the assert above, before `set_len`; AlignedPage is
        // plain bytes.
        unsafe {
            let dst = pages.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(head.as_ptr(), dst, head.len());
            std::ptr::write_bytes(dst.add(head.len()), 0, gap);
            std::ptr::copy_nonoverlapping(tail.as_ptr(), dst.add(head.len() + gap), tail.len());
            pages.set_len(count);
        }
        PageRun { pages, bare: false }
    }

    /// A bare run holding `value` (see `VALUE_BARE_RUN`).
    pub fn bare_value(value: &[u8]) -> Self {
        let mut run = PageRun::scratch(bare_run_pages(value.len()));
        init_bare_run(run.bytes_mut(), value);
        run.bare = true;
        run
    }

    /// Marks a run rebuilt from a journal image of a bare run.
    pub fn into_bare(mut self) -> Self {
        self.bare = true;
        self
    }

    pub fn is_bare(&self) -> bool {
        self.bare
    }

    pub fn page_count(&self) -> usize {
        self.pages.len()
    }
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: AlignedPage is repr(C) around a byte array; the Vec is contiguous.
        unsafe {
            std::slice::from_raw_parts(
                self.pages.as_ptr().cast::<u8>(),
                self.pages.len() * PAGE_SIZE,
            )
        }
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, with unique access through &mut self.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.pages.as_mut_ptr().cast::<u8>(),
                self.pages.len() * PAGE_SIZE,
            )
        }
    }
}
