//! Writes decided by a cluster's replicated log. Every node applies the same log
//! entries in the same order, with the time the leader stamped into the entry, so
//! a write gets the same etag and the same `@last-modified` on every node. The
//! entry's log index is stored in the same transaction as its writes: an entry
//! applied before a crash is recognised after it and not applied a second time
//! (which would move the etag sequence on, and the nodes apart).

use super::apply::apply_op;
use super::{at_index, Database};
use crate::model::schema::{decode_u64, META, META_APPLIED_LOG_INDEX, META_LOGGED_CLOCK_MS};
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
        // database's write clock is the same on every node at this entry, whether
        // or not it reopened the database since (the clock is stored with the
        // entry, and moves only with a committed one).
        let at_ms = at_ms.max(self.write_clock_ms.load(Ordering::SeqCst));
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
            txn.put(META, META_LOGGED_CLOCK_MS, &at_ms.to_be_bytes())?;
            Ok(LoggedOutcome::Applied(out))
        });
        if let Ok(LoggedOutcome::Applied(_)) = &outcome {
            self.write_clock_ms.fetch_max(at_ms, Ordering::SeqCst);
        }
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

/// An entry of a run ready to apply: its index, its time (never before the last
/// one's), its writes and each write's checks.
type PreparedEntry = (u64, u64, Vec<WriteOp>, Vec<Result<()>>);

/// One log entry of writes that each succeed or fail on their own, for
/// [`Database::apply_logged_run`].
#[derive(Debug)]
pub struct LoggedEntry {
    pub log_index: u64,
    pub at_ms: u64,
    pub ops: Vec<WriteOp>,
}

impl Database {
    /// `apply_logged` for a run of entries whose writes each succeed or fail on
    /// their own (`Atomicity::Each`), in ONE transaction: one journal write for
    /// the run instead of one per entry (a leader applies a batch of entries
    /// before it answers any of them). The run's last index is stored with its
    /// writes. One outcome per entry, as `apply_logged` would give them one by one.
    ///
    /// A write that fails in a way that would spoil the shared transaction (not a
    /// conflict or a refused document: `leaves_transaction_untouched` is false)
    /// fails the whole run with nothing written; the caller then applies the
    /// entries one by one, which gives each its own outcome.
    pub fn apply_logged_run(&self, entries: Vec<LoggedEntry>) -> Result<Vec<LoggedOutcome>> {
        let env = self.live()?;
        // As in `apply_logged`, times never go back along the writes; the clock
        // moves only once the run is in, so that a run that fails and is applied
        // again one entry at a time gets the same times.
        let mut clock_ms = self.write_clock_ms.load(Ordering::SeqCst);
        let prepared: Vec<PreparedEntry> = entries
            .into_iter()
            .map(|e| {
                let checks = e.ops.iter().map(|op| self.check_op(op)).collect();
                clock_ms = clock_ms.max(e.at_ms);
                (e.log_index, clock_ms, e.ops, checks)
            })
            .collect();
        let mut unit = self.unit().at_time(0);
        let run_clock_ms = clock_ms;
        let outcomes = env.submit_with(move |txn| {
            let applied = decode_applied(txn.get(META, META_APPLIED_LOG_INDEX)?)?;
            let mut last = applied;
            let mut out = Vec::with_capacity(prepared.len());
            for (log_index, at_ms, ops, checks) in prepared {
                if log_index <= applied {
                    out.push(LoggedOutcome::AlreadyApplied);
                    continue;
                }
                assert!(
                    log_index > last,
                    "log entries out of order in a run: {log_index} after {last}"
                );
                unit.set_time(at_ms);
                let mut results = Vec::with_capacity(ops.len());
                for (op, check) in ops.iter().zip(checks) {
                    match check.and_then(|()| apply_op(txn, &mut unit, op)) {
                        Ok(o) => results.push(Ok(o)),
                        Err(e) if e.leaves_transaction_untouched() => results.push(Err(e)),
                        Err(e) => return Err(e),
                    }
                }
                last = log_index;
                out.push(LoggedOutcome::Applied(results));
            }
            unit.finish(txn)?;
            if last > applied {
                txn.put(META, META_APPLIED_LOG_INDEX, &last.to_be_bytes())?;
                txn.put(META, META_LOGGED_CLOCK_MS, &run_clock_ms.to_be_bytes())?;
            }
            Ok::<_, DocError>(out)
        })?;
        self.write_clock_ms.fetch_max(clock_ms, Ordering::SeqCst);
        for outcome in &outcomes {
            if let LoggedOutcome::Applied(results) = outcome {
                self.published(results.iter().filter_map(|r| r.as_ref().ok()));
            }
        }
        Ok(outcomes)
    }
}

/// For an entry that is not a document write (a revisions configuration, a purge
/// of revisions), inside its transaction: false if the entry was applied before,
/// else records `log_index` as applied with it, as `apply_logged` does.
pub(crate) fn claim_log_index(
    txn: &mut kiln_storage::WriteTxn<'_>,
    log_index: u64,
) -> Result<bool> {
    if log_index <= decode_applied(txn.get(META, META_APPLIED_LOG_INDEX)?)? {
        return Ok(false);
    }
    txn.put(META, META_APPLIED_LOG_INDEX, &log_index.to_be_bytes())?;
    Ok(true)
}

/// Records `log_index` as the last log entry applied to the (closed) database
/// environment at `dir`, whatever it held (a restore for a cluster's entry).
pub(crate) fn set_applied_log_index_at(
    dir: &std::path::Path,
    opts: kiln_storage::Options,
    log_index: u64,
) -> Result<()> {
    let env = kiln_storage::Env::open(dir, opts)?;
    let written = env
        .submit(move |w| w.put(META, META_APPLIED_LOG_INDEX, &log_index.to_be_bytes()))
        .map_err(DocError::from)
        .and_then(|()| env.sync().map_err(DocError::from));
    let closed = env.close().map_err(DocError::from);
    written.and(closed)
}

/// The write clock a database resumes from: its last write's time, or the time
/// of the last log entry applied to it when that is later.
pub(crate) fn resumed_write_clock_ms(r: &ReadTxn<'_>, last_write_ms: Option<u64>) -> Result<u64> {
    let logged = r
        .get(META, META_LOGGED_CLOCK_MS)?
        .map(|b| decode_u64(b, "logged clock"))
        .transpose()?;
    Ok(last_write_ms.unwrap_or(0).max(logged.unwrap_or(0)))
}

fn read_applied(r: &ReadTxn<'_>) -> Result<u64> {
    decode_applied(r.get(META, META_APPLIED_LOG_INDEX)?)
}

fn decode_applied(raw: Option<&[u8]>) -> Result<u64> {
    raw.map_or(Ok(0), |b| {
        decode_u64(b, "applied log index").map_err(DocError::from)
    })
}
