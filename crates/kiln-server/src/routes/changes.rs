//! `GET /dbs/{db}/changes` (a page of the change log, optionally long-polled) and
//! `GET /dbs/{db}/changes/ws` (subscriptions over one WebSocket).

use crate::changes::connection::{self, ConnectionConfig};
use crate::error::{ApiError, ErrorCode};
use crate::http_util::{encode_path, encode_query_value};
use crate::http_util::{json_response, ApiPath};
use crate::query_params::{NoParams, Params};
use crate::state::SharedState;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use kiln_docs::{ChangeFilter, ChangesPage, Database};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// The subprotocol a changes WebSocket may ask for; the server selects it when offered.
pub const WS_PROTOCOL: &str = "kiln.changes.v1";
/// A subprotocol offered as `kiln.key.<api key>` authenticates the upgrade (browsers
/// cannot set headers on a WebSocket); it is never selected nor echoed.
pub const WS_KEY_PROTOCOL_PREFIX: &str = "kiln.key.";

/// The longest a pull may wait for a change.
const MAX_WAIT_MS: u64 = 60_000;

#[derive(Deserialize)]
pub struct ChangesQuery {
    since: Option<String>,
    limit: Option<usize>,
    wait_ms: Option<u64>,
    id: Option<String>,
    prefix: Option<String>,
    collection: Option<String>,
    #[serde(default)]
    include_docs: bool,
}

