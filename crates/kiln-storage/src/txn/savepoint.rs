//! Savepoints: roll back one unit of work inside a write transaction that carries
//! others (the commit queue runs many units in one transaction).
//!
//! A savepoint copies the transaction's small bookkeeping, records the pages the unit
//! creates, and keeps an undo copy of each page that was already dirty at the
//! savepoint the first time the unit changes or frees it. So its cost follows what
//! the unit touches, not the size of the transaction. On rollback, created pages are
//! dropped (their numbers go back where they came from) and undo copies restored.

use super::{TreeState, WriteTxn};
use crate::page::{PageNo, PageRun};

pub(crate) struct Savepoint {
    trees: crate::fasthash::FastMap<String, TreeState>,
    dropped: Vec<String>,
    catalog_root: PageNo,
    freed_committed_len: usize,
    local_free: Vec<PageNo>,
    taken_from_free_len: usize,
    page_count: u64,
    /// Write-buffer writes before the savepoint.
    undo_len: usize,
    /// Dirty pages created since the savepoint.
    created: crate::fasthash::FastSet<PageNo>,
    /// Pages dirty before the savepoint, as they were, with their diff source.
    undo: crate::fasthash::FastMap<PageNo, (PageRun, Option<PageNo>)>,
}

impl WriteTxn<'_> {
    /// Starts a savepoint (replacing any open one).
    pub(crate) fn savepoint(&mut self) {
        let page_count = self.alloc().page_count;
        self.savepoint = Some(Savepoint {
            trees: self.trees.clone(),
            dropped: self.dropped.clone(),
            catalog_root: self.catalog_root,
            freed_committed_len: self.freed_committed.len(),
            local_free: self.local_free.clone(),
            taken_from_free_len: self.taken_from_free.len(),
            page_count,
            undo_len: self.undo.len(),
            created: Default::default(),
            undo: Default::default(),
        });
    }

    /// Keeps the changes made since the savepoint.
    pub(crate) fn release_savepoint(&mut self) {
        self.savepoint = None;
    }

    /// Called before a dirty page is changed or dropped: saves its bytes once if it
    /// predates the savepoint.
    pub(crate) fn note_page_change(&mut self, no: PageNo) {
        let Some(sp) = self.savepoint.as_mut() else {
            return;
        };
        if !sp.created.contains(&no) && !sp.undo.contains_key(&no) {
            if let Some(run) = self.dirty.get(&no) {
                sp.undo
                    .insert(no, (run.clone(), self.sources.get(&no).copied()));
            }
        }
    }

    /// Adds a page this transaction created (so a rollback knows to drop it).
    pub(crate) fn insert_dirty(&mut self, no: PageNo, run: PageRun) {
        if let Some(sp) = self.savepoint.as_mut() {
            sp.created.insert(no);
        }
        self.dirty_bytes_written += run.bytes().len();
        let before = self.dirty.insert(no, run);
        debug_assert!(
            before.is_none(),
            "page {no} created twice in one transaction"
        );
    }

    /// Undoes everything since the savepoint.
    pub(crate) fn rollback_to_savepoint(&mut self) {
        let Some(sp) = self.savepoint.take() else {
            return;
        };
        self.undo_buffer_writes(sp.undo_len);
        for no in &sp.created {
            self.dirty.remove(no);
            self.sources.remove(no);
        }
        for (no, (run, source)) in sp.undo {
            self.dirty.insert(no, run);
            match source {
                Some(s) => self.sources.insert(no, s),
                None => self.sources.remove(&no),
            };
        }
        self.trees = sp.trees;
        self.dropped = sp.dropped;
        self.catalog_root = sp.catalog_root;
        self.freed_committed.truncate(sp.freed_committed_len);
        self.local_free = sp.local_free;
        let taken: Vec<PageNo> = self
            .taken_from_free
            .drain(sp.taken_from_free_len..)
            .collect();
        let alloc = self.alloc();
        alloc.put_free(taken);
        alloc.page_count = sp.page_count;
        self.broken = None;
    }

    /// Bytes of pages this transaction has created so far, including ones freed
    /// again (an upper bound, kept as a running count: it bounds a commit group).
    pub(crate) fn dirty_bytes(&self) -> usize {
        self.dirty_bytes_written
    }
}
