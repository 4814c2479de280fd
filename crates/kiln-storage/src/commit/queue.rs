//! The commit queue: many threads submit units of work; one of them at a time (the
//! leader) runs the queued units back to back in ONE write transaction, and the group
//! is committed with ONE journal write. Each submitter is answered when that write is
//! durable. A unit that fails or panics is rolled back alone (a savepoint per unit).
//!
//! Group size adapts by itself: a lone submitter finds the queue empty and leads its
//! own unit at once (no waiting for company); under load, units pile up while the
//! previous group is executing or writing, and the next leader takes them all (up to
//! `max_group_units` / `max_group_bytes`).
//!
//! Pipelining: a leader gives up leadership as soon as its group is encoded (phase 1),
//! so the next group executes in memory while this one's journal write is in flight.
//! At most one group waits for the journal behind the one being written: more would
//! only split the work into smaller writes.

use super::PendingCommit;
use crate::options::QueueLimits;
pub use crate::stats::QueueStats;
use crate::txn::WriteTxn;
use crate::Failure;
use crate::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

pub(crate) type Unit = Box<dyn for<'a, 'e> FnOnce(&'a mut WriteTxn<'e>) -> Result<()> + Send>;

/// What a waiting submitter is told: lead the next group, or the outcome of its unit
/// (the id of the transaction that committed it, or why it did not).
enum Word {
    Wait,
    Lead,
    Done(Result<u64>),
}

/// Each submitter waits on its own answer, so a leader wakes exactly the threads it
/// has news for (waking all 64 waiters per group costs more than the group's write).
struct Answer {
    word: Mutex<Word>,
    cv: Condvar,
}

impl Answer {
    fn tell(&self, w: Word) {
        *self.word.lock() = w;
        self.cv.notify_one();
    }
}

struct Job {
    unit: Unit,
    answer: Arc<Answer>,
    enqueued: Instant,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    /// A leader is executing a group (phase 1).
    leader_active: bool,
    /// Groups encoded and not yet through their journal write.
    groups_in_flight: usize,
    /// The transaction of the last group prepared (ids only increase).
    last_group_txn: u64,
}

#[derive(Default)]
pub(crate) struct CommitQueue {
    state: Mutex<QueueState>,
    units_committed: AtomicU64,
    units_failed: AtomicU64,
    groups: AtomicU64,
    max_group_units: AtomicU64,
    overloaded: AtomicU64,
    /// Size of the most recent group (a hint of how many submitters are active).
    last_group_units: AtomicU64,
}

impl CommitQueue {
    pub fn stats(&self) -> QueueStats {
        QueueStats {
            units_committed: self.units_committed.load(Relaxed),
            units_failed: self.units_failed.load(Relaxed),
            groups: self.groups.load(Relaxed),
            max_group_units: self.max_group_units.load(Relaxed),
            overloaded_rejections: self.overloaded.load(Relaxed),
        }
    }

    fn enqueue(&self, unit: Unit, limits: &QueueLimits) -> Result<Arc<Answer>> {
        let mut st = self.state.lock();
        let oldest_wait_ms = st
            .jobs
            .front()
            .map_or(0, |j| j.enqueued.elapsed().as_millis() as u64);
        if st.jobs.len() >= limits.max_queued_units || oldest_wait_ms > limits.max_queue_delay_ms {
            self.overloaded.fetch_add(1, Relaxed);
            return Err(Error::Overloaded {
                queued: st.jobs.len(),
                oldest_wait_ms,
                max_units: limits.max_queued_units,
                max_delay_ms: limits.max_queue_delay_ms,
            });
        }
        let answer = Arc::new(Answer {
            word: Mutex::new(Word::Wait),
            cv: Condvar::new(),
        });
        st.jobs.push_back(Job {
            unit,
            answer: answer.clone(),
            enqueued: Instant::now(),
        });
        Self::appoint_leader(&mut st);
        Ok(answer)
    }

    /// Makes the owner of the first queued unit the leader, if a group may start:
    /// nobody is executing one, and at most one group waits for the journal.
    fn appoint_leader(st: &mut QueueState) {
        if st.leader_active || st.groups_in_flight > 1 {
            return;
        }
        if let Some(first) = st.jobs.front() {
            st.leader_active = true;
            first.answer.tell(Word::Lead);
        }
    }

