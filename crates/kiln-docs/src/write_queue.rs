//! The one batching layer for document writes.
//!
//! The server's single-document writes and bulk insert hand their writes here
//! instead of calling the engine from their own thread (`POST /batch`, the indexer
//! and restores go to the engine's commit queue directly). A few worker threads take
//! whatever has queued up, turn the independent writes for one database into ONE
//! commit-queue unit (`Database::write_each`: each write succeeds or fails on its
//! own) and answer each caller through its reply when that unit is durable. Writes
//! that arrive while a unit commits queue up and go out together as the next unit,
//! so under load many requests share one journal write; a lone write goes out at
//! once. Workers serve different databases (or all-or-nothing jobs) at once.
//!
//! One worker at a time gathers a database's independent writes: while it commits
//! them, new ones for that database wait in the queue without waking another worker
//! (it takes them all when it comes back, one commit later). Units for one database
//! go through its commit queue one after another anyway; a second worker would only
//! split the next unit in two and pay a thread wake-up per write. Other databases'
//! writes, all-or-nothing jobs, and a backlog larger than a unit still wake an idle
//! worker at once.
//!
//! A reply is a plain callback, so the queue serves any caller: a blocking thread
//! (`write_blocking`), or an async runtime (the server passes a closure that sends
//! on a oneshot channel). Callbacks run on a worker thread and must not block.

use crate::DatabaseError;
use crate::{BatchOutcome, Database, DocError, Result, WriteOp};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use tracing::Span;

pub type Reply<T> = Box<dyn FnOnce(Result<T>) + Send>;

enum Job {
    /// An independent write: merged with others, fails alone.
    One {
        op: WriteOp,
        reply: Reply<BatchOutcome>,
        traced: Traced,
    },
    /// Writes that commit together or not at all (a bulk insert's batch).
    All {
        ops: Vec<WriteOp>,
        reply: Reply<Vec<BatchOutcome>>,
        traced: Traced,
    },
}

/// A job's place in a trace (traces on, `kiln serve --otlp-endpoint`): the
/// caller's span (a request's), and the span of its wait for a worker, which ends
/// when a worker takes it. Both are disabled spans (nothing) otherwise.
struct Traced {
    caller: Span,
    waiting: Span,
}

impl Traced {
    fn here() -> Traced {
        let caller = Span::current();
        let waiting = if caller.is_disabled() {
            Span::none()
        } else {
            tracing::info_span!(parent: &caller, "kiln.write_queue.wait")
        };
        Traced { caller, waiting }
    }

    /// Ends the wait; the span of the commit that follows it (`writes`: in the
    /// unit this job's writes are part of), `None` when traces are off.
    fn committing(&mut self, database: &Database, writes: usize) -> Option<Span> {
        drop(std::mem::replace(&mut self.waiting, Span::none()));
        if self.caller.is_disabled() {
            return None;
        }
        Some(tracing::info_span!(
            parent: &self.caller,
            "kiln.commit",
            database = database.name(),
            writes
        ))
    }
}

/// How the queue runs: workers are units in flight at once.
#[derive(Debug, Clone, Copy)]
pub struct WriteQueueOptions {
    pub workers: usize,
    /// Independent writes merged into one unit at most.
    pub max_writes_per_unit: usize,
    /// Jobs waiting at most; past it a write fails at once with `Overloaded`.
    pub max_queued_jobs: usize,
}

impl Default for WriteQueueOptions {
    fn default() -> Self {
        WriteQueueOptions {
            workers: 4,
            max_writes_per_unit: 256,
            max_queued_jobs: 65_536,
        }
    }
}

struct State {
    jobs: VecDeque<(Arc<Database>, Job)>,
    closed: bool,
    /// The databases whose independent writes a worker is committing now (by the
    /// address of their `Database`, only compared), with how many workers are at it
    /// (usually one; as many entries as databases written at once).
    gathering: Vec<(usize, usize)>,
    /// Workers waiting for work.
    idle: usize,
    /// Of those, woken and not yet back at the queue: each takes what is queued
    /// when it gets there, so a job pushed meanwhile needs no wake-up of its own.
    woken: usize,
}

