//! Gathers the writes of concurrent requests into shared commit-queue units.
//!
//! Handing each request's write to a blocking thread that waits in `Env::submit`
//! costs two thread wake-ups per request on top of the commit; on a small virtual
//! machine those wake-ups, not the disk, bound the write rate. Here one task takes
//! whatever writes have arrived, hands them to `Database::write_each` as ONE unit
//! (each write still succeeds or fails on its own), and answers each request when
//! that unit is durable. At most `max_units_in_flight` units wait on the engine at
//! once, so under load the next one fills up while the previous commits; a lone
//! request goes out at once.

use crate::error::ApiError;
use axum::http::StatusCode;
use kiln_docs::{BatchOutcome, Database, DocError, WriteOp};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};

struct Pending {
    db: Arc<Database>,
    op: WriteOp,
    reply: oneshot::Sender<Result<BatchOutcome, DocError>>,
}

pub struct WriteCombiner {
    tx: mpsc::Sender<Pending>,
}

impl WriteCombiner {
    /// Starts the combining task on the current runtime.
    pub fn start(
        max_units_in_flight: usize,
        max_writes_per_unit: usize,
        queue_len: usize,
    ) -> WriteCombiner {
        let (tx, rx) = mpsc::channel(queue_len);
        tokio::spawn(combine(
            rx,
            Arc::new(Semaphore::new(max_units_in_flight)),
            max_writes_per_unit,
        ));
        WriteCombiner { tx }
    }

    /// Queues one write and waits until it is durable (or failed).
    pub async fn write(&self, db: Arc<Database>, op: WriteOp) -> Result<BatchOutcome, ApiError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .try_send(Pending { db, op, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => {
                    let mut e = ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "overloaded",
                        "too many writes are waiting; retry later",
                    );
                    e.retry_after_s = Some(1);
                    e
                }
                mpsc::error::TrySendError::Closed(_) => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "shutting_down",
                    "the server is shutting down",
                ),
            })?;
        match answer.await {
            Ok(result) => result.map_err(ApiError::from),
            Err(_) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "the write was dropped before it finished",
            )),
        }
    }
}

async fn combine(mut rx: mpsc::Receiver<Pending>, in_flight: Arc<Semaphore>, max_per_unit: usize) {
    while let Some(first) = rx.recv().await {
        // Waiting for a free slot first lets more writes arrive to share the unit.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max_per_unit {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        // One unit per database; usually there is one.
        let mut groups: Vec<(Arc<Database>, Vec<Pending>)> = Vec::new();
        for p in batch {
            match groups.iter_mut().find(|(db, _)| Arc::ptr_eq(db, &p.db)) {
                Some((_, g)) => g.push(p),
                None => groups.push((p.db.clone(), vec![p])),
            }
        }
        let permit = Arc::new(permit);
        for (db, group) in groups {
            let permit = permit.clone();
            tokio::task::spawn_blocking(move || {
                let (ops, replies): (Vec<WriteOp>, Vec<_>) =
                    group.into_iter().map(|p| (p.op, p.reply)).unzip();
                let results = db.write_each(ops);
                drop(db);
                for (reply, result) in replies.into_iter().zip(results) {
                    // A request whose client went away no longer listens; its write
                    // stands, as with any database once the commit was made.
                    let _ = reply.send(result);
                }
                drop(permit);
            });
        }
    }
}
