//! Indexes and queries:
//! - `PUT/GET/DELETE /dbs/{db}/indexes/{name}`, `GET /dbs/{db}/indexes`,
//!   `POST /dbs/{db}/indexes/{name}/reset`
//! - `POST /dbs/{db}/queries` with `{"query", "params"?, "wait_for_non_stale_ms"?}`
//!
//! A query answer carries an `ETag` made of the query, its parameters, the
//! database's last etag and the index's; `If-None-Match` with it gives 304 without
//! running the query while none of them changed.

use crate::error::{ApiError, ErrorCode};
use crate::http_util::{blocking, json_response, json_value, read_body, ApiPath};
use crate::query_params::NoParams;
use crate::state::SharedState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_docs::{DocError, IndexDefinition, IndexField, IndexInfo, QueryOptions, ReduceSpec};
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// The body of `PUT /indexes/{name}`: fields as paths, or as objects with
/// `case_insensitive`; or, for a reduce index, `group_by` (fields likewise) and
/// `aggregate` (output name -> `count()`, `sum(path)`, `avg(path)`, `min(path)`,
/// `max(path)`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexBody {
    #[serde(default)]
    collection: Option<String>,
    #[serde(default)]
    fields: Vec<FieldSpec>,
    #[serde(default)]
    group_by: Vec<FieldSpec>,
    #[serde(default)]
    aggregate: std::collections::BTreeMap<String, String>,
}

fn index_fields(specs: Vec<FieldSpec>) -> Vec<IndexField> {
    specs
        .into_iter()
        .map(|f| match f {
            FieldSpec::Path(path) => IndexField {
                path,
                case_insensitive: false,
                ..Default::default()
            },
            FieldSpec::Full(f) => f,
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FieldSpec {
    Path(String),
    Full(IndexField),
}

fn bad_json(e: serde_json::Error) -> ApiError {
    ApiError::new(ErrorCode::InvalidIndex, format!("index definition: {e}"))
}

pub fn info_json(i: &IndexInfo) -> Value {
    let mut v = json!({
        "name": i.definition.name,
        "collection": i.definition.collection,
        "fields": i.definition.fields,
        "auto": i.definition.auto,
        "last_indexed_etag": i.last_indexed_etag.map(|e| e.to_string()),
        "database_etag": i.database_etag.map(|e| e.to_string()),
        "docs_behind": i.docs_behind,
        "stale": i.stale,
        "entries": i.entries,
        "errors": i.errors,
        "error_samples": i.error_samples,
        "batch_size": i.batch_size,
        "docs_per_sec": (i.docs_per_sec * 10.0).round() / 10.0,
    });
    if let Some(r) = &i.definition.reduce {
        // A reduce index: its `entries` are its groups.
        v["group_by"] = json!(r.group_by);
        v["aggregate"] = json!(r.aggregate);
    }
    if i.definition.is_search() {
        // Where the full-text index resumed when the database opened (after a
        // restore: the commit its backup carried); null: built from the start.
        v["opened_at_etag"] = json!(i.opened_at_etag.map(|e| e.to_string()));
    }
    v
}

pub async fn put_index(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, name)): ApiPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let bytes = read_body(&headers, body, &state.limits).await?;
    let b: IndexBody = serde_json::from_slice(&bytes).map_err(bad_json)?;
    let reduce = (!b.group_by.is_empty() || !b.aggregate.is_empty()).then(|| ReduceSpec {
        group_by: index_fields(b.group_by),
        aggregate: b.aggregate,
    });
    let def = IndexDefinition {
        name,
        collection: b.collection,
        fields: index_fields(b.fields),
        auto: false,
        reduce,
    };
    let created = if state.cluster.is_some() {
        // Checked here first (a bad definition never reaches the log).
        def.check()?;
        let created = crate::routes::cluster::define_index(&state, &db, def.clone()).await?;
        (
            created,
            blocking(move || database.index_info(&def.name)).await?,
        )
    } else {
        blocking(move || {
            let created = database.define_index(def.clone())?;
            Ok((created, database.index_info(&def.name)?))
        })
        .await?
    };
    let status = if created.0 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_value(status, info_json(&created.1)))
}

pub async fn get_index(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, name)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let info = blocking(move || database.index_info(&name)).await?;
    Ok(json_value(StatusCode::OK, info_json(&info)))
}

pub async fn delete_index(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, name)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    if state.cluster.is_some() {
        crate::routes::cluster::delete_index(&state, &db, &name).await?;
    } else {
        let n = name.clone();
        blocking(move || database.delete_index(&n)).await?;
    }
    Ok(json_value(StatusCode::OK, json!({"deleted": name})))
}

