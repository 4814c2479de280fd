//! Merging ahead: while a write transaction is still putting into the write buffer,
//! a second thread merges the frozen generation's next keys into the trees for it.
//!
//! Why: a buffered random put costs the committing thread its buffer write and,
//! later, its share of a merge slice (leaves found, copied, changed). Merged at
//! commit, the slice was a third of W3's committing thread while the other core
//! idled.
//!
//! How: a commit that leaves a frozen generation to merge builds the next
//! transaction's tree state (the writer lock with the allocator, the dirty pages,
//! the trees' roots) at the end of its phase 1, as a `WriteTxn` of the next id on
//! itself, and lends it to the merge thread; the next `begin` adopts it
//! (`lend_next_or_release`, `acquire_writer`). The caller keeps the write buffer's side (its
//! logical log and undo list) and may put, delete and read meanwhile. Reads see the
//! base's pages, and merging changes nothing a read can tell: a merged key's version
//! is still in the frozen generation, which reads consult before the tree. Any use of
//! the tree state (a tree write, a savepoint, the allocator, the commit, an abort)
//! first takes it back (`join_ahead`): the thread stops after its current step of
//! `STEP_KEYS` keys and hands the second transaction back, whose pages and roots
//! become the caller's. The commit counts the keys merged ahead toward its slice and
//! merges the rest itself.
//!
//! The thread does not look keys up in the active generation (`Superseded::Merge`):
//! the caller puts there meanwhile, and the lookups' read locks against its write
//! locks made W3 slower. A key with a newer version there is merged anyway, which a
//! reader cannot tell; only an in-tree version must not be merged over, so the thread
//! stops once the active generation has had one. An abort rolls back what the
//! thread merged with the rest (the merge position moves only when a commit passes
//! its point of no return), so nothing of a frozen key can be lost, and a crash finds
//! the same records it would without the thread: the merged pages are in the
//! commit's record like any slice's.

use super::WriteTxn;
use crate::options::MergeAhead;
use crate::shared::{Shared, Snapshot, WriterState};
use crate::write_buffer::{Superseded, TreeNames};
use crate::Failure;
use parking_lot::MutexGuard;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Keys merged between two looks at the stop flag: about what a join waits for.
const STEP_KEYS: usize = 32;
/// Keys merged ahead for one transaction at most: its commit carries their pages.
const MAX_AHEAD_KEYS: usize = 1 << 15;
/// A commit lends the next transaction only if it made this many buffer writes: a
/// short transaction takes its trees back before the thread has merged anything, and
/// pays the hand-over for nothing (W6's one-put commits).
const MIN_PREVIOUS_BUFFER_WRITES: usize = 32;

/// Work for the merge thread: a transaction's tree side and where to merge from.
pub(crate) struct Job {
    txn: WriteTxn<'static>,
    cursor: Option<Box<[u8]>>,
    max_keys: usize,
    /// False for `MergeAhead::ExactKeys`: the caller waits for all `max_keys`.
    stops_when_asked: bool,
    stop: Arc<AtomicBool>,
    reply: mpsc::SyncSender<Returned>,
}

/// The tree side handed back, with what was merged into it.
struct Returned {
    txn: WriteTxn<'static>,
    merged: Merged,
}

/// What the merge thread did for a transaction.
#[derive(Debug, Default)]
pub(crate) struct Merged {
    /// The last buffer key merged (`None` when done).
    pub cursor: Option<Box<[u8]>>,
    /// Keys of the frozen generation gone past, superseded ones included.
    pub keys: usize,
    /// The frozen generation is merged to its end.
    pub done: bool,
}

/// The caller's side of a transaction whose tree side is with the merge thread.
pub(crate) struct Lent {
    stop: Arc<AtomicBool>,
    reply: mpsc::Receiver<Returned>,
    /// The commit the side was built on.
    base: Snapshot,
}

pub(crate) type JobSender = mpsc::Sender<Job>;

/// The merge thread: runs jobs until the environment drops the sender (at close).
pub(crate) fn run_merge_thread(env: Arc<Shared>, jobs: mpsc::Receiver<Job>) {
    while let Some(job) = receive_soon(&jobs, NEXT_JOB_SPIN, true) {
        let Job {
            mut txn,
            cursor,
            max_keys,
            stops_when_asked,
            stop,
            reply,
        } = job;
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            merge_into(&mut txn, cursor, max_keys, stops_when_asked, &stop)
        }));
        let merged = run.unwrap_or_else(|panic| {
            // The trees may be half-changed: the transaction can only abort, and the
            // environment latches (as a panic in a commit's preparation does).
            let why = Failure::internal(
                "merging ahead panicked",
                crate::error::panic_message(&*panic),
            );
            env.poison(why.clone());
            txn.broken
                .get_or_insert_with(|| Arc::new(crate::Error::Poisoned(why)));
            Merged::default()
        });
        // The receiver is gone only if the environment dropped a parked handle
        // without taking it back; the side then gives up its lock here. (A caller
        // that leaked its transaction still owns the receiver: the side waits in the
        // channel with the lock, as a leaked transaction always held it.)
        if let Err(mpsc::SendError(returned)) = reply.send(Returned { txn, merged }) {
            returned.txn.discard();
        }
    }
    // `env` drops last: it kept every job's `'static` borrow of it valid.
}

