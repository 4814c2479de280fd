//! Data subscriptions (`kiln_docs` `subscriptions/`; the worker's WebSocket is
//! `changes/subscription_worker.rs`):
//! - `POST /dbs/{db}/subscriptions` with `{"name", "query", "parameters"?, "start"?}`
//!   creates one (201; 409 `subscription_exists` if the name is taken)
//! - `GET /dbs/{db}/subscriptions`: every subscription with its position
//! - `GET /dbs/{db}/subscriptions/{name}`, `DELETE /dbs/{db}/subscriptions/{name}`
//! - `GET /dbs/{db}/subscriptions/{name}/ws?batch_size=N&strategy=wait|take_over|if_free`:
//!   a worker's connection
//!
//! In a cluster, creations, deletions and acknowledgments go through the log
//! (`routes/cluster.rs`; a follower answers 307 to the leader as for any write),
//! and a worker connects to the leader (307 elsewhere), which serves its batches
//! from its own copy and proposes its acknowledgments: the position is the same
//! on every node, and a worker moved by a failover resumes after the last
//! acknowledgment the cluster committed (docs/cluster.md).

use crate::changes::subscription_worker::{self, Strategy, WorkerConfig};
use crate::error::{ApiError, ErrorCode};
use crate::http_util::{blocking, encode_path, json_value, read_body, ApiPath};
use crate::query_params::{NoParams, Params};
use crate::routes::changes::{room_for_connection, websocket_upgrade};
use crate::state::SharedState;
use axum::body::Body;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use kiln_docs::{
    format_rfc3339_ms, BatchLimits, Database, LeaseStrategy, SubscriptionInfo, SubscriptionLease,
    SubscriptionStart,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// The subprotocol a worker's WebSocket may ask for; selected when offered.
pub const WS_PROTOCOL: &str = "kiln.subscription.v1";
/// Documents per batch when the worker does not say (`batch_size`).
pub const DEFAULT_BATCH_SIZE: usize = 1024;
/// The most documents a worker may ask for per batch.
pub const MAX_BATCH_SIZE: usize = 10_000;
/// A batch ends once its documents reach this many bytes (a larger document still
/// goes, alone): a worker's frames stay bounded whatever the documents' sizes.
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// A worker silent (no frame, pongs included) for this many heartbeat intervals is
/// let go, so that a peer gone without closing does not hold the subscription.
const WORKER_TIMEOUT_HEARTBEATS: u32 = 4;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSubscription {
    name: String,
    query: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    /// `beginning` (the default), `now`, or an etag to start after.
    #[serde(default)]
    start: Option<String>,
}

fn info_json(db: &Database, s: &SubscriptionInfo) -> Value {
    let position =
        (s.acknowledged_sequence > 0).then(|| db.etag_at(s.acknowledged_sequence).to_string());
    json!({
        "name": s.name,
        "query": s.query,
        "parameters": s.parameters,
        "collection": s.collection,
        "created_at": format_rfc3339_ms(s.created_ms),
        "position": position,
        "acknowledged_at": s.acknowledged_ms.map(format_rfc3339_ms),
        "acknowledgments": s.acknowledgments,
        "connected": s.held,
    })
}

pub async fn create(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let bytes = read_body(&headers, body, &state.limits).await?;
    let new: NewSubscription = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            ErrorCode::MalformedJson,
            format!("{e} (the body is {{\"name\": \"...\", \"query\": \"from <collection> [where ...]\", \"parameters\": {{...}}, \"start\": \"beginning\" | \"now\" | \"<etag>\"}})"),
        )
    })?;
    let start = new.start.unwrap_or_else(|| "beginning".to_string());
    let info = if state.cluster.is_some() {
        let name = new.name.clone();
        let new = crate::routes::cluster::NewSubscription {
            name: new.name,
            query: new.query,
            parameters: new.parameters,
            start,
        };
        crate::routes::cluster::create_subscription(&state, &database, new).await?;
        let d = database.clone();
        blocking(move || d.subscription(&name)).await?
    } else {
        let start = SubscriptionStart::parse(&start);
        let d = database.clone();
        blocking(move || d.create_subscription(&new.name, &new.query, new.parameters, start))
            .await?
    };
    let mut resp = json_value(StatusCode::CREATED, info_json(&database, &info));
    let location = format!(
        "/dbs/{}/subscriptions/{}",
        encode_path(&db),
        encode_path(&info.name)
    );
    if let Ok(v) = HeaderValue::from_str(&location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

pub async fn list(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let d = database.clone();
    let all = blocking(move || d.subscriptions()).await?;
    let last = database.last_sequence();
    Ok(json_value(
        StatusCode::OK,
        json!({
            "subscriptions": all.iter().map(|s| info_json(&database, s)).collect::<Vec<_>>(),
            "database_etag": (last > 0).then(|| database.etag_at(last).to_string()),
        }),
    ))
}

pub async fn get_one(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, name)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let d = database.clone();
    let info = blocking(move || d.subscription(&name)).await?;
    Ok(json_value(StatusCode::OK, info_json(&database, &info)))
}

