//! Phase 2 of a commit, in transaction order: the durable journal write, then
//! publishing the snapshot and handing the pages to the flusher.

use super::PendingCommit;
use crate::shared::Shared;
use crate::shared::Snapshot;
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
            mut applied,
            gens,
        } = pending;
        let txn_id = applied.txn_id;
        assert_eq!(
            record.txn_id, txn_id,
            "record and commit disagree on the transaction id"
        );
        let mut j = self.journal.lock();
        while j.last_txn + 1 != txn_id {
            self.journal_turn.wait(&mut j);
        }
        let written = match self.poison_reason() {
            Some(why) => Err(Error::Poisoned(why)),
            // A panic here must still pass the turn on below, or every later commit
            // would wait for this one forever.
            None => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| j.writer.write(&record)))
                    .unwrap_or_else(|panic| {
                        Err(Error::Poisoned(Failure::internal(
                            "the journal write panicked",
                            crate::error::panic_message(&*panic),
                        )))
                    })
            }
        };
        let result = match written {
            Ok(end) => {
                applied.end = end;
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
                // A journal file to prepare is the one thing that cannot wait for
                // the flusher's next window.
                let wake_now = self.journal_files.spare_wanted();
                if let Err(e) = self.flush_queue.push_applied(applied, wake_now) {
                    // The commit is durable and visible: report it as committed, but no
                    // further commits can be written back, so latch.
                    self.poison(Failure::from_error(
                        "cannot hand commits to the flusher",
                        &e,
                    ));
                }
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
}