pub async fn pull(
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    Params(q): Params<ChangesQuery>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let since = database.sequence_of(q.since.as_deref().unwrap_or(""))?;
    let limit = crate::routes::page_size(&state, q.limit)?;
    let wait_ms = checked_wait_ms(q.wait_ms)?;
    let next_query = next_page_query(&q, limit);
    let next = |page: &ChangesPage| {
        (page.changes.len() >= limit).then(|| {
            format!(
                "/dbs/{}/changes?{next_query}&since={}",
                encode_path(&db),
                database.etag_at(page.last_sequence)
            )
        })
    };
    let filter = ChangeFilter {
        id: q.id,
        prefix: q.prefix,
        collection: q.collection,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    // The hub's signals, not the hub (which holds the database): a long poll ends
    // early when the database is deleted or replaced, so it does not hold it open.
    let (mut commits, mut stopped) = if wait_ms > 0 {
        let hub = state.hubs.hub(&database);
        (Some(hub.commits()), Some(hub.stopped()))
    } else {
        (None, None)
    };
    let mut from = since;
    loop {
        let page = read(&database, from, limit, &filter, q.include_docs).await?;
        let Some(rx) = commits.as_mut().filter(|_| page.changes.is_empty()) else {
            let link = next(&page);
            return Ok(page_response(&database, page, link.as_deref()));
        };
        // Nothing yet: wait for the next durable write (or the deadline). Marking the
        // channel seen before looking at the last sequence loses no wake-up.
        from = page.last_sequence;
        rx.borrow_and_update();
        if database.last_sequence() > from {
            continue;
        }
        let stop = async {
            match stopped.as_mut() {
                Some(s) => s.wait_for(|stopped| *stopped).await.map(|_| ()),
                None => std::future::pending().await,
            }
        };
        let woken = tokio::select! {
            changed = tokio::time::timeout_at(deadline, rx.changed()) => matches!(changed, Ok(Ok(()))),
            _ = stop => false,
        };
        match woken {
            true => continue,
            false => {
                let link = next(&page);
                return Ok(page_response(&database, page, link.as_deref()));
            }
        }
    }
}

/// `wait_ms` (0 when absent), refused past [`MAX_WAIT_MS`].
fn checked_wait_ms(wait_ms: Option<u64>) -> Result<u64, ApiError> {
    let wait_ms = wait_ms.unwrap_or(0);
    if wait_ms > MAX_WAIT_MS {
        return Err(ApiError::new(
            ErrorCode::InvalidWait,
            format!("wait_ms {wait_ms} exceeds the limit of {MAX_WAIT_MS}"),
        ));
    }
    Ok(wait_ms)
}

/// The next page's query, but for `since` (added when there may be one).
fn next_page_query(q: &ChangesQuery, limit: usize) -> String {
    let mut next_query = format!("limit={limit}");
    for (name, value) in [
        ("id", &q.id),
        ("prefix", &q.prefix),
        ("collection", &q.collection),
    ] {
        if let Some(v) = value {
            next_query.push_str(&format!("&{name}={}", encode_query_value(v)));
        }
    }
    if q.include_docs {
        next_query.push_str("&include_docs=true");
    }
    next_query
}

async fn read(
    db: &Arc<Database>,
    since: u64,
    limit: usize,
    filter: &ChangeFilter,
    include_docs: bool,
) -> Result<ChangesPage, ApiError> {
    let db = db.clone();
    let filter = filter.clone();
    crate::http_util::blocking(move || db.changes_since(since, limit, &filter, include_docs)).await
}

fn page_response(db: &Database, page: ChangesPage, next_target: Option<&str>) -> Response {
    let results: Vec<serde_json::Value> = page
        .changes
        .into_iter()
        .map(|e| {
            let c = e.change;
            let mut v = json!({
                "id": c.id,
                "etag": c.etag.to_string(),
                "change": c.kind.as_str(),
                "collection": c.collection,
            });
            if let Some(doc) = e.document {
                match serde_json::from_slice::<serde_json::Value>(&doc.json) {
                    Ok(d) => v["document"] = d,
                    Err(err) => {
                        v["document_error"] = format!("stored document unreadable: {err}").into()
                    }
                }
            }
            v
        })
        .collect();
    let body = json!({
        "results": results,
        "last_etag": db.etag_at(page.last_sequence).to_string(),
    });
    let mut resp = json_response(StatusCode::OK, body.to_string().into_bytes());
    if let Some(target) = next_target {
        crate::http_util::link_next(&mut resp, target);
    }
    resp
}

/// The upgrade a WebSocket route takes: a request that is no WebSocket upgrade
/// gets a JSON error like any other, not axum's plain-text rejection.
pub(crate) fn websocket_upgrade(
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<WebSocketUpgrade, ApiError> {
    upgrade.map_err(|r| {
        ApiError::new(
            ErrorCode::BadRequest,
            format!("this route takes a WebSocket upgrade (GET with Connection: upgrade, Upgrade: websocket, Sec-WebSocket-Version: 13 and Sec-WebSocket-Key): {}", r.body_text()),
        )
    })
}

/// Whether another WebSocket connection may open (they are counted together,
/// whatever their route); `kind` names them in the error.
pub(crate) fn room_for_connection(state: &SharedState, kind: &str) -> Result<(), ApiError> {
    let open = usize::try_from(state.metrics.ws_connections_open.get()).unwrap_or(0);
    if open >= state.changes.max_connections {
        return Err(ApiError::new(
            ErrorCode::TooManyConnections,
            format!(
                "{open} {kind} connections are open, the limit is {}",
                state.changes.max_connections
            ),
        ));
    }
    Ok(())
}

pub async fn websocket(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = websocket_upgrade(upgrade)?;
    let database = state.store.database(&db)?;
    room_for_connection(&state, "changes")?;
    let hub = state.hubs.hub(&database);
    let cfg = ConnectionConfig {
        queue_len: state.changes.subscriber_queue_len,
        max_subscriptions: state.changes.max_subscriptions_per_connection,
        heartbeat: state.heartbeat.clone(),
        heartbeat_interval: Duration::from_millis(state.changes.heartbeat_ms),
        send_timeout: Duration::from_millis(state.changes.send_timeout_ms),
        metrics: state.metrics.clone(),
    };
    // Small buffers: an idle subscriber should cost kilobytes, not the library's
    // 128 KiB defaults; they grow for a large message.
    Ok(upgrade
        .protocols([WS_PROTOCOL])
        .read_buffer_size(4 << 10)
        .write_buffer_size(0)
        .max_message_size(64 << 10)
        .on_upgrade(move |socket| connection::run(socket, hub, cfg)))
}
