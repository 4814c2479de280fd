//! The free pages, kept as maximal extents of contiguous pages.
//!
//! A set of single pages made a multi-page allocation (a large value's bare run) a
//! scan: with thousands of single pages freed by leaves, every 2-page put walked the
//! set looking for neighbours. Extents indexed by length answer "the smallest free run
//! of at least n pages" in one ordered lookup, and single-page allocations still take
//! the lowest free page, as before.

use crate::page::PageNo;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Default, Clone)]
pub(crate) struct FreeSet {
    /// Start -> length of each maximal extent (no two touch).
    extents: BTreeMap<PageNo, u64>,
    /// (length, start) of the extents of two pages or more: the run search.
    by_len: BTreeSet<(u64, PageNo)>,
    pages: u64,
}

impl FreeSet {
    pub fn len(&self) -> usize {
        self.pages as usize
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// Free pages in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = PageNo> + '_ {
        self.extents
            .iter()
            .flat_map(|(&start, &len)| start..start + len)
    }

    /// The extent holding `p`, if `p` is free.
    fn extent_of(&self, p: PageNo) -> Option<(PageNo, u64)> {
        let (&start, &len) = self.extents.range(..=p).next_back()?;
        (p < start + len).then_some((start, len))
    }

    /// (Debug builds check with it that a page freed was not free already.)
    #[cfg(any(test, debug_assertions))]
    pub fn contains(&self, p: &PageNo) -> bool {
        self.extent_of(*p).is_some()
    }

    fn add_extent(&mut self, start: PageNo, len: u64) {
        debug_assert!(len > 0);
        self.extents.insert(start, len);
        if len >= 2 {
            self.by_len.insert((len, start));
        }
    }

    fn drop_extent(&mut self, start: PageNo, len: u64) {
        self.extents.remove(&start);
        if len >= 2 {
            self.by_len.remove(&(len, start));
        }
    }

    /// Adds a page; false if it was free already. Joins it to the extents it touches.
    /// (Pages are below the allocator's `page_count`, far from `PageNo::MAX`, so
    /// `p + 1` and `start + len` cannot overflow.)
    pub fn insert(&mut self, p: PageNo) -> bool {
        let before = self.extents.range(..=p).next_back().map(|(&s, &l)| (s, l));
        if let Some((start, len)) = before {
            if p < start + len {
                return false;
            }
        }
        let mut start = p;
        let mut len = 1;
        if let Some((b_start, b_len)) = before.filter(|&(s, l)| s + l == p) {
            self.drop_extent(b_start, b_len);
            start = b_start;
            len += b_len;
        }
        if let Some(&a_len) = self.extents.get(&(p + 1)) {
            self.drop_extent(p + 1, a_len);
            len += a_len;
        }
        self.add_extent(start, len);
        self.pages += 1;
        true
    }

    /// Removes a page; false if it was not free. Splits its extent.
    pub fn remove(&mut self, p: &PageNo) -> bool {
        let p = *p;
        let Some((start, len)) = self.extent_of(p) else {
            return false;
        };
        self.drop_extent(start, len);
        if p > start {
            self.add_extent(start, p - start);
        }
        let end = start + len;
        if p + 1 < end {
            self.add_extent(p + 1, end - p - 1);
        }
        self.pages -= 1;
        true
    }

    /// Takes the lowest free page.
    pub fn pop_first(&mut self) -> Option<PageNo> {
        let (&start, &len) = self.extents.iter().next()?;
        self.drop_extent(start, len);
        if len > 1 {
            self.add_extent(start + 1, len - 1);
        }
        self.pages -= 1;
        Some(start)
    }

    /// Takes `n` (>= 2) contiguous pages from the smallest extent that holds them (the
    /// lowest such extent among equals), from its start.
    pub fn take_run(&mut self, n: u64) -> Option<PageNo> {
        debug_assert!(n >= 2);
        let &(len, start) = self.by_len.range((n, 0)..).next()?;
        self.drop_extent(start, len);
        if len > n {
            self.add_extent(start + n, len - n);
        }
        self.pages -= n;
        Some(start)
    }
}

impl FromIterator<PageNo> for FreeSet {
    fn from_iter<I: IntoIterator<Item = PageNo>>(pages: I) -> Self {
        let mut set = FreeSet::default();
        set.extend(pages);
        set
    }
}

