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
    /// Where the next search for a multi-page run starts (next fit; see `find_run`).
    run_search_from: PageNo,
}

/// Free pages a search for a run of `n` pages looks at, at most: this many, or `2n`
/// for a longer run. Scanning the whole free list cost every large value's put time
/// in proportion to the list (5 % of W1's committing thread, whose freed leaves leave
/// thousands of single pages). With a bound, and a search that resumes at the start of
/// the partial run it stopped in, the whole list is still covered over successive
/// puts and no run is cut in two for good; a put that finds nothing grows the file.
const MAX_RUN_SEARCH_PAGES: usize = 1024;

impl Allocator {
    pub fn new(page_count: u64, free: impl IntoIterator<Item = PageNo>) -> Self {
        Allocator {
            free: free.into_iter().collect(),
            pending: VecDeque::new(),
            pending_pages: 0,
            page_count: page_count.max(FIRST_DATA_PAGE),
            run_search_from: 0,
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

    /// `n` contiguous free pages, looking at no more than `MAX_RUN_SEARCH_PAGES` (or
    /// `2n`) free pages from where the previous search stopped, wrapping around once.
    fn find_run(&mut self, n: u64) -> Option<PageNo> {
        let from = self.run_search_from;
        let window = usize::try_from(n.saturating_mul(2))
            .unwrap_or(usize::MAX)
            .max(MAX_RUN_SEARCH_PAGES);
        let in_order = self.free.range(from..).chain(self.free.range(..from));
        let (mut run_start, mut run_len) = (from, 0);
        for &p in in_order.take(window) {
            // (At the wrap-around `p` is below the run: a new run starts.)
            if run_len > 0 && p == run_start + run_len {
                run_len += 1;
            } else {
                run_start = p;
                run_len = 1;
            }
            if run_len == n {
                self.run_search_from = run_start + n;
                return Some(run_start);
            }
        }
        // The next search starts with the run this one stopped in: it may go on past
        // the window, or (after the wrap-around) continue into pages at `from`.
        self.run_search_from = run_start;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_past_the_search_bound_is_found_by_a_later_search() {
        // Single free pages (no two adjacent) in front of one free run of three.
        let singles: Vec<PageNo> = (0..3 * MAX_RUN_SEARCH_PAGES as u64)
            .map(|i| 10 + 2 * i)
            .collect();
        let run_at = 100_000;
        let mut a = Allocator::new(200_000, singles.iter().copied().chain(run_at..run_at + 3));
        let mut grown = 0;
        let found = (0..10).find_map(|_| match a.take(3) {
            (start, true) => Some(start),
            (_, false) => {
                grown += 1;
                None
            }
        });
        assert_eq!(found, Some(run_at));
        assert!(
            (1..=4).contains(&grown),
            "{grown} searches before the run was found"
        );
        // The search wraps around: a run freed below where it stopped is found too.
        a.put_free([4, 5]);
        let found = (0..10).find_map(|_| match a.take(2) {
            (start, true) => Some(start),
            _ => None,
        });
        assert_eq!(found, Some(4));
        assert!(
            a.free.iter().all(|&p| p % 2 == 0),
            "only the singles are left"
        );
    }

    #[test]
    fn a_run_across_the_resume_point_or_longer_than_the_bound_is_found() {
        // Free {10, 11}, the search resuming at 11: it sees 11, wraps to 10, and must
        // not resume at 11 again, or no search would ever join them.
        let mut a = Allocator::new(100, [10, 11, 50]);
        a.run_search_from = 11;
        let found = (0..3).find_map(|_| match a.take(2) {
            (start, true) => Some(start),
            _ => None,
        });
        assert_eq!(found, Some(10));
        // A run longer than the search bound (a value of over 8 MiB freed and written
        // again) is reused, not appended at the file's end every time.
        let long = 3 * MAX_RUN_SEARCH_PAGES as u64;
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
        assert_eq!(a.free.iter().copied().collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(a.take(2), (3, true));
        assert_eq!(a.take(1), (10, false));
    }
}
