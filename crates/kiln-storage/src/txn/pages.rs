//! A write transaction's pages: taking page numbers (its own freed ones first, then
//! the allocator's), freeing them, and copy-on-write copies of committed pages.

use super::WriteTxn;
use crate::btree::node;
use crate::page::{self, hdr, PageNo, PageRun, KIND_BRANCH, KIND_LEAF};
use crate::Result;

impl WriteTxn<'_> {
    /// Whether `no` is a page this transaction created (or copied) and may change.
    pub(crate) fn is_dirty(&self, no: PageNo) -> bool {
        self.dirty.contains_key(&no)
    }

    /// A tree node this transaction owns, to change in place. The node's header
    /// names the page it is at: a node written under another number would be read
    /// back as corrupt (or, worse, as another node) once written back.
    pub(crate) fn dirty_mut(&mut self, no: PageNo) -> &mut [u8] {
        self.note_page_change(no);
        let run = self
            .dirty
            .get_mut(&no)
            .expect("page made writable before mutation");
        debug_assert!(
            !run.is_bare(),
            "page {no}: a bare value run changed as a tree node"
        );
        let bytes = run.bytes_mut();
        debug_assert_eq!(
            hdr::page_no(bytes),
            no,
            "dirty node at page {no} names another page"
        );
        debug_assert!(
            matches!(hdr::kind(bytes), KIND_LEAF | KIND_BRANCH),
            "dirty page {no} of kind {} changed as a tree node",
            hdr::kind(bytes)
        );
        bytes
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
        debug_assert!(
            !self.dirty.contains_key(&start),
            "page {start} handed out while this transaction still holds it"
        );
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
        debug_assert!(n >= 1, "page {start}: a run of no pages freed");
        debug_assert!(
            start >= page::FIRST_DATA_PAGE,
            "page {start} freed: it is one of the file's header pages"
        );
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
        let mut copy = PageRun::from_bytes(node(&*self, no)?);
        let new_no = self.take_pages(1);
        // A committed page is never reused while this transaction's base can reach
        // it (it is freed below, reusable only after every reader of it is gone).
        assert_ne!(new_no, no, "page {no} copied onto itself");
        hdr::set_page_no(copy.bytes_mut(), new_no);
        self.insert_dirty(new_no, copy);
        self.sources.insert(new_no, no);
        self.freed_committed.push(no);
        Ok(new_no)
    }
}
