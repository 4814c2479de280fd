//! The router: routes and the layers every request passes:
//! compression, then `observe` (request id, metrics, access log), then CORS, then
//! (on the API routes) authentication. The own HTTP/1.1 loop (`http1/`) serves
//! plain document GETs, PUTs, POSTs (to a prefix) and PATCHes through the same
//! admission (`admit`), the same document request (`doc_request.rs`) and
//! `observe`, and hands anything the front layers could change to this router
//! (`cross_origin::FrontLayers`).

use crate::error::{ApiError, ErrorCode};
use crate::http_util::{visible_ascii, HeaderLookup};
use crate::metrics::DOCUMENT_ROUTE;
use crate::observe::{Exchange, KeyId, RequestId, REQUEST_ID_HEADER};
use crate::routes::{
    admin as routes_admin, bulk, changes, docs as routes_docs, queries, revisions, studio,
    subscriptions,
};
use crate::state::{AppState, ConnInfo, SharedState};
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use std::time::Instant;

/// The largest Raft message a node takes (entries carry whole documents).
const RAFT_MESSAGE_MAX_BYTES: usize = 256 << 20;

/// The router with every layer (its front layers as `state.front` says).
pub fn router(state: SharedState) -> Router {
    let api = Router::new()
        .merge(admin_routes())
        .merge(document_routes())
        .merge(attachment_routes())
        .merge(backup_routes())
        .merge(index_routes())
        .merge(revision_routes())
        .merge(subscription_routes())
        .merge(cluster_routes());
    // Without authentication the layer would only pass requests on: leave it out.
    let api = if state.require_auth {
        api.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
    } else {
        api
    };
    // A follower sends writes to the leader (before authentication: the leader
    // authenticates them).
    let api = if state.cluster.is_some() {
        api.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::routes::cluster::front_door,
        ))
    } else {
        api
    };
    api.merge(open_routes())
        .route_layer(axum::middleware::from_fn(label_route))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(tower::util::option_layer(
            crate::cross_origin::Cors::new(&state.front.cors_origins).map(|c| {
                axum::middleware::from_fn_with_state(
                    std::sync::Arc::new(c),
                    crate::cross_origin::cors,
                )
            }),
        ))
        .layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .layer(crate::cross_origin::compression())
        .with_state(state)
}

/// The server and its databases: metrics, statistics, databases created and
/// deleted, tombstones purged.
fn admin_routes() -> Router<SharedState> {
    Router::new()
        .route("/metrics", get(routes_admin::metrics))
        .route("/stats", get(routes_admin::server_stats))
        .route("/dbs", get(routes_admin::list_databases))
        .route(
            "/dbs/{db}",
            put(routes_admin::create_database)
                .get(routes_admin::database_stats)
                .delete(routes_admin::delete_database),
        )
        .route(
            "/dbs/{db}/tombstones",
            get(routes_admin::tombstones).delete(routes_admin::purge_tombstones),
        )
}

