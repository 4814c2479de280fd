//! Free-page management.
//!
//! A page freed by transaction T goes to `pending` and becomes reusable only when
//! (a) no open reader's snapshot is older than T, so no reader can still reach it,
//! and (b) T is synced to the data file, so recovery from the journal never needs
//! the page's old bytes. Until then it is not handed out again.

use crate::page::{PageNo, FIRST_DATA_PAGE};
use std::collections::{BTreeSet, VecDeque};

#[derive(Debug, Default)]
pub(crate) struct Allocator {
    pub free: BTreeSet<PageNo>,
    pending: VecDeque<(u64, Vec<PageNo>)>,
    /// Pages in `pending` (kept as a count: read on every commit).
    pending_pages: u64,
    /// High-water mark: pages [0, page_count) exist in the logical file.
    pub page_count: u64,
}

impl Allocator {
    pub fn new(page_count: u64, free: impl IntoIterator<Item = PageNo>) -> Self {
        Allocator {
            free: free.into_iter().collect(),
            pending: VecDeque::new(),
            pending_pages: 0,
            page_count: page_count.max(FIRST_DATA_PAGE),
        }
    }

    /// Makes pages freed by transactions <= `horizon` reusable; `released` sees them
    /// before they can be handed out again.
    pub fn release(&mut self, horizon: u64, mut released: impl FnMut(&[PageNo])) {
        while self.pending.front().is_some_and(|(txn, _)| *txn <= horizon) {
            if let Some((_, pages)) = self.pending.pop_front() {
                self.pending_pages -= pages.len() as u64;
                released(&pages);
                self.put_free(pages);
            }
        }
    }

    pub fn pending_len(&self) -> u64 {
        self.pending_pages
    }

    /// Pages freed by transaction `txn_id`, reusable once `release` passes it.
    pub fn add_pending(&mut self, txn_id: u64, pages: Vec<PageNo>) {
        #[cfg(debug_assertions)]
        for &p in &pages {
            self.debug_check_in_range(p);
            debug_assert!(!self.free.contains(&p), "page {p} freed while already free");
        }
        self.pending_pages += pages.len() as u64;
        self.pending.push_back((txn_id, pages));
    }

    /// Every page not reusable yet.
    pub fn pending_pages(&self) -> impl Iterator<Item = PageNo> + '_ {
        self.pending.iter().flat_map(|(_, p)| p.iter().copied())
    }

    /// Takes `n` contiguous pages; returns (start, came_from_free_list).
    pub fn take(&mut self, n: u64) -> (PageNo, bool) {
        debug_assert!(n >= 1);
        if n == 1 {
            if let Some(p) = self.free.pop_first() {
                #[cfg(debug_assertions)]
                self.debug_check_in_range(p);
                return (p, true);
            }
        } else if let Some(start) = self.find_run(n) {
            for p in start..start + n {
                self.free.remove(&p);
            }
            return (start, true);
        }
        let start = self.page_count;
        self.page_count += n;
        debug_assert!(
            start >= FIRST_DATA_PAGE,
            "page {start} handed out over the file header"
        );
        (start, false)
    }

    /// Returns pages to the free list (pages of an aborted transaction, or freed
    /// and reusable). A page must be in the file and not free already.
    pub fn put_free(&mut self, pages: impl IntoIterator<Item = PageNo>) {
        for p in pages {
            #[cfg(debug_assertions)]
            self.debug_check_in_range(p);
            let fresh = self.free.insert(p);
            debug_assert!(fresh, "page {p} freed twice");
        }
    }

    #[cfg(debug_assertions)]
    fn debug_check_in_range(&self, p: PageNo) {
        debug_assert!(
            (FIRST_DATA_PAGE..self.page_count).contains(&p),
            "page {p} outside the data pages {FIRST_DATA_PAGE}..{}",
            self.page_count
        );
    }

    fn find_run(&self, n: u64) -> Option<PageNo> {
        let mut run_start = 0;
        let mut run_len = 0;
        for &p in &self.free {
            if run_len > 0 && p == run_start + run_len {
                run_len += 1;
            } else {
                run_start = p;
                run_len = 1;
            }
            if run_len == n {
                return Some(run_start);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_pages_wait_for_the_horizon() {
        let mut a = Allocator::new(10, []);
        a.add_pending(5, vec![3, 4]);
        a.add_pending(7, vec![8]);
        a.release(4, |_| {});
        assert!(a.free.is_empty());
        a.release(6, |_| {});
        assert_eq!(a.free.iter().copied().collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(a.take(2), (3, true));
        assert_eq!(a.take(1), (10, false));
    }
}
