//! Page layout. Every page is 8 KiB and starts with a 40-byte header:
//!
//! ```text
//! offset size field
//!  0     4    crc32c over bytes 4..end of the page (or run), seeded with the page number
//!  4     1    kind: 1 branch, 2 leaf, 3 overflow run
//!  5     1    node flags: bit 0 on a branch = counted (`BRANCH_COUNTED`); else 0
//!  6     2    entry count (branch: separator keys; leaf: entries; overflow: 0)
//!  8     8    page number (detects misdirected reads and writes)
//! 16     8    id of the transaction that wrote this version
//! 24     2    upper: start of the cell area (cells grow down from the page end)
//! 26     2    fragmented bytes inside the cell area (reclaimed by compaction)
//! 28     4    overflow: number of pages in the run; otherwise 0
//! 32     8    branch: leftmost child; overflow: value length in bytes; leaf: 0
//! 40     ..   slot array: `count` u16 offsets of cells, in key order
//! ```
//! The gap between the slot array and `upper` is always zero, so a page can be
//! journaled as its head and its tail without the gap.

use crate::{Error, Result};
use std::path::Path;

pub const PAGE_SIZE: usize = 8192;
pub type PageNo = u64;
pub const HEADER_SIZE: usize = 40;
/// Pages 0 and 1 of the data file hold the two copies of the file header.
pub const FIRST_DATA_PAGE: PageNo = 2;

pub const KIND_BRANCH: u8 = 1;
pub const KIND_LEAF: u8 = 2;
pub const KIND_OVERFLOW: u8 = 3;

/// Node flag (header byte 5) of a branch of a counted tree (an order-statistic
/// B+tree): each of its cells ends with the number of entries under the cell's
/// child. The leftmost child's count is not stored (the header has no room for it):
/// it is the branch's own total, which its parent's cell (or, for the root, the
/// catalog's entry count) gives, minus the cells' counts. See `btree/count.rs`.
pub const BRANCH_COUNTED: u8 = 1;
/// Bytes of the count that ends a counted branch's cell.
pub const BRANCH_COUNT_SIZE: usize = 8;

const _: () = assert!(PAGE_SIZE.is_multiple_of(crate::io::DIRECT_IO_ALIGN));
const _: () = assert!(PAGE_SIZE <= u16::MAX as usize + 1);

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

// Bounds: fixed header offsets and cell offsets of a page that passed `verify` (or was built here); the hottest path of every read, so the slice's own bounds check is the only one.
#[allow(clippy::indexing_slicing)]
pub fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
// Bounds: as `read_u16`.
#[allow(clippy::indexing_slicing)]
pub fn read_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
// Bounds: as `read_u16`.
#[allow(clippy::indexing_slicing)]
pub fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
// Bounds: as `read_u16`, on pages this process builds.
#[allow(clippy::indexing_slicing)]
pub fn write_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
// Bounds: as `read_u16`, on pages this process builds.
#[allow(clippy::indexing_slicing)]
pub fn write_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
// Bounds: as `read_u16`, on pages this process builds.
#[allow(clippy::indexing_slicing)]
pub fn write_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Header accessors over a page's bytes.
pub mod hdr {
    use super::*;
    // Bounds: byte 4 of the page header: every page is at least `HEADER_SIZE` bytes.
    #[allow(clippy::indexing_slicing)]
    pub fn kind(p: &[u8]) -> u8 {
        p[4]
    }
    // Bounds: byte 5 of the page header, as `kind`.
    #[allow(clippy::indexing_slicing)]
    pub fn flags(p: &[u8]) -> u8 {
        p[5]
    }
    // Bounds: as `flags`.
    #[allow(clippy::indexing_slicing)]
    pub fn set_flags(p: &mut [u8], v: u8) {
        p[5] = v
    }
    pub fn count(p: &[u8]) -> usize {
        read_u16(p, 6) as usize
    }
    pub fn page_no(p: &[u8]) -> PageNo {
        read_u64(p, 8)
    }
    pub fn txn_id(p: &[u8]) -> u64 {
        read_u64(p, 16)
    }
    pub fn upper(p: &[u8]) -> usize {
        read_u16(p, 24) as usize
    }
    pub fn fragmented(p: &[u8]) -> usize {
        read_u16(p, 26) as usize
    }
    pub fn run_pages(p: &[u8]) -> u32 {
        read_u32(p, 28)
    }
    pub fn extra(p: &[u8]) -> u64 {
        read_u64(p, 32)
    }
    pub fn set_count(p: &mut [u8], v: usize) {
        write_u16(p, 6, v as u16)
    }
    pub fn set_page_no(p: &mut [u8], v: PageNo) {
        write_u64(p, 8, v)
    }
    pub fn set_txn_id(p: &mut [u8], v: u64) {
        write_u64(p, 16, v)
    }
    pub fn set_upper(p: &mut [u8], v: usize) {
        // `upper` may equal PAGE_SIZE (empty cell area), which needs 14 bits: fine in u16.
        write_u16(p, 24, v as u16)
    }
    pub fn set_fragmented(p: &mut [u8], v: usize) {
        write_u16(p, 26, v as u16)
    }
    pub fn set_extra(p: &mut [u8], v: u64) {
        write_u64(p, 32, v)
    }
}

