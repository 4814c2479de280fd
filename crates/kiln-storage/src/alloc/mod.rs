//! Free-page management.
//!
//! A page freed by transaction T goes to `pending` and becomes reusable only when
//! (a) no open reader's snapshot is older than T, so no reader can still reach it,
//! and (b) T is synced to the data file, so recovery from the journal never needs
//! the page's old bytes. Until then it is not handed out again.

mod free_set;

use crate::page::{PageNo, FIRST_DATA_PAGE};
pub(crate) use free_set::FreeSet;
use std::collections::VecDeque;

#[derive(Debug, Default)]
pub(crate) struct Allocator {
    pub free: FreeSet,
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
        } else if let Some(start) = self.free.take_run(n) {
            #[cfg(debug_assertions)]
            self.debug_check_in_range(start + n - 1);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_found_among_thousands_of_single_pages() {
        // Single free pages (no two adjacent, as freed leaves leave them) and one run
        // of three far behind them: found at once, and a run freed later is reused.
        let singles = (0..3_000u64).map(|i| 10 + 2 * i);
        let run_at = 100_000;
        let mut a = Allocator::new(200_000, singles.chain(run_at..run_at + 3));
        assert_eq!(a.take(3), (run_at, true));
        assert_eq!(
            a.take(2),
            (200_000, false),
            "no run of two is left: the file grows"
        );
        a.put_free([4, 5]);
        assert_eq!(a.take(2), (4, true));
        assert!(
            a.free.iter().all(|p| p % 2 == 0),
            "only the singles are left"
        );
        // A run longer than any the old bounded search looked at is reused too.
        let long = 3_000;
        let mut a = Allocator::new(
            10 * long,
            (5..5 + long).chain((8 * long..8 * long + 5).step_by(2)),
        );
        assert_eq!(a.take(long), (5, true));
    }

    #[test]
    fn pending_pages_wait_for_the_horizon() {
        let mut a = Allocator::new(10, []);
        a.add_pending(5, vec![3, 4]);
        a.add_pending(7, vec![8]);
        a.release(4, |_| {});
        assert!(a.free.is_empty());
        a.release(6, |_| {});
        assert_eq!(a.free.iter().collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(a.take(2), (3, true));
        assert_eq!(a.take(1), (10, false));
    }
}
