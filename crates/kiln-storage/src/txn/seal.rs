//! What a commit takes from a write transaction: `WriteTxn::seal` updates the
//! catalog, seals the dirty pages and hands them, with the writer lock, to the
//! commit code as a `SealedTxn`; that either aborts (the lock goes back, the
//! transaction rolls back) or passes the point of no return (`SealedTxn::commit`).

use super::WriteTxn;
use crate::btree::{self, PageSource};
use crate::journal::record::{JournalPage, LogicalLog};
use crate::page::{self, PageNo, PageRun, PAGE_SIZE};
use crate::shared::WriterState;
use crate::write_buffer::Gens;
use crate::Result;
use parking_lot::MutexGuard;
use std::sync::Arc;

/// A write transaction with its catalog updated and its pages sealed, and the
/// writer lock taken out of it: the record is encoded into the writer's encoder
/// (`writer`, borrowed mutably) from pages the transaction still lends (`content`:
/// the diff sources), so the two are separate fields.
pub(crate) struct SealedTxn<'t, 'env> {
    pub writer: MutexGuard<'env, WriterState>,
    pub content: Sealed<'t, 'env>,
}

/// The transaction's part of a `SealedTxn`.
pub(crate) struct Sealed<'t, 'env> {
    txn: &'t mut WriteTxn<'env>,
    /// The sealed pages (and overflow runs), by page number.
    pub pages: Vec<(PageNo, Arc<PageRun>)>,
    /// Pages the transaction freed: committed ones, then its own.
    pub freed: Vec<PageNo>,
}

/// A commit past the point of no return: what the commit code publishes.
pub(crate) struct Committed<'env> {
    pub writer: MutexGuard<'env, WriterState>,
    pub txn_id: u64,
    pub catalog_root: PageNo,
    pub pages: Vec<(PageNo, Arc<PageRun>)>,
    pub freed: Vec<PageNo>,
}

impl<'env> WriteTxn<'env> {
    /// The write buffer's generations this transaction started from.
    pub(crate) fn base_gens(&self) -> &Gens {
        &self.base.gens
    }

    /// Notes a value merged from the frozen generation, which the record may name
    /// instead of carrying.
    ///
    /// SAFETY (for callers): as `MergedValues::note`.
    pub(crate) unsafe fn note_merged(
        &mut self,
        frozen: &Arc<crate::write_buffer::Generation>,
        bkey: &[u8],
        value: &[u8],
    ) {
        self.merged_values.note(frozen, bkey, value);
    }

    /// How far the merge of the frozen generation got: kept by the writer, or moved
    /// on by the merge thread for this transaction.
    pub(crate) fn merge_cursor(&mut self) -> Option<Box<[u8]>> {
        self.join_ahead();
        if let Some(merged) = self.merged_ahead() {
            return merged.cursor.clone();
        }
        self.writer.as_ref().and_then(|w| w.merge_cursor.clone())
    }

    /// Buffer writes made by this transaction.
    pub(crate) fn buffer_writes(&self) -> usize {
        self.undo.len()
    }

    /// Journal bytes written since the write buffer last froze (`WriterState`).
    pub(crate) fn journal_bytes_since_freeze(&self) -> u64 {
        self.writer
            .as_ref()
            .map_or(0, |w| w.journal_bytes_since_freeze)
    }

    /// Whether this transaction merges the whole write buffer (close, check).
    pub(crate) fn force_merge(&self) -> bool {
        self.force_merge
    }

    pub(crate) fn set_force_merge(&mut self) {
        self.force_merge = true;
        // The loop that merges everything takes the lock between its commits.
        self.lends_next = false;
    }

    /// Updates the catalog, seals every dirty page, and takes the writer lock out
    /// of the transaction for the commit code. The transaction is unusable
    /// afterwards except through the returned `SealedTxn`.
    pub(crate) fn seal(&mut self) -> Result<SealedTxn<'_, 'env>> {
        self.join_ahead();
        if let Some(w) = self.writer.as_mut() {
            w.last_txn_buffer_writes = self.undo.len();
        }
        self.mutate(|t| t.update_catalog())?;
        let pages: Vec<(PageNo, Arc<PageRun>)> = self
            .seal_dirty()
            .into_iter()
            .map(|(n, r)| (n, Arc::new(r)))
            .collect();
        let mut freed = self.freed_committed.clone();
        freed.extend_from_slice(&self.local_free);
        let writer = self
            .writer
            .take()
            .ok_or_else(|| crate::Error::Misuse("commit of a transaction that has ended"))?;
        Ok(SealedTxn {
            writer,
            content: Sealed {
                txn: self,
                pages,
                freed,
            },
        })
    }

