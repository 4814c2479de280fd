//! Tree mutations, copy-on-write: every page on the path to a change is copied to a
//! fresh page number inside the write transaction, so readers of older snapshots
//! keep seeing the old pages untouched.
//!
//! A circle, on purpose: these are `WriteTxn` methods (btree -> txn) and the
//! transaction reads its trees through `btree` (txn -> btree). A mutation takes and
//! frees pages through the transaction's bookkeeping (`txn/pages.rs`, which keeps
//! them private to it), and the tree code is the only user of that bookkeeping;
//! passing the bookkeeping as a separate object would mean a second borrow of the
//! transaction on every page access in the hot path.

use super::{node, PageSource, MAX_DEPTH};
use crate::page::{
    self, hdr, LeafValue, PageNo, PageRun, KIND_BRANCH, KIND_LEAF, NODE_CAPACITY, PAGE_SIZE,
};
use crate::txn::WriteTxn;
use crate::Result;

/// A node below this many used bytes is merged with a sibling when they fit together.
const UNDERFLOW_BYTES: usize = NODE_CAPACITY / 4;

/// What an insert below a branch left for the branch to do.
enum Outcome {
    Done,
    /// The child split; the branch gets a cell for the new right node.
    Split(Split),
    /// The leaf child did not hold its new cell and was left unchanged: these are
    /// all its cells, the new one included, for the branch to spread over the leaf
    /// and a sibling (`place_overflow`).
    Overflow(FlatCells),
}

/// Two adjacent leaves whose cells take at most this many bytes are refilled evenly
/// instead of split: each keeps at least 1/16 of a page free, so the next insert into
/// either does not overflow at once (which would copy both again).
const REDISTRIBUTE_MAX_BYTES: usize = 2 * NODE_CAPACITY - NODE_CAPACITY / 8;

struct Split {
    separator: Vec<u8>,
    right: PageNo,
    /// Entries under `right` (kept for counted trees only; 0 otherwise).
    right_count: u64,
}

/// A counted tree's count that went below zero or past u64: the tree's counts
/// disagree with its entries.
fn bad_count(txn: &WriteTxn<'_>, no: PageNo, what: &str) -> crate::Error {
    super::corrupt(txn, no, format!("counted branch: {what}"))
}

/// The branch cell for a split's right node (counted trees carry its count).
fn split_cell(s: &Split, counted: bool) -> Vec<u8> {
    if counted {
        page::encode_counted_branch_cell(&s.separator, s.right, s.right_count)
    } else {
        page::encode_branch_cell(&s.separator, s.right)
    }
}

// Bounds: a cell of a node this transaction holds: pages read from disk passed `page::verify` (cell bounds), cells built here are well formed.
#[allow(clippy::indexing_slicing)]
fn cell_key_of(kind: u8, cell: &[u8]) -> &[u8] {
    let len = page::read_u16(cell, 0) as usize;
    let start = if kind == KIND_BRANCH {
        page::BRANCH_CELL_FIXED
    } else {
        page::LEAF_CELL_FIXED + page::value_ref_size(cell[2])
    };
    &cell[start..start + len]
}

fn node_cells(p: &[u8]) -> Vec<Vec<u8>> {
    (0..hdr::count(p))
        .map(|i| page::cell_bytes(p, i).to_vec())
        .collect()
}

/// Cells copied out of nodes into one buffer: what an overflowing leaf and its
/// sibling hold while they are spread over two or three pages. A vector per cell
/// (`node_cells`) cost a random fill more in the allocator than in the tree.
struct FlatCells {
    bytes: Vec<u8>,
    /// Each cell's (start, end) in `bytes`, in key order.
    spans: Vec<(usize, usize)>,
}