pub async fn reset_index(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, name)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let info = blocking(move || {
        database.reset_index(&name)?;
        database.index_info(&name)
    })
    .await?;
    Ok(json_value(StatusCode::OK, info_json(&info)))
}

pub async fn list_indexes(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let infos = blocking(move || database.indexes()).await?;
    Ok(json_value(
        StatusCode::OK,
        json!({"indexes": infos.iter().map(info_json).collect::<Vec<_>>()}),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueryBody {
    query: String,
    #[serde(default)]
    params: Map<String, Value>,
    #[serde(default)]
    wait_for_non_stale_ms: u64,
    /// The `continuation` of the previous page.
    #[serde(default)]
    continuation: Option<String>,
}

fn tag_matches(headers: &HeaderMap, tag: &str) -> bool {
    headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',').map(str::trim).any(|t| {
                let t = t.strip_prefix("W/").unwrap_or(t);
                t.trim_matches('"') == tag
            })
        })
}

fn with_etag(mut resp: Response, tag: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(&format!("\"{tag}\"")) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// What a query did, on its span (traces and the slow-request log): the index
/// it used (a collection scan without one, an auto index it created) and its cost.
fn record_plan(span: &tracing::Span, r: &kiln_docs::QueryResult) {
    if span.is_disabled() {
        return;
    }
    let plan = match (&r.index, &r.auto_index_created) {
        (Some(index), _) => format!("index {index}{}", if r.stale { " (stale)" } else { "" }),
        (None, Some(auto)) => format!("collection scan (auto index {auto} created for the next)"),
        (None, None) => "collection scan".to_string(),
    };
    span.record("plan", plan.as_str());
    span.record("total", r.total);
    span.record("entries_read", r.entries_read);
    span.record("documents_loaded", r.documents_loaded);
}

pub async fn run_query(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let bytes = read_body(&headers, body, &state.limits).await?;
    let b: QueryBody = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::new(ErrorCode::InvalidQuery, format!("query body: {e}")))?;
    let conditional = headers.contains_key(header::IF_NONE_MATCH);
    let answer = blocking(move || {
        let span = tracing::info_span!(
            "kiln.query",
            database = %database.name(),
            query = %b.query,
            plan = tracing::field::Empty,
            total = tracing::field::Empty,
            entries_read = tracing::field::Empty,
            documents_loaded = tracing::field::Empty,
        );
        let _entered = span.enter();
        if conditional && b.continuation.is_none() {
            let tag = database.query_fingerprint(&b.query, &b.params)?;
            if tag_matches(&headers, &tag) {
                return Ok(Err(tag));
            }
        }
        let r = database.query_page(
            &b.query,
            &b.params,
            QueryOptions {
                wait_for_non_stale_ms: b.wait_for_non_stale_ms,
            },
            b.continuation.as_deref(),
        )?;
        record_plan(&span, &r);
        let tag = database.query_result_fingerprint(&b.query, &b.params, &r);
        Ok::<_, DocError>(Ok((r, tag)))
    })
    .await?;
    let (r, tag) = match answer {
        Err(tag) => return Ok(with_etag(StatusCode::NOT_MODIFIED.into_response(), &tag)),
        Ok(x) => x,
    };
    Ok(with_etag(
        json_response(StatusCode::OK, page_json(&r)),
        &tag,
    ))
}

/// A query's page as the answer's JSON body.
fn page_json(r: &kiln_docs::QueryResult) -> Vec<u8> {
    // The documents are already JSON text: spliced in, not parsed again.
    let mut out = Vec::with_capacity(r.results.iter().map(|d| d.len() + 1).sum::<usize>() + 256);
    out.extend_from_slice(b"{\"results\":[");
    for (i, d) in r.results.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(d);
    }
    out.extend_from_slice(b"],");
    let rest = json!({
        "total": r.total,
        "skipped": r.skipped,
        "stale": r.stale,
        "index": r.index,
        "index_etag": r.index_etag.map(|e| e.to_string()),
        "database_etag": r.database_etag.map(|e| e.to_string()),
        "auto_index_created": r.auto_index_created,
        "entries_read": r.entries_read,
        "documents_loaded": r.documents_loaded,
        "continuation": r.continuation,
        "duration_ms": (r.duration_ms * 1000.0).round() / 1000.0,
    })
    .to_string();
    out.extend_from_slice(&rest.as_bytes()[1..]);
    out
}