fn db_key(db: &Arc<Database>) -> usize {
    Arc::as_ptr(db) as usize
}

impl State {
    fn gathering_for(&self, db: &Arc<Database>) -> bool {
        let k = db_key(db);
        self.gathering.iter().any(|&(g, _)| g == k)
    }

    fn start_gathering(&mut self, db: &Arc<Database>) {
        let k = db_key(db);
        match self.gathering.iter_mut().find(|(g, _)| *g == k) {
            Some((_, n)) => *n += 1,
            None => self.gathering.push((k, 1)),
        }
    }

    fn stop_gathering(&mut self, db: usize) {
        if let Some(i) = self.gathering.iter().position(|&(g, _)| g == db) {
            self.gathering[i].1 -= 1;
            if self.gathering[i].1 == 0 {
                self.gathering.swap_remove(i);
            }
        }
    }

    /// Whether a queued job would wait for no busy worker: an all-or-nothing job, an
    /// independent write for a database no worker is committing, or more of them
    /// than the worker committing that database takes in one unit.
    fn needs_a_worker(&self, unit: usize) -> bool {
        if self.jobs.len() > unit {
            return true;
        }
        self.jobs.iter().any(|(db, job)| match job {
            Job::All { .. } => true,
            Job::One { .. } => !self.gathering_for(db),
        })
    }

    /// Wakes an idle worker when queued work needs one and none is on its way.
    fn wake_if_needed(&mut self, ready: &Condvar, unit: usize) {
        if self.idle > self.woken && self.woken == 0 && self.needs_a_worker(unit) {
            self.woken += 1;
            ready.notify_one();
        }
    }
}

struct Shared {
    state: Mutex<State>,
    ready: Condvar,
    opts: WriteQueueOptions,
}

pub struct WriteQueue {
    shared: Arc<Shared>,
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl WriteQueue {
    pub fn start(opts: WriteQueueOptions) -> Result<WriteQueue> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                closed: false,
                gathering: Vec::new(),
                idle: 0,
                woken: 0,
            }),
            ready: Condvar::new(),
            opts,
        });
        let mut workers = Vec::new();
        for i in 0..opts.workers.max(1) {
            let s = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("kiln-write-{i}"))
                .spawn(move || work(&s))
                .map_err(|e| DocError::io("(write queue worker thread)", e))?;
            workers.push(handle);
        }
        Ok(WriteQueue {
            shared,
            workers: Mutex::new(workers),
        })
    }

    /// Queues an independent write; `reply` gets its outcome once durable or failed.
    /// Fails at once (and does not call `reply`) when the queue is full or closed.
    pub fn write(
        &self,
        db: Arc<Database>,
        op: WriteOp,
        reply: impl FnOnce(Result<BatchOutcome>) + Send + 'static,
    ) -> Result<()> {
        self.push(
            db,
            Job::One {
                op,
                reply: Box::new(reply),
                traced: Traced::here(),
            },
        )
    }

    /// Queues writes that commit together or not at all.
    pub fn write_all(
        &self,
        db: Arc<Database>,
        ops: Vec<WriteOp>,
        reply: impl FnOnce(Result<Vec<BatchOutcome>>) + Send + 'static,
    ) -> Result<()> {
        self.push(
            db,
            Job::All {
                ops,
                reply: Box::new(reply),
                traced: Traced::here(),
            },
        )
    }

    /// Queues an independent write and waits for it on this thread.
    pub fn write_blocking(&self, db: Arc<Database>, op: WriteOp) -> Result<BatchOutcome> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.write(db, op, move |r| {
            let _ = tx.send(r);
        })?;
        rx.recv()
            .unwrap_or(Err(DocError::Database(DatabaseError::ShuttingDown)))
    }

    /// Jobs waiting for a worker.
    pub fn queued(&self) -> usize {
        self.shared.state.lock().jobs.len()
    }

    fn push(&self, db: Arc<Database>, job: Job) -> Result<()> {
        let mut state = self.shared.state.lock();
        if state.closed {
            return Err(DocError::Database(DatabaseError::ShuttingDown));
        }
        if state.jobs.len() >= self.shared.opts.max_queued_jobs {
            return Err(DocError::Database(DatabaseError::Overloaded {
                queued: state.jobs.len(),
            }));
        }
        // A worker committing this database's independent writes takes this one
        // too when it comes back: no need to wake another (see the module doc).
        state.jobs.push_back((db, job));
        state.wake_if_needed(&self.shared.ready, self.shared.opts.max_writes_per_unit);
        Ok(())
    }

    /// Stops taking writes, finishes the queued ones and joins the workers.
    pub fn close(&self) {
        self.shared.state.lock().closed = true;
        self.shared.ready.notify_all();
        for w in self.workers.lock().drain(..) {
            let _ = w.join();
        }
    }
}