/// Documents: read and written one at a time, in batches and in bulk, listed,
/// and their changes.
fn document_routes() -> Router<SharedState> {
    Router::new()
        .route("/dbs/{db}/docs", get(routes_docs::list_by_prefix))
        .route(
            DOCUMENT_ROUTE,
            // An id with an `/attachments/{name}` tail is an attachment's path
            // (`routes/attachments.rs`); any other goes to `routes/docs.rs`.
            get(crate::routes::attachments::get)
                .put(crate::routes::attachments::put)
                .post(crate::routes::attachments::post)
                .patch(crate::routes::attachments::patch)
                .delete(crate::routes::attachments::delete)
                // Attachments stream: no body limit beyond the disk's.
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/dbs/{db}/batch", post(routes_docs::batch))
        .route("/dbs/{db}/bulk", post(bulk::bulk_insert))
        .route("/dbs/{db}/changes", get(changes::pull))
        .route("/dbs/{db}/changes/ws", get(changes::websocket))
        .route("/dbs/{db}/collections", get(routes_docs::collections))
        .route(
            "/dbs/{db}/collections/{collection}/docs",
            get(routes_docs::list_collection),
        )
}

/// Attachments staged for a batch and their blobs (a document's attachments
/// share the document route: `document_routes`).
fn attachment_routes() -> Router<SharedState> {
    Router::new()
        .route(
            "/dbs/{db}/attachments",
            post(crate::routes::attachments::stage)
                .get(crate::routes::attachments::list_blobs)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route(
            "/dbs/{db}/attachments/{hash}",
            get(crate::routes::attachments::get_blob),
        )
}

/// A database's backups and restores.
fn backup_routes() -> Router<SharedState> {
    Router::new()
        .route("/dbs/{db}/backup", get(crate::routes::backup::backup))
        .route(
            "/dbs/{db}/backup/chain",
            get(crate::routes::backup::chain_stats).delete(crate::routes::backup::chain_stop),
        )
        .route("/dbs/{db}/restore", post(crate::routes::backup::restore))
}

/// Indexes and the queries that use them.
fn index_routes() -> Router<SharedState> {
    Router::new()
        .route("/dbs/{db}/indexes", get(queries::list_indexes))
        .route(
            "/dbs/{db}/indexes/{name}",
            put(queries::put_index)
                .get(queries::get_index)
                .delete(queries::delete_index),
        )
        .route("/dbs/{db}/indexes/{name}/reset", post(queries::reset_index))
        .route("/dbs/{db}/queries", post(queries::run_query))
}

/// Document revisions: which collections keep them, listed, purged, reverted to.
fn revision_routes() -> Router<SharedState> {
    Router::new()
        .route(
            "/dbs/{db}/revisions/config",
            get(revisions::get_config).put(revisions::put_config),
        )
        .route(
            "/dbs/{db}/revisions/docs/{*id}",
            get(revisions::list).delete(revisions::purge),
        )
        .route("/dbs/{db}/revisions/revert/{*id}", post(revisions::revert))
}

/// Subscriptions to a database's changes, and their websockets.
fn subscription_routes() -> Router<SharedState> {
    Router::new()
        .route(
            "/dbs/{db}/subscriptions",
            get(subscriptions::list).post(subscriptions::create),
        )
        .route(
            "/dbs/{db}/subscriptions/{name}",
            get(subscriptions::get_one).delete(subscriptions::delete),
        )
        .route(
            "/dbs/{db}/subscriptions/{name}/ws",
            get(subscriptions::websocket),
        )
}

/// The cluster's status and membership (its Raft messages: `open_routes`).
fn cluster_routes() -> Router<SharedState> {
    Router::new()
        .route("/cluster", get(crate::routes::cluster::status))
        .route("/cluster/members", post(crate::routes::cluster::add_member))
        .route(
            "/cluster/leader",
            post(crate::routes::cluster_leader::transfer),
        )
        .route(
            "/cluster/members/{id}",
            axum::routing::delete(crate::routes::cluster::remove_member),
        )
        .route(
            "/cluster/members/{id}/promote",
            post(crate::routes::cluster::promote_member),
        )
}

/// The routes outside the API's layers (authentication, the follower's front
/// door): health, Raft's messages, the studio.
fn open_routes() -> Router<SharedState> {
    Router::new()
        // /health answers without authentication (load balancers, probes).
        .route("/health", get(routes_admin::health))
        // Raft's messages between the nodes of a cluster: not API keys but the
        // cluster's key (`raft_message` checks it; required with --auth).
        .route(
            "/cluster/raft/{kind}",
            // A catch-up batch of entries or a snapshot chunk can be megabytes.
            post(crate::routes::cluster::raft_message)
                .layer(axum::extract::DefaultBodyLimit::max(RAFT_MESSAGE_MAX_BYTES)),
        )
        // The studio's static files: no data in them, so no key needed to load them.
        .route("/", get(studio::root))
        .route("/studio", get(studio::index))
        .route("/studio/", get(studio::index))
        .route("/studio/{*path}", get(studio::file))
}

async fn not_found() -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        "no such endpoint; see the README or openapi.yaml",
    )
}

async fn method_not_allowed(uri: axum::http::Uri) -> Response {
    // An attachment shares the document route (its id's tail names it), whose
    // methods axum would list: it takes fewer (`routes/attachments.rs`).
    if crate::routes::attachments::attachment_target(uri.path()).is_some() {
        return crate::routes::attachments::not_allowed_on_attachment();
    }
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "this endpoint does not take that method",
    )
    .into_response()
}

/// The route template a request matched, for `observe` (which runs outside the
/// routing and so sees only the answer).
#[derive(Clone)]
struct RouteLabel(MatchedPath);

async fn label_route(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().cloned();
    let mut resp = next.run(req).await;
    if let Some(route) = route {
        resp.extensions_mut().insert(RouteLabel(route));
    }
    resp
}

/// Every request through the router: its id (kept or made, echoed, in an error's
/// body), then its count, latency and access-log line (`observe::finished`).
async fn observe(State(state): State<SharedState>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = RequestId::from_presented(
        req.headers()
            .get(REQUEST_ID_HEADER)
            .map(HeaderValue::as_bytes),
    );
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    req.extensions_mut().insert(id.clone());
    let resp = with_request_id(next.run(req).await, &id).await;
    let route = resp.extensions().get::<RouteLabel>();
    let bytes = axum::body::HttpBody::size_hint(resp.body()).exact();
    crate::observe::finished(
        &state.metrics,
        state.access_log,
        &Exchange {
            route: route.map_or("unmatched", |r| r.0.as_str()),
            method: method.as_str(),
            path: &path,
            status: resp.status().as_u16(),
            bytes,
            elapsed: started.elapsed(),
            request_id: &id,
            key_id: resp.extensions().get::<KeyId>().map(|k| k.0.as_str()),
        },
    );
    resp
}

