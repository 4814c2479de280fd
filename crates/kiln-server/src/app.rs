//! The router: routes, shared state, and the layers every request passes
//! (metrics, then authentication).

use crate::auth::KeyVerifier;
use crate::config::Limits;
use crate::error::ApiError;
use crate::http_util::{visible_ascii, ApiPath, HeaderLookup};
use crate::metrics::Metrics;
use crate::routes::{admin as routes_admin, bulk, changes, docs as routes_docs, queries, studio};
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use kiln_docs::DocStore;
use std::sync::Arc;
use std::time::Instant;

pub struct AppState {
    pub store: Arc<DocStore>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub require_auth: bool,
    pub keys: Arc<KeyVerifier>,
    pub changes: crate::config::ChangesConfig,
    /// The changes hubs, one per database with subscribers.
    pub hubs: crate::changes::hub::Hubs,
    /// The shared heartbeat tick of the changes connections.
    pub heartbeat: tokio::sync::watch::Receiver<u64>,
    /// `ServerConfig::own_http1`.
    pub own_http1: bool,
}

pub type SharedState = Arc<AppState>;

/// What the connection knows about its client; inserted into every request.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub peer: std::net::SocketAddr,
    /// The client presented a certificate that the configured CA verified.
    pub client_certificate: bool,
}

pub fn router(state: SharedState) -> Router {
    let api = Router::new()
        .route("/metrics", get(routes_admin::metrics))
        .route("/stats", get(routes_admin::server_stats))
        .route("/dbs", get(routes_admin::list_databases))
        .route(
            "/dbs/{db}",
            put(routes_admin::create_database)
                .get(routes_admin::database_stats)
                .delete(routes_admin::delete_database),
        )
        .route("/dbs/{db}/docs", get(routes_docs::list_by_prefix))
        .route(
            DOCUMENT_ROUTE,
            get(routes_docs::get_document)
                .put(routes_docs::put_document)
                .post(routes_docs::put_document)
                .delete(routes_docs::delete_document),
        )
        .route("/dbs/{db}/backup", get(crate::routes::backup::backup))
        .route(
            "/dbs/{db}/backup/chain",
            get(crate::routes::backup::chain_stats).delete(crate::routes::backup::chain_stop),
        )
        .route("/dbs/{db}/restore", post(crate::routes::backup::restore))
        .route("/dbs/{db}/batch", post(routes_docs::batch))
        .route("/dbs/{db}/bulk", post(bulk::bulk_insert))
        .route("/dbs/{db}/changes", get(changes::pull))
        .route("/dbs/{db}/changes/ws", get(changes::websocket))
        .route(
            "/dbs/{db}/tombstones",
            get(routes_admin::tombstones).delete(routes_admin::purge_tombstones),
        )
        .route("/dbs/{db}/collections", get(routes_docs::collections))
        .route(
            "/dbs/{db}/collections/{collection}/docs",
            get(routes_docs::list_collection),
        )
        .route("/dbs/{db}/indexes", get(queries::list_indexes))
        .route(
            "/dbs/{db}/indexes/{name}",
            put(queries::put_index)
                .get(queries::get_index)
                .delete(queries::delete_index),
        )
        .route("/dbs/{db}/indexes/{name}/reset", post(queries::reset_index))
        .route("/dbs/{db}/queries", post(queries::run_query));
    // Without authentication the layer would only pass requests on: leave it out.
    let api = if state.require_auth {
        api.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
    } else {
        api
    };
    api
        // /health answers without authentication (load balancers, probes).
        .route("/health", get(routes_admin::health))
        // The studio's static files: no data in them, so no key needed to load them.
        .route("/", get(studio::root))
        .route("/studio", get(studio::index))
        .route("/studio/", get(studio::index))
        .route("/studio/{*path}", get(studio::file))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), track))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see the README or openapi.yaml",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not take that method",
    )
}

/// Counts and times every routed request by its route template.
async fn track(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req.extensions().get::<MatchedPath>().cloned();
    let method = req.method().clone();
    let resp = next.run(req).await;
    state.metrics.record_request(
        route.as_ref().map_or("unmatched", MatchedPath::as_str),
        method.as_str(),
        resp.status().as_u16(),
        started.elapsed(),
    );
    resp
}

/// With authentication on, a request needs a verified client certificate or a valid
/// API key (`Authorization: Bearer <key>` or `X-Api-Key: <key>`).
async fn authenticate(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let client_certificate = req
        .extensions()
        .get::<ConnInfo>()
        .is_some_and(|c| c.client_certificate);
    match refusal(&state, req.headers(), client_certificate) {
        Some(refused) => refused,
        None => next.run(req).await,
    }
}