/// Initializes an empty branch or leaf page.
// Bounds: `p` is a page buffer of at least `PAGE_SIZE` bytes (asserted in debug builds).
#[allow(clippy::indexing_slicing)]
pub fn init_node(p: &mut [u8], kind: u8, page_no: PageNo) {
    debug_assert!(p.len() >= PAGE_SIZE, "a node needs a whole page");
    debug_assert!(matches!(kind, KIND_BRANCH | KIND_LEAF), "node kind {kind}");
    p[..PAGE_SIZE].fill(0);
    p[4] = kind;
    hdr::set_page_no(p, page_no);
    hdr::set_upper(p, PAGE_SIZE);
}

/// Number of bytes of a run that a checksum covers: a node page, or a whole run.
/// At least a page (or all of `p`): a damaged header that claims a run of no pages
/// must fail its checksum, not make the checksum's range empty.
fn checksummed_len(p: &[u8]) -> usize {
    if hdr::kind(p) == KIND_OVERFLOW {
        (hdr::run_pages(p) as usize * PAGE_SIZE)
            .max(PAGE_SIZE)
            .min(p.len())
    } else {
        PAGE_SIZE.min(p.len())
    }
}

// Bounds: `checksummed_len` is at most `p.len()` and a page is longer than 4 bytes.
#[allow(clippy::indexing_slicing)]
pub fn compute_checksum(p: &[u8], page_no: PageNo) -> u32 {
    let len = checksummed_len(p);
    let seed = crc32c::crc32c(&page_no.to_le_bytes());
    crc32c::crc32c_append(seed, &p[4..len])
}

/// Stamps the transaction id, page number and checksum before a page leaves memory.
pub fn seal(p: &mut [u8], page_no: PageNo, txn_id: u64) {
    // (Fuzz tests seal arbitrary bytes: what makes a page well formed is asserted
    // where the engine seals its own pages, `WriteTxn::seal_dirty`.)
    debug_assert!(p.len() >= PAGE_SIZE, "sealing a page of {} bytes", p.len());
    hdr::set_page_no(p, page_no);
    hdr::set_txn_id(p, txn_id);
    let sum = compute_checksum(p, page_no);
    write_u32(p, 0, sum);
    debug_assert_eq!(
        read_u32(p, 0),
        compute_checksum(p, page_no),
        "checksum written"
    );
}

/// Checks a page read from disk: its checksum, self-identity and structural bounds.
/// `p` may be a whole run (for overflow pages) or at least one page.
pub fn verify(p: &[u8], page_no: PageNo, file: &Path) -> Result<()> {
    let bad = |what: String| Err(Error::corrupted(file, format!("page {page_no}"), what));
    if p.len() < PAGE_SIZE {
        return bad(format!("page truncated to {} bytes", p.len()));
    }
    let kind = hdr::kind(p);
    if !matches!(kind, KIND_BRANCH | KIND_LEAF | KIND_OVERFLOW) {
        return bad(format!(
            "unknown page kind {kind} (page never written, or overwritten)"
        ));
    }
    if kind == KIND_OVERFLOW {
        let run = hdr::run_pages(p) as usize;
        if run == 0 || run * PAGE_SIZE > p.len() {
            return bad(format!("overflow run of {run} pages does not fit"));
        }
    }
    let stored = read_u32(p, 0);
    let actual = compute_checksum(p, page_no);
    if stored != actual {
        return bad(format!(
            "checksum mismatch: stored {stored:#010x}, computed {actual:#010x}"
        ));
    }
    if hdr::page_no(p) != page_no {
        return bad(format!(
            "page claims to be page {} (misdirected write)",
            hdr::page_no(p)
        ));
    }
    if kind != KIND_OVERFLOW {
        check_node_bounds(p).or_else(bad)?;
    }
    debug_assert!(checksummed_len(p) <= p.len() && checksummed_len(p) >= PAGE_SIZE.min(p.len()));
    Ok(())
}