impl FlatCells {
    /// The cells of node `p` with `cell` inserted at slot `at`.
    fn of_node_with(p: &[u8], at: usize, cell: &[u8]) -> FlatCells {
        let count = hdr::count(p);
        let mut flat = FlatCells {
            bytes: Vec::with_capacity(2 * PAGE_SIZE),
            spans: Vec::with_capacity(3 * (count + 1)),
        };
        for i in 0..count {
            if i == at {
                flat.push(cell);
            }
            flat.push(page::cell_bytes(p, i));
        }
        if at >= count {
            flat.push(cell);
        }
        flat
    }

    fn push(&mut self, cell: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(cell);
        self.spans.push((start, self.bytes.len()));
    }

    /// Appends the cells of node `p`, placed before the ones held when `before`.
    fn add_node(&mut self, p: &[u8], before: bool) {
        let held = self.spans.len();
        for i in 0..hdr::count(p) {
            self.push(page::cell_bytes(p, i));
        }
        if before {
            self.spans.rotate_left(held);
        }
    }

    // Bounds: spans were made by `push` inside `bytes`.
    #[allow(clippy::indexing_slicing)]
    fn slices(&self) -> Vec<&[u8]> {
        self.spans.iter().map(|&(s, e)| &self.bytes[s..e]).collect()
    }

    fn to_vecs(&self) -> Vec<Vec<u8>> {
        self.slices().into_iter().map(<[u8]>::to_vec).collect()
    }
}

/// Where to cut `cells` so both halves fit and are roughly equal in bytes.
fn split_point<C: AsRef<[u8]>>(cells: &[C]) -> usize {
    let total = page::cells_space(cells);
    let mut acc = 0;
    for (i, c) in cells.iter().enumerate() {
        acc += c.as_ref().len() + 2;
        if acc >= total / 2 {
            // Keep at least one cell on each side.
            return (i + 1).clamp(1, cells.len() - 1);
        }
    }
    cells.len() - 1
}

/// Cuts `cells` into `parts` runs of about equal bytes, each non-empty and fitting a
/// node; `None` when no such cut was found (cells too large for the count of parts).
fn cut_evenly<C: AsRef<[u8]>>(cells: &[C], parts: usize) -> Option<Vec<usize>> {
    let total = page::cells_space(cells);
    let mut cuts = Vec::with_capacity(parts - 1);
    let mut acc = 0;
    for (i, c) in cells.iter().enumerate() {
        if cuts.len() + 1 == parts {
            break;
        }
        let size = c.as_ref().len() + 2;
        // Cut before cell i when its middle lies past the next boundary.
        let boundary = total * (cuts.len() + 1) / parts;
        if i > cuts.last().copied().unwrap_or(0) && acc + size / 2 > boundary {
            cuts.push(i);
        }
        acc += size;
    }
    if cuts.len() + 1 != parts {
        return None;
    }
    let mut start = 0;
    for end in cuts.iter().copied().chain(std::iter::once(cells.len())) {
        if end <= start || page::cells_space(cells.get(start..end)?) > NODE_CAPACITY {
            return None;
        }
        start = end;
    }
    Some(cuts)
}

/// Where to cut when a cell appended at the end of a right-edge node overflows it:
/// everything before it stays. A leaf's right half is the new cell alone; a branch
/// keeps one separator on the right, since the middle separator moves up (so the
/// last old one goes up and the new one stays with its child).
fn append_split_point(kind: u8, cells: usize) -> usize {
    if kind == KIND_LEAF {
        cells - 1
    } else {
        cells.saturating_sub(2).max(1)
    }
}

/// `page::search`, first checking the last key when `at_right_edge`: there, keys
/// beyond every key of the node are the common case (appends), answered with one
/// comparison instead of a binary search.
fn search_for_insert(
    p: &[u8],
    key: &[u8],
    at_right_edge: bool,
) -> std::result::Result<usize, usize> {
    let count = hdr::count(p);
    if at_right_edge && count > 0 && page::cell_key(p, count - 1) < key {
        return Err(count);
    }
    page::search(p, key)
}

