//! Integrity check: walks every tree and page and reports what is wrong, precisely.

use crate::btree::{PageSource, MAX_DEPTH};
use crate::page::{self, hdr, LeafValue, PageNo, KIND_BRANCH, KIND_LEAF, KIND_OVERFLOW};
use crate::txn::{ReadTxn, TreeInfo};
use crate::Result;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

/// One problem found by `Env::check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub page: Option<PageNo>,
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.page {
            Some(p) => write!(f, "{}: page {p}: {}", self.file.display(), self.what),
            None => write!(f, "{}: {}", self.file.display(), self.what),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub txn_id: u64,
    pub trees: u64,
    pub entries: u64,
    pub pages_total: u64,
    pub pages_reachable: u64,
    pub pages_free: u64,
    pub problems: Vec<Problem>,
    /// Where each tree's pages go (the catalog as `<catalog>`): what `kiln check
    /// --json` reports for the space breakdown (docs/benchmarks.md, "Bytes on disk").
    pub tree_pages: BTreeMap<String, TreePages>,
}

/// The pages one tree holds, and how full its leaves are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreePages {
    pub leaf_pages: u64,
    pub branch_pages: u64,
    /// Pages of values kept out of their leaf (overflow runs, bare runs).
    pub value_pages: u64,
    /// Bytes of the keys and in-leaf values of its leaves (without the cells'
    /// headers and slots): over `leaf_pages` x the page size, the leaves' fill.
    pub leaf_entry_bytes: u64,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

struct Walker<'a, 't> {
    txn: &'a ReadTxn<'t>,
    file: PathBuf,
    /// Page -> what references it (for double-reference reports).
    owner: HashMap<PageNo, String>,
    report: CheckReport,
    /// The tree being walked (its pages are counted in `report.tree_pages`).
    tree: String,
}

/// Key bounds a subtree must respect: lo <= key < hi.
struct Bounds<'k> {
    lo: Option<&'k [u8]>,
    hi: Option<&'k [u8]>,
}

impl<'a, 't> Walker<'a, 't> {
    fn problem(&mut self, page: Option<PageNo>, what: impl Into<String>) {
        self.report.problems.push(Problem {
            file: self.file.clone(),
            page,
            what: what.into(),
        });
    }

    /// The page counts of the tree being walked.
    fn tree_pages(&mut self) -> &mut TreePages {
        self.report.tree_pages.entry(self.tree.clone()).or_default()
    }

    /// Claims `n` pages starting at `no` for `who`; false if any was already claimed.
    fn claim(&mut self, no: PageNo, n: u64, who: &str) -> bool {
        if no < page::FIRST_DATA_PAGE || no.saturating_add(n) > self.report.pages_total {
            self.problem(
                Some(no),
                format!(
                    "{who} references pages {no}..{} outside 2..{}",
                    no.saturating_add(n),
                    self.report.pages_total
                ),
            );
            return false;
        }
        for p in no..no + n {
            if let Some(prev) = self.owner.insert(p, who.to_string()) {
                self.problem(Some(p), format!("referenced twice: by {prev} and by {who}"));
                return false;
            }
        }
        true
    }

    /// Walks a tree; returns its entry count and leaf depth.
    fn walk_tree(&mut self, name: &str, root: PageNo) -> u64 {
        if root == 0 {
            return 0;
        }
        let mut leaf_depth = None;
        self.tree = name.to_string();
        self.walk_node(
            name,
            root,
            Bounds { lo: None, hi: None },
            0,
            &mut leaf_depth,
        )
    }

    fn walk_node(
        &mut self,
        tree: &str,
        no: PageNo,
        b: Bounds,
        depth: usize,
        leaf_depth: &mut Option<usize>,
    ) -> u64 {
        let who = format!("tree {tree:?}");
        let Some(p) = self.load_node(&who, no, depth) else {
            return 0;
        };
        self.report.pages_reachable += 1;
        self.check_keys(&who, no, p, &b);
        match hdr::kind(p) {
            KIND_LEAF => {
                match *leaf_depth {
                    None => *leaf_depth = Some(depth),
                    Some(d) if d != depth => self.problem(
                        Some(no),
                        format!("{who}: leaf at depth {depth}, others at {d}"),
                    ),
                    _ => {}
                }
                self.check_leaf_values(&who, no, p);
                let mut bytes = 0u64;
                for i in 0..hdr::count(p) {
                    bytes += page::cell_key(p, i).len() as u64;
                    if let LeafValue::Inline(v) = page::leaf_value(p, i) {
                        bytes += v.len() as u64;
                    }
                }
                let t = self.tree_pages();
                t.leaf_pages += 1;
                t.leaf_entry_bytes += bytes;
                hdr::count(p) as u64
            }
            KIND_BRANCH => {
                self.tree_pages().branch_pages += 1;
                let count = hdr::count(p);
                let mut entries = 0;
                for n in 0..page::branch_fanout(p) {
                    let lo = if n == 0 {
                        b.lo
                    } else {
                        Some(page::cell_key(p, n - 1))
                    };
                    let hi = if n < count {
                        Some(page::cell_key(p, n))
                    } else {
                        b.hi
                    };
                    let child = page::branch_nth_child(p, n);
                    let below =
                        self.walk_node(tree, child, Bounds { lo, hi }, depth + 1, leaf_depth);
                    entries += below;
                    self.check_child_count(&who, no, p, n, child, below);
                }
                entries
            }
            k => {
                self.problem(
                    Some(no),
                    format!("{who}: page kind {k} where a tree node was expected"),
                );
                0
            }
        }
    }