/// Structural checks that make every later slot/cell access in bounds.
// Bounds: each cell offset is checked against the page before its bytes are read.
#[allow(clippy::indexing_slicing)]
pub fn check_node_bounds(p: &[u8]) -> std::result::Result<(), String> {
    let count = hdr::count(p);
    let upper = hdr::upper(p);
    let slots_end = HEADER_SIZE + 2 * count;
    if slots_end > upper || upper > PAGE_SIZE {
        return Err(format!(
            "slot array end {slots_end} beyond cell area start {upper}"
        ));
    }
    let leaf = hdr::kind(p) == KIND_LEAF;
    let flags = hdr::flags(p);
    if flags != 0 && (leaf || flags != BRANCH_COUNTED) {
        return Err(format!(
            "unknown node flags {flags:#04x} on a {} page",
            if leaf { "leaf" } else { "branch" }
        ));
    }
    let count_bytes = if flags == BRANCH_COUNTED {
        BRANCH_COUNT_SIZE
    } else {
        0
    };
    for i in 0..count {
        let off = read_u16(p, HEADER_SIZE + 2 * i) as usize;
        let fixed = if leaf {
            LEAF_CELL_FIXED
        } else {
            BRANCH_CELL_FIXED
        };
        if off < upper || off + fixed > PAGE_SIZE {
            return Err(format!("slot {i} points to {off}, outside the cell area"));
        }
        let key_len = read_u16(p, off) as usize;
        let mut end = off + fixed + key_len + count_bytes;
        if leaf {
            match p[off + 2] {
                VALUE_INLINE => end += read_u32(p, off + 3) as usize,
                VALUE_OVERFLOW => end += OVERFLOW_REF_SIZE,
                VALUE_BARE_RUN => end += BARE_RUN_REF_SIZE,
                other => return Err(format!("cell {i} has unknown value kind {other}")),
            }
        }
        if end > PAGE_SIZE {
            return Err(format!("cell {i} at {off} runs past the page end"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Cells.
//
// leaf cell:   key_len u16 | value kind u8 | inline: value_len u32 | key | value
//                                          | overflow: value_len u32 | run start u64 | key
//                                          | bare run: value_len u32 | run start u64
//                                                      | checksum u32 | key
// branch cell: key_len u16 | child u64 | key
//     counted: key_len u16 | child u64 | key | entries under the child u64
// ---------------------------------------------------------------------------------

pub const VALUE_INLINE: u8 = 0;
/// A value in an overflow run with a page header (written before 2026-11-25;
/// still read, no longer written).
pub const VALUE_OVERFLOW: u8 = 1;
/// A value in a bare run: the value's bytes from the run's first byte, zeros after
/// them, no page header. Its checksum lives in the cell (see `bare_run_checksum`).
/// A 16 KiB value fills two pages instead of three, a third less to write back.
pub const VALUE_BARE_RUN: u8 = 2;
pub const LEAF_CELL_FIXED: usize = 7;
pub const OVERFLOW_REF_SIZE: usize = 8;
pub const BARE_RUN_REF_SIZE: usize = 12;

/// Bytes between a leaf cell's fixed part and its key, by value kind.
#[inline]
pub fn value_ref_size(value_kind: u8) -> usize {
    match value_kind {
        VALUE_OVERFLOW => OVERFLOW_REF_SIZE,
        VALUE_BARE_RUN => BARE_RUN_REF_SIZE,
        _ => 0,
    }
}
pub const BRANCH_CELL_FIXED: usize = 10;

/// Largest key accepted.
pub const MAX_KEY_SIZE: usize = 1024;
/// Largest leaf cell stored inline; larger values move to overflow runs. Chosen so
/// that at least four cells fit in a page, which keeps splits simple and trees shallow.
pub const MAX_INLINE_CELL: usize = (PAGE_SIZE - HEADER_SIZE) / 4 - 2;
/// Largest value accepted (overflow runs are bounded by the u32 run length).
pub const MAX_VALUE_SIZE: usize = 1 << 30;

const _: () = assert!(LEAF_CELL_FIXED + BARE_RUN_REF_SIZE + MAX_KEY_SIZE <= MAX_INLINE_CELL);

pub fn slot(p: &[u8], i: usize) -> usize {
    read_u16(p, HEADER_SIZE + 2 * i) as usize
}

// Bounds: as `cell_size`.
#[allow(clippy::indexing_slicing)]
pub fn cell_key(p: &[u8], i: usize) -> &[u8] {
    let off = slot(p, i);
    let len = read_u16(p, off) as usize;
    let fixed = if hdr::kind(p) == KIND_LEAF {
        LEAF_CELL_FIXED
    } else {
        BRANCH_CELL_FIXED
    };
    let start = off
        + fixed
        + if hdr::kind(p) == KIND_LEAF {
            value_ref_size(p[off + 2])
        } else {
            0
        };
    &p[start..start + len]
}

/// Where a leaf value lives.
pub enum LeafValue<'a> {
    Inline(&'a [u8]),
    Overflow {
        start: PageNo,
        len: u64,
    },
    BareRun {
        start: PageNo,
        len: u64,
        checksum: u32,
    },
}

// Bounds: as `cell_size`.
#[allow(clippy::indexing_slicing)]
pub fn leaf_value(p: &[u8], i: usize) -> LeafValue<'_> {
    let off = slot(p, i);
    let key_len = read_u16(p, off) as usize;
    let value_len = read_u32(p, off + 3) as usize;
    if p[off + 2] == VALUE_OVERFLOW {
        LeafValue::Overflow {
            start: read_u64(p, off + LEAF_CELL_FIXED),
            len: value_len as u64,
        }
    } else if p[off + 2] == VALUE_BARE_RUN {
        LeafValue::BareRun {
            start: read_u64(p, off + LEAF_CELL_FIXED),
            len: value_len as u64,
            checksum: read_u32(p, off + LEAF_CELL_FIXED + 8),
        }
    } else {
        let start = off + LEAF_CELL_FIXED + key_len;
        LeafValue::Inline(&p[start..start + value_len])
    }
}

pub fn branch_child(p: &[u8], i: usize) -> PageNo {
    read_u64(p, slot(p, i) + 2)
}

pub fn set_branch_child(p: &mut [u8], i: usize, child: PageNo) {
    debug_assert!(
        hdr::kind(p) == KIND_BRANCH,
        "a child set in a page of kind {}",
        hdr::kind(p)
    );
    debug_assert!(
        i < hdr::count(p),
        "child of cell {i} set in a branch of {} cells",
        hdr::count(p)
    );
    debug_assert!(
        child >= FIRST_DATA_PAGE,
        "branch child set to header page {child}"
    );
    let off = slot(p, i);
    write_u64(p, off + 2, child);
}

/// Whether a node is a counted branch (`BRANCH_COUNTED`).
#[inline]
pub fn is_counted_branch(p: &[u8]) -> bool {
    hdr::kind(p) == KIND_BRANCH && hdr::flags(p) & BRANCH_COUNTED != 0
}

/// The entry count of the child of cell `i` of a counted branch.
pub fn branch_count(p: &[u8], i: usize) -> u64 {
    let off = slot(p, i);
    read_u64(p, off + BRANCH_CELL_FIXED + read_u16(p, off) as usize)
}

pub fn set_branch_count(p: &mut [u8], i: usize, count: u64) {
    debug_assert!(
        is_counted_branch(p),
        "a count set in a node that keeps none"
    );
    debug_assert!(
        i < hdr::count(p),
        "count of cell {i} set in a branch of {} cells",
        hdr::count(p)
    );
    let off = slot(p, i);
    let at = off + BRANCH_CELL_FIXED + read_u16(p, off) as usize;
    write_u64(p, at, count);
}

/// The count at the end of a counted branch cell's bytes.
pub fn branch_cell_count(cell: &[u8]) -> u64 {
    read_u64(cell, BRANCH_CELL_FIXED + read_u16(cell, 0) as usize)
}

/// Byte size of the cell in slot `i` (excluding its slot).
// Bounds: cell offsets of a page that passed `verify` (cell bounds) or was built here.
#[allow(clippy::indexing_slicing)]
pub fn cell_size(p: &[u8], i: usize) -> usize {
    let off = slot(p, i);
    let key_len = read_u16(p, off) as usize;
    if hdr::kind(p) == KIND_BRANCH {
        return BRANCH_CELL_FIXED
            + key_len
            + if hdr::flags(p) & BRANCH_COUNTED != 0 {
                BRANCH_COUNT_SIZE
            } else {
                0
            };
    }
    match p[off + 2] {
        VALUE_INLINE => LEAF_CELL_FIXED + key_len + read_u32(p, off + 3) as usize,
        kind => LEAF_CELL_FIXED + value_ref_size(kind) + key_len,
    }
}

// Bounds: as `cell_size`.
#[allow(clippy::indexing_slicing)]
pub fn cell_bytes(p: &[u8], i: usize) -> &[u8] {
    let off = slot(p, i);
    &p[off..off + cell_size(p, i)]
}

/// A cell being built: on the stack up to this size (a put's cell was a heap
/// allocation of its own, once per put and per merged key).
pub type CellBytes = smallvec::SmallVec<[u8; CELL_ON_STACK]>;
const CELL_ON_STACK: usize = 256;

// Bounds: the cell is sized for its fixed part, key and value just above.
#[allow(clippy::indexing_slicing)]
pub fn encode_leaf_cell(key: &[u8], value: &[u8]) -> CellBytes {
    // Sized once and filled by range: SmallVec's piecewise extends showed up in
    // W2's profile (a put builds one cell).
    let value_at = LEAF_CELL_FIXED + key.len();
    let len = value_at + value.len();
    if len > CELL_ON_STACK {
        // On the heap anyway: appended piece by piece, the allocation is not zeroed
        // first (a merged 1 KiB document paid a calloc and a memset for it, W8).
        let mut c = CellBytes::with_capacity(len);
        c.extend_from_slice(&(key.len() as u16).to_le_bytes());
        c.push(VALUE_INLINE);
        c.extend_from_slice(&(value.len() as u32).to_le_bytes());
        c.extend_from_slice(key);
        c.extend_from_slice(value);
        return c;
    }
    let mut c = CellBytes::from_elem(0, len);
    c[0..2].copy_from_slice(&(key.len() as u16).to_le_bytes());
    c[2] = VALUE_INLINE;
    c[3..7].copy_from_slice(&(value.len() as u32).to_le_bytes());
    c[LEAF_CELL_FIXED..value_at].copy_from_slice(key);
    c[value_at..].copy_from_slice(value);
    c
}

/// The cell of a value in an overflow run with a page header (tests and the fuzz
/// harness build these to check that such files stay readable).
pub fn encode_overflow_cell(key: &[u8], start: PageNo, value_len: usize) -> CellBytes {
    let mut c = CellBytes::with_capacity(LEAF_CELL_FIXED + OVERFLOW_REF_SIZE + key.len());
    c.extend_from_slice(&(key.len() as u16).to_le_bytes());
    c.push(VALUE_OVERFLOW);
    c.extend_from_slice(&(value_len as u32).to_le_bytes());
    c.extend_from_slice(&start.to_le_bytes());
    c.extend_from_slice(key);
    c
}

/// The cell of a value in a bare run at `start` (see `VALUE_BARE_RUN`).
pub fn encode_bare_run_cell(
    key: &[u8],
    start: PageNo,
    value_len: usize,
    checksum: u32,
) -> CellBytes {
    let mut c = CellBytes::with_capacity(LEAF_CELL_FIXED + BARE_RUN_REF_SIZE + key.len());
    c.extend_from_slice(&(key.len() as u16).to_le_bytes());
    c.push(VALUE_BARE_RUN);
    c.extend_from_slice(&(value_len as u32).to_le_bytes());
    c.extend_from_slice(&start.to_le_bytes());
    c.extend_from_slice(&checksum.to_le_bytes());
    c.extend_from_slice(key);
    c
}

pub fn encode_branch_cell(key: &[u8], child: PageNo) -> Vec<u8> {
    let mut c = Vec::with_capacity(BRANCH_CELL_FIXED + key.len());
    c.extend_from_slice(&(key.len() as u16).to_le_bytes());
    c.extend_from_slice(&child.to_le_bytes());
    c.extend_from_slice(key);
    c
}

/// A counted branch's cell: `encode_branch_cell` and the child's entry count.
pub fn encode_counted_branch_cell(key: &[u8], child: PageNo, count: u64) -> Vec<u8> {
    let mut c = Vec::with_capacity(BRANCH_CELL_FIXED + key.len() + BRANCH_COUNT_SIZE);
    c.extend_from_slice(&(key.len() as u16).to_le_bytes());
    c.extend_from_slice(&child.to_le_bytes());
    c.extend_from_slice(key);
    c.extend_from_slice(&count.to_le_bytes());
    c
}

/// Binary search: Ok(i) if key found at slot i, Err(i) for the insertion point.
///
/// The hot loop of every lookup (W5's random gets spent 80 % of their time here):
/// the page kind is read once, and keys are compared by their first eight bytes as
/// one integer before any byte-wise compare (`key_head`).
pub fn search(p: &[u8], key: &[u8]) -> std::result::Result<usize, usize> {
    let leaf = hdr::kind(p) == KIND_LEAF;
    let head = key_head(key);
    let (mut lo, mut hi) = (0, hdr::count(p));
    while lo < hi {
        let mid = (lo + hi) / 2;
        // The cell compared next is the middle of one half or the other: asking for
        // both now overlaps their cache misses with this one (each step of the
        // search otherwise waits for memory in turn on a cold page).
        if hi - lo > 2 {
            prefetch_cell(p, (lo + mid) / 2);
            prefetch_cell(p, (mid + 1 + hi) / 2);
        }
        let cell = if leaf {
            leaf_cell_key(p, mid)
        } else {
            branch_cell_key(p, mid)
        };
        let order = match key_head(cell).cmp(&head) {
            std::cmp::Ordering::Equal => cell.cmp(key),
            unequal => unequal,
        };
        match order {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Ok(mid),
        }
    }
    Err(lo)
}

/// Asks the CPU to bring the start of `bytes` into the cache (a hint: no effect on
/// what the program computes).
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address; `bytes` is valid anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            bytes.as_ptr().cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Prefetches the start of the cell in slot `i` (its length, flags and key head).
#[inline]
fn prefetch_cell(p: &[u8], i: usize) {
    if let Some(cell) = p.get(slot(p, i)..) {
        prefetch(cell);
    }
}

/// A key's first eight bytes as a big-endian integer, zero-padded. When two keys'
/// heads differ they order as the keys do (the first differing byte decides both;
/// a padding zero sorts a prefix first, as byte order does); equal heads need the
/// full compare.
#[inline]
fn key_head(key: &[u8]) -> u64 {
    match key.first_chunk::<8>() {
        Some(first) => u64::from_be_bytes(*first),
        None => {
            let mut buf = [0u8; 8];
            if let Some(dst) = buf.get_mut(..key.len()) {
                dst.copy_from_slice(key);
            }
            u64::from_be_bytes(buf)
        }
    }
}

/// `cell_key` of a page known to be a leaf.
// Bounds: as `cell_size`.
#[allow(clippy::indexing_slicing)]
#[inline]
fn leaf_cell_key(p: &[u8], i: usize) -> &[u8] {
    let off = slot(p, i);
    let len = read_u16(p, off) as usize;
    let start = off + LEAF_CELL_FIXED + value_ref_size(p[off + 2]);
    &p[start..start + len]
}

/// `cell_key` of a page known to be a branch.
// Bounds: as `cell_size`.
#[allow(clippy::indexing_slicing)]
#[inline]
fn branch_cell_key(p: &[u8], i: usize) -> &[u8] {
    let off = slot(p, i);
    let len = read_u16(p, off) as usize;
    let start = off + BRANCH_CELL_FIXED;
    &p[start..start + len]
}

/// Index of the child of a branch that covers `key`: usize::MAX stands for the
/// leftmost child (keys below the first separator).
pub fn branch_route(p: &[u8], key: &[u8]) -> usize {
    route_of(search(p, key))
}

/// The child a branch search's answer routes to (see `branch_route`): a separator
/// equal to the key routes to its own child, otherwise the one before the
/// insertion point.
pub fn route_of(found: std::result::Result<usize, usize>) -> usize {
    match found {
        Ok(i) => i,
        Err(0) => usize::MAX,
        Err(i) => i - 1,
    }
}

pub fn branch_child_at(p: &[u8], route: usize) -> PageNo {
    if route == usize::MAX {
        hdr::extra(p)
    } else {
        branch_child(p, route)
    }
}

/// Number of children of a branch page.
pub fn branch_fanout(p: &[u8]) -> usize {
    hdr::count(p) + 1
}

/// Child `n` in 0..fanout order (0 is the leftmost).
pub fn branch_nth_child(p: &[u8], n: usize) -> PageNo {
    if n == 0 {
        hdr::extra(p)
    } else {
        branch_child(p, n - 1)
    }
}

pub fn free_space(p: &[u8]) -> usize {
    hdr::upper(p) - (HEADER_SIZE + 2 * hdr::count(p))
}

/// Bytes in use by slots and live cells.
pub fn used_space(p: &[u8]) -> usize {
    PAGE_SIZE - HEADER_SIZE - free_space(p) - hdr::fragmented(p)
}

/// Inserts `cell` at slot `i` if there is room (compacting if that makes room).
/// Returns false when the page is too full.
// Bounds: the free space between the cell array and `upper` was checked to hold the cell just above.
#[allow(clippy::indexing_slicing)]
pub fn insert_cell(p: &mut [u8], i: usize, cell: &[u8]) -> bool {
    let need = cell.len() + 2;
    if free_space(p) < need {
        if free_space(p) + hdr::fragmented(p) < need {
            return false;
        }
        compact(p);
    }
    let count = hdr::count(p);
    debug_assert!(
        i <= count,
        "cell inserted at slot {i} of a node of {count} cells"
    );
    let upper = hdr::upper(p) - cell.len();
    p[upper..upper + cell.len()].copy_from_slice(cell);
    let slots = HEADER_SIZE + 2 * i;
    p.copy_within(slots..HEADER_SIZE + 2 * count, slots + 2);
    write_u16(p, slots, upper as u16);
    hdr::set_count(p, count + 1);
    hdr::set_upper(p, upper);
    debug_assert_keys_ordered_around(p, i);
    true
}

/// A node's keys increase strictly from slot to slot (search depends on it): checks
/// slot `i` against its neighbours after a change there.
#[inline]
fn debug_assert_keys_ordered_around(p: &[u8], i: usize) {
    if cfg!(debug_assertions) {
        let count = hdr::count(p);
        let key = cell_key(p, i);
        debug_assert!(
            i == 0 || cell_key(p, i - 1) < key,
            "node page {}: the key at slot {i} is not above the one before it",
            hdr::page_no(p)
        );
        debug_assert!(
            i + 1 >= count || key < cell_key(p, i + 1),
            "node page {}: the key at slot {i} is not below the one after it",
            hdr::page_no(p)
        );
    }
}

/// Removes slot `i`; its cell becomes fragmented space (zeroed, to keep the page
/// image compressible and free of stale data).
// Bounds: `i < count`, and the cell array and the cell lie inside the page.
#[allow(clippy::indexing_slicing)]
pub fn remove_cell(p: &mut [u8], i: usize) {
    let count = hdr::count(p);
    debug_assert!(i < count, "slot {i} removed from a node of {count} cells");
    let off = slot(p, i);
    let size = cell_size(p, i);
    p[off..off + size].fill(0);
    let slots = HEADER_SIZE + 2 * i;
    p.copy_within(slots + 2..HEADER_SIZE + 2 * count, slots);
    let last = HEADER_SIZE + 2 * (count - 1);
    p[last..last + 2].fill(0);
    hdr::set_count(p, count - 1);
    if off == hdr::upper(p) {
        hdr::set_upper(p, off + size);
        // Space right at the boundary is reclaimed at once; the fragmented counter
        // only tracks holes further in.
    } else {
        hdr::set_fragmented(p, hdr::fragmented(p) + size);
    }
}

/// Rewrites the cell area without holes.
pub fn compact(p: &mut [u8]) {
    // From a copy of the page, so that no cell needs an allocation of its own.
    let copy: [u8; PAGE_SIZE] = match p.get(..PAGE_SIZE).map(<[u8; PAGE_SIZE]>::try_from) {
        Some(Ok(copy)) => copy,
        _ => panic!("compact: a node page is {PAGE_SIZE} bytes, not {}", p.len()),
    };
    let count = hdr::count(&copy);
    rebuild_from(p, count, (0..count).map(|i| cell_bytes(&copy, i)));
}

/// Replaces the entries of a node page with `cells` (in order). Header fields other
/// than count/upper/fragmented are kept.
// Bounds: the cells were checked to fit the page (`cells_space`) by the caller; `upper` moves down from `PAGE_SIZE` by each cell's length.
#[allow(clippy::indexing_slicing)]
pub fn rebuild<C: AsRef<[u8]>>(p: &mut [u8], cells: &[C]) {
    rebuild_from(p, cells.len(), cells.iter().map(AsRef::as_ref));
}

/// `rebuild` from `count` cells borrowed from elsewhere (never from `p`).
// Bounds: as `rebuild`'s.
#[allow(clippy::indexing_slicing)]
fn rebuild_from<'c>(p: &mut [u8], count: usize, cells: impl Iterator<Item = &'c [u8]>) {
    let mut upper = PAGE_SIZE;
    let mut written = 0;
    for (i, c) in cells.enumerate() {
        upper = upper
            .checked_sub(c.len())
            .filter(|&u| u >= HEADER_SIZE + 2 * (i + 1))
            .expect("rebuild overfilled a page");
        p[upper..upper + c.len()].copy_from_slice(c);
        write_u16(p, HEADER_SIZE + 2 * i, upper as u16);
        written += 1;
    }
    assert_eq!(written, count, "rebuild was given a wrong cell count");
    debug_assert!(
        matches!(hdr::kind(p), KIND_LEAF | KIND_BRANCH),
        "rebuild of a page of kind {}",
        hdr::kind(p)
    );
    // Cells fill [upper, PAGE_SIZE) and slots [HEADER_SIZE, slots end) whole: only
    // the gap between them keeps old bytes, zeroed (no stale data in an image).
    p[HEADER_SIZE + 2 * count..upper].fill(0);
    hdr::set_count(p, count);
    hdr::set_upper(p, upper);
    hdr::set_fragmented(p, 0);
    if cfg!(debug_assertions) {
        for i in 1..count {
            debug_assert_keys_ordered_around(p, i);
        }
    }
}

/// Space a set of cells needs in a page (cells plus slots).
pub fn cells_space<C: AsRef<[u8]>>(cells: &[C]) -> usize {
    cells.iter().map(|c| c.as_ref().len() + 2).sum()
}

pub const NODE_CAPACITY: usize = PAGE_SIZE - HEADER_SIZE;

/// The bytes of a page image worth journaling: [0, head) and [tail, len). For node
/// pages the gap between slot array and cell area is zero by construction.
pub fn image_extent(p: &[u8]) -> (usize, usize) {
    match hdr::kind(p) {
        KIND_BRANCH | KIND_LEAF => (HEADER_SIZE + 2 * hdr::count(p), hdr::upper(p)),
        KIND_OVERFLOW => {
            let used = OVERFLOW_HEADER + hdr::extra(p) as usize;
            (used.min(p.len()), p.len())
        }
        _ => (p.len(), p.len()),
    }
}

/// Overflow runs: the header, then the value bytes.
pub const OVERFLOW_HEADER: usize = HEADER_SIZE;

pub fn overflow_run_pages(value_len: usize) -> usize {
    (OVERFLOW_HEADER + value_len).div_ceil(PAGE_SIZE)
}

/// How much of a bare run a journal image keeps: up to its last non-zero byte (the
/// zeros after the value are restored by the replay), but always into its last
/// page, so that the image's gap stays under a page as a full image's must.
// Bounds: `floor <= run.len()` by `saturating_sub`.
#[allow(clippy::indexing_slicing)]
pub fn bare_image_len(run: &[u8]) -> usize {
    // Only the last page can hold the zeros to leave out: look no further back.
    let floor = run.len().saturating_sub(PAGE_SIZE - 1);
    floor
        + run[floor..]
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |i| i + 1)
}

/// Test hook: when set, large values are written in headered overflow runs, the
/// format before bare runs, so that a test can build such a file and check that it
/// stays readable. Process-wide: a test that sets it runs in a binary of its own.
#[doc(hidden)]
pub static WRITE_HEADERED_OVERFLOW_RUNS_FOR_TESTS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Pages of a bare run holding `value_len` bytes.
pub fn bare_run_pages(value_len: usize) -> usize {
    value_len.div_ceil(PAGE_SIZE).max(1)
}

/// A bare run's value length as its leaf cell gives it, if it is one a value can
/// have (a damaged cell could claim more than `MAX_VALUE_SIZE`).
pub fn bare_value_len(len: u64) -> Option<usize> {
    usize::try_from(len).ok().filter(|&l| l <= MAX_VALUE_SIZE)
}

/// The checksum a bare run's cell carries: crc32c of the value, seeded with the
/// run's first page number as page checksums are (a run read from the wrong place
/// fails it). It covers the value only: the zeros after it are never read.
pub fn bare_run_checksum(start: PageNo, value: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&start.to_le_bytes()), value)
}

