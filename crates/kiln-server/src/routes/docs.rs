//! Documents: get/head/put/post/delete, listings, collections and batches.

use crate::doc_request::{self, put_json, DocAnswer, DocMethod, INLINE_PARSE_BYTES};
use crate::error::{ApiError, ErrorCode};
use crate::http_util::{
    blocking, condition_from_if_match, encode_path, encode_query_value, json_response, json_value,
    link_next, read_body, write_condition, ApiPath, RequestKey,
};
use crate::query_params::{NoParams, Params};
use crate::routes::page_size;
use crate::state::SharedState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use kiln_docs::{BatchOp, BatchOutcome, Condition, DocId, Document, Page, WriteOp};
use serde::Deserialize;
use serde_json::{json, Value};

/// A document's GET (`doc_request::read`), on the connection's thread or, while
/// reads wait on the disk, on the blocking pool (`read_offload.rs`).
pub async fn get_document(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let render = |answer: DocAnswer<'_>| answer.to_response();
    if state.read_offload.now() {
        let shared = state.clone();
        crate::read_offload::offloaded(move || {
            doc_request::read(&shared, &db, &id, &headers, render)
        })
        .await
        .map_err(crate::read_offload::unfinished)?
    } else {
        crate::read_offload::watched(|| doc_request::read(&state, &db, &id, &headers, render))
    }
}

/// POST to a prefix ending in `/` (`users/`) creates a document with a new id
/// under it (`doc_request::check_write` refuses one to a whole id).
pub async fn post_document(
    params: NoParams,
    state: State<SharedState>,
    path: ApiPath<(String, String)>,
    key: RequestKey,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    write_document(params, state, path, key, headers, body, DocMethod::Post).await
}

/// PUT to an id writes it; PUT or POST to an id ending in `/` (`users/`) creates a
/// document with a new id under that prefix.
pub async fn put_document(
    params: NoParams,
    state: State<SharedState>,
    path: ApiPath<(String, String)>,
    key: RequestKey,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    write_document(params, state, path, key, headers, body, DocMethod::Put).await
}

/// `PATCH` of a document with a JSON merge patch (RFC 7396): answers like PUT.
pub async fn patch_document(
    params: NoParams,
    state: State<SharedState>,
    path: ApiPath<(String, String)>,
    key: RequestKey,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    write_document(params, state, path, key, headers, body, DocMethod::Patch).await
}

/// A document's PUT, POST or PATCH through the router: `doc_request`'s steps.
async fn write_document(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
    key: RequestKey,
    headers: HeaderMap,
    body: Body,
    method: DocMethod,
) -> Result<Response, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let ready = doc_request::check_write(&state, method, &db, &id, &headers, declared)?;
    let bytes = read_body(&headers, body, &state.limits).await?;
    let outcome = doc_request::write(&state, ready, id, &bytes, key.id()).await?;
    Ok(DocAnswer::Written {
        db: &db,
        outcome: &outcome,
    }
    .to_response())
}

fn mismatched_outcome() -> ApiError {
    ApiError::new(
        ErrorCode::InternalError,
        "a write came back with another kind of outcome",
    )
}

pub async fn delete_document(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
    key: RequestKey,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let condition = write_condition(&headers)?;
    let database = state.store.database(&db)?;
    let written = if state.cluster.is_some() {
        let op = crate::routes::cluster::logged_delete(id, &condition).attributed(key.id());
        crate::routes::cluster::write_one(&state, &db, op).await?
    } else {
        let op = WriteOp::Delete { id, condition }.attributed(key.id());
        crate::routes::write(&state, database, op).await?
    };
    let out = match written {
        BatchOutcome::Delete(out) => out,
        BatchOutcome::Put(_) => return Err(mismatched_outcome()),
    };
    Ok(json_value(
        StatusCode::OK,
        json!({"id": out.id, "deleted_etag": out.etag.to_string(), "etag": out.tombstone_etag.to_string()}),
    ))
}

/// A batch's operation as a cluster's log carries it.
fn logged_batch_op(op: &BatchOp) -> kiln_cluster::LoggedOp {
    use kiln_cluster::{LoggedCondition, LoggedOp};
    match op {
        BatchOp::Put {
            id,
            document,
            condition,
        } => LoggedOp::Put {
            id: match id {
                DocId::Given(id) => id.clone(),
                DocId::Generate { prefix } => prefix.clone(),
            },
            json: document.to_string(),
            condition: LoggedCondition::from_condition(condition),
        },
        BatchOp::Delete { id, condition } => LoggedOp::Delete {
            id: id.clone(),
            condition: LoggedCondition::from_condition(condition),
        },
    }
}

#[derive(Deserialize)]
pub struct PrefixQuery {
    #[serde(default)]
    prefix: String,
    start_after: Option<String>,
    page_size: Option<usize>,
}

pub async fn list_by_prefix(
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    Params(q): Params<PrefixQuery>,
) -> Result<Response, ApiError> {
    let limit = page_size(&state, q.page_size)?;
    let database = state.store.database(&db)?;
    let prefix = q.prefix.clone();
    let page =
        blocking(move || database.list_by_prefix(&q.prefix, q.start_after.as_deref(), limit))
            .await?;
    let next = page.next.as_ref().map(|after| {
        format!(
            "/dbs/{}/docs?prefix={}&start_after={}&page_size={limit}",
            encode_path(&db),
            encode_query_value(&prefix),
            encode_query_value(after)
        )
    });
    Ok(page_response(page, next.as_deref()))
}

