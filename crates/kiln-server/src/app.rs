//! The router: routes and the layers every request passes:
//! compression, then `observe` (request id, metrics, access log), then CORS, then
//! (on the API routes) authentication. The own HTTP/1.1 loop (`http1/`) serves
//! plain document GETs, PUTs, POSTs (to a prefix) and PATCHes through the same
//! admission (`admit`), the same document request (`doc_request.rs`) and
//! `observe`, and hands anything the front layers could change to this router
//! (`cross_origin::FrontLayers`).

use crate::access::Need;
use crate::audit::{Event, Outcome, RequestFacts};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorCode};
use crate::http_util::{visible_ascii, HeaderLookup};
use crate::observe::{Exchange, KeyId, RequestId, REQUEST_ID_HEADER};
use crate::route_table::Rule;
use crate::routes::{admin as routes_admin, changes, studio};
use crate::state::{AppState, ConnInfo, SharedState};
use crate::telemetry;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::time::Instant;

/// The largest Raft message a node takes (entries carry whole documents).
const RAFT_MESSAGE_MAX_BYTES: usize = 256 << 20;

/// The router with every layer (its front layers as `state.front` says).
pub fn router(state: SharedState) -> Router {
    // The rules are checked where they can refuse or record something.
    let guarded = state.require_auth || state.audit.is_some();
    let api = crate::route_table::api_routes(guarded.then(|| state.clone())).into_router();
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
/// body), its span when traces are on (`telemetry.rs`: `traceresponse` in the
/// answer, the slow-request line), then its count, latency and access-log line
/// (`observe::finished`).
async fn observe(State(state): State<SharedState>, mut req: Request, next: Next) -> Response {
    use tracing::Instrument;
    let started = Instant::now();
    let id = RequestId::from_presented(
        req.headers()
            .get(REQUEST_ID_HEADER)
            .map(HeaderValue::as_bytes),
    );
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let traced = state.traces.on().then(|| {
        telemetry::request_span(
            &state.traces,
            req.headers(),
            method.as_str(),
            &path,
            id.as_str(),
        )
    });
    req.extensions_mut().insert(id.clone());
    let resp = match &traced {
        Some((span, _)) => next.run(req).instrument(span.clone()).await,
        None => next.run(req).await,
    };
    let mut resp = with_request_id(resp, &id).await;
    let matched = resp.extensions().get::<RouteLabel>().map(|r| r.0.clone());
    let route = matched.as_ref().map_or("unmatched", |r| r.as_str());
    let status = resp.status().as_u16();
    let elapsed = started.elapsed();
    if let Some((span, traceresponse)) = traced {
        telemetry::record_answer(
            &span,
            method.as_str(),
            matched.as_ref().map(|r| r.as_str()),
            status,
        );
        if let Ok(v) = HeaderValue::from_str(&traceresponse) {
            resp.headers_mut()
                .insert(telemetry::TRACERESPONSE_HEADER, v);
        }
        let slow = state
            .traces
            .slow_request_ms
            .is_some_and(|ms| elapsed >= std::time::Duration::from_millis(ms));
        if slow {
            let what = format!("{method} {path} {status} id={}", id.as_str());
            log_slow_request(&span, &traceresponse, started, elapsed, &what);
        }
    }
    let bytes = axum::body::HttpBody::size_hint(resp.body()).exact();
    crate::observe::finished(
        &state.metrics,
        state.access_log,
        &Exchange {
            route,
            method: method.as_str(),
            path: &path,
            status,
            bytes,
            elapsed,
            request_id: &id,
            key_id: resp.extensions().get::<KeyId>().map(|k| k.0.as_str()),
        },
    );
    resp
}

/// The slow-request line (`--slow-request-ms`): the request, its trace id and its
/// spans' timeline.
fn log_slow_request(
    span: &tracing::Span,
    traceresponse: &str,
    started: Instant,
    elapsed: std::time::Duration,
    what: &str,
) {
    let timeline = telemetry::take_timeline(span);
    // The trace id: `00-<trace id>-...`.
    let trace_id = traceresponse.get(3..35).unwrap_or_default();
    tracing::warn!(
        target: "kiln::slow",
        "{}",
        telemetry::slow_request_line(started, elapsed, what, trace_id, &timeline)
    );
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

/// With authentication on, a request needs a registered client certificate or a
/// valid API key (`Authorization: Bearer <key>` or `X-Api-Key: <key>`). The caller
/// goes into the request's extensions for the route's rule (`route_table::guard`)
/// and the handlers (a write keeps its key with the revisions it makes).
async fn authenticate(State(state): State<SharedState>, mut req: Request, next: Next) -> Response {
    let certificate = req
        .extensions()
        .get::<ConnInfo>()
        .and_then(|c| c.client_certificate.clone());
    let headers = req.headers();
    let admitted = tracing::info_span!("kiln.admission").in_scope(|| {
        admit(&state, certificate.as_deref(), || {
            presented_key(headers).map(|k| k.or_else(|| key_from_websocket_protocol(headers)))
        })
    });
    match admitted {
        Err(refused) => {
            audit_refusal(&state, &req, None, None, &refused);
            refused.into_response()
        }
        Ok(caller) => {
            let key = caller.as_ref().map(|c| KeyId(c.id.clone()));
            if let Some(caller) = caller {
                req.extensions_mut().insert(caller);
            }
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

/// A request authentication or its route's rule refused.
#[derive(Debug)]
pub(crate) enum Refused {
    /// 401: no credential, or one that is not valid.
    Unauthenticated(String),
    /// 403: the caller's clearance falls short.
    Forbidden(String),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Unauthenticated(message) => unauthorized(&message),
            Refused::Forbidden(message) => {
                ApiError::new(ErrorCode::Forbidden, message).into_response()
            }
        }
    }
}

/// Admission, the one rule of both HTTP paths: with authentication on, a request
/// needs a registered client certificate (`certificate`: the thumbprint of the one
/// the connection presented, verified by the configured CA) or a valid API key.
/// `presented` finds the key the request presents (looked for only when needed).
/// `Ok` lets the request in, with its caller when authentication is on.
pub(crate) fn admit<'h>(
    state: &AppState,
    certificate: Option<&str>,
    presented: impl FnOnce() -> Result<Option<&'h str>, &'static str>,
) -> Result<Option<Caller>, Refused> {
    if !state.require_auth {
        return Ok(None);
    }
    if let Some(caller) = certificate.and_then(|t| state.keys.verify_certificate(t)) {
        return Ok(Some(caller));
    }
    let Some(key) = presented().map_err(|why| Refused::Unauthenticated(why.to_string()))? else {
        return Err(Refused::Unauthenticated(match certificate {
            Some(thumbprint) => format!(
                "the client certificate (SHA-256 {thumbprint}) is not registered with this server (kiln api-key create --certificate FILE), and no API key was sent"
            ),
            None => "authentication required: send an API key (Authorization: Bearer <key>) or a client certificate".to_string(),
        }));
    };
    match state.keys.verify(key.trim()) {
        Some(caller) => Ok(Some(caller)),
        None => Err(Refused::Unauthenticated(
            "the API key is not valid (unknown, revoked or mistyped)".to_string(),
        )),
    }
}

/// Whether the request's caller may make it, by its route's rule (`None`: the route
/// declares no rule for this method, refused to everyone). With an audit log and
/// an audited rule, `Ok` carries the entry to finish with the answer's status.
pub(crate) fn authorize(
    state: &AppState,
    req: &Request,
    rule: Option<&'static Rule>,
    db: Option<&str>,
) -> Result<Option<PendingAudit>, Response> {
    let caller = req.extensions().get::<Caller>();
    let verdict = match (rule, caller) {
        (None, _) => Err(Refused::Forbidden(
            "this route declares no permission for this method; nobody may use it".to_string(),
        )),
        (Some(rule), Some(caller)) => check_need(caller, rule.need, db),
        (Some(_), None) => Ok(()),
    };
    if let Err(refused) = verdict {
        audit_refusal(state, req, caller, db, &refused);
        return Err(refused.into_response());
    }
    let audit = state.audit.clone();
    Ok(rule
        .and_then(|r| r.audit)
        .zip(audit)
        .map(|(event, log)| PendingAudit {
            log,
            event,
            who: caller.cloned(),
            database: db.map(str::to_string),
            request: request_facts(req),
        }))
}

/// The caller's clearance against a need; the refusal names what was missing.
pub(crate) fn check_need(caller: &Caller, need: Need, db: Option<&str>) -> Result<(), Refused> {
    need.check(&caller.clearance, db).map_err(|denied| {
        Refused::Forbidden(format!("{denied} (key {} {:?})", caller.id, caller.name))
    })
}

/// An audited request on its way: written with the status it is answered with.
pub(crate) struct PendingAudit {
    log: std::sync::Arc<crate::audit::AuditLog>,
    event: &'static str,
    who: Option<Caller>,
    database: Option<String>,
    request: RequestFacts,
}

impl PendingAudit {
    pub(crate) fn finish(self, status: u16) {
        self.log.record(&Event {
            event: self.event,
            outcome: Outcome::of_status(status),
            who: self.who.as_deref(),
            database: self.database.as_deref(),
            request: Some(&self.request),
            status: Some(status),
            detail: None,
        });
    }
}

fn request_facts(req: &Request) -> RequestFacts {
    RequestFacts {
        method: req.method().as_str().to_string(),
        path: req.uri().path().to_string(),
        request_id: req
            .extensions()
            .get::<RequestId>()
            .map(|id| id.as_str().to_string())
            .unwrap_or_default(),
        peer: req.extensions().get::<ConnInfo>().map(|c| c.peer),
    }
}

/// A refusal in the audit log (`authentication.failed` or `access.denied`).
pub(crate) fn audit_refusal(
    state: &AppState,
    req: &Request,
    who: Option<&Caller>,
    db: Option<&str>,
    refused: &Refused,
) {
    if let Some(log) = &state.audit {
        log_refusal(log, &request_facts(req), who, db, refused);
    }
}

/// A refusal in the audit log, from either HTTP path.
pub(crate) fn log_refusal(
    log: &crate::audit::AuditLog,
    request: &RequestFacts,
    who: Option<&Caller>,
    db: Option<&str>,
    refused: &Refused,
) {
    let (event, status, why) = match refused {
        Refused::Unauthenticated(why) => ("authentication.failed", 401, why),
        Refused::Forbidden(why) => ("access.denied", 403, why),
    };
    log.record(&Event {
        event,
        outcome: Outcome::Refused,
        who: who.map(|c| &**c),
        database: db,
        request: Some(request),
        status: Some(status),
        detail: Some(serde_json::Value::String(why.clone())),
    });
}

/// The API key a request presents: `Authorization: Bearer <key>` or `X-Api-Key`.
/// Both, with different keys, is refused: which one the request meant is not ours
/// to guess (and a valid key must not let an invalid one pass unnoticed).
pub(crate) fn presented_key(headers: &impl HeaderLookup) -> Result<Option<&str>, &'static str> {
    let bearer = headers
        .first("authorization")
        .and_then(visible_ascii)
        // The scheme name is case-insensitive (RFC 9110, section 11.1).
        .and_then(|v| {
            v.get(..7)
                .filter(|s| s.eq_ignore_ascii_case("bearer "))
                .map(|_| &v[7..])
        });
    let api_key = headers.first("x-api-key").and_then(visible_ascii);
    match (bearer, api_key) {
        (Some(a), Some(b)) if a.trim() != b.trim() => {
            Err("two different API keys were sent (Authorization: Bearer and X-Api-Key): send one")
        }
        (a, b) => Ok(a.or(b)),
    }
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
