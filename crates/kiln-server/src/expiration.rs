//! Document expiration on a server: every `ServerConfig::expiration_check_ms`
//! (and once at start), each database's documents whose `@metadata.@expires` has
//! passed are deleted, `BATCH_DOCS` per commit, until none is due. The deletes are
//! ordinary deletes (a tombstone, a change in the feed), conditional on the etag
//! each document had when it was found: one rewritten meanwhile is left alone.
//!
//! The same pass frees a single server's staged attachment blobs whose time ran
//! out (`Database::expire_staged_attachments`).
//!
//! A single server deletes through `Database::delete_expired`. In a cluster only
//! the leader looks, and it proposes the same conditional deletes through the log
//! (as an HTTP DELETE with `If-Match` would be): every node then deletes them, with
//! the same tombstone etags. A follower does nothing; a new leader takes over at
//! its next check.

use crate::error::{ApiError, ErrorCode};
use crate::http_util::blocking;
use crate::state::AppState;
use kiln_cluster::{LoggedCondition, LoggedOp};
use kiln_docs::{Database, DueDocument, ExpireReport};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;

/// Documents deleted per commit-queue unit, or per log entry in a cluster (within
/// the batcher's 1,024 operations per entry).
const BATCH_DOCS: usize = 1_000;

/// Runs until `shutdown`: a pass over every database each `every_ms`. A pass that
/// takes longer than the period delays the next one instead of piling them up.
pub(crate) async fn expire_periodically(
    state: Weak<AppState>,
    every_ms: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut timer = tokio::time::interval(Duration::from_millis(every_ms.max(1)));
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = timer.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(state) = state.upgrade() else { return };
        if is_follower(&state) {
            continue;
        }
        for db in state.store.databases() {
            if *shutdown.borrow() {
                return;
            }
            if state.cluster.is_none() {
                expire_staged(db.clone()).await;
            }
            expire_database(&state, db, &shutdown).await;
        }
    }
}

/// A cluster's node that does not lead: the leader's deletes reach it by the log.
fn is_follower(state: &AppState) -> bool {
    state
        .cluster
        .as_ref()
        .is_some_and(|node| node.status().leader != Some(node.node_id()))
}

/// One database's pass, logged and counted.
async fn expire_database(state: &AppState, db: Arc<Database>, shutdown: &watch::Receiver<bool>) {
    let name = db.name().to_string();
    match delete_due(state, db, shutdown).await {
        Ok(report) if report.deleted > 0 || report.skipped > 0 => {
            state.metrics.documents_expired.inc_by(report.deleted);
            tracing::info!(database = %name, expired = report.deleted, skipped = report.skipped, "expired documents deleted");
        }
        Ok(_) => {}
        // Deleted while the pass ran: nothing left to expire.
        Err(e) if e.code == ErrorCode::DatabaseNotFound => {}
        Err(e) => {
            tracing::warn!(database = %name, error = %e.code, message = %e.message, "deleting expired documents failed")
        }
    }
}

/// Frees the database's staged attachment blobs (`POST /dbs/{db}/attachments`)
/// that no document named within their time: without this pass they stayed until
/// the next open. A single server only (a cluster's attachments are its own).
async fn expire_staged(db: Arc<Database>) {
    let name = db.name().to_string();
    let now_ms = now_ms();
    match blocking(move || db.expire_staged_attachments(now_ms)).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(database = %name, freed = n, "staged attachments expired"),
        Err(e) if e.code == ErrorCode::DatabaseNotFound => {}
        Err(e) => {
            tracing::warn!(database = %name, error = %e.code, message = %e.message, "expiring staged attachments failed")
        }
    }
}

/// Deletes what is due now, a batch at a time, until none is (or the server
/// stops: a batch is never cut, the rest waits for the next start).
async fn delete_due(
    state: &AppState,
    db: Arc<Database>,
    shutdown: &watch::Receiver<bool>,
) -> Result<ExpireReport, ApiError> {
    let now_ms = now_ms();
    let mut total = ExpireReport::default();
    while !*shutdown.borrow() {
        let found = db.clone();
        let due = blocking(move || found.expired(now_ms, BATCH_DOCS)).await?;
        let full = due.len() == BATCH_DOCS;
        if due.is_empty() {
            break;
        }
        let report = match state.cluster {
            None => {
                let db = db.clone();
                blocking(move || db.delete_expired(due)).await?
            }
            Some(_) => delete_through_log(state, db.name(), due).await?,
        };
        total.deleted += report.deleted;
        total.skipped += report.skipped;
        // A batch that deleted nothing would find the same documents again.
        if !full || report.deleted == 0 {
            break;
        }
    }
    Ok(total)
}

/// The deletes as one log entry of independent writes, each with `If-Match`.
async fn delete_through_log(
    state: &AppState,
    database: &str,
    due: Vec<DueDocument>,
) -> Result<ExpireReport, ApiError> {
    let ops = due
        .into_iter()
        .map(|d| LoggedOp::Delete {
            id: d.id,
            condition: LoggedCondition::IfMatch(d.etag.to_string()),
        })
        .collect();
    let outcomes = crate::routes::cluster::write(state, database, ops, false).await?;
    let mut report = ExpireReport::default();
    for outcome in outcomes {
        match outcome {
            Ok(_) => report.deleted += 1,
            // Rewritten or deleted since it was found: its new write decides.
            Err(e) if matches!(e.code, ErrorCode::Conflict | ErrorCode::DocumentNotFound) => {
                report.skipped += 1
            }
            Err(e) => return Err(e),
        }
    }
    Ok(report)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
