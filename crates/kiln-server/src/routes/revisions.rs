//! Document revisions (`kiln_docs` `revisions/`):
//! - `GET /dbs/{db}/revisions/config`, `PUT /dbs/{db}/revisions/config` with
//!   `{"collections": {"orders": {"max_revisions": 50, "max_age_ms": null}}}`
//! - `GET /dbs/{db}/revisions/docs/{id}?limit=N&continuation=<etag>`: a page of the
//!   document's previous versions, newest first
//! - `DELETE /dbs/{db}/revisions/docs/{id}`: purges them
//! - `POST /dbs/{db}/revisions/revert/{id}?etag=<revision etag>`: writes that
//!   revision back as a new version (a PUT: `If-Match` applies to the current one)
//!
//! Not `/dbs/{db}/docs/{id}/revisions`: ids may contain `/`, so that path already
//! names the document `{id}/revisions`, which the document routes (and the own
//! HTTP/1.1 loop) serve.

use crate::error::{ApiError, ErrorCode};
use crate::http_util::{
    blocking, encode_path, encode_query_value, json_response, json_value, link_next, read_body,
    write_condition, ApiPath, RequestKey,
};
use crate::query_params::{NoParams, Params};
use crate::state::{AppState, SharedState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use kiln_docs::RevisionError;
use kiln_docs::{format_rfc3339_ms, DocError, Etag, Page, Revision, RevisionsConfig};
use serde::{Deserialize, Serialize};

fn config_json(config: &RevisionsConfig) -> Response {
    json_value(
        StatusCode::OK,
        serde_json::to_value(config).unwrap_or_default(),
    )
}

pub async fn get_config(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    Ok(config_json(&database.revisions_config()?))
}

/// Replaces the configuration; answers with it. In a cluster, through the log.
pub async fn put_config(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let bytes = read_body(&headers, body, &state.limits).await?;
    let config = RevisionsConfig::from_json(&bytes)?;
    if state.cluster.is_some() {
        crate::routes::cluster::set_revisions_config(&state, &db, config.clone()).await?;
    } else {
        let stored = config.clone();
        blocking(move || database.set_revisions_config(stored)).await?;
    }
    Ok(config_json(&config))
}

#[derive(Deserialize)]
pub struct ListQuery {
    /// Revisions per page (the server's default page size when absent).
    limit: Option<usize>,
    /// The `continuation` of the previous page: the etag to continue before.
    continuation: Option<String>,
}

/// The page size asked for, within the server's limits.
fn limit(state: &AppState, asked: Option<usize>) -> Result<usize, ApiError> {
    let max = state.limits.max_page_size;
    match asked {
        None => Ok(state.limits.default_page_size),
        Some(0) => Err(ApiError::new(
            ErrorCode::InvalidPageSize,
            "limit must be at least 1",
        )),
        Some(n) if n > max => Err(ApiError::new(
            ErrorCode::PageSizeTooLarge,
            format!("limit {n} exceeds the limit of {max}"),
        )),
        Some(n) => Ok(n),
    }
}

pub async fn list(
    State(state): State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
    Params(q): Params<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = limit(&state, q.limit)?;
    let database = state.store.database(&db)?;
    let doc_id = id.clone();
    let page =
        blocking(move || database.revisions(&doc_id, q.continuation.as_deref(), limit)).await?;
    let next = page.next.as_ref().map(|etag| {
        format!(
            "/dbs/{}/revisions/docs/{}?limit={limit}&continuation={}",
            encode_path(&db),
            encode_path(&id),
            encode_query_value(etag)
        )
    });
    let mut resp = json_response(StatusCode::OK, page_json(&page));
    if let Some(target) = next {
        link_next(&mut resp, &target);
    }
    Ok(resp)
}

/// A revision's fields besides its document.
#[derive(Serialize)]
struct RevisionFields<'a> {
    etag: String,
    last_modified: String,
    replaced_at: String,
    deleted: bool,
    key_id: Option<&'a str>,
}

/// `{"revisions": [{..., "document": <JSON as stored>}], "continuation": etag|null}`,
/// the stored JSON written as it is (not parsed again).
fn page_json(page: &Page<Revision>) -> Vec<u8> {
    let size: usize = page.items.iter().map(|r| r.json.len() + 160).sum();
    let mut out = Vec::with_capacity(size + 64);
    out.extend_from_slice(b"{\"revisions\":[");
    for (i, r) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let fields = RevisionFields {
            etag: r.etag.to_string(),
            last_modified: format_rfc3339_ms(r.last_modified_ms),
            replaced_at: format_rfc3339_ms(r.replaced_ms),
            deleted: r.deleted,
            key_id: r.key_id.as_deref(),
        };
        let fields = serde_json::to_vec(&fields).expect("revision fields serialize");
        // An object's text ends with '}': the document goes before it.
        out.extend_from_slice(&fields[..fields.len() - 1]);
        out.extend_from_slice(b",\"document\":");
        out.extend_from_slice(&r.json);
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"continuation\":");
    let next = serde_json::to_vec(&page.next).expect("an Option<String> serializes");
    out.extend_from_slice(&next);
    out.push(b'}');
    out
}

/// Purges the document's revisions: `{"id", "purged": N}`.
pub async fn purge(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let purged = if state.cluster.is_some() {
        crate::routes::cluster::purge_revisions(&state, &db, &id).await?
    } else {
        let doc_id = id.clone();
        blocking(move || database.purge_revisions(&doc_id)).await?
    };
    Ok(json_value(
        StatusCode::OK,
        serde_json::json!({"id": id, "purged": purged}),
    ))
}

#[derive(Deserialize)]
pub struct RevertQuery {
    /// The etag of the revision to write back.
    etag: String,
}

/// Writes the revision back as a new version, answering as a PUT does.
pub async fn revert(
    State(state): State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
    Params(q): Params<RevertQuery>,
    key: RequestKey,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let condition = write_condition(&headers)?;
    let etag = Etag::parse(q.etag.trim_matches('"'))?;
    let database = state.store.database(&db)?;
    let revision = database.revision(&id, etag)?.ok_or_else(|| {
        DocError::Revision(RevisionError::NotFound {
            id: id.clone(),
            etag: etag.to_string(),
        })
    })?;
    let out =
        crate::doc_request::put(&state, database, id, &revision.json, condition, key.id()).await?;
    Ok(crate::doc_request::DocAnswer::Written {
        db: &db,
        outcome: &out,
    }
    .to_response())
}