    /// A node's page, if it is within the depth limit, not reached twice, readable
    /// and intact (checksum, page number); otherwise the problem is reported.
    fn load_node(&mut self, who: &str, no: PageNo, depth: usize) -> Option<&'a [u8]> {
        if depth >= MAX_DEPTH {
            self.problem(
                Some(no),
                format!("{who}: deeper than {MAX_DEPTH} levels (cycle?)"),
            );
            return None;
        }
        if !self.claim(no, 1, who) {
            return None;
        }
        let p = match self.txn.page(no) {
            Ok(p) => p,
            Err(e) => {
                self.problem(Some(no), format!("{who}: {e}"));
                return None;
            }
        };
        if let Err(e) = page::verify(p, no, &self.file) {
            self.problem(Some(no), format!("{who}: {e}"));
            return None;
        }
        Some(p)
    }

    /// Keys in strictly increasing order, inside the range the parent gives.
    fn check_keys(&mut self, who: &str, no: PageNo, p: &[u8], b: &Bounds) {
        for i in 0..hdr::count(p) {
            let k = page::cell_key(p, i);
            if i > 0 && page::cell_key(p, i - 1) >= k {
                self.problem(Some(no), format!("{who}: keys out of order at slot {i}"));
            }
            if b.lo.is_some_and(|lo| k < lo) || b.hi.is_some_and(|hi| k >= hi) {
                self.problem(
                    Some(no),
                    format!("{who}: key at slot {i} outside the range its parent allows"),
                );
            }
        }
    }

    /// The out-of-page values of a leaf: overflow chains and bare runs.
    fn check_leaf_values(&mut self, who: &str, no: PageNo, p: &[u8]) {
        for i in 0..hdr::count(p) {
            match page::leaf_value(p, i) {
                LeafValue::Overflow { start, len } => self.check_overflow(who, no, start, len),
                value @ LeafValue::BareRun { start, len, .. } => {
                    self.check_bare_run(who, no, start, len, value)
                }
                LeafValue::Inline(_) => {}
            }
        }
    }

    fn check_bare_run(
        &mut self,
        who: &str,
        leaf: PageNo,
        start: PageNo,
        len: u64,
        value: LeafValue,
    ) {
        // Claim the pages first: a run overlapping another owner is reported as such
        // even when its bytes also fail their checksum. (A length no value can have
        // claims nothing; `value_bytes` reports it.)
        if let Some(pages) = page::bare_value_len(len).map(|l| page::bare_run_pages(l) as u64) {
            if self.claim(start, pages, &format!("{who} (bare run of leaf {leaf})")) {
                self.report.pages_reachable += pages;
                self.tree_pages().value_pages += pages;
            }
        }
        if let Err(e) = crate::btree::value_bytes(self.txn, value) {
            self.problem(Some(start), format!("{who}: value of leaf {leaf}: {e}"));
        }
    }

    fn check_overflow(&mut self, who: &str, leaf: PageNo, start: PageNo, len: u64) {
        let run = match self.txn.page(start) {
            Ok(r) => r,
            Err(e) => {
                return self.problem(
                    Some(start),
                    format!("{who}: overflow value of leaf {leaf}: {e}"),
                )
            }
        };
        if hdr::kind(run) != KIND_OVERFLOW {
            return self.problem(
                Some(start),
                format!(
                    "{who}: leaf {leaf} points to page kind {} instead of an overflow run",
                    hdr::kind(run)
                ),
            );
        }
        if let Err(e) = page::verify(run, start, &self.file) {
            return self.problem(Some(start), format!("{who}: {e}"));
        }
        let pages = hdr::run_pages(run) as u64;
        if hdr::extra(run) != len || page::overflow_run_pages(len as usize) as u64 != pages {
            self.problem(Some(start), format!("{who}: overflow run of {pages} pages holding {} bytes, leaf {leaf} expects {len}", hdr::extra(run)));
        }
        if self.claim(start, pages, &format!("{who} (overflow of leaf {leaf})")) {
            self.report.pages_reachable += pages;
            self.tree_pages().value_pages += pages;
        }
    }
}

