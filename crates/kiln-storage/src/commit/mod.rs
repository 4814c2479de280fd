//! Where a commit goes: the commit queue merges units of work from many callers into
//! one write transaction (`queue`); the transaction is then prepared under the writer
//! lock (`prepare`: write-buffer step, catalog, sealing, record encoding) and finished
//! in journal order (`finish`: the durable journal write, publishing the snapshot,
//! handing the pages to the flusher).

mod finish;
mod prepare;
pub(crate) mod queue;

// (`QueueLimits` is defined with the other options, which import nothing of this module.)
pub use crate::options::QueueLimits;
pub use queue::QueueStats;

use crate::flusher::Applied;
use crate::journal::writer::PreparedRecord;
use crate::shared::Shared;
use crate::txn::WriteTxn;
use crate::write_buffer::Gens;
use crate::{Failure, Result};

/// A commit whose record is encoded and whose pages are in place, waiting for its
/// journal write.
pub(crate) struct PendingCommit {
    record: PreparedRecord,
    applied: Applied,
    gens: Gens,
}

impl PendingCommit {
    /// The transaction this commit makes durable.
    pub(crate) fn txn_id(&self) -> u64 {
        self.applied.txn_id
    }
}

impl Shared {
    /// Commits a write transaction: `prepare_commit`, then `finish_commit`.
    pub(crate) fn commit(&self, txn: &mut WriteTxn) -> Result<u64> {
        let prepared =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.prepare_commit(txn)))
                .unwrap_or_else(|panic| {
                    // Half-done commit state cannot be trusted: latch, then let the panic
                    // continue to the caller.
                    self.poison(Failure::internal(
                        "preparing a commit panicked",
                        crate::error::panic_message(&*panic),
                    ));
                    std::panic::resume_unwind(panic)
                });
        match prepared? {
            Some(pending) => self.finish_commit(pending),
            None => {
                let base = txn.base_txn_id();
                self.wait_durable(base).map(|_| base)
            }
        }
    }
}

/// The environment as the commit queue sees it: the commit phases and the latch.
impl queue::Committer for Shared {
    fn limits(&self) -> &QueueLimits {
        &self.opts.queue_limits
    }
    fn begin(&self) -> Result<WriteTxn<'_>> {
        WriteTxn::begin_for_queue(self)
    }
    fn prepare(&self, txn: &mut WriteTxn) -> Result<Option<PendingCommit>> {
        self.prepare_commit(txn)
    }
    fn finish(&self, pending: PendingCommit) -> Result<u64> {
        self.finish_commit(pending)
    }
    fn wait_durable(&self, txn_id: u64) -> Result<()> {
        Shared::wait_durable(self, txn_id)
    }
    fn latch(&self, why: Failure) {
        self.poison(why)
    }
}
