//! Phase 1 of a commit, under the writer lock: the write buffer's step (merge a
//! slice, or freeze), the catalog update, sealing the pages, encoding the record
//! (which fixes its place in the journal chain), and making the pages readable for
//! the next transaction.

use super::PendingCommit;
use crate::flusher::Applied;
use crate::journal::record::{RecordInput, FLAG_FREEZE, FLAG_MERGE_DONE, MAX_RECORD_BODY};
use crate::journal::writer::{JournalPos, PreparedRecord};
use crate::shared::Shared;
use crate::shared::Snapshot;
use crate::txn::{Committed, SealedTxn, WriteTxn};
use crate::{Error, Result};

/// What a commit does to the write buffer: generations after it, merge position to
/// keep, record flags (`Shared::buffer_step`).
type BufferStep = (crate::write_buffer::Gens, Option<Box<[u8]>>, u8);
/// Keys of the frozen write-buffer generation merged per commit, at least.
const MIN_MERGE_SLICE_KEYS: usize = 256;
/// The active generation also freezes once the journal written since the last
/// freeze reaches this many times `Options::write_buffer_bytes`.
pub(crate) const JOURNAL_PER_BUFFER_BYTE: u64 = 2;
/// Keys merged per commit when the whole buffer must go (close, check).
const FORCED_MERGE_SLICE_KEYS: usize = 1 << 16;

impl Shared {
    /// Phase 1, under the writer lock: catalog update, sealing, encoding the record
    /// (which fixes its place in the journal chain), and making the pages readable for
    /// the next transaction. Readers cannot reach them yet: the snapshot they start
    /// from moves only in phase 2. Releases the writer lock, so the next transaction
    /// can run while this one's journal write is in flight. `None` if nothing changed.
    pub(crate) fn prepare_commit(&self, txn: &mut WriteTxn) -> Result<Option<PendingCommit>> {
        // Asked before the trees come back from the merge thread: a transaction that
        // wrote nothing still writes nothing, whatever the thread merged for it (that
        // is dropped with it).
        if !txn.has_changes() {
            txn.rollback();
            return Ok(None);
        }
        // What the thread merged goes in this record.
        txn.join_ahead();
        let lends_next = txn.lends_next();
        if let Some(why) = self.poison_reason() {
            return Err(Error::Poisoned(why));
        }
        self.wait_for_flusher_room()?;
        // (Its record is merge traffic: see `encode_record`.)
        let merges = txn.base_gens().frozen.is_some();
        let (gens, merge_cursor, buffer_flags) = self.buffer_step(txn)?;
        let mut sealed = txn.seal()?;
        let record = match self.encode_record(&mut sealed, buffer_flags, merges) {
            Ok(record) => record,
            Err(e) => {
                sealed.abort();
                return Err(e);
            }
        };
        // The point of no return.
        let Committed {
            writer: mut w,
            txn_id,
            catalog_root,
            pages,
            freed,
        } = sealed.commit();
        w.merge_cursor = merge_cursor;
        self.store.publish(&pages);
        let bytes: u64 = pages.iter().map(|(_, r)| r.bytes().len() as u64).sum();
        self.backlog.add(bytes);
        self.note_alloc(&w.alloc);
        w.latest = Snapshot {
            txn_id,
            catalog_root,
            page_count: w.alloc.page_count,
            gens: gens.clone(),
        };
        let applied = Applied {
            txn_id,
            catalog_root,
            page_count: w.latest.page_count,
            pages,
            freed,
            froze: buffer_flags & FLAG_FREEZE != 0,
            merge_done: buffer_flags & FLAG_MERGE_DONE != 0,
            buffer_empty: gens.is_empty(),
            // (Set once the record is written.)
            end: JournalPos::UNSET,
        };
        if lends_next {
            crate::txn::lend_next_or_release(self, w);
        } else {
            drop(w);
        }
        Ok(Some(PendingCommit {
            record,
            applied,
            gens,
        }))
    }

