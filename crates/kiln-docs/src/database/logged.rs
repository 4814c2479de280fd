//! Writes decided by a cluster's replicated log. Every node applies the same log
//! entries in the same order, with the time the leader stamped into the entry, so
//! a write gets the same etag and the same `@last-modified` on every node. The
//! entry's log index is stored in the same transaction as its writes: an entry
//! applied before a crash is recognised after it and not applied a second time
//! (which would move the etag sequence on, and the nodes apart).

use super::apply::apply_op;
use super::{at_index, Database};
use crate::schema::{decode_u64, META, META_APPLIED_LOG_INDEX};
use crate::{BatchOutcome, DocError, Result, WriteOp};
use kiln_storage::ReadTxn;
use std::sync::atomic::Ordering;

/// What applying a log entry did.
#[derive(Debug)]
pub enum LoggedOutcome {
    /// The entry was applied before (its index is at or below the stored one).
    AlreadyApplied,
    /// One result per write, in order. With `all_or_none`, either all succeeded
    /// or the first failure is the only result and nothing was written.
    Applied(Vec<Result<BatchOutcome>>),
}

/// How the writes of one log entry succeed or fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Atomicity {
    /// All or none (a client's batch, a bulk insert's batch).
    AllOrNone,
    /// Each on its own (a conflict fails only its write).
    Each,
}

impl Database {
    /// The index of the last log entry applied to this database (0: none).
    pub fn applied_log_index(&self) -> Result<u64> {
        let r = self.env().begin_read()?;
        read_applied(&r)
    }

    /// Applies the writes of log entry `log_index`, stamped `at_ms` by the leader,
    /// and records the index in the same transaction; an index at or below the
    /// recorded one is not applied again. Checks (ids, sizes) are the same as for
    /// a direct write, and fail the same way on every node.
    pub fn apply_logged(
        &self,
        log_index: u64,
        at_ms: u64,
        ops: Vec<WriteOp>,
        atomicity: Atomicity,
    ) -> Result<LoggedOutcome> {
        let env = self.live()?;
        let checks: Vec<Result<()>> = ops.iter().map(|op| self.check_op(op)).collect();
        // Times never go back along a database's writes (a restore to a time takes
        // a prefix of them), whatever the clock of the leader that stamped them: the
        // database's own last write time is the same on every node at this entry.
        let at_ms = at_ms.max(self.write_clock_ms.fetch_max(at_ms, Ordering::SeqCst));
        let mut unit = self.unit().at_time(at_ms);
        let outcome = env.submit_with(move |txn| {
            if log_index <= decode_applied(txn.get(META, META_APPLIED_LOG_INDEX)?)? {
                return Ok(LoggedOutcome::AlreadyApplied);
            }
            let mut out = Vec::with_capacity(ops.len());
            for (index, (op, check)) in ops.iter().zip(checks).enumerate() {
                match check.and_then(|()| apply_op(txn, &mut unit, op)) {
                    Ok(o) => out.push(Ok(o)),
                    Err(e) if atomicity == Atomicity::Each && e.leaves_transaction_untouched() => {
                        out.push(Err(e))
                    }
                    Err(DocError::Storage(e)) => return Err(DocError::Storage(e)),
                    Err(e) => return Err(at_index(index)(e)),
                }
            }
            unit.finish(txn)?;
            txn.put(META, META_APPLIED_LOG_INDEX, &log_index.to_be_bytes())?;
            Ok(LoggedOutcome::Applied(out))
        });
        let outcome = match outcome {
            // An all-or-none entry that fails writes nothing (the transaction is
            // dropped), its index included: the same log gives the same failure on
            // every node and on a replay.
            Err(e) if atomicity == Atomicity::AllOrNone && !matches!(e, DocError::Storage(_)) => {
                LoggedOutcome::Applied(vec![Err(e)])
            }
            other => other?,
        };
        if let LoggedOutcome::Applied(results) = &outcome {
            self.published(results.iter().filter_map(|r| r.as_ref().ok()));
        }
        Ok(outcome)
    }
}

fn read_applied(r: &ReadTxn<'_>) -> Result<u64> {
    decode_applied(r.get(META, META_APPLIED_LOG_INDEX)?)
}

fn decode_applied(raw: Option<&[u8]>) -> Result<u64> {
    raw.map_or(Ok(0), |b| decode_u64(b, "applied log index"))
}