    /// Writes modified tree roots into the catalog and removes dropped trees.
    fn update_catalog(&mut self) -> Result<()> {
        let mut names: Vec<String> = self
            .trees
            .iter()
            .filter(|(_, t)| t.modified)
            .map(|(n, _)| n.clone())
            .collect();
        names.sort();
        for name in names {
            let Some(info) = self.trees.get(&name).map(|t| t.info) else {
                continue;
            };
            let (root, _) =
                self.tree_put(self.catalog_root, false, name.as_bytes(), &info.encode())?;
            self.catalog_root = root;
        }
        for name in std::mem::take(&mut self.dropped) {
            if btree::get(&*self, self.catalog_root, name.as_bytes())?.is_some() {
                self.catalog_root = self.tree_delete(self.catalog_root, name.as_bytes())?;
            }
        }
        Ok(())
    }

    /// Seals every dirty page (txn id, page number, checksum) for the journal.
    /// (The copy-on-write sources stay in `self.sources`.)
    fn seal_dirty(&mut self) -> Vec<(PageNo, PageRun)> {
        let txn_id = self.txn_id;
        let mut pages: Vec<(PageNo, PageRun)> = self.dirty.drain().collect();
        pages.sort_unstable_by_key(|(no, _)| *no);
        for (no, run) in &mut pages {
            #[cfg(debug_assertions)]
            if let Some(w) = self.writer.as_ref() {
                // A free page is never referenced: a page (or bare run) this transaction
                // writes was taken from the free set (a lookup per page: debug builds only).
                let end = *no + run.page_count() as u64;
                debug_assert!(
                    end <= w.alloc.page_count && !(*no..end).any(|p| w.alloc.free.contains(&p)),
                    "sealing pages {no}..{end} of txn {txn_id}: outside the {} pages, or free",
                    w.alloc.page_count
                );
            }
            if run.is_bare() {
                // Value bytes only: the leaf cell pointing here carries their checksum.
                continue;
            }
            let b = run.bytes_mut();
            debug_assert!(b.len() >= PAGE_SIZE);
            debug_assert!(
                *no >= page::FIRST_DATA_PAGE,
                "sealing page {no}, a header page"
            );
            #[cfg(debug_assertions)]
            match page::hdr::kind(b) {
                page::KIND_BRANCH | page::KIND_LEAF => {
                    if let Err(e) = page::check_node_bounds(b) {
                        panic!("sealing node page {no}: {e}");
                    }
                }
                page::KIND_OVERFLOW => debug_assert!(
                    page::hdr::run_pages(b) as usize * PAGE_SIZE <= b.len(),
                    "sealing overflow page {no}: its run is longer than its buffer"
                ),
                other => panic!("sealing page {no} of unknown kind {other}"),
            }
            page::seal(b, *no, txn_id);
            debug_assert!(
                page::verify(b, *no, std::path::Path::new("<memory>")).is_ok(),
                "page {no} fails verification right after sealing"
            );
        }
        pages
    }
}

impl<'t, 'env> Sealed<'t, 'env> {
    pub fn txn_id(&self) -> u64 {
        self.txn.txn_id
    }
    pub fn catalog_root(&self) -> PageNo {
        self.txn.catalog_root
    }
    /// The transaction's write-buffer entries in their journal form.
    pub fn logical(&self) -> &LogicalLog {
        &self.txn.logical
    }

    /// The values the transaction merged, which its record may name by buffer key.
    pub fn merged_values(&self) -> Option<&dyn crate::journal::record::MergedValueSource> {
        let m = &self.txn.merged_values;
        (!m.is_empty()).then_some(m as &dyn crate::journal::record::MergedValueSource)
    }

    /// An upper bound of the record body: page bytes, image headers, freed list,
    /// buffer entries.
    pub fn record_body_bound(&self) -> usize {
        self.pages
            .iter()
            .map(|(_, r)| r.bytes().len() + 64)
            .sum::<usize>()
            + self.freed.len() * 8
            + self.txn.logical.encoded_len()
    }

    /// The pages as the journal takes them: each with the committed page it was
    /// copied from, if any (the record may hold the difference instead).
    pub fn journal_pages(&self) -> Result<Vec<JournalPage<'_>>> {
        self.pages
            .iter()
            .map(|(no, run)| {
                let source = match self.txn.sources.get(no) {
                    Some(s) => Some((*s, PageSource::page(&*self.txn, *s)?)),
                    None => None,
                };
                Ok(JournalPage {
                    no: *no,
                    run,
                    source,
                })
            })
            .collect()
    }
}

impl<'t, 'env> SealedTxn<'t, 'env> {
    /// Gives the writer lock back and rolls the transaction back.
    pub fn abort(self) {
        let SealedTxn { writer, content } = self;
        content.txn.writer = Some(writer);
        content.txn.rollback();
    }

    /// The point of no return: the buffer writes are part of the commit now, and
    /// the freed pages go to the allocator (pending until no reader can see them).
    pub fn commit(self) -> Committed<'env> {
        let SealedTxn {
            mut writer,
            content,
        } = self;
        let Sealed { txn, pages, freed } = content;
        txn.undo.clear();
        txn.logical.clear();
        writer
            .alloc
            .add_pending(txn.txn_id, std::mem::take(&mut txn.freed_committed));
        writer.alloc.put_free(txn.local_free.drain(..));
        Committed {
            writer,
            txn_id: txn.txn_id,
            catalog_root: txn.catalog_root,
            pages,
            freed,
        }
    }
}