impl Extend<PageNo> for FreeSet {
    fn extend<I: IntoIterator<Item = PageNo>>(&mut self, pages: I) {
        for p in pages {
            self.insert(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Extents are maximal, the length index matches them, and the count is right.
    fn assert_consistent(set: &FreeSet) {
        let mut prev_end = None;
        let mut pages = 0;
        for (&start, &len) in &set.extents {
            assert!(len > 0, "empty extent at {start}");
            if let Some(end) = prev_end {
                assert!(start > end, "extents touch or overlap at {start}");
            }
            prev_end = Some(start + len);
            pages += len;
            assert_eq!(set.by_len.contains(&(len, start)), len >= 2);
        }
        assert_eq!(
            set.by_len.len(),
            set.extents.values().filter(|&&l| l >= 2).count()
        );
        assert_eq!(pages, set.pages);
    }

    #[test]
    fn neighbours_join_and_a_removal_splits() {
        let mut s: FreeSet = [10, 12, 11, 20].into_iter().collect();
        assert_consistent(&s);
        assert_eq!(s.extents.get(&10), Some(&3));
        assert!(!s.insert(11), "a page already free is not added twice");
        assert!(s.remove(&11));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![10, 12, 20]);
        assert!(!s.remove(&11));
        assert_consistent(&s);
    }

    #[test]
    fn a_run_comes_from_the_smallest_extent_that_holds_it() {
        let mut s: FreeSet = (100..110).chain(50..53).chain([7]).chain(30..33).collect();
        assert_eq!(s.take_run(3), Some(30), "lowest of the two 3-page extents");
        assert_eq!(s.take_run(3), Some(50));
        assert_eq!(
            s.take_run(3),
            Some(100),
            "then the 10-page one, from its start"
        );
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            vec![7, 103, 104, 105, 106, 107, 108, 109]
        );
        assert_eq!(s.take_run(8), None);
        assert_eq!(s.pop_first(), Some(7));
        assert_consistent(&s);
    }

    #[test]
    fn a_run_comes_from_the_smallest_fitting_extent_even_above_a_larger_one() {
        // First fit would take 10 (the lowest extent that holds 3 pages); best fit
        // takes the 3-page extent at 40 and keeps the long one whole.
        let mut s: FreeSet = (10..20).chain(40..43).collect();
        assert_eq!(s.take_run(3), Some(40));
        assert_eq!(s.take_run(10), Some(10));
        assert!(s.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Remove(u64),
        PopFirst,
        TakeRun(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..64).prop_map(Op::Insert),
            2 => (0u64..64).prop_map(Op::Remove),
            1 => Just(Op::PopFirst),
            1 => (2u64..6).prop_map(Op::TakeRun),
        ]
    }

    proptest! {
        /// Against a plain set of pages: the same answers, and a run handed out is
        /// free, contiguous and the shortest maximal run that fits.
        #[test]
        fn behaves_as_a_set_of_pages(ops in proptest::collection::vec(op(), 1..200)) {
            let mut s = FreeSet::default();
            let mut model = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(p) => prop_assert_eq!(s.insert(p), model.insert(p)),
                    Op::Remove(p) => prop_assert_eq!(s.remove(&p), model.remove(&p)),
                    Op::PopFirst => prop_assert_eq!(s.pop_first(), model.pop_first()),
                    Op::TakeRun(n) => {
                        let runs = maximal_runs(&model);
                        let best = runs.iter().filter(|r| r.1 >= n).min_by_key(|r| (r.1, r.0));
                        let got = s.take_run(n);
                        prop_assert_eq!(got, best.map(|r| r.0));
                        if let Some(start) = got {
                            for p in start..start + n {
                                prop_assert!(model.remove(&p));
                            }
                        }
                    }
                }
                assert_consistent(&s);
                for p in 0..66 {
                    prop_assert_eq!(s.contains(&p), model.contains(&p));
                }
                prop_assert_eq!(s.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(s.len(), model.len());
            }
        }
    }

    fn maximal_runs(pages: &BTreeSet<u64>) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &p in pages {
            match runs.last_mut() {
                Some((start, len)) if *start + *len == p => *len += 1,
                _ => runs.push((p, 1)),
            }
        }
        runs
    }
}