#[derive(Deserialize)]
pub struct CollectionQuery {
    /// The etag to continue after (the `next` of the previous page).
    after: Option<String>,
    page_size: Option<usize>,
}

pub async fn list_collection(
    State(state): State<SharedState>,
    ApiPath((db, collection)): ApiPath<(String, String)>,
    Params(q): Params<CollectionQuery>,
) -> Result<Response, ApiError> {
    let limit = page_size(&state, q.page_size)?;
    let database = state.store.database(&db)?;
    let name = collection.clone();
    let page =
        blocking(move || database.list_collection(&collection, q.after.as_deref(), limit)).await?;
    let next = page.next.as_ref().map(|after| {
        format!(
            "/dbs/{}/collections/{}/docs?after={}&page_size={limit}",
            encode_path(&db),
            encode_query_value(&name),
            encode_query_value(after)
        )
    });
    Ok(page_response(page, next.as_deref()))
}

/// `{"results": [<documents as stored>], "next": ...}`, written without re-parsing
/// the stored JSON, with a `Link` to `next_target` when there is a next page.
fn page_response(page: Page<Document>, next_target: Option<&str>) -> Response {
    let size: usize = page.items.iter().map(|d| d.json.len() + 1).sum();
    let mut out = Vec::with_capacity(size + 64);
    out.extend_from_slice(b"{\"results\":[");
    for (i, d) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&d.json);
    }
    out.extend_from_slice(b"],\"next\":");
    out.extend_from_slice(
        serde_json::to_string(&page.next)
            .expect("an Option<String> serializes")
            .as_bytes(),
    );
    out.push(b'}');
    let mut resp = json_response(StatusCode::OK, out);
    if let Some(target) = next_target {
        link_next(&mut resp, target);
    }
    resp
}

pub async fn collections(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let list = database.collections()?;
    let items: Vec<Value> = list
        .iter()
        .map(|c| json!({"name": c.name, "documents": c.documents}))
        .collect();
    Ok(json_value(StatusCode::OK, json!({"collections": items})))
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum BatchOpJson {
    Put {
        id: String,
        document: Value,
        if_match: Option<String>,
        #[serde(default)]
        create_only: bool,
    },
    Delete {
        id: String,
        if_match: Option<String>,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchJson {
    ops: Vec<BatchOpJson>,
}

/// `POST /dbs/{db}/batch` with `{"ops": [...]}`: one transaction, all or nothing.
pub async fn batch(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    key: RequestKey,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let bytes = read_body(&headers, body, &state.limits).await?;
    let ops = batch_ops(parse_batch(bytes).await?.ops)?;
    let outcomes = if state.cluster.is_some() {
        let logged = ops
            .iter()
            .map(|op| logged_batch_op(op).attributed(key.id()))
            .collect();
        crate::routes::cluster::write(&state, &db, logged, true)
            .await?
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
    } else {
        blocking(move || database.batch_as(ops, key.id())).await?
    };
    let results: Vec<Value> = outcomes.iter().map(batch_result).collect();
    Ok(json_value(StatusCode::OK, json!({"results": results})))
}

/// A batch's body, parsed off the async workers when it is large.
async fn parse_batch(bytes: axum::body::Bytes) -> Result<BatchJson, ApiError> {
    let inline = bytes.len() <= INLINE_PARSE_BYTES;
    let parse = move || {
        serde_json::from_slice::<BatchJson>(&bytes)
            .map_err(|e| kiln_docs::DocError::malformed_json(&e))
    };
    Ok(if inline {
        parse()?
    } else {
        blocking(parse).await?
    })
}

/// A batch's operations as the store takes them (an id ending in `/` is a prefix
/// to generate one under).
fn batch_ops(parsed: Vec<BatchOpJson>) -> Result<Vec<BatchOp>, ApiError> {
    let mut ops = Vec::with_capacity(parsed.len());
    for op in parsed {
        ops.push(match op {
            BatchOpJson::Put {
                id,
                document,
                if_match,
                create_only,
            } => BatchOp::Put {
                id: if id.ends_with('/') {
                    DocId::Generate { prefix: id }
                } else {
                    DocId::Given(id)
                },
                document,
                condition: batch_condition(if_match, create_only)?,
            },
            BatchOpJson::Delete { id, if_match } => BatchOp::Delete {
                id,
                condition: batch_condition(if_match, false)?,
            },
        });
    }
    Ok(ops)
}

/// A batch operation's condition: its `if_match` or `create_only`, not both.
fn batch_condition(if_match: Option<String>, create_only: bool) -> Result<Condition, ApiError> {
    match (if_match, create_only) {
        (Some(_), true) => Err(ApiError::new(
            ErrorCode::InvalidPrecondition,
            "an operation may have if_match or create_only, not both",
        )),
        (Some(m), false) => condition_from_if_match(&m),
        (None, true) => Ok(Condition::IfNotExists),
        (None, false) => Ok(Condition::None),
    }
}

/// One operation's entry in a batch's `results`.
fn batch_result(outcome: &BatchOutcome) -> Value {
    match outcome {
        BatchOutcome::Put(p) => {
            let mut v = put_json(p);
            v["op"] = "put".into();
            v
        }
        BatchOutcome::Delete(d) => {
            json!({"op": "delete", "id": d.id, "deleted_etag": d.etag.to_string(), "etag": d.tombstone_etag.to_string()})
        }
    }
}