/// Fills a bare run: the value, then zeros (`run` may hold old bytes).
// Bounds: the run was allocated for `bare_run_pages(value.len())` pages.
#[allow(clippy::indexing_slicing)]
pub fn init_bare_run(run: &mut [u8], value: &[u8]) {
    run[..value.len()].copy_from_slice(value);
    run[value.len()..].fill(0);
}

/// Fills an overflow run: header, value, and zeros after it (`run` may hold old bytes).
// Bounds: the run was allocated for `OVERFLOW_HEADER + value.len()` bytes just above.
#[allow(clippy::indexing_slicing)]
pub fn init_overflow(run: &mut [u8], value: &[u8]) {
    let pages = run.len() / PAGE_SIZE;
    run[..OVERFLOW_HEADER].fill(0);
    run[OVERFLOW_HEADER + value.len()..].fill(0);
    run[4] = KIND_OVERFLOW;
    write_u32(run, 28, pages as u32);
    hdr::set_extra(run, value.len() as u64);
    run[OVERFLOW_HEADER..OVERFLOW_HEADER + value.len()].copy_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::key_head;
    use proptest::prelude::*;

    /// Head, zeros, tail, whatever the buffer held before (a pooled run of the
    /// same size, dropped with other bytes, is taken first).
    #[test]
    fn a_run_from_head_and_tail_has_zeros_between() {
        for pages in [1usize, 2, 3, 9] {
            let total = pages * super::PAGE_SIZE;
            for (head, tail) in [(0, 0), (100, 0), (0, 100), (4000, 3000), (total - 5, 5)] {
                drop(super::PageRun::from_bytes(&vec![0xEEu8; total]));
                let run = super::PageRun::from_head_tail(pages, &vec![1u8; head], &vec![2u8; tail]);
                let b = run.bytes();
                assert_eq!(b.len(), total);
                assert!(
                    b[..head].iter().all(|&x| x == 1),
                    "{pages} pages, {head}+{tail}"
                );
                assert!(
                    b[head..total - tail].iter().all(|&x| x == 0),
                    "{pages} pages, {head}+{tail}"
                );
                assert!(
                    b[total - tail..].iter().all(|&x| x == 2),
                    "{pages} pages, {head}+{tail}"
                );
            }
        }
    }

    proptest! {
        /// Differing heads order two keys as the bytes do; the search relies on it.
        #[test]
        fn key_heads_order_as_bytes(
            a in proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(255u8), any::<u8>()], 0..12),
            b in proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(255u8), any::<u8>()], 0..12),
        ) {
            let (ha, hb) = (key_head(&a), key_head(&b));
            if ha != hb {
                prop_assert_eq!(ha.cmp(&hb), a.cmp(&b));
            }
        }
    }

    /// A damaged header may claim an overflow run of no pages: sealing it (the fuzz
    /// tests reseal mutated pages) and verifying it must not panic.
    #[test]
    fn an_overflow_header_of_no_pages_is_rejected_without_panicking() {
        let mut p = vec![0u8; super::PAGE_SIZE];
        p[4] = super::KIND_OVERFLOW;
        super::seal(&mut p, 9, 1);
        let err = super::verify(&p, 9, std::path::Path::new("data")).unwrap_err();
        assert!(err.to_string().contains("overflow run of 0 pages"), "{err}");
    }

    /// Runs built from a prefix hold the prefix, then zeros to the end, whether their
    /// buffer is fresh or recycled with old bytes in it.
    #[test]
    fn runs_from_a_prefix_are_zero_after_it_fresh_or_recycled() {
        use super::{PageRun, PAGE_SIZE};
        for round in 0..3 {
            // Dirty buffers of every pooled size go back to the pool on drop.
            for pages in 1..=4 {
                let mut junk = PageRun::zeroed(pages);
                junk.bytes_mut().fill(0xAB);
            }
            for len in [
                0,
                1,
                PAGE_SIZE - 1,
                PAGE_SIZE,
                PAGE_SIZE + 7,
                2 * PAGE_SIZE,
                16_384 + 5,
            ] {
                let value: Vec<u8> = (0..len).map(|i| (i * 7 + round) as u8 | 1).collect();
                let run = PageRun::bare_value(&value);
                assert!(run.is_bare());
                assert_eq!(run.page_count(), len.div_ceil(PAGE_SIZE).max(1), "{len}");
                assert_eq!(&run.bytes()[..len], &value[..], "{len}");
                assert!(run.bytes()[len..].iter().all(|&b| b == 0), "{len}");
                let copy = PageRun::from_bytes(&value);
                assert!(!copy.is_bare());
                assert_eq!(&copy.bytes()[..len], &value[..], "{len}");
                assert!(copy.bytes()[len..].iter().all(|&b| b == 0), "{len}");
            }
            for pages in [1, 3, 5] {
                assert!(PageRun::zeroed(pages).bytes().iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn key_heads_of_prefixes() {
        assert!(key_head(b"ab") < key_head(b"ab\x01"));
        assert_eq!(key_head(b"ab"), key_head(b"ab\0"));
        assert_eq!(key_head(b""), 0);
        assert_eq!(key_head(b"12345678"), key_head(b"123456789"));
    }
}
