//! Phase 2 of a commit, in transaction order: the durable journal write, then
//! publishing the snapshot and handing the pages to the flusher.

use super::PendingCommit;
use crate::flusher::Applied;
use crate::journal::writer::{JournalPos, JournalWriter, PreparedRecord};
use crate::shared::Shared;
use crate::shared::Snapshot;
use crate::write_buffer::Gens;
use crate::{Error, Failure, Result};
use std::sync::atomic::Ordering::Relaxed;

impl Shared {
    /// Phase 2: waits for this transaction's turn, writes its record durably, then
    /// publishes the snapshot and hands the pages to the flusher. A failed write
    /// latches the environment; transactions prepared after it then fail too, since
    /// they were built on it.
    pub(crate) fn finish_commit(&self, pending: PendingCommit) -> Result<u64> {
        let PendingCommit {
            record,
            applied,
            gens,
        } = pending;
        let txn_id = applied.txn_id;
        // A trace's view of the commit (a child of the caller's span; nothing is
        // made when no layer wants it): the wait for the journal's turn and the
        // durable write of one record for the whole group.
        let _span = tracing::info_span!(
            "kiln.journal.write",
            txn_id,
            journal_bytes = record.journal_len(),
            body_bytes = record.stored_body_len,
        )
        .entered();
        let mut j = self.journal.lock();
        // Turns pass in transaction order: a turn already past this one would make
        // the wait below endless.
        assert!(
            j.last_txn < txn_id,
            "commit of transaction {txn_id} after the journal's turn reached {}",
            j.last_txn
        );
        while j.last_txn + 1 != txn_id {
            self.journal_turn.wait(&mut j);
        }
        // Nothing between taking the turn and passing it on may panic: every later
        // commit waits for it.
        let result = match self.write_in_turn(&mut j.writer, &record, txn_id) {
            Ok(end) => {
                self.publish_committed(applied, gens, end);
                Ok(txn_id)
            }
            Err(e) => {
                // What reached the disk is unknown: latch, so that only a reopen (which
                // reads the journal back) decides what was committed; and say so.
                let failure = Failure::from_error("journal write failed", &e);
                self.poison(failure.clone());
                Err(Error::Poisoned(failure))
            }
        };
        j.last_txn = txn_id;
        drop(j);
        self.journal_turn.notify_all();
        result
    }

    /// The journal write of a transaction whose turn it is; a panic in it, or a
    /// record of another transaction, becomes an error instead of a stuck turn.
    fn write_in_turn(
        &self,
        writer: &mut JournalWriter,
        record: &PreparedRecord,
        txn_id: u64,
    ) -> Result<JournalPos> {
        if let Some(why) = self.poison_reason() {
            return Err(Error::Poisoned(why));
        }
        if record.txn_id != txn_id {
            return Err(Error::Poisoned(Failure::internal(
                "a commit's journal record",
                format!(
                    "the record is of transaction {}, the commit of {txn_id}",
                    record.txn_id
                ),
            )));
        }
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.write(record)))
            .unwrap_or_else(|panic| {
                Err(Error::Poisoned(Failure::internal(
                    "the journal write panicked",
                    crate::error::panic_message(&*panic),
                )))
            })
    }

    /// Makes a durable commit visible to readers and hands its pages to the flusher.
    fn publish_committed(&self, mut applied: Applied, gens: Gens, end: JournalPos) {
        applied.end = end;
        let txn_id = applied.txn_id;
        self.readers.publish(Snapshot {
            txn_id,
            catalog_root: applied.catalog_root,
            page_count: applied.page_count,
            gens,
        });
        self.counters.commits.fetch_add(1, Relaxed);
        if applied.froze {
            self.counters.write_buffer_freezes.fetch_add(1, Relaxed);
        }
        if applied.merge_done {
            self.counters.write_buffer_merges.fetch_add(1, Relaxed);
        }
        // A journal file to prepare is the one thing that cannot wait for the
        // flusher's next window.
        let wake_now = self.journal_files.spare_wanted();
        if let Err(e) = self.flush_queue.push_applied(applied, wake_now) {
            // The commit is durable and visible: report it as committed, but no
            // further commits can be written back, so latch.
            self.poison(Failure::from_error(
                "cannot hand commits to the flusher",
                &e,
            ));
        }
    }
}
