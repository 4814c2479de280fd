//! Range counts in O(log n) over counted trees (order-statistic B+trees): each
//! branch cell of a counted tree ends with its child's entry count (`page/cells.rs`,
//! `BRANCH_COUNTED`), kept by every insert, delete, split and merge (`write.rs`).
//! The leftmost child's count is implied: the branch's total (from its parent's
//! cell, or the catalog's entry count at the root) minus its cells' counts.
//!
//! `rank` descends one path summing the counts of the children left of it; a range's
//! count is the difference of two ranks. Each leaf reached must hold as many entries
//! as the counts above it say, or the tree is reported corrupted: a drifted count on
//! a descent's path is caught by that reader (counts off its path are summed
//! unverified: `kiln check` verifies them all).

use super::{corrupt, node, PageSource, MAX_DEPTH};
use crate::page::{self, hdr, PageNo, KIND_LEAF};
use crate::Result;
use std::ops::Bound;

/// The entry counts of a counted branch's children, leftmost first (its implied
/// count computed from `total`).
pub(crate) fn child_counts(
    src: &dyn PageSource,
    no: PageNo,
    p: &[u8],
    total: u64,
) -> Result<Vec<u64>> {
    if !page::is_counted_branch(p) {
        return Err(corrupt(
            src,
            no,
            "a branch of a counted tree without counts",
        ));
    }
    let n = hdr::count(p);
    let mut counts = Vec::with_capacity(n + 1);
    counts.push(0);
    let mut stored: u64 = 0;
    for i in 0..n {
        let c = page::branch_count(p, i);
        stored = stored
            .checked_add(c)
            .ok_or_else(|| corrupt(src, no, "counted branch: its cells' counts overflow u64"))?;
        counts.push(c);
    }
    let leftmost = total.checked_sub(stored).ok_or_else(|| {
        corrupt(
            src,
            no,
            format!(
                "counted branch: its cells count {stored} entries, more than the {total} its parent gives it"
            ),
        )
    })?;
    if let Some(first) = counts.first_mut() {
        *first = leftmost;
    }
    Ok(counts)
}

/// Number of entries of the counted tree at `root` (holding `total` entries) below
/// `key`, or at or below it when `inclusive`.
pub fn rank(
    src: &dyn PageSource,
    root: PageNo,
    total: u64,
    key: &[u8],
    inclusive: bool,
) -> Result<u64> {
    if root == 0 {
        return Ok(0);
    }
    let (mut no, mut below, mut acc) = (root, total, 0u64);
    for _ in 0..MAX_DEPTH {
        let p = node(src, no)?;
        if hdr::kind(p) == KIND_LEAF {
            let n = hdr::count(p) as u64;
            if n != below {
                return Err(corrupt(
                    src,
                    no,
                    format!("leaf holds {n} entries, the counts above it say {below}"),
                ));
            }
            let at = match page::search(p, key) {
                Ok(i) => i + usize::from(inclusive),
                Err(i) => i,
            };
            return Ok(acc + at as u64);
        }
        let counts = child_counts(src, no, p, below)?;
        let route = page::branch_route(p, key);
        let child = if route == usize::MAX { 0 } else { route + 1 };
        acc += counts.iter().take(child).sum::<u64>();
        below = counts.get(child).copied().unwrap_or_default();
        no = page::branch_nth_child(p, child);
    }
    Err(corrupt(
        src,
        root,
        "tree deeper than the depth limit (cycle?)",
    ))
}

/// Number of entries of the counted tree at `root` (holding `total` entries) with a
/// key inside (`lo`, `hi`): two descents, whatever the range's size.
pub fn count_range(
    src: &dyn PageSource,
    root: PageNo,
    total: u64,
    lo: Bound<&[u8]>,
    hi: Bound<&[u8]>,
) -> Result<u64> {
    let start = match lo {
        Bound::Unbounded => 0,
        Bound::Included(k) => rank(src, root, total, k, false)?,
        Bound::Excluded(k) => rank(src, root, total, k, true)?,
    };
    let end = match hi {
        Bound::Unbounded => total,
        Bound::Included(k) => rank(src, root, total, k, true)?,
        Bound::Excluded(k) => rank(src, root, total, k, false)?,
    };
    Ok(end.saturating_sub(start))
}
