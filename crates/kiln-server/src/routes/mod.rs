//! The HTTP routes, one module per area.

pub mod admin;
pub mod api_keys;
pub mod attachments;
pub mod backup;
pub mod bulk;
pub mod changes;
pub mod cluster;
pub mod cluster_leader;
pub mod docs;
pub mod queries;
pub mod revisions;
pub mod studio;
pub mod subscriptions;

use crate::error::{ApiError, ErrorCode};
use crate::state::SharedState;
use kiln_docs::{BatchOutcome, Database, WriteOp};
use std::sync::Arc;

/// Queues one write on the store's write queue and waits until it is durable.
pub async fn write(
    state: &crate::state::AppState,
    db: Arc<Database>,
    op: WriteOp,
) -> Result<BatchOutcome, ApiError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    state.store.writes().write(db, op, move |r| {
        // A request whose client went away no longer listens; its write stands,
        // as with any database once the commit was made.
        let _ = reply.send(r);
    })?;
    match answer.await {
        Ok(result) => result.map_err(ApiError::from),
        Err(_) => Err(ApiError::new(
            ErrorCode::InternalError,
            "the write was dropped before it finished",
        )),
    }
}

pub fn page_size(state: &SharedState, asked: Option<usize>) -> Result<usize, ApiError> {
    let max = state.limits.max_page_size;
    match asked {
        None => Ok(state.limits.default_page_size),
        Some(0) => Err(ApiError::new(
            ErrorCode::InvalidPageSize,
            "page_size must be at least 1",
        )),
        Some(n) if n > max => Err(ApiError::new(
            ErrorCode::PageSizeTooLarge,
            format!("page_size {n} exceeds the limit of {max}"),
        )),
        Some(n) => Ok(n),
    }
}