pub async fn delete(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, name)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    if state.cluster.is_some() {
        crate::routes::cluster::delete_subscription(&state, &db, &name).await?;
    } else {
        let deleted = name.clone();
        blocking(move || database.delete_subscription(&deleted)).await?;
    }
    Ok(json_value(StatusCode::OK, json!({"deleted": name})))
}

#[derive(Deserialize)]
pub struct WorkerQuery {
    batch_size: Option<usize>,
    strategy: Option<Strategy>,
}

pub async fn websocket(
    State(state): State<SharedState>,
    ApiPath((db, name)): ApiPath<(String, String)>,
    Params(q): Params<WorkerQuery>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = websocket_upgrade(upgrade)?;
    let batch_size = batch_size(q.batch_size)?;
    let strategy = q.strategy.unwrap_or(Strategy::Wait);
    let database = state.store.database(&db)?;
    room_for_connection(&state, "WebSocket")?;
    if let Some(node) = &state.cluster {
        // Only the leader gets here (the front door sends workers to it); what the
        // cluster committed before (acknowledgments included) is applied here
        // before the worker reads its position.
        node.ensure_linearizable()
            .await
            .map_err(crate::routes::cluster::cluster_error)?;
    }
    let lease = lease(&database, &name, strategy).await?;
    let hub = state.hubs.hub(&database);
    let cfg = worker_config(&state, name, batch_size);
    Ok(upgrade
        .protocols([WS_PROTOCOL])
        .read_buffer_size(4 << 10)
        .write_buffer_size(0)
        .max_message_size(64 << 10)
        .on_upgrade(move |socket| subscription_worker::run(socket, hub, lease, cfg)))
}

/// The documents a worker's batch holds at most (`batch_size`, 1 to
/// `MAX_BATCH_SIZE`).
fn batch_size(given: Option<usize>) -> Result<usize, ApiError> {
    match given {
        None => Ok(DEFAULT_BATCH_SIZE),
        Some(n) if (1..=MAX_BATCH_SIZE).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::new(
            ErrorCode::InvalidSubscription,
            format!("batch_size {n}: give 1 to {MAX_BATCH_SIZE}"),
        )),
    }
}

/// The worker's lease on the subscription `name`, as `strategy` takes it.
async fn lease(
    database: &Arc<Database>,
    name: &str,
    strategy: Strategy,
) -> Result<Option<SubscriptionLease>, ApiError> {
    // An unknown subscription is a 404 before the upgrade; `if_free` and
    // `take_over` take the lease here too, so a busy subscription is a 409.
    let d = database.clone();
    let n = name.to_string();
    Ok(match strategy {
        Strategy::Wait => {
            blocking(move || d.subscription(&n)).await?;
            None
        }
        Strategy::IfFree => {
            Some(blocking(move || d.lease_subscription(&n, LeaseStrategy::IfFree)).await?)
        }
        Strategy::TakeOver => {
            Some(blocking(move || d.lease_subscription(&n, LeaseStrategy::TakeOver)).await?)
        }
    })
}

/// The worker of the subscription `name`: its batches, heartbeats and timeouts.
fn worker_config(state: &SharedState, name: String, batch_size: usize) -> WorkerConfig {
    let heartbeat_interval = Duration::from_millis(state.changes.heartbeat_ms);
    WorkerConfig {
        name,
        limits: BatchLimits {
            max_documents: batch_size,
            max_bytes: MAX_BATCH_BYTES,
        },
        heartbeat: state.heartbeat.clone(),
        heartbeat_interval,
        send_timeout: Duration::from_millis(state.changes.send_timeout_ms),
        worker_timeout: heartbeat_interval * WORKER_TIMEOUT_HEARTBEATS,
        metrics: state.metrics.clone(),
        cluster: state.cluster.clone(),
    }
}
