//! `POST /cluster/leader` with `{"id": N}`: the leader hands leadership to voter N
//! (`kiln cluster transfer-leader`), before taking itself down for maintenance or
//! to move the leader's load. A follower redirects it to the leader (307, as every
//! write). Answers `{"leader": N}` once this node follows N.

use crate::error::{ApiError, ErrorCode};
use crate::http_util::json_value;
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use kiln_cluster::ClusterError;
use std::time::Duration;

/// How long the target may take to catch up and win: a follower a few seconds
/// behind catches up well within it.
const TRANSFER_PATIENCE: Duration = Duration::from_secs(10);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewLeader {
    id: u64,
}

pub async fn transfer(State(state): State<SharedState>, body: Bytes) -> Result<Response, ApiError> {
    let node = state.cluster.as_ref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotClustered,
            "this server is not part of a cluster (start it with --node-id and --cluster)",
        )
    })?;
    let wanted: NewLeader = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            ErrorCode::MalformedJson,
            format!("{e} (the body is {{\"id\": N}}, a voter's node id)"),
        )
    })?;
    let leader = node
        .transfer_leadership(wanted.id, TRANSFER_PATIENCE)
        .await
        .map_err(|e| {
            let code = match &e {
                ClusterError::NotLeader { .. } => ErrorCode::NotLeader,
                _ => ErrorCode::ClusterError,
            };
            ApiError::new(code, e.to_string())
        })?;
    Ok(json_value(
        StatusCode::OK,
        serde_json::json!({"leader": leader}),
    ))
}
