//! Phase 1 of a commit, under the writer lock: the write buffer's step (merge a
//! slice, or freeze), the catalog update, sealing the pages, encoding the record
//! (which fixes its place in the journal chain), and making the pages readable for
//! the next transaction.

use super::PendingCommit;
use crate::flusher::Applied;
use crate::journal::record::{
    JournalPage, RecordInput, FLAG_FREEZE, FLAG_MERGE_DONE, MAX_RECORD_BODY,
};
use crate::journal::writer::JournalPos;
use crate::page::{PageNo, PageRun};
use crate::shared::Shared;
use crate::txn::{Snapshot, WriteTxn};
use crate::{Error, Result};
use std::sync::Arc;

/// What a commit does to the write buffer: generations after it, merge position to
/// keep, record flags (`Shared::buffer_step`).
type BufferStep = (crate::write_buffer::Gens, Option<Box<[u8]>>, u8);
/// Keys of the frozen write-buffer generation merged per commit, at least.
const MIN_MERGE_SLICE_KEYS: usize = 256;
/// Keys merged per commit when the whole buffer must go (close, check).
const FORCED_MERGE_SLICE_KEYS: usize = 1 << 16;

impl Shared {
    /// Phase 1, under the writer lock: catalog update, sealing, encoding the record
    /// (which fixes its place in the journal chain), and making the pages readable for
    /// the next transaction. Readers cannot reach them yet: the snapshot they start
    /// from moves only in phase 2. Releases the writer lock, so the next transaction
    /// can run while this one's journal write is in flight. `None` if nothing changed.
    pub(crate) fn prepare_commit(&self, txn: &mut WriteTxn) -> Result<Option<PendingCommit>> {
        if !txn.has_changes() {
            txn.rollback();
            return Ok(None);
        }
        if let Some(why) = self.poison_reason() {
            return Err(Error::Poisoned(why));
        }
        self.wait_for_flusher_room()?;
        let (gens, merge_cursor, buffer_flags) = self.buffer_step(txn)?;
        txn.mutate(|t| t.update_catalog())?;
        let sealed = txn.seal_dirty();
        let pages: Vec<(PageNo, Arc<PageRun>)> =
            sealed.into_iter().map(|(n, r)| (n, Arc::new(r))).collect();
        let mut freed = txn.freed_committed.clone();
        freed.extend_from_slice(&txn.local_free);
        // An upper bound of the record body: page bytes, image headers, freed list.
        let page_bytes: usize = pages
            .iter()
            .map(|(_, r)| r.bytes().len() + 64)
            .sum::<usize>()
            + (txn.freed_committed.len() + txn.local_free.len()) * 8
            + txn.logical.encoded_len();
        if page_bytes > MAX_RECORD_BODY {
            txn.rollback();
            return Err(Error::TransactionTooLarge {
                bytes: page_bytes as u64,
                max: MAX_RECORD_BODY as u64,
            });
        }
        let mut w = txn.writer.take().expect("writer guard held until commit");
        let sourced: Result<Vec<JournalPage>> = pages
            .iter()
            .map(|(no, run)| {
                let source = match txn.sources.get(no) {
                    Some(s) => Some((*s, crate::btree::PageSource::page(&*txn, *s)?)),
                    None => None,
                };
                Ok(JournalPage {
                    no: *no,
                    run,
                    source,
                })
            })
            .collect();
        let journal_pages = match sourced {
            Ok(j) => j,
            Err(e) => {
                txn.writer = Some(w);
                txn.rollback();
                return Err(e);
            }
        };
        assert_eq!(
            txn.txn_id,
            w.latest.txn_id + 1,
            "transaction ids must increase by one"
        );
        let page_count = w.alloc.page_count;
        let chain_before = w.encoder.chain_checksum();
        let record = w.encoder.encode(RecordInput {
            txn_id: txn.txn_id,
            nonce: 0,
            prev_checksum: 0,
            catalog_root: txn.catalog_root,
            page_count,
            freed: &freed,
            pages: &journal_pages,
            logical: &txn.logical,
            buffer_flags,
        });
        drop(journal_pages);
        // The journal file this record goes to must exist before the point of no
        // return: creating one can fail for lack of space, and then only this commit
        // fails, with nothing of it written (later commits are built on this one once
        // it passes that point, so a failure after it latches).
        match w
            .journal_end
            .advance(record.journal_len() as u64, &self.journal_files)
        {
            Ok(end) => w.journal_end = end,
            Err(e) => {
                w.encoder.rewind_chain(chain_before);
                txn.writer = Some(w);
                txn.rollback();
                return Err(e);
            }
        }
        // The point of no return: the buffer writes are part of the commit now.
        txn.undo.clear();
        txn.logical.clear();
        w.merge_cursor = merge_cursor;
        self.store.publish(&pages);
        let bytes: u64 = pages.iter().map(|(_, r)| r.bytes().len() as u64).sum();
        self.backlog.add(bytes);
        w.alloc
            .add_pending(txn.txn_id, std::mem::take(&mut txn.freed_committed));
        w.alloc.free.extend(txn.local_free.drain(..));
        self.note_alloc(&w.alloc);
        w.latest = Snapshot {
            txn_id: txn.txn_id,
            catalog_root: txn.catalog_root,
            page_count: w.alloc.page_count,
            gens: gens.clone(),
        };
        let applied = Applied {
            txn_id: txn.txn_id,
            catalog_root: txn.catalog_root,
            page_count: w.latest.page_count,
            pages,
            freed,
            froze: buffer_flags & FLAG_FREEZE != 0,
            merge_done: buffer_flags & FLAG_MERGE_DONE != 0,
            buffer_empty: gens.is_empty(),
            end: JournalPos {
                file_seq: 0,
                offset: 0,
                chain_checksum: 0,
            },
        };
        drop(w);
        Ok(Some(PendingCommit {
            record,
            applied,
            gens,
        }))
    }

    /// The write buffer's part of a commit, before its catalog update: merges the
    /// next slice of the frozen generation into the trees, and decides whether the
    /// active generation freezes. Returns the generations after the commit, the
    /// merge position to keep if it commits, and the record's buffer flags.
    fn buffer_step(&self, txn: &mut WriteTxn) -> Result<BufferStep> {
        let mut gens = txn.base.gens.clone();
        let mut cursor = txn
            .writer
            .as_ref()
            .expect("writer guard held until commit")
            .merge_cursor
            .clone();
        let threshold = self.opts.write_buffer_bytes;
        if gens.frozen.is_some() {
            // Merge faster than commits fill the active generation, so it is done
            // before that one is due to freeze; much faster once it is overdue.
            let mut limit = (2 * txn.undo.len()).max(MIN_MERGE_SLICE_KEYS);
            if txn.force_merge {
                limit = FORCED_MERGE_SLICE_KEYS;
            } else if gens.active.bytes() > threshold {
                limit *= 8;
            }
            let done = txn.mutate(|t| t.merge_slice(&mut cursor, limit))?;
            if done {
                gens.frozen = None;
                return Ok((gens, None, FLAG_MERGE_DONE));
            }
            return Ok((gens, cursor, 0));
        }
        let full = gens.active.bytes() >= threshold || txn.force_merge;
        if full && !gens.active.is_empty() {
            // This transaction's own entries are in the generation that freezes.
            gens.frozen = Some(std::mem::take(&mut gens.active));
            return Ok((gens, None, FLAG_FREEZE));
        }
        Ok((gens, cursor, 0))
    }
}