/// An error's JSON body at most this large gets the request id added.
const MAX_STAMPED_BODY_BYTES: u64 = 64 << 10;

/// The answer with `X-Request-Id`, and the id in its JSON body if it is an error
/// (a 307 `not_leader` included).
pub(crate) async fn with_request_id(resp: Response, id: &RequestId) -> Response {
    let (mut parts, body) = resp.into_parts();
    if let Ok(v) = HeaderValue::from_str(id.as_str()) {
        parts.headers.insert(REQUEST_ID_HEADER, v);
    }
    // An error, or a 307 `not_leader` (its body is an error's).
    let json_error = (parts.status.as_u16() >= 400
        || parts.status == axum::http::StatusCode::TEMPORARY_REDIRECT)
        && !parts.headers.contains_key(header::CONTENT_ENCODING)
        && parts
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
        && axum::body::HttpBody::size_hint(&body)
            .exact()
            .is_some_and(|n| n <= MAX_STAMPED_BODY_BYTES);
    if !json_error {
        return Response::from_parts(parts, body);
    }
    let Ok(bytes) = axum::body::to_bytes(body, MAX_STAMPED_BODY_BYTES as usize).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let stamped = crate::observe::error_body_with_id(&bytes, id).map_or(bytes, Into::into);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(stamped))
}

/// With authentication on, a request needs a verified client certificate or a valid
/// API key (`Authorization: Bearer <key>` or `X-Api-Key: <key>`).
async fn authenticate(State(state): State<SharedState>, mut req: Request, next: Next) -> Response {
    let client_certificate = req
        .extensions()
        .get::<ConnInfo>()
        .is_some_and(|c| c.client_certificate);
    let headers = req.headers();
    match admit(&state, client_certificate, || {
        presented_key(headers).or_else(|| key_from_websocket_protocol(headers))
    }) {
        Err(refused) => refused,
        Ok(key) => {
            // For the handlers too: a write keeps its key with the revisions it makes.
            if let Some(key) = &key {
                req.extensions_mut().insert(key.clone());
            }
            let mut resp = next.run(req).await;
            if let Some(key) = key {
                resp.extensions_mut().insert(key);
            }
            resp
        }
    }
}

/// Admission, the one rule of both HTTP paths: with authentication on, a request
/// needs a verified client certificate or a valid API key. `presented` finds the
/// key the request presents (looked for only when needed). `Ok` lets the request
/// in, with the key's id when a key let it in; `Err` is the 401 to answer.
pub(crate) fn admit<'h>(
    state: &AppState,
    client_certificate: bool,
    presented: impl FnOnce() -> Option<&'h str>,
) -> Result<Option<KeyId>, Response> {
    if !state.require_auth || client_certificate {
        return Ok(None);
    }
    let Some(key) = presented() else {
        return Err(unauthorized("authentication required: send an API key (Authorization: Bearer <key>) or a client certificate"));
    };
    match state.keys.verify(key.trim()) {
        Some(id) => Ok(Some(KeyId(id))),
        None => Err(unauthorized(
            "the API key is not valid (unknown, revoked or mistyped)",
        )),
    }
}

/// The API key a request presents: `Authorization: Bearer <key>` or `X-Api-Key`.
pub(crate) fn presented_key(headers: &impl HeaderLookup) -> Option<&str> {
    headers
        .first("authorization")
        .and_then(visible_ascii)
        // The scheme name is case-insensitive (RFC 9110, section 11.1).
        .and_then(|v| {
            v.get(..7)
                .filter(|s| s.eq_ignore_ascii_case("bearer "))
                .map(|_| &v[7..])
        })
        .or_else(|| headers.first("x-api-key").and_then(visible_ascii))
}

/// A browser cannot set headers on a WebSocket, and a key must never be in a URL
/// (logs, history, Referer). So a WebSocket upgrade may carry the key as one of the
/// subprotocols it offers, `kiln.key.<key>` (keys are `kiln_<hex>_<hex>`, valid
/// protocol tokens), next to [`changes::WS_PROTOCOL`], the only one the server
/// selects and echoes: the key never comes back in a response.
fn key_from_websocket_protocol(headers: &axum::http::HeaderMap) -> Option<&str> {
    let upgrade = headers
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !upgrade {
        return None;
    }
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(changes::WS_KEY_PROTOCOL_PREFIX))
}

fn unauthorized(message: &str) -> Response {
    let mut r = ApiError::new(ErrorCode::Unauthorized, message).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"kiln\""),
    );
    r
}