fn merge_into(
    txn: &mut WriteTxn<'static>,
    mut cursor: Option<Box<[u8]>>,
    max_keys: usize,
    stops_when_asked: bool,
    stop: &AtomicBool,
) -> Merged {
    let mut keys = 0;
    let mut names: Option<TreeNames> = None;
    while keys < max_keys {
        if stops_when_asked && stop.load(Ordering::Acquire) {
            break;
        }
        // Keys superseded by an in-tree version must be skipped, which takes a
        // lookup each: rare, left to the commit (the caller's own in-tree writes
        // take the trees back first, so this holds for the whole step).
        if txn.base_gens().active.has_had_in_tree_versions() {
            break;
        }
        let step = STEP_KEYS.min(max_keys - keys);
        match txn.merge_keys(&mut cursor, step, Superseded::Merge, &mut names) {
            Ok((went, true)) => {
                return Merged {
                    cursor: None,
                    keys: keys + went,
                    done: true,
                }
            }
            Ok((went, false)) => keys += went,
            Err(e) => {
                txn.broken.get_or_insert_with(|| Arc::new(e));
                break;
            }
        }
    }
    Merged {
        cursor,
        keys,
        done: false,
    }
}

/// How long the merge thread keeps looking for the next job before it sleeps: the
/// next transaction usually begins within a commit's journal write, and waking a
/// sleeping thread took 100-150 us on the 2-core VM (a tenth of a W3 commit).
const NEXT_JOB_SPIN: Duration = Duration::from_millis(2);
/// How long a join looks for the trees coming back before it sleeps: the thread
/// stops within a step (tens of us), while a wake-up takes longer.
const JOIN_SPIN: Duration = Duration::from_micros(200);

/// The next message, looked for (spinning, or yielding the core between looks)
/// for up to `spin`, then waited for. `None` once the sender is gone.
fn receive_soon<T>(from: &mpsc::Receiver<T>, spin: Duration, yielding: bool) -> Option<T> {
    let start = Instant::now();
    loop {
        match from.try_recv() {
            Ok(message) => return Some(message),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if start.elapsed() < spin => {
                if yielding {
                    std::thread::yield_now()
                } else {
                    std::hint::spin_loop()
                }
            }
            Err(mpsc::TryRecvError::Empty) => return from.recv().ok(),
        }
    }
}

/// The writer lock, or the tree side of a transaction lent to the merge thread
/// (which holds the lock) for the next transaction to adopt.
pub(crate) enum Acquired<'env> {
    Writer(MutexGuard<'env, WriterState>),
    Lent(Lent),
}

/// Waits for the writer lock or a lent transaction, whichever comes.
///
/// A lent lock is handed over, not released, so a thread parked on the mutex would
/// not see it: a waiter counts itself in `writer_waiters` before it looks for a lent
/// transaction, and a commit that lends looks at that count after it parks one, and
/// takes it back (releasing the lock) if anyone waits. Both sides are `SeqCst`, so at
/// least one of them sees the other: the waiter adopts, or the lock is released.
pub(crate) fn acquire_writer(env: &Shared) -> Acquired<'_> {
    env.writer_waiters.fetch_add(1, Ordering::SeqCst);
    let pending = env.merge_ahead_pending.lock().take();
    let acquired = match pending {
        Some(lent) => Acquired::Lent(lent),
        None => Acquired::Writer(env.writer.lock()),
    };
    env.writer_waiters.fetch_sub(1, Ordering::SeqCst);
    acquired
}

/// The writer lock for work outside a transaction (close, check): a transaction
/// lent to the merge thread is taken back and dropped (what it merged is merged
/// again later).
pub(crate) fn lock_writer(env: &Shared) -> MutexGuard<'_, WriterState> {
    loop {
        match acquire_writer(env) {
            Acquired::Writer(w) => return w,
            Acquired::Lent(lent) => WriteTxn::adopt(env, lent).discard(),
        }
    }
}