/// The answer to a request that authentication turns away; `None` lets it in.
pub(crate) fn refusal(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    client_certificate: bool,
) -> Option<Response> {
    refusal_by(state, client_certificate, || {
        presented_key(headers).or_else(|| key_from_websocket_protocol(headers))
    })
}

/// `refusal` given how to find the key the request presents (looked for only when
/// authentication is on and no verified client certificate came with it).
pub(crate) fn refusal_by<'h>(
    state: &AppState,
    client_certificate: bool,
    presented: impl FnOnce() -> Option<&'h str>,
) -> Option<Response> {
    if !state.require_auth || client_certificate {
        return None;
    }
    let Some(key) = presented() else {
        return Some(unauthorized("authentication required: send an API key (Authorization: Bearer <key>) or a client certificate"));
    };
    match state.keys.verify(key.trim()) {
        Some(_name) => None,
        None => Some(unauthorized(
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

/// The route template of the document requests, as metrics label them.
pub(crate) const DOCUMENT_ROUTE: &str = "/dbs/{db}/docs/{*id}";

/// `(db, id)` of a GET, PUT or POST of one document (`/dbs/{db}/docs/{*id}`) that
/// the document fast path can serve as the router would: a path with nothing to
/// percent-decode, a database name and a non-empty id. Anything else (`None`)
/// goes through the router.
pub(crate) fn document_fast_path(method: &Method, path: &str) -> Option<(String, String)> {
    if !(method == Method::GET || method == Method::PUT || method == Method::POST) {
        return None;
    }
    document_target(path).map(|(db, id)| (db.to_string(), id.to_string()))
}

/// `(db, id)` of a plain document path (see `document_fast_path`).
pub(crate) fn document_target(path: &str) -> Option<(&str, &str)> {
    let (db, id) = path.strip_prefix("/dbs/")?.split_once("/docs/")?;
    if db.is_empty() || db.contains('/') || id.is_empty() || path.contains('%') {
        return None;
    }
    Some((db, id))
}

/// Serves a request `document_fast_path` took: the same authentication, handlers
/// and request metrics as through the router, without the router's layers (a
/// boxed service, two middleware futures, path matching and decoding, a copy of
/// the headers) on the busiest routes.
pub(crate) async fn serve_document(
    state: SharedState,
    client_certificate: bool,
    (db, id): (String, String),
    req: axum::http::Request<Body>,
) -> Response {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let resp = match refusal(&state, &parts.headers, client_certificate) {
        Some(refused) => refused,
        None if parts.method == Method::GET => {
            routes_docs::get_document(State(state.clone()), ApiPath((db, id)), parts.headers)
                .await
                .into_response()
        }
        None => {
            routes_docs::put_document(State(state.clone()), ApiPath((db, id)), parts.headers, body)
                .await
                .into_response()
        }
    };
    state.metrics.record_request(
        DOCUMENT_ROUTE,
        parts.method.as_str(),
        resp.status().as_u16(),
        started.elapsed(),
    );
    resp
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
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"kiln\""),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_fast_path_takes_only_plain_document_paths() {
        let take = |m: Method, p: &str| document_fast_path(&m, p);
        assert_eq!(
            take(Method::PUT, "/dbs/bench/docs/users/1"),
            Some(("bench".into(), "users/1".into()))
        );
        assert_eq!(
            take(Method::POST, "/dbs/b/docs/users/"),
            Some(("b".into(), "users/".into()))
        );
        assert_eq!(
            take(Method::GET, "/dbs/b/docs/a/docs/c"),
            Some(("b".into(), "a/docs/c".into()))
        );
        // Left to the router: other methods, percent-encoding, other routes, and
        // paths the route template would not match as such.
        assert_eq!(take(Method::DELETE, "/dbs/b/docs/x"), None);
        assert_eq!(take(Method::HEAD, "/dbs/b/docs/x"), None);
        assert_eq!(take(Method::GET, "/dbs/b/docs/a%20b"), None);
        assert_eq!(take(Method::GET, "/dbs/b/docs"), None);
        assert_eq!(take(Method::GET, "/dbs/b/docs/"), None);
        assert_eq!(take(Method::GET, "/dbs//docs/x"), None);
        assert_eq!(take(Method::GET, "/dbs/a/b/docs/x"), None);
        assert_eq!(take(Method::GET, "/dbs/b/collections"), None);
    }
}
