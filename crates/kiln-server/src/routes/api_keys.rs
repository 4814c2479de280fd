//! API keys over HTTP (operator only):
//! - `GET /admin/api-keys`: every key and registered certificate (ids, names,
//!   clearances; never a secret or its hash)
//! - `POST /admin/api-keys` with `{"name": "shop-app", "grants": ["shop:read_write"]}`
//!   or `{"name": "ops", "operator": true}`, and `"certificate_pem"` to register a
//!   client certificate instead of making a key: 201 with the key (the only time
//!   it is shown)
//! - `DELETE /admin/api-keys/{id}`: revokes it
//!
//! A single server changes its key file. A cluster's node proposes the change to
//! the log (`kiln_cluster::api_keys`): the record, which holds only the hash of the
//! key's secret, is saved on every node, and a revocation takes effect on every
//! node as it applies the entry. The secret is made here and answered once.

use crate::access::{Clearance, DbGrant};
use crate::auth::{self, ApiKeyRecord};
use crate::error::{ApiError, ErrorCode};
use crate::http_util::{json_value, read_body, ApiPath};
use crate::query_params::NoParams;
use crate::state::{AppState, SharedState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use kiln_cluster::{Answer, Command};
use serde::Deserialize;
use serde_json::json;

/// The body of `POST /admin/api-keys`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    name: String,
    #[serde(default)]
    operator: bool,
    /// `DATABASE:ACCESS` each, as `kiln api-key create --db` takes them.
    #[serde(default)]
    grants: Vec<String>,
    /// A client certificate (PEM) to register instead of making a key.
    #[serde(default)]
    certificate_pem: Option<String>,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, message)
}

fn auth_error(e: auth::AuthError) -> ApiError {
    match e {
        auth::AuthError::NoSuchKey(_) => ApiError::new(ErrorCode::NotFound, e.to_string()),
        auth::AuthError::InvalidName(_) | auth::AuthError::CertificateExists { .. } => {
            bad(e.to_string())
        }
        e => ApiError::new(ErrorCode::InternalError, e.to_string()),
    }
}

/// Runs work on the key file off the async workers.
async fn on_key_file<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, auth::AuthError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(ErrorCode::InternalError, e.to_string()))?
        .map_err(auth_error)
}

/// What a record shows: never the secret's hash.
fn record_json(r: &ApiKeyRecord) -> serde_json::Value {
    json!({
        "id": r.id,
        "name": r.name,
        "kind": if r.certificate_sha256.is_some() { "certificate" } else { "key" },
        "certificate_sha256": r.certificate_sha256,
        "clearance": r.clearance,
        "created_ms": r.created_ms,
    })
}

pub async fn list(_: NoParams, State(state): State<SharedState>) -> Result<Response, ApiError> {
    let dir = state.keys.data_dir().to_path_buf();
    let keys = on_key_file(move || auth::list_api_keys(&dir)).await?;
    let keys: Vec<_> = keys.iter().map(record_json).collect();
    Ok(json_value(StatusCode::OK, json!({"keys": keys})))
}

/// The clearance a body asks for: `operator`, or one grant or more.
fn clearance_of(body: &CreateKey) -> Result<Clearance, ApiError> {
    match (body.operator, body.grants.is_empty()) {
        (true, true) => Ok(Clearance::Operator),
        (false, false) => body
            .grants
            .iter()
            .map(|g| DbGrant::parse(g).map_err(|e| bad(format!("grants: {e}"))))
            .collect::<Result<Vec<_>, _>>()
            .map(Clearance::Databases),
        (true, false) => Err(bad("give \"operator\": true or \"grants\", not both")),
        (false, true) => Err(bad(
            "give \"operator\": true or \"grants\" (e.g. [\"shop:read_write\", \"reports-*:read\"])",
        )),
    }
}

/// The record of a certificate given as PEM text, refused if already registered.
fn certificate_record(
    state: &AppState,
    name: &str,
    clearance: Clearance,
    pem: &str,
) -> Result<ApiKeyRecord, ApiError> {
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or_else(|| bad("certificate_pem holds no certificate"))?
        .map_err(|e| bad(format!("certificate_pem: {e}")))?;
    let thumbprint = auth::certificate_thumbprint(&der);
    auth::certificate_record(state.keys.data_dir(), name, clearance, thumbprint).map_err(auth_error)
}

pub async fn create(
    _: NoParams,
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body, &state.limits).await?;
    let body: CreateKey = serde_json::from_slice(&bytes).map_err(|e| {
        bad(format!(
            "{e} (the body is {{\"name\": N, \"operator\": true}} or {{\"name\": N, \"grants\": \
             [\"DB:read|read_write|admin\", ...]}}, with \"certificate_pem\" to register a client \
             certificate)"
        ))
    })?;
    let clearance = clearance_of(&body)?;
    let (record, key) = match &body.certificate_pem {
        Some(pem) => (
            certificate_record(&state, &body.name, clearance, pem)?,
            None,
        ),
        None => {
            let (record, key) = auth::new_api_key(&body.name, clearance).map_err(auth_error)?;
            (record, Some(key))
        }
    };
    save(&state, &record).await?;
    let mut answer = record_json(&record);
    if let Some(key) = key {
        answer["key"] = key.into();
    }
    Ok(json_value(StatusCode::CREATED, answer))
}

/// Saves `record` here, or on every node of the cluster.
async fn save(state: &AppState, record: &ApiKeyRecord) -> Result<(), ApiError> {
    match &state.cluster {
        Some(node) => {
            let record_json = serde_json::to_string(record)
                .map_err(|e| ApiError::new(ErrorCode::InternalError, e.to_string()))?;
            let answer =
                crate::routes::cluster::propose_command(node, Command::PutApiKey { record_json })
                    .await?;
            match answer {
                Answer::ApiKeySaved => Ok(()),
                other => Err(crate::routes::cluster::answer_error(other)),
            }
        }
        None => {
            let dir = state.keys.data_dir().to_path_buf();
            let record = record.clone();
            on_key_file(move || auth::save_record(&dir, &record)).await
        }
    }
}

pub async fn revoke(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let existed = match &state.cluster {
        Some(node) => {
            let command = Command::RevokeApiKey { id: id.clone() };
            match crate::routes::cluster::propose_command(node, command).await? {
                Answer::ApiKeyRevoked { existed } => existed,
                other => return Err(crate::routes::cluster::answer_error(other)),
            }
        }
        None => {
            let dir = state.keys.data_dir().to_path_buf();
            let id = id.clone();
            on_key_file(move || auth::remove_record(&dir, &id)).await?
        }
    };
    if !existed {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no API key with id {id:?}"),
        ));
    }
    Ok(json_value(StatusCode::OK, json!({"revoked": id})))
}
