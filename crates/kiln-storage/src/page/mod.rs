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

mod cells;
mod run;
pub use cells::*;
pub use run::{AlignedPage, PageRun};

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
    use super::cells::key_head;
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