    /// The leader's group is encoded (as transaction `prepared`, if it changed
    /// anything): let the next group start. `Err` says which invariant of the queue
    /// does not hold (`Broken`); the state is updated all the same.
    fn end_leadership(&self, prepared: Option<u64>) -> std::result::Result<(), Broken> {
        let mut st = self.state.lock();
        let mut broken = Broken::check(st.leader_active, || {
            "a group ended its leadership while no group was being led".into()
        });
        st.leader_active = false;
        if let Some(txn_id) = prepared {
            // Leaders follow each other (`appoint_leader`), and each prepares its
            // transaction under the writer lock: on top of the previous one.
            broken = broken.and(Broken::check(txn_id > st.last_group_txn, || {
                format!(
                    "a group prepared txn {txn_id} after a group prepared txn {}: transaction ids must increase",
                    st.last_group_txn
                )
            }));
            st.last_group_txn = txn_id;
            st.groups_in_flight += 1;
            broken = broken.and(Broken::check(st.groups_in_flight <= 2, || {
                format!(
                    "{} groups wait for the journal; a leader starts only while at most one does",
                    st.groups_in_flight
                )
            }));
        }
        Self::appoint_leader(&mut st);
        broken
    }

    /// A group's journal write is done. `Err`: no group was in flight.
    fn group_written(&self) -> std::result::Result<(), Broken> {
        let mut st = self.state.lock();
        let broken = Broken::check(st.groups_in_flight > 0, || {
            "a journal write finished while no group was in flight".into()
        });
        st.groups_in_flight = st.groups_in_flight.saturating_sub(1);
        Self::appoint_leader(&mut st);
        broken
    }

