//! B+trees over copy-on-write pages. Reads (this file, `cursor.rs`) work on any
//! [`PageSource`]; writes (`write.rs`) need a write transaction. Counted trees
//! answer range counts in O(log n) (`count.rs`).

pub mod count;
pub mod cursor;
pub mod write;

use crate::page::{self, hdr, LeafValue, PageNo, KIND_BRANCH, KIND_LEAF};
use crate::{Error, Result};
use std::path::Path;

/// Depth limit: a tree of 8 KiB pages with at least 4 entries per page needs far
/// fewer levels for any file that fits a 64-bit offset; deeper means a cycle.
pub const MAX_DEPTH: usize = 48;

/// Something that can produce the bytes of a page visible to a transaction.
pub trait PageSource {
    fn page(&self, no: PageNo) -> Result<&[u8]>;
    /// The `pages` pages of the bare run at `no`, unverified (the caller checks the
    /// value's checksum from its leaf cell).
    fn bare_run(&self, no: PageNo, pages: u64) -> Result<&[u8]>;
    fn data_path(&self) -> &Path;
    /// Hints that the pages `runs` (first page, pages) are about to be read in
    /// order (a cursor's next leaves); advisory.
    fn prefetch(&self, _runs: &[(PageNo, u64)]) {}
}

pub(crate) fn corrupt(src: &dyn PageSource, no: PageNo, what: impl Into<String>) -> Error {
    Error::corrupted(src.data_path(), format!("page {no}"), what)
}

/// Fetches a node page and checks it is of an expected kind.
pub(crate) fn node<S: PageSource + ?Sized>(src: &S, no: PageNo) -> Result<&[u8]> {
    let p = src.page(no)?;
    match hdr::kind(p) {
        KIND_BRANCH | KIND_LEAF => Ok(p),
        k => Err(Error::corrupted(
            src.data_path(),
            format!("page {no}"),
            format!("expected a tree node, found page kind {k}"),
        )),
    }
}

/// Resolves a leaf value to its bytes (reading the overflow run if needed).
pub(crate) fn value_bytes<'a, S: PageSource + ?Sized>(
    src: &'a S,
    v: LeafValue<'a>,
) -> Result<&'a [u8]> {
    match v {
        LeafValue::Inline(b) => Ok(b),
        LeafValue::Overflow { start, len } => {
            let run = src.page(start)?;
            let stored = hdr::extra(run);
            if hdr::kind(run) != page::KIND_OVERFLOW
                || stored != len
                || page::OVERFLOW_HEADER as u64 + len > run.len() as u64
            {
                return Err(Error::corrupted(
                    src.data_path(),
                    format!("page {start}"),
                    format!("overflow run does not hold a value of {len} bytes (kind {}, length {stored})", hdr::kind(run)),
                ));
            }
            run.get(page::OVERFLOW_HEADER..page::OVERFLOW_HEADER + len as usize)
                .ok_or_else(|| {
                    Error::corrupted(
                        src.data_path(),
                        format!("page {start}"),
                        format!("overflow run shorter than its value of {len} bytes"),
                    )
                })
        }
        LeafValue::BareRun {
            start,
            len,
            checksum,
        } => {
            let bad =
                |what: String| Error::corrupted(src.data_path(), format!("page {start}"), what);
            let len = page::bare_value_len(len)
                .ok_or_else(|| bad(format!("bare run claims a value of {len} bytes")))?;
            let pages = page::bare_run_pages(len) as u64;
            let value = src
                .bare_run(start, pages)?
                .get(..len)
                .ok_or_else(|| bad(format!("bare run shorter than its value of {len} bytes")))?;
            let actual = page::bare_run_checksum(start, value);
            if actual != checksum {
                return Err(bad(format!(
                    "bare run of a {len}-byte value: checksum mismatch: the leaf cell says {checksum:#010x}, the bytes give {actual:#010x}"
                )));
            }
            Ok(value)
        }
    }
}

/// Point lookup.
pub fn get<'a, S: PageSource + ?Sized>(
    src: &'a S,
    root: PageNo,
    key: &[u8],
) -> Result<Option<&'a [u8]>> {
    if root == 0 {
        return Ok(None);
    }
    let mut no = root;
    for _ in 0..MAX_DEPTH {
        let p = node(src, no)?;
        if hdr::kind(p) == KIND_LEAF {
            return match page::search(p, key) {
                Ok(i) => value_bytes(src, page::leaf_value(p, i)).map(Some),
                Err(_) => Ok(None),
            };
        }
        no = page::branch_child_at(p, page::branch_route(p, key));
    }
    Err(Error::corrupted(
        src.data_path(),
        format!("page {root}"),
        "tree deeper than the depth limit (cycle?)",
    ))
}

/// Levels from `root` down to its leaves (1: the root is a leaf; 0: empty tree),
/// by the leftmost path.
pub(crate) fn depth<S: PageSource + ?Sized>(src: &S, root: PageNo) -> Result<usize> {
    if root == 0 {
        return Ok(0);
    }
    let mut no = root;
    for level in 1..=MAX_DEPTH {
        let p = node(src, no)?;
        if hdr::kind(p) == KIND_LEAF {
            return Ok(level);
        }
        no = hdr::extra(p);
    }
    Err(Error::corrupted(
        src.data_path(),
        format!("page {root}"),
        "tree deeper than the depth limit (cycle?)",
    ))
}

/// Where a lookup of `key` ends: the leaf and its neighbours under the same parent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeafPlace {
    pub leaf: PageNo,
    pub left: Option<PageNo>,
    pub right: Option<PageNo>,
}

/// The leaf a lookup of `key` ends in (with its neighbours), found by reading only
/// the `depth - 1` branch levels above it (`depth` from [`depth`]); None for an
/// empty tree. The leaf itself is not read: a caller asks for it ahead
/// (`prefetch.rs`).
pub(crate) fn leaf_at_depth<S: PageSource + ?Sized>(
    src: &S,
    root: PageNo,
    key: &[u8],
    depth: usize,
) -> Result<Option<LeafPlace>> {
    if root == 0 || depth == 0 {
        return Ok(None);
    }
    let mut place = LeafPlace {
        leaf: root,
        left: None,
        right: None,
    };
    for _ in 1..depth {
        let p = node(src, place.leaf)?;
        if hdr::kind(p) == KIND_LEAF {
            return Err(Error::corrupted(
                src.data_path(),
                format!("page {}", place.leaf),
                "a leaf above the tree's leaf level (leaves at different depths)",
            ));
        }
        // Child n of a branch: the leftmost (`extra`) is 0, cell i's child is i + 1.
        let n = page::branch_route(p, key).wrapping_add(1);
        let fanout = page::branch_fanout(p);
        place = LeafPlace {
            leaf: page::branch_nth_child(p, n),
            left: n.checked_sub(1).map(|l| page::branch_nth_child(p, l)),
            right: (n + 1 < fanout).then(|| page::branch_nth_child(p, n + 1)),
        };
    }
    Ok(Some(place))
}