impl Drop for WriteQueue {
    fn drop(&mut self) {
        self.close();
    }
}

fn work(shared: &Shared) {
    // The database whose independent writes this worker just committed.
    let mut gathered = None;
    loop {
        let Some((db, taken)) = take(shared, gathered.take()) else {
            return;
        };
        match taken {
            Taken::All(ops, reply, mut traced) => {
                let commit = traced.committing(&db, ops.len());
                let result = match &commit {
                    Some(span) => span.in_scope(|| db.write_all_patiently(ops)),
                    None => db.write_all_patiently(ops),
                };
                drop(commit);
                reply(result);
            }
            Taken::Many(ops, mut replies) => {
                let writes = ops.len();
                // Empty (no allocation) when traces are off.
                let commits: Vec<Span> = replies
                    .iter_mut()
                    .filter_map(|(_, traced)| traced.committing(&db, writes))
                    .collect();
                // The engine's spans (the commit group, its journal write) go
                // under the first request's commit.
                let results = match commits.first() {
                    Some(first) => first.in_scope(|| db.write_each(ops)),
                    None => db.write_each(ops),
                };
                drop(commits);
                gathered = Some(db_key(&db));
                drop(db);
                for ((reply, _), result) in replies.into_iter().zip(results) {
                    reply(result);
                }
            }
        }
    }
}

enum Taken {
    All(Vec<WriteOp>, Reply<Vec<BatchOutcome>>, Traced),
    Many(Vec<WriteOp>, Vec<(Reply<BatchOutcome>, Traced)>),
}

/// Waits for work; takes an all-or-nothing job alone, or the independent writes at
/// the front of the queue that go to the same database (up to a unit's worth).
/// `None` once the queue is closed and empty. `gathered`: the database whose
/// independent writes this worker has just answered.
fn take(shared: &Shared, gathered: Option<usize>) -> Option<(Arc<Database>, Taken)> {
    let mut state = shared.state.lock();
    if let Some(db) = gathered {
        state.stop_gathering(db);
    }
    while state.jobs.is_empty() {
        if state.closed {
            return None;
        }
        state.idle += 1;
        shared.ready.wait(&mut state);
        state.idle -= 1;
        state.woken = state.woken.saturating_sub(1);
    }
    let (db, first) = state.jobs.pop_front()?;
    let taken = match first {
        Job::All { ops, reply, traced } => Taken::All(ops, reply, traced),
        Job::One { op, reply, traced } => {
            let mut ops = vec![op];
            let mut replies = vec![(reply, traced)];
            while ops.len() < shared.opts.max_writes_per_unit {
                let same_db_single = matches!(
                    state.jobs.front(),
                    Some((next, Job::One { .. })) if Arc::ptr_eq(next, &db)
                );
                if !same_db_single {
                    break;
                }
                if let Some((_, Job::One { op, reply, traced })) = state.jobs.pop_front() {
                    ops.push(op);
                    replies.push((reply, traced));
                }
            }
            state.start_gathering(&db);
            Taken::Many(ops, replies)
        }
    };
    // Others may be waiting behind what this worker took.
    state.wake_if_needed(&shared.ready, shared.opts.max_writes_per_unit);
    Some((db, taken))
}
