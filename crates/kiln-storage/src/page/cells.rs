//! A node's cells: their layout, reading them, binary search over a node's keys, and
//! changing a node in place (insert, remove, compact, rebuild).
//!
//! ```text
//! leaf cell:   key_len u16 | value kind u8 | inline: value_len u32 | key | value
//!                                          | overflow: value_len u32 | run start u64 | key
//!                                          | bare run: value_len u32 | run start u64
//!                                                      | checksum u32 | key
//! branch cell: key_len u16 | child u64 | key
//!     counted: key_len u16 | child u64 | key | entries under the child u64
//! ```

use super::*;

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
pub(super) fn key_head(key: &[u8]) -> u64 {
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