/// Checks the snapshot `txn` against the free pages `free` (free + pending).
pub(crate) fn run(txn: &ReadTxn, free: &BTreeSet<PageNo>) -> Result<CheckReport> {
    let mut w = Walker {
        txn,
        file: txn.data_path().to_path_buf(),
        owner: HashMap::new(),
        tree: String::new(),
        report: CheckReport {
            txn_id: txn.txn_id(),
            pages_total: txn.page_count(),
            pages_free: free.len() as u64,
            ..Default::default()
        },
    };
    let catalog_entries = w.walk_tree("<catalog>", txn.catalog_root());
    let names = match txn.tree_names() {
        Ok(n) => n,
        Err(e) => {
            w.problem(None, format!("cannot list the trees in the catalog: {e}"));
            return Ok(w.report);
        }
    };
    if names.len() as u64 != catalog_entries {
        w.problem(
            None,
            format!(
                "catalog lists {} trees but holds {catalog_entries} entries",
                names.len()
            ),
        );
    }
    for name in names {
        w.check_tree(&name);
    }
    w.check_free_list(free);
    Ok(w.report)
}

impl Walker<'_, '_> {
    /// One tree of the catalog: walked, and its entry count as the catalog says.
    fn check_tree(&mut self, name: &str) {
        let txn = self.txn;
        let info = match crate::btree::get(txn, txn.catalog_root(), name.as_bytes())
            .and_then(|v| TreeInfo::decode(v.unwrap_or_default(), &self.file, name.as_bytes()))
        {
            Ok(i) => i,
            Err(e) => {
                self.problem(None, format!("catalog entry for tree {name:?}: {e}"));
                return;
            }
        };
        let n = self.walk_tree(name, info.root);
        self.check_counted_root(name, &info);
        if n != info.entries {
            self.problem(
                Some(info.root),
                format!(
                    "tree {name:?}: catalog says {} entries, tree holds {n}",
                    info.entries
                ),
            );
        }
        self.report.trees += 1;
        self.report.entries += n;
    }

    /// A counted branch's cell must give its child's actual entry count (the
    /// leftmost child's count is implied, not stored: the parent's count for this
    /// branch covers it); a child branch is counted exactly when its parent is.
    fn check_child_count(
        &mut self,
        who: &str,
        no: PageNo,
        p: &[u8],
        n: usize,
        child: PageNo,
        actual: u64,
    ) {
        let counted = page::is_counted_branch(p);
        if counted && n > 0 {
            let stored = page::branch_count(p, n - 1);
            if stored != actual {
                self.problem(
                    Some(no),
                    format!(
                        "{who}: counted branch: cell {} says child page {child} holds {stored} entries, it holds {actual}",
                        n - 1
                    ),
                );
            }
        }
        if let Ok(c) = self.txn.page(child) {
            if hdr::kind(c) == KIND_BRANCH && page::is_counted_branch(c) != counted {
                self.problem(
                    Some(child),
                    format!(
                        "{who}: branch is {} but its parent page {no} is {}",
                        if counted { "uncounted" } else { "counted" },
                        if counted { "counted" } else { "uncounted" }
                    ),
                );
            }
        }
    }

    /// A counted tree's root branch keeps counts, an uncounted tree's does not.
    fn check_counted_root(&mut self, name: &str, info: &TreeInfo) {
        let Ok(p) = self.txn.page(info.root) else {
            return;
        };
        if info.root != 0
            && hdr::kind(p) == KIND_BRANCH
            && page::is_counted_branch(p) != info.counted
        {
            self.problem(
                Some(info.root),
                format!(
                    "tree {name:?}: the catalog says the tree is {}counted, its root branch is {}counted",
                    if info.counted { "" } else { "un" },
                    if info.counted { "un" } else { "" }
                ),
            );
        }
    }

    /// Free pages never referenced and inside the file; every page either
    /// reachable or free (none leaked).
    fn check_free_list(&mut self, free: &BTreeSet<PageNo>) {
        let pages_total = self.report.pages_total;
        for &p in free {
            if let Some(who) = self.owner.get(&p).cloned() {
                self.problem(Some(p), format!("listed as free but referenced by {who}"));
            }
            if p < page::FIRST_DATA_PAGE || p >= pages_total {
                self.problem(Some(p), format!("free page outside 2..{pages_total}"));
            }
        }
        let leaked: Vec<PageNo> = (page::FIRST_DATA_PAGE..pages_total)
            .filter(|p| !self.owner.contains_key(p) && !free.contains(p))
            .collect();
        if !leaked.is_empty() {
            let sample: Vec<String> = leaked.iter().take(10).map(|p| p.to_string()).collect();
            self.problem(
                leaked.first().copied(),
                format!(
                    "{} pages neither reachable nor free (leaked), e.g. {}",
                    leaked.len(),
                    sample.join(", ")
                ),
            );
        }
    }
}