/// At the end of a commit's phase 1, with the writer lock: if the frozen generation
/// is still being merged, builds the next transaction's tree side on this commit,
/// lends it with the lock to the merge thread, and leaves it for the next `begin`
/// (so the thread also has the journal write's time). Otherwise releases the lock.
pub(crate) fn lend_next_or_release(env: &Shared, mut w: MutexGuard<'_, WriterState>) {
    let (max_keys, stops_when_asked) = match env.opts.merge_ahead {
        MergeAhead::Off => return,
        MergeAhead::WhileOpen => (MAX_AHEAD_KEYS, true),
        MergeAhead::ExactKeys(n) => (n, false),
    };
    if w.latest.gens.frozen.is_none()
        || max_keys == 0
        || (stops_when_asked && w.last_txn_buffer_writes < MIN_PREVIOUS_BUFFER_WRITES)
    {
        return;
    }
    let Some(jobs) = w.merge_jobs.clone() else {
        return;
    };
    WriteTxn::make_writer_ready(env, &mut w);
    let cursor = w.merge_cursor.clone();
    let base = w.latest.clone();
    let side = WriteTxn::with_state(env, Some(w), base.clone());
    // SAFETY: only the lifetime changes. The side borrows the environment's `Shared`,
    // which the merge thread keeps alive (it holds an `Arc` of it until it ends) for
    // as long as it may use the side; the side comes back through `join_ahead`, or,
    // if the transaction that adopted it was leaked, drops on the merge thread.
    let side: WriteTxn<'static> = unsafe { std::mem::transmute(side) };
    let stop = Arc::new(AtomicBool::new(false));
    let (reply, replies) = mpsc::sync_channel(1);
    let job = Job {
        txn: side,
        cursor,
        max_keys,
        stops_when_asked,
        stop: stop.clone(),
        reply,
    };
    match jobs.send(job) {
        Ok(()) => {
            *env.merge_ahead_pending.lock() = Some(Lent {
                stop,
                reply: replies,
                base,
            })
        }
        // The thread has ended (the environment is closing): the lock goes back.
        Err(mpsc::SendError(job)) => return job.txn.discard(),
    }
    // Someone already waits on the mutex (see `acquire_writer`): release the lock to
    // them, unless one of them adopted the transaction meanwhile.
    if env.writer_waiters.load(Ordering::SeqCst) > 0 {
        let parked = env.merge_ahead_pending.lock().take();
        if let Some(lent) = parked {
            WriteTxn::adopt(env, lent).discard();
        }
    }
}

impl<'env> WriteTxn<'env> {
    /// The next transaction, on a tree side lent to the merge thread.
    pub(super) fn adopt(env: &'env Shared, lent: Lent) -> Self {
        let mut txn = WriteTxn::with_state(env, None, lent.base.clone());
        txn.ahead = Some(lent);
        txn
    }

    /// Takes the tree side back from the merge thread, if lent (see the module
    /// comment): every use of the writer lock, the allocator, the dirty pages or a
    /// tree's root for writing comes through here first.
    pub(crate) fn join_ahead(&mut self) {
        let Some(lent) = self.ahead.take() else {
            return;
        };
        lent.stop.store(true, Ordering::Release);
        let r = receive_soon(&lent.reply, JOIN_SPIN, false).ok_or(());
        match r {
            Ok(Returned { txn, merged }) => {
                self.merged_ahead = Some(merged);
                self.take_back(txn);
            }
            Err(_) => {
                // The thread dropped the side without answering, which releases the
                // writer lock: this transaction's buffer writes can no longer be
                // undone under it, so nothing may commit after it.
                let why =
                    Failure::internal("the merge thread ended holding a transaction's trees", "");
                self.env.poison(why.clone());
                self.broken
                    .get_or_insert_with(|| Arc::new(crate::Error::Poisoned(why)));
            }
        }
    }

    fn take_back(&mut self, mut side: WriteTxn<'env>) {
        debug_assert!(
            side.undo.is_empty() && side.dropped.is_empty() && side.savepoint.is_none(),
            "the merge thread only merges"
        );
        debug_assert!(
            self.dirty.is_empty() && self.freed_committed.is_empty() && self.local_free.is_empty(),
            "a transaction changes no tree while its trees are lent"
        );
        self.writer = side.writer.take();
        if let Some(why) = side.broken.take() {
            // A step failed half-way (its pages changed, its trees' counts not
            // stored): none of the side's work is kept. The commit merges from the
            // last committed position itself and meets the error if it persists.
            tracing::warn!(error = %why, "merging ahead failed; the commit merges instead");
            self.merged_ahead = None;
            let w = self.writer.as_mut().expect("the side held the lock");
            w.alloc.put_free(side.taken_from_free.drain(..));
            w.alloc.page_count = self.base.page_count;
            return;
        }
        self.dirty = std::mem::take(&mut side.dirty);
        self.sources = std::mem::take(&mut side.sources);
        self.freed_committed = std::mem::take(&mut side.freed_committed);
        self.local_free = std::mem::take(&mut side.local_free);
        self.taken_from_free = std::mem::take(&mut side.taken_from_free);
        self.catalog_root = side.catalog_root;
        // The side's roots are the newer; the caller's own entries are lookups of
        // the base (it changes none while lent).
        self.trees.extend(side.trees.drain());
        self.dirty_bytes_written += side.dirty_bytes_written;
        self.merged_values
            .absorb(std::mem::take(&mut side.merged_values));
        // `side` drops holding nothing: its rollback has no lock and no writes.
    }

    /// What the merge thread merged for this transaction, once taken back.
    pub(crate) fn merged_ahead(&self) -> Option<&Merged> {
        self.merged_ahead.as_ref()
    }
}