impl WriteTxn<'_> {
    fn leaf_cell_for(&mut self, key: &[u8], value: &[u8]) -> page::CellBytes {
        if page::LEAF_CELL_FIXED + key.len() + value.len() <= page::MAX_INLINE_CELL {
            return page::encode_leaf_cell(key, value);
        }
        if page::WRITE_HEADERED_OVERFLOW_RUNS_FOR_TESTS.load(std::sync::atomic::Ordering::Relaxed) {
            let n = page::overflow_run_pages(value.len());
            let start = self.take_pages(n as u64);
            let mut run = PageRun::scratch(n);
            page::init_overflow(run.bytes_mut(), value);
            self.insert_dirty(start, run);
            return page::encode_overflow_cell(key, start, value.len());
        }
        let start = self.take_pages(page::bare_run_pages(value.len()) as u64);
        self.insert_dirty(start, PageRun::bare_value(value));
        page::encode_bare_run_cell(
            key,
            start,
            value.len(),
            page::bare_run_checksum(start, value),
        )
    }

    /// Frees the overflow run a leaf cell points to, if any.
    fn free_value(&mut self, leaf: PageNo, i: usize) -> Result<()> {
        let p = node(&*self, leaf)?;
        let run = match page::leaf_value(p, i) {
            LeafValue::Inline(_) => None,
            // The cell alone says how long a bare run is: no need to read it.
            LeafValue::BareRun { start, len, .. } => {
                let pages = page::bare_value_len(len)
                    .map(page::bare_run_pages)
                    .ok_or_else(|| {
                        super::corrupt(
                            &*self,
                            leaf,
                            format!("a leaf cell claims a value of {len} bytes"),
                        )
                    })?;
                Some((start, pages as u64))
            }
            LeafValue::Overflow { start, .. } => {
                let run = self.page(start)?;
                if hdr::kind(run) != page::KIND_OVERFLOW {
                    return Err(super::corrupt(
                        &*self,
                        start,
                        "leaf points to a page that is not an overflow run",
                    ));
                }
                Some((start, hdr::run_pages(run) as u64))
            }
        };
        if let Some((start, pages)) = run {
            self.free_pages(start, pages);
        }
        Ok(())
    }

    /// A new branch node, counted if its tree is.
    fn new_branch(&mut self, counted: bool) -> PageNo {
        let no = self.new_node(KIND_BRANCH);
        if counted {
            hdr::set_flags(self.dirty_mut(no), page::BRANCH_COUNTED);
        }
        no
    }

    /// Inserts or replaces; returns the new root and whether the key existed.
    /// `counted`: the tree keeps entry counts in its branches (see `btree/count.rs`).
    pub(crate) fn tree_put(
        &mut self,
        root: PageNo,
        counted: bool,
        key: &[u8],
        value: &[u8],
    ) -> Result<(PageNo, bool)> {
        let cell = self.leaf_cell_for(key, value);
        if root == 0 {
            let leaf = self.new_node(KIND_LEAF);
            let inserted = page::insert_cell(self.dirty_mut(leaf), 0, &cell);
            assert!(inserted, "a cell always fits in an empty leaf");
            return Ok((leaf, false));
        }
        let (new_root, outcome, existed) = self.insert_rec(root, counted, key, &cell, 0, true)?;
        let split = match outcome {
            Outcome::Done => return Ok((new_root, existed)),
            Outcome::Split(s) => s,
            // A root leaf splits itself (`insert_rec` at depth 0).
            Outcome::Overflow(_) => {
                return Err(super::corrupt(
                    &*self,
                    new_root,
                    "a root leaf overflowed without splitting",
                ))
            }
        };
        let top = self.new_branch(counted);
        let p = self.dirty_mut(top);
        hdr::set_extra(p, new_root);
        // The old root, now leftmost, has the rest: its count is implied.
        let inserted = page::insert_cell(p, 0, &split_cell(&split, counted));
        assert!(inserted, "a separator always fits in an empty branch");
        Ok((top, existed))
    }

    /// `rightmost`: `no` is the last node of its level (every ancestor routed to its
    /// last child), where ascending keys (appends) arrive.
    fn insert_rec(
        &mut self,
        no: PageNo,
        counted: bool,
        key: &[u8],
        cell: &[u8],
        depth: usize,
        rightmost: bool,
    ) -> Result<(PageNo, Outcome, bool)> {
        if depth >= MAX_DEPTH {
            return Err(super::corrupt(
                &*self,
                no,
                "tree deeper than the depth limit",
            ));
        }
        let no = self.writable(no)?;
        if hdr::kind(self.dirty_mut(no)) == KIND_LEAF {
            let (outcome, existed) = self.insert_in_leaf(no, key, cell, depth, rightmost)?;
            return Ok((no, outcome, existed));
        }
        let p = self.dirty_mut(no);
        let route = page::route_of(search_for_insert(p, key, rightmost));
        let last_route = hdr::count(p).wrapping_sub(1);
        let child = page::branch_child_at(p, route);
        let child_rightmost = rightmost && route == last_route;
        let (new_child, outcome, existed) =
            self.insert_rec(child, counted, key, cell, depth + 1, child_rightmost)?;
        set_route_child(self.dirty_mut(no), route, new_child);
        if counted && route != usize::MAX {
            self.count_child_insert(no, route, &outcome, existed)?;
        }
        let at = if route == usize::MAX { 0 } else { route + 1 };
        let split = match outcome {
            Outcome::Done => None,
            Outcome::Split(s) => {
                self.insert_or_split(no, at, &split_cell(&s, counted), rightmost)?
            }
            Outcome::Overflow(cells) => self.place_overflow(no, at, cells, counted)?,
        };
        Ok((no, split.map_or(Outcome::Done, Outcome::Split), existed))
    }

    /// Puts `cell` (for `key`) in leaf `no`, which this transaction owns, replacing
    /// the key's cell if it has one. Returns what the parent must do (nothing, take
    /// a split, or spread an overflow) and whether the key existed.
    fn insert_in_leaf(
        &mut self,
        no: PageNo,
        key: &[u8],
        cell: &[u8],
        depth: usize,
        rightmost: bool,
    ) -> Result<(Outcome, bool)> {
        let (idx, existed) = match search_for_insert(self.dirty_mut(no), key, rightmost) {
            Ok(i) => {
                self.free_value(no, i)?;
                page::remove_cell(self.dirty_mut(no), i);
                (i, true)
            }
            Err(i) => (i, false),
        };
        if page::insert_cell(self.dirty_mut(no), idx, cell) {
            return Ok((Outcome::Done, existed));
        }
        // Appends at the right edge split there (full pages for ascending keys);
        // any other overflow is the parent's to spread over siblings.
        let appended = rightmost && idx == hdr::count(self.dirty_mut(no));
        if depth == 0 || appended {
            let mut cells = node_cells(self.dirty_mut(no));
            cells.insert(idx, cell.to_vec());
            let split = self.split_cells(no, cells, appended)?;
            return Ok((Outcome::Split(split), existed));
        }
        let cells = FlatCells::of_node_with(self.dirty_mut(no), idx, cell);
        Ok((Outcome::Overflow(cells), existed))
    }

    /// The count of child `route` of counted branch `no` after an insert below it:
    /// one more if the key is new, less what its split moved to the new right
    /// sibling. The leftmost child's count is implied (the caller skips it); every
    /// ancestor's cell on the path moves by the same one. An overflowing child
    /// counts its new cell here; `place_overflow` then sets the counts of the nodes
    /// it spread the cells over.
    fn count_child_insert(
        &mut self,
        no: PageNo,
        route: usize,
        outcome: &Outcome,
        existed: bool,
    ) -> Result<()> {
        let moved = match outcome {
            Outcome::Split(s) => s.right_count,
            _ => 0,
        };
        let count = page::branch_count(self.dirty_mut(no), route)
            .checked_add(u64::from(!existed))
            .and_then(|c| c.checked_sub(moved));
        let Some(count) = count else {
            return Err(bad_count(self, no, "a child's count went below zero"));
        };
        page::set_branch_count(self.dirty_mut(no), route, count);
        Ok(())
    }

    /// Places the cells of child `n` of `parent`, a leaf that overflowed, B*-tree
    /// style: with the adjacent sibling holding fewer bytes, refilled evenly into
    /// the two when they fit (no new page), else spread over three (the two and a
    /// new one, each about 2/3 full). Splitting a leaf in halves left leaves 67% full
    /// under random keys (measured at 1M documents, docs/benchmarks.md "SPACE");
    /// this keeps them above 2/3 and about 80% on average. Returns the parent's split
    /// if its new or longer separators do not fit it.
    fn place_overflow(
        &mut self,
        parent: PageNo,
        n: usize,
        mut cells: FlatCells,
        counted: bool,
    ) -> Result<Option<Split>> {
        let me = page::branch_nth_child(self.dirty_mut(parent), n);
        let Some((sib, sib_no)) = self.emptier_sibling(parent, n)? else {
            // An only child (a branch emptied by deletes): split it alone.
            let s = self.split_cells(me, cells.to_vecs(), false)?;
            return self.insert_or_split(parent, n, &split_cell(&s, counted), false);
        };
        let sib_no = self.writable(sib_no)?;
        cells.add_node(self.dirty_mut(sib_no), sib < n);
        let (a, pages) = if sib < n {
            (sib, [sib_no, me])
        } else {
            (n, [me, sib_no])
        };
        let all = cells.slices();
        let cuts = if page::cells_space(&all) <= REDISTRIBUTE_MAX_BYTES {
            cut_evenly(&all, 2).or_else(|| cut_evenly(&all, 3))
        } else {
            cut_evenly(&all, 3)
        };
        let Some(cuts) = cuts else {
            return Err(super::corrupt(
                &*self,
                me,
                "leaf cells too large to spread over three pages",
            ));
        };
        let mut nos = pages.to_vec();
        if cuts.len() == 2 {
            nos.push(self.new_node(KIND_LEAF));
        }
        let mut parts = Vec::with_capacity(nos.len());
        let mut start = 0;
        for (&no, end) in nos.iter().zip(cuts.iter().copied().chain([all.len()])) {
            let part = all.get(start..end).unwrap_or_default();
            page::rebuild(self.dirty_mut(no), part);
            parts.push((no, part));
            start = end;
        }
        self.relink_spread(parent, a, &parts, counted)
    }

    /// Of the two siblings next to child `n` of `parent`, the leaf holding fewer
    /// bytes (its position and page), or none for an only child.
    fn emptier_sibling(&mut self, parent: PageNo, n: usize) -> Result<Option<(usize, PageNo)>> {
        let pp = self.dirty_mut(parent);
        let fanout = page::branch_fanout(pp);
        let mut best: Option<(usize, PageNo, usize)> = None;
        let mut siblings = [n.checked_sub(1), (n + 1 < fanout).then_some(n + 1)]
            .map(|s| s.map(|s| (s, page::branch_nth_child(pp, s))));
        // Past RAM (the merge reads ahead), a sibling this transaction already holds
        // is taken without reading the other: a merge goes in key order, so the left
        // one usually is, and each clean sibling read is a fault that waits on the disk.
        if self.store().read_ahead.is_open()
            && siblings.iter().flatten().any(|&(_, no)| self.is_dirty(no))
        {
            siblings = siblings.map(|s| s.filter(|&(_, no)| self.is_dirty(no)));
        }
        for (s, sno) in siblings.into_iter().flatten() {
            let sp = node(&*self, sno)?;
            if hdr::kind(sp) != KIND_LEAF {
                return Err(super::corrupt(
                    &*self,
                    parent,
                    "siblings of different kinds (tree levels disagree)",
                ));
            }
            let used = page::used_space(sp);
            if best.is_none_or(|(_, _, u)| used < u) {
                best = Some((s, sno, used));
            }
        }
        Ok(best.map(|(s, sno, _)| (s, sno)))
    }

    /// Points `parent`'s children `a..` at the leaves a spread filled (`parts`: page
    /// and cells, two that were there and maybe a new third), in place: the first
    /// keeps its separator, the others get their first key, a third is inserted.
    /// Only when a new separator does not fit is the parent rebuilt from all its
    /// cells and split (copying a branch's hundreds of cells at every spread was
    /// most of a random fill's time, with glibc's malloc).
    fn relink_spread(
        &mut self,
        parent: PageNo,
        a: usize,
        parts: &[(PageNo, &[&[u8]])],
        counted: bool,
    ) -> Result<Option<Split>> {
        let mut pending: Vec<(usize, Vec<u8>)> = Vec::new();
        for (i, &(no, part)) in parts.iter().enumerate() {
            let child = a + i;
            let pp = self.dirty_mut(parent);
            if child == 0 {
                // The leftmost child: no cell, its count is implied.
                hdr::set_extra(pp, no);
                continue;
            }
            if i == 0 {
                page::set_branch_child(pp, child - 1, no);
                if counted {
                    page::set_branch_count(pp, child - 1, part.len() as u64);
                }
                continue;
            }
            let key = part
                .first()
                .map(|c| cell_key_of(KIND_LEAF, c))
                .unwrap_or_default();
            let cell = if counted {
                page::encode_counted_branch_cell(key, no, part.len() as u64)
            } else {
                page::encode_branch_cell(key, no)
            };
            // Child a + 1 existed (its cell is replaced); a third is new.
            if i == 1 {
                page::remove_cell(pp, child - 1);
            }
            if pending.is_empty() && page::insert_cell(pp, child - 1, &cell) {
                continue;
            }
            pending.push((child - 1, cell));
        }
        if pending.is_empty() {
            return Ok(None);
        }
        let mut pcells = node_cells(self.dirty_mut(parent));
        for (at, cell) in pending {
            pcells.insert(at, cell);
        }
        if page::cells_space(&pcells) <= NODE_CAPACITY {
            page::rebuild(self.dirty_mut(parent), &pcells);
            return Ok(None);
        }
        self.split_cells(parent, pcells, false).map(Some)
    }

    /// Inserts a cell at slot `idx`, splitting the node if it does not fit. A node at
    /// the right edge of its level that overflows by a cell appended at its end is
    /// split there, leaving it full: keys arriving in ascending order (W2, ids from
    /// a counter) then fill whole pages instead of halves, which halved the data
    /// file, the journal's page images and the write-back of a sequential fill.
    fn insert_or_split(
        &mut self,
        no: PageNo,
        idx: usize,
        cell: &[u8],
        rightmost: bool,
    ) -> Result<Option<Split>> {
        if page::insert_cell(self.dirty_mut(no), idx, cell) {
            return Ok(None);
        }
        let mut cells = node_cells(self.dirty_mut(no));
        cells.insert(idx, cell.to_vec());
        let appended = rightmost && idx + 1 == cells.len();
        self.split_cells(no, cells, appended).map(Some)
    }

    /// Splits node `no` whose content should be `cells` (too many for one page) into
    /// it and a new right node: at the end when `appended`, else in the middle.
    // Bounds: `m` is a split point from `split_point` or `append_split_point`, which keep it inside `cells`.
    #[allow(clippy::indexing_slicing)]
    fn split_cells(
        &mut self,
        no: PageNo,
        mut cells: Vec<Vec<u8>>,
        appended: bool,
    ) -> Result<Split> {
        let p = self.dirty_mut(no);
        let kind = hdr::kind(p);
        let counted = page::is_counted_branch(p);
        let right = if kind == KIND_LEAF {
            self.new_node(kind)
        } else {
            self.new_branch(counted)
        };
        let m = if appended {
            append_split_point(kind, cells.len())
        } else {
            split_point(&cells)
        };
        let (separator, right_cells, right_leftmost, right_count) = if kind == KIND_LEAF {
            let separator = cell_key_of(kind, &cells[m]).to_vec();
            let right_cells = cells.split_off(m);
            let n = right_cells.len() as u64;
            (separator, right_cells, None, n)
        } else {
            // The middle separator moves up; its child becomes the right node's
            // leftmost, whose count (now implied) adds to the right node's total.
            let mut rest = cells.split_off(m);
            let middle = rest.remove(0);
            let child = page::read_u64(&middle, 2);
            let count = if counted {
                rest.iter()
                    .map(|c| page::branch_cell_count(c))
                    .try_fold(page::branch_cell_count(&middle), u64::checked_add)
                    .ok_or_else(|| bad_count(self, no, "counts overflow u64"))?
            } else {
                0
            };
            (
                cell_key_of(kind, &middle).to_vec(),
                rest,
                Some(child),
                count,
            )
        };
        page::rebuild(self.dirty_mut(no), &cells);
        let rp = self.dirty_mut(right);
        page::rebuild(rp, &right_cells);
        if let Some(c) = right_leftmost {
            hdr::set_extra(rp, c);
        }
        Ok(Split {
            separator,
            right,
            right_count,
        })
    }

    /// Deletes a key known to exist; returns the new root (0 when the tree empties).
    pub(crate) fn tree_delete(&mut self, root: PageNo, key: &[u8]) -> Result<PageNo> {
        let (mut root, _) = self.delete_rec(root, key, 0)?;
        loop {
            let p = self.dirty_mut(root);
            match (hdr::kind(p), hdr::count(p)) {
                (KIND_BRANCH, 0) => {
                    let only = hdr::extra(p);
                    self.free_pages(root, 1);
                    root = only;
                }
                (KIND_LEAF, 0) => {
                    self.free_pages(root, 1);
                    return Ok(0);
                }
                _ => return Ok(root),
            }
            if !self.is_dirty(root) {
                return Ok(root);
            }
        }
    }

    /// Returns (new page number, whether the node is now under-full).
    fn delete_rec(&mut self, no: PageNo, key: &[u8], depth: usize) -> Result<(PageNo, bool)> {
        if depth >= MAX_DEPTH {
            return Err(super::corrupt(
                &*self,
                no,
                "tree deeper than the depth limit",
            ));
        }
        let no = self.writable(no)?;
        if hdr::kind(self.dirty_mut(no)) == KIND_LEAF {
            let Ok(i) = page::search(self.dirty_mut(no), key) else {
                return Err(super::corrupt(
                    &*self,
                    no,
                    "key vanished between lookup and delete",
                ));
            };
            self.free_value(no, i)?;
            let p = self.dirty_mut(no);
            page::remove_cell(p, i);
            return Ok((no, page::used_space(p) < UNDERFLOW_BYTES));
        }
        let p = self.dirty_mut(no);
        let route = page::branch_route(p, key);
        let child = page::branch_child_at(p, route);
        let (new_child, under) = self.delete_rec(child, key, depth + 1)?;
        let p = self.dirty_mut(no);
        set_route_child(p, route, new_child);
        // One entry fewer under the child (the leftmost's count is implied).
        if page::is_counted_branch(p) && route != usize::MAX {
            let Some(count) = page::branch_count(p, route).checked_sub(1) else {
                return Err(bad_count(self, no, "a child's count went below zero"));
            };
            page::set_branch_count(self.dirty_mut(no), route, count);
        }
        if under && page::branch_fanout(self.dirty_mut(no)) > 1 {
            let n = if route == usize::MAX { 0 } else { route + 1 };
            self.merge_children(no, if n > 0 { n - 1 } else { 0 })?;
        }
        let p = self.dirty_mut(no);
        Ok((no, page::used_space(p) < UNDERFLOW_BYTES))
    }

    /// Merges child `a` and child `a + 1` of branch `parent` if they fit in one page.
    fn merge_children(&mut self, parent: PageNo, a: usize) -> Result<()> {
        let pp = self.dirty_mut(parent);
        let left_no = page::branch_nth_child(pp, a);
        let right_no = page::branch_nth_child(pp, a + 1);
        let separator = page::cell_key(pp, a).to_vec();
        let counted = page::is_counted_branch(pp);
        // Entries under the right child (its cell's count: child a + 1 is cell a).
        let right_total = if counted {
            page::branch_count(pp, a)
        } else {
            0
        };
        let left = node(&*self, left_no)?;
        let right = node(&*self, right_no)?;
        let kind = hdr::kind(left);
        if kind != hdr::kind(right) {
            return Err(super::corrupt(
                &*self,
                parent,
                "siblings of different kinds (tree levels disagree)",
            ));
        }
        let mut cells = node_cells(left);
        if kind == KIND_BRANCH {
            if counted {
                // The separator comes down with the right node's leftmost child,
                // whose count was implied there and is stored here.
                let stored = (0..hdr::count(right))
                    .try_fold(0u64, |acc, i| acc.checked_add(page::branch_count(right, i)));
                let Some(leftmost) = stored.and_then(|s| right_total.checked_sub(s)) else {
                    return Err(bad_count(
                        self,
                        right_no,
                        "its cells count more entries than its parent gives it",
                    ));
                };
                cells.push(page::encode_counted_branch_cell(
                    &separator,
                    hdr::extra(right),
                    leftmost,
                ));
            } else {
                cells.push(page::encode_branch_cell(&separator, hdr::extra(right)));
            }
        }
        cells.extend(node_cells(right));
        if page::cells_space(&cells) > NODE_CAPACITY {
            return Ok(());
        }
        let left_no = self.writable(left_no)?;
        page::rebuild(self.dirty_mut(left_no), &cells);
        self.free_pages(right_no, 1);
        let pp = self.dirty_mut(parent);
        page::remove_cell(pp, a);
        if a == 0 {
            hdr::set_extra(pp, left_no);
        } else {
            page::set_branch_child(pp, a - 1, left_no);
            if counted {
                // The merged node holds both children's entries.
                let Some(count) = page::branch_count(pp, a - 1).checked_add(right_total) else {
                    return Err(bad_count(self, parent, "counts overflow u64"));
                };
                page::set_branch_count(self.dirty_mut(parent), a - 1, count);
            }
        }
        Ok(())
    }

    /// Frees every page of a tree (used by drop_tree).
    pub(crate) fn free_tree(&mut self, root: PageNo) -> Result<()> {
        if root == 0 {
            return Ok(());
        }
        let mut stack = vec![(root, 0usize)];
        while let Some((no, depth)) = stack.pop() {
            if depth >= MAX_DEPTH {
                return Err(super::corrupt(
                    &*self,
                    no,
                    "tree deeper than the depth limit",
                ));
            }
            let p = node(&*self, no)?;
            if hdr::kind(p) == KIND_BRANCH {
                let children: Vec<PageNo> = (0..page::branch_fanout(p))
                    .map(|i| page::branch_nth_child(p, i))
                    .collect();
                stack.extend(children.into_iter().map(|c| (c, depth + 1)));
            } else {
                for i in 0..hdr::count(p) {
                    self.free_value(no, i)?;
                }
            }
            self.free_pages(no, 1);
        }
        Ok(())
    }
}

fn set_route_child(p: &mut [u8], route: usize, child: PageNo) {
    if route == usize::MAX {
        hdr::set_extra(p, child);
    } else {
        page::set_branch_child(p, route, child);
    }
}