    /// Under load, gives the submitters just answered a moment to queue their next
    /// units, so that they join this group instead of forming the next small one:
    /// every journal write costs a device round trip and, in a VM, a trap to the
    /// hypervisor. Only yields the CPU (no sleep), and only while the last group was
    /// large and far more units are on their way than are queued: a lone writer, or
    /// a light load, never waits.
    fn let_company_arrive(&self) {
        let expected = self.last_group_units.load(Relaxed) as usize;
        if expected < 4 {
            return;
        }
        for _ in 0..8 {
            if self.state.lock().jobs.len() * 2 >= expected {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// The leader takes the units at the front of the queue (its own is first).
    fn take_group(&self, max_units: usize) -> Vec<Job> {
        let mut st = self.state.lock();
        let take = st.jobs.len().min(max_units.max(1));
        st.jobs.drain(..take).collect()
    }

    fn put_back(&self, jobs: Vec<Job>) {
        let mut st = self.state.lock();
        for job in jobs.into_iter().rev() {
            st.jobs.push_front(job);
        }
    }
}

/// Why a unit failed that returned `Ok` after one of its operations failed (the
/// source): it went on with a transaction that can only be rolled back.
#[derive(Debug, thiserror::Error)]
#[error("an operation of this unit failed and the unit went on: {0}")]
struct WentOn(#[source] Arc<Error>);

/// A broken invariant of the queue. Found where an assertion's panic would leave
/// other threads waiting forever (a leader holds the journal's turn from its group's
/// point of no return to its journal write, and its group's submitters wait for its
/// answer), so it latches the environment instead: this group and every later
/// commit fail with `Poisoned`, the message saying what was expected and found.
#[derive(Debug)]
pub(crate) struct Broken(String);

impl Broken {
    fn new(what: String) -> Self {
        Broken(what)
    }

    /// `Err` if `holds` is false (the message is only built then).
    fn check(holds: bool, what: impl FnOnce() -> String) -> std::result::Result<(), Broken> {
        if holds {
            Ok(())
        } else {
            Err(Broken(what()))
        }
    }

    /// Latches the environment; the error to answer with.
    fn latch(self, env: &impl Committer) -> Error {
        let why = Failure::internal("commit queue invariant broken", self.0);
        env.latch(why.clone());
        Error::Poisoned(why)
    }
}

/// The environment as the queue sees it: the commit phases, and the latch for a
/// panic in them.
pub(crate) trait Committer {
    fn limits(&self) -> &QueueLimits;
    fn begin(&self) -> Result<WriteTxn<'_>>;
    fn prepare(&self, txn: &mut WriteTxn) -> Result<Option<PendingCommit>>;
    fn finish(&self, pending: PendingCommit) -> Result<u64>;
    fn wait_durable(&self, txn_id: u64) -> Result<()>;
    fn latch(&self, why: Failure);
}

impl CommitQueue {
    /// Submits a unit and blocks until it is durable (or failed).
    pub(crate) fn submit(&self, env: &impl Committer, unit: Unit) -> Result<u64> {
        let q = self;
        let answer = q.enqueue(unit, env.limits())?;
        let mut word = answer.word.lock();
        loop {
            match std::mem::replace(&mut *word, Word::Wait) {
                Word::Done(r) => return r,
                Word::Lead => {
                    drop(word);
                    q.let_company_arrive();
                    let group = q.take_group(env.limits().max_group_units);
                    q.lead_group(env, group);
                    word = answer.word.lock();
                }
                Word::Wait => answer.cv.wait(&mut word),
            }
        }
    }

    /// Runs a group in one write transaction and commits it with one journal write.
    fn lead_group(&self, env: &impl Committer, group: Vec<Job>) {
        let mut txn = match env.begin() {
            Ok(t) => t,
            Err(e) => {
                let e = Arc::new(e);
                for job in group {
                    job.answer
                        .tell(Word::Done(Err(Error::GroupFailed(e.clone()))));
                }
                if let Err(broken) = self.end_leadership(None) {
                    broken.latch(env);
                }
                return;
            }
        };
        // Units' lookups that fault (past RAM) open the read-ahead window, so that
        // the next writers ask for their leaves before taking the turn.
        let faults_before = crate::prefetch::thread_major_faults();
        // In a trace: the group this thread leads (its units are other callers'
        // too) and, inside it, the journal write (`finish.rs`).
        let span = tracing::info_span!("kiln.commit.group", units = tracing::field::Empty);
        let _entered = span.enter();
        let committed = self.run_units(env, &mut txn, group);
        span.record("units", committed.len());
        txn.store().read_ahead.note_batch(faults_before);
        let result = self.commit_group(env, txn);
        self.answer_group(&committed, result);
    }

    /// Runs the group's units in `txn`, each under a savepoint, until the group's
    /// byte bound; units beyond it go back to the front of the queue, in order. A
    /// unit that fails, panics or ignores a failed operation is rolled back and
    /// answered now; the others' answers are returned, to be told the group's outcome.
    fn run_units(
        &self,
        env: &impl Committer,
        txn: &mut WriteTxn,
        group: Vec<Job>,
    ) -> Vec<Arc<Answer>> {
        let q = self;
        let mut committed = Vec::with_capacity(group.len());
        let mut rest = group.into_iter();
        for job in rest.by_ref() {
            txn.savepoint();
            match catch_unwind(AssertUnwindSafe(|| (job.unit)(txn))) {
                Ok(Ok(())) => match txn.broken_cause() {
                    // The unit ignored a failed operation: its changes may be half
                    // done, so they go, and the unit is told why.
                    Some(why) => {
                        txn.rollback_to_savepoint();
                        q.units_failed.fetch_add(1, Relaxed);
                        job.answer
                            .tell(Word::Done(Err(Error::UnitFailed(Box::new(WentOn(why))))));
                    }
                    None => {
                        txn.release_savepoint();
                        committed.push(job.answer);
                    }
                },
                Ok(Err(e)) => {
                    txn.rollback_to_savepoint();
                    q.units_failed.fetch_add(1, Relaxed);
                    job.answer.tell(Word::Done(Err(e)));
                }
                Err(panic) => {
                    txn.rollback_to_savepoint();
                    q.units_failed.fetch_add(1, Relaxed);
                    let msg = crate::error::panic_message(&*panic);
                    job.answer.tell(Word::Done(Err(Error::UnitPanicked(msg))));
                }
            }
            if txn.dirty_bytes() >= env.limits().max_group_bytes {
                break;
            }
        }
        // Units beyond the byte bound go back to the front of the queue, in order.
        let leftover: Vec<Job> = rest.collect();
        if !leftover.is_empty() {
            q.put_back(leftover);
        }
        committed
    }

    /// Commits the group's transaction: prepares it (phase 1), lets the next group
    /// start, then writes its record (phase 2). Returns the id of the transaction
    /// that holds the group's units.
    fn commit_group<'e>(&self, env: &'e impl Committer, mut txn: WriteTxn<'e>) -> Result<u64> {
        // A panic in the engine must not leave this group's submitters, or the queue's
        // leadership, waiting forever: it becomes an error and latches the
        // environment (its state after a half-done commit cannot be trusted).
        let prepared = match catch_unwind(AssertUnwindSafe(|| env.prepare(&mut txn))) {
            Ok(p) => p,
            Err(panic) => {
                let why = crate::Failure::internal(
                    "preparing a commit panicked",
                    crate::error::panic_message(&*panic),
                );
                env.latch(why.clone());
                Err(Error::Poisoned(why))
            }
        };
        let base_txn = txn.base_txn_id();
        drop(txn);
        let prepared_txn = match &prepared {
            Ok(Some(p)) => Some(p.txn_id()),
            _ => None,
        };
        // (Latched before `finish`: it then fails the group, passing the turn on.)
        if let Err(broken) = self.end_leadership(prepared_txn) {
            broken.latch(env);
        }
        match prepared {
            Ok(Some(p)) => {
                let txn_id = p.txn_id();
                let r = env.finish(p);
                if let Err(broken) = self.group_written() {
                    broken.latch(env);
                }
                match r {
                    Ok(committed) if committed != txn_id => Err(Broken::new(format!(
                        "txn {txn_id} was prepared, and its journal write answered txn {committed}"
                    ))
                    .latch(env)),
                    r => r,
                }
            }
            // Nothing changed, but what the units read may still be in flight.
            Ok(None) => env.wait_durable(base_txn).map(|_| base_txn),
            Err(e) => Err(e),
        }
    }

    /// Tells the group's committed units the outcome of its commit.
    fn answer_group(&self, committed: &[Arc<Answer>], result: Result<u64>) {
        let q = self;
        if !committed.is_empty() {
            q.groups.fetch_add(1, Relaxed);
            q.max_group_units.fetch_max(committed.len() as u64, Relaxed);
            q.last_group_units.store(committed.len() as u64, Relaxed);
        }
        match result {
            Ok(txn_id) => {
                q.units_committed.fetch_add(committed.len() as u64, Relaxed);
                for a in committed {
                    a.tell(Word::Done(Ok(txn_id)));
                }
            }
            Err(e) => {
                q.units_failed.fetch_add(committed.len() as u64, Relaxed);
                // One failure for the whole group, shared by its units' answers.
                let e = Arc::new(e);
                for a in committed {
                    a.tell(Word::Done(Err(Error::GroupFailed(e.clone()))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broken invariant of the queue is reported (to be latched), not panicked
    /// over, and the queue's state still moves on.
    #[test]
    fn broken_queue_invariants_are_reported_with_what_was_found() {
        let q = CommitQueue::default();
        let lead = || q.state.lock().leader_active = true;
        lead();
        q.end_leadership(Some(5)).unwrap();
        lead();
        q.end_leadership(Some(6)).unwrap();
        lead();
        let order = q.end_leadership(Some(6)).unwrap_err().0;
        assert!(
            order.contains("prepared txn 6 after a group prepared txn 6"),
            "{order}"
        );
        assert!(order.contains("must increase"), "{order}");
        // (Three groups in flight now: reported too, after the first problem.)
        q.group_written().unwrap();
        lead();
        let too_many = q.end_leadership(Some(9)).unwrap_err().0;
        assert!(
            too_many.contains("3 groups wait for the journal"),
            "{too_many}"
        );
        let not_leading = q.end_leadership(None).unwrap_err().0;
        assert!(
            not_leading.contains("no group was being led"),
            "{not_leading}"
        );
        for _ in 0..3 {
            q.group_written().unwrap();
        }
        let none = q.group_written().unwrap_err().0;
        assert!(none.contains("no group was in flight"), "{none}");
        assert_eq!(q.state.lock().groups_in_flight, 0);
    }
}
