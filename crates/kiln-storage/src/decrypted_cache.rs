//! An encrypted environment's pages decrypted once and shared by the transactions
//! that read them, up to `Options::decrypted_cache_bytes` (CLOCK eviction).
//!
//! Why: opening a sealed 8 KiB page costs ~8 us of CPU (XChaCha20-Poly1305, about
//! 1 GB/s here), several times a point read's whole cost; a tree's root and
//! branches are read by every lookup. With each transaction decrypting for itself
//! (Voron's way), every request paid for its path from the root again.
//!
//! Why it stays right: a page number's bytes change only when the page is written
//! again, and it is written again only after every snapshot that could reach the
//! old version has ended (copy-on-write, `alloc/mod.rs`); until the new version is
//! in the data file, readers find it in the unflushed table, which is looked up
//! first. `PageStore` drops a page's entry here when it writes the page, before it
//! leaves the unflushed table, so no reader can find the old version afterwards.
//!
//! The plaintext lives in process memory, as the unflushed table's pages always
//! did: encryption at rest protects the files. Buffers are wiped when the last
//! reference goes (`Plain`).

use crate::fasthash::FastMap;
use crate::page::{PageNo, PageRun, PAGE_SIZE};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A decrypted run, wiped when dropped.
pub(crate) struct Plain(pub PageRun);

impl Drop for Plain {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(self.0.bytes_mut());
    }
}

struct Entry {
    no: PageNo,
    run: Arc<Plain>,
    /// CLOCK's bit: read since the hand last passed (set under the read lock).
    referenced: AtomicBool,
}

#[derive(Default)]
struct Inner {
    index: FastMap<PageNo, usize>,
    entries: Vec<Entry>,
    hand: usize,
    pages: usize,
}

/// Reads take the lock shared (a lookup and a reference count); only inserts,
/// evictions and invalidations take it alone.
pub(crate) struct DecryptedCache {
    inner: RwLock<Inner>,
    capacity_pages: usize,
}

impl DecryptedCache {
    pub fn new(capacity_bytes: u64) -> Self {
        DecryptedCache {
            inner: RwLock::new(Inner::default()),
            capacity_pages: usize::try_from(capacity_bytes / PAGE_SIZE as u64)
                .unwrap_or(usize::MAX),
        }
    }

    pub fn get(&self, no: PageNo) -> Option<Arc<Plain>> {
        let inner = self.inner.read();
        let at = *inner.index.get(&no)?;
        let entry = inner.entries.get(at)?;
        entry.referenced.store(true, Ordering::Relaxed);
        Some(entry.run.clone())
    }

    /// Keeps `run` (the run starting at page `no`), evicting others as needed. A run
    /// larger than an eighth of the cache is not kept (a large value read once
    /// would push out the tree's hot pages).
    pub fn insert(&self, no: PageNo, run: &Arc<Plain>) {
        let pages = run.0.page_count();
        if self.capacity_pages == 0 || pages > self.capacity_pages / 8 {
            return;
        }
        let mut inner = self.inner.write();
        if inner.index.contains_key(&no) {
            return;
        }
        while inner.pages + pages > self.capacity_pages && !inner.entries.is_empty() {
            inner.evict_one();
        }
        let at = inner.entries.len();
        inner.entries.push(Entry {
            no,
            run: run.clone(),
            referenced: AtomicBool::new(false),
        });
        inner.index.insert(no, at);
        inner.pages += pages;
    }

    /// Forgets the runs starting at pages `first..first + count` (they are being
    /// written again).
    pub fn invalidate(&self, first: PageNo, count: u64) {
        let mut inner = self.inner.write();
        if inner.entries.is_empty() {
            return;
        }
        for no in first..first + count {
            if let Some(at) = inner.index.get(&no).copied() {
                inner.remove_at(at);
            }
        }
    }
}

impl Inner {
    /// CLOCK: the first entry from the hand whose bit is clear goes; bits passed
    /// over are cleared.
    fn evict_one(&mut self) {
        loop {
            if self.hand >= self.entries.len() {
                self.hand = 0;
            }
            let Some(entry) = self.entries.get_mut(self.hand) else {
                return;
            };
            if *entry.referenced.get_mut() {
                *entry.referenced.get_mut() = false;
                self.hand += 1;
            } else {
                let at = self.hand;
                self.remove_at(at);
                return;
            }
        }
    }

    fn remove_at(&mut self, at: usize) {
        if at >= self.entries.len() {
            return;
        }
        let gone = self.entries.swap_remove(at);
        self.index.remove(&gone.no);
        self.pages -= gone.run.0.page_count();
        if let Some(moved) = self.entries.get(at) {
            self.index.insert(moved.no, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pages: usize, byte: u8) -> Arc<Plain> {
        let mut r = PageRun::scratch(pages);
        r.bytes_mut().fill(byte);
        Arc::new(Plain(r))
    }

    #[test]
    fn keeps_at_most_its_capacity_prefers_what_is_read_and_forgets_on_invalidate() {
        let cache = DecryptedCache::new(16 * PAGE_SIZE as u64);
        for no in 0..16 {
            cache.insert(no, &run(1, no as u8));
        }
        // Page 3 is read; the next insert evicts an unread one.
        assert!(cache.get(3).is_some());
        cache.insert(100, &run(1, 100));
        assert!(
            cache.get(3).is_some(),
            "a page read since the hand passed stays"
        );
        assert!(cache.get(100).is_some());
        assert_eq!((0..16).filter(|&n| cache.get(n).is_some()).count(), 15);
        assert_eq!(cache.get(3).unwrap().0.bytes()[0], 3);
        cache.invalidate(3, 1);
        assert!(cache.get(3).is_none());
        // Too large to keep: a run of more than an eighth of the cache.
        cache.insert(200, &run(3, 1));
        assert!(cache.get(200).is_none());
        let inner = cache.inner.read();
        assert!(inner.pages <= 16);
        assert_eq!(inner.index.len(), inner.entries.len());
        for (no, &at) in &inner.index {
            assert_eq!(inner.entries[at].no, *no);
        }
    }
}
