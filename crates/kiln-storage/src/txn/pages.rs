//! A write transaction's pages: taking page numbers (its own freed ones first, then
//! the allocator's), freeing them, and copy-on-write copies of committed pages.

use super::WriteTxn;
use crate::btree::node;
use crate::page::{self, hdr, PageNo, PageRun};
use crate::Result;

impl WriteTxn<'_> {
    /// Whether `no` is a page this transaction created (or copied) and may change.
    pub(crate) fn is_dirty(&self, no: PageNo) -> bool {
        self.dirty.contains_key(&no)
    }

    pub(crate) fn dirty_mut(&mut self, no: PageNo) -> &mut [u8] {
        self.note_page_change(no);
        self.dirty
            .get_mut(&no)
            .expect("page made writable before mutation")
            .bytes_mut()
    }

    pub(crate) fn take_pages(&mut self, n: u64) -> PageNo {
        if n == 1 {
            if let Some(p) = self.local_free.pop() {
                return p;
            }
        }
        let (start, from_free) = self.alloc().take(n);
        if from_free {
            self.taken_from_free.extend(start..start + n);
        }
        start
    }

    pub(crate) fn new_node(&mut self, kind: u8) -> PageNo {
        let no = self.take_pages(1);
        let mut run = PageRun::zeroed(1);
        page::init_node(run.bytes_mut(), kind, no);
        self.insert_dirty(no, run);
        no
    }

    /// Releases a page or run that this transaction no longer references.
    pub(crate) fn free_pages(&mut self, start: PageNo, n: u64) {
        self.note_page_change(start);
        if self.dirty.remove(&start).is_some() {
            self.sources.remove(&start);
            self.local_free.extend(start..start + n);
        } else {
            self.freed_committed.extend(start..start + n);
        }
    }

    /// Returns a page number holding a private, mutable copy of `no`.
    pub(crate) fn writable(&mut self, no: PageNo) -> Result<PageNo> {
        if self.dirty.contains_key(&no) {
            return Ok(no);
        }
        let copy = PageRun::from_bytes(node(&*self, no)?);
        let new_no = self.take_pages(1);
        self.insert_dirty(new_no, copy);
        hdr::set_page_no(self.dirty_mut(new_no), new_no);
        self.sources.insert(new_no, no);
        self.freed_committed.push(no);
        Ok(new_no)
    }
}