    /// Encodes the sealed transaction's record, which fixes its place in the journal
    /// chain, and makes sure the journal file it goes to exists. On error the chain
    /// is as before and nothing is written: the caller aborts the transaction. A
    /// commit that `merges` a slice of the frozen generation journals the leaves it
    /// rewrites: merge traffic, not counted toward the next freeze (counted, it
    /// froze an ordinary load's generations smaller).
    fn encode_record(
        &self,
        sealed: &mut SealedTxn,
        buffer_flags: u8,
        merges: bool,
    ) -> Result<PreparedRecord> {
        let body_bound = sealed.content.record_body_bound();
        if body_bound > MAX_RECORD_BODY {
            return Err(Error::TransactionTooLarge {
                bytes: body_bound as u64,
                max: MAX_RECORD_BODY as u64,
            });
        }
        let journal_pages = sealed.content.journal_pages()?;
        let txn_id = sealed.content.txn_id();
        let w = &mut sealed.writer;
        assert_eq!(
            txn_id,
            w.latest.txn_id + 1,
            "transaction ids must increase by one"
        );
        let page_count = w.alloc.page_count;
        let chain_before = w.encoder.chain_checksum();
        let record = w.encoder.encode(RecordInput {
            txn_id,
            nonce: 0,
            prev_checksum: 0,
            catalog_root: sealed.content.catalog_root(),
            page_count,
            freed: &sealed.content.freed,
            pages: &journal_pages,
            logical: sealed.content.logical(),
            buffer_flags,
            merged: sealed.content.merged_values(),
        });
        drop(journal_pages);
        // The journal file this record goes to must exist before the point of no
        // return: creating one can fail for lack of space, and then only this commit
        // fails, with nothing of it written (later commits are built on this one once
        // it passes that point, so a failure after it latches).
        match sealed
            .writer
            .journal_end
            .advance(record.journal_len() as u64, &self.journal_files)
        {
            Ok(end) => {
                let w = &mut sealed.writer;
                w.journal_end = end;
                if buffer_flags & FLAG_FREEZE != 0 {
                    w.journal_bytes_since_freeze = 0;
                } else if !merges {
                    w.journal_bytes_since_freeze += record.journal_len() as u64;
                }
            }
            Err(e) => {
                sealed.writer.encoder.rewind_chain(chain_before);
                return Err(e);
            }
        }
        Ok(record)
    }

    /// The write buffer's part of a commit, before its catalog update: merges the
    /// next slice of the frozen generation into the trees, and decides whether the
    /// active generation freezes. Returns the generations after the commit, the
    /// merge position to keep if it commits, and the record's buffer flags.
    fn buffer_step(&self, txn: &mut WriteTxn) -> Result<BufferStep> {
        let mut gens = txn.base_gens().clone();
        let mut cursor = txn.merge_cursor();
        let threshold = self.opts.write_buffer_bytes;
        if gens.frozen.is_some() {
            // Merge faster than commits fill the active generation, so it is done
            // before that one is due to freeze; much faster once it is overdue.
            let mut limit = (2 * txn.buffer_writes()).max(MIN_MERGE_SLICE_KEYS);
            if txn.force_merge() {
                limit = FORCED_MERGE_SLICE_KEYS;
            } else if gens.active.bytes() > threshold {
                limit *= 8;
            }
            // Keys the merge thread went past count toward the slice.
            let (ahead_keys, ahead_done) =
                txn.merged_ahead().map_or((0, false), |m| (m.keys, m.done));
            self.counters
                .write_buffer_keys_merged_ahead
                .fetch_add(ahead_keys as u64, std::sync::atomic::Ordering::Relaxed);
            let done = ahead_done
                || (ahead_keys < limit
                    && txn.mutate(|t| t.merge_slice(&mut cursor, limit - ahead_keys))?);
            if done {
                gens.frozen = None;
                return Ok((gens, None, FLAG_MERGE_DONE));
            }
            return Ok((gens, cursor, 0));
        }
        // By the journal too: a few keys written over and over keep the buffer's
        // memory small while every commit adds a padded record to the journal
        // that recovery would replay from the last freeze. Twice the threshold:
        // an ordinary load (an entry's record about its size) still freezes by
        // memory, as before.
        let full = gens.active.bytes() >= threshold
            || txn.journal_bytes_since_freeze() >= JOURNAL_PER_BUFFER_BYTE * threshold
            || txn.force_merge();
        if full && !gens.active.is_empty() {
            // This transaction's own entries are in the generation that freezes.
            gens.frozen = Some(std::mem::take(&mut gens.active));
            return Ok((gens, None, FLAG_FREEZE));
        }
        Ok((gens, cursor, 0))
    }
}
