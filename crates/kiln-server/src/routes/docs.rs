//! Documents: get/head/put/post/delete, listings, collections and batches.

use crate::error::{ApiError, ErrorCode};
use crate::http_util::{
    blocking, condition_from_if_match, encode_path, encode_query_value, etag_header, json_response,
    json_value, link_next, none_match_hits, read_body, write_condition, ApiPath, HeaderLookup,
    RequestKey,
};
use crate::query_params::{NoParams, Params};
use crate::routes::page_size;
use crate::state::{AppState, SharedState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_docs::{
    BatchOp, BatchOutcome, Condition, Database, DocId, Document, Etag, Page, PutOutcome, WriteOp,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

/// A body up to this size is parsed where it arrived; a larger one on a blocking
/// thread. A connection thread serves many connections: a 16 MiB document parsed
/// inline would hold all of them up for tens of milliseconds.
const INLINE_PARSE_BYTES: usize = 64 << 10;

/// `Last-Modified` of a document written at `doc_ms` (shown as text, or written
/// into an answer without a `String`).
pub(crate) fn last_modified_date(doc_ms: u64) -> httpdate::HttpDate {
    (std::time::UNIX_EPOCH + std::time::Duration::from_millis(doc_ms)).into()
}

fn last_modified(doc_ms: u64) -> Option<HeaderValue> {
    HeaderValue::from_str(&last_modified_date(doc_ms).to_string()).ok()
}

/// The document a GET names, or why there is none.
pub(crate) fn lookup(state: &AppState, db: &str, id: &str) -> Result<Document, ApiError> {
    lookup_with(state, db, id, |view| Document::from_view(id, view))
}

/// `lookup`, with the document borrowed from the read snapshot while `read` runs.
pub(crate) fn lookup_with<R>(
    state: &AppState,
    db: &str,
    id: &str,
    read: impl FnOnce(kiln_docs::DocumentView<'_>) -> R,
) -> Result<R, ApiError> {
    let database = state.store.database(db)?;
    // A read is a snapshot lookup in the memory map: no need to leave the worker.
    database
        .get_with(id, read)?
        .ok_or_else(|| ApiError::from(kiln_docs::DocError::DocumentNotFound { id: id.to_string() }))
}

pub async fn get_document(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let doc = if state.read_offload.now() {
        let shared = state.clone();
        crate::read_offload::offloaded(move || lookup(&shared, &db, &id))
            .await
            .map_err(crate::read_offload::unfinished)??
    } else {
        crate::read_offload::watched(|| lookup(&state, &db, &id))?
    };
    let mut resp = if none_match_hits(&headers, doc.etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        json_response(StatusCode::OK, doc.json)
    };
    let h = resp.headers_mut();
    h.insert(header::ETAG, etag_header(doc.etag));
    if let Some(lm) = last_modified(doc.last_modified_ms) {
        h.insert(header::LAST_MODIFIED, lm);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

/// POST to a prefix ending in `/` (`users/`) creates a document with a new id
/// under it. POST to a whole id is refused: it would silently overwrite what PUT
/// is for (and what a retried POST must never do).
pub async fn post_document(
    params: NoParams,
    state: State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
    key: RequestKey,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    if !id.ends_with('/') {
        let mut e = ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!(
                "POST creates a document with a generated id under a prefix ending in \"/\" \
                 (POST /dbs/{db}/docs/{}/); to write the document {id:?} itself, use PUT",
                id.rsplit_once('/').map_or("prefix", |(p, _)| p)
            ),
        );
        e.allow = Some("GET, PUT, PATCH, DELETE");
        return Err(e);
    }
    put_document(params, state, ApiPath((db, id)), key, headers, body).await
}

/// PUT to an id writes it; PUT or POST to an id ending in `/` (`users/`) creates a
/// document with a new id under that prefix.
pub async fn put_document(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
    key: RequestKey,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let condition = write_condition(&headers)?;
    let database = state.store.database(&db)?;
    let bytes = read_body(&headers, body, &state.limits).await?;
    let out = put(&state, database, id, &bytes, condition, key.id()).await?;
    Ok(put_response(&db, &out))
}

/// Parses `body` as the document and writes it to `id` (a new id under it when it
/// ends in `/`), durably; `key_id` is the API key making the write, if known.
pub(crate) async fn put(
    state: &AppState,
    database: Arc<Database>,
    id: String,
    body: &[u8],
    condition: Condition,
    key_id: Option<String>,
) -> Result<PutOutcome, ApiError> {
    let target = if id.ends_with('/') {
        DocId::Generate { prefix: id.clone() }
    } else {
        DocId::Given(id.clone())
    };
    let document = if body.len() <= INLINE_PARSE_BYTES {
        database.parse_document(body)?
    } else {
        let (database, body) = (database.clone(), body.to_vec());
        blocking(move || database.parse_document(&body)).await?
    };
    if state.cluster.is_some() {
        // Checked here (a bad document never reaches the log), applied by every
        // node from its text.
        database.check_id(&target)?;
        let op = crate::routes::cluster::logged_put(id, body, &condition)?.attributed(key_id);
        return match crate::routes::cluster::write_one(state, database.name(), op).await? {
            BatchOutcome::Put(out) => Ok(out),
            BatchOutcome::Delete(_) => Err(mismatched_outcome()),
        };
    }
    let op = WriteOp::Put {
        id: target,
        document,
        condition,
    }
    .attributed(key_id);
    match crate::routes::write(state, database, op).await? {
        BatchOutcome::Put(out) => Ok(out),
        BatchOutcome::Delete(_) => Err(mismatched_outcome()),
    }
}

/// `PATCH` of a document with a JSON merge patch (RFC 7396): the fields it names
/// are merged into the stored document, read and written in one transaction
/// (`kiln_docs::WriteOp::Patch`). Answers like PUT (200, the new etag); 404 when
/// the document does not exist; If-Match as for PUT.
pub async fn patch_document(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath((db, id)): ApiPath<(String, String)>,
    key: RequestKey,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_merge_patch_type(&headers)?;
    let condition = write_condition(&headers)?;
    let database = state.store.database(&db)?;
    let bytes = read_body(&headers, body, &state.limits).await?;
    let out = patch(&state, database, id, &bytes, condition, key.id()).await?;
    Ok(put_response(&db, &out))
}

/// A PATCH body is read as a JSON merge patch whatever its Content-Type says (as
/// a PUT's body is read as JSON: `curl -d` sends form-urlencoded), except a JSON
/// Patch (RFC 6902, `application/json-patch+json`): another patch format, refused
/// with 415 rather than misread.
pub(crate) fn check_merge_patch_type(headers: &impl HeaderLookup) -> Result<(), ApiError> {
    let Some(value) = headers.first("content-type") else {
        return Ok(());
    };
    let text = String::from_utf8_lossy(value);
    let media = text.split(';').next().unwrap_or_default().trim();
    if !media.eq_ignore_ascii_case("application/json-patch+json") {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::UnsupportedMediaType,
        "PATCH takes a JSON merge patch (RFC 7396: Content-Type: \
         application/merge-patch+json), not a JSON Patch (RFC 6902)",
    ))
}

/// Parses `body` as a merge patch and applies it to `id`, durably; `key_id` is the
/// API key making the write, if known.
pub(crate) async fn patch(
    state: &AppState,
    database: Arc<Database>,
    id: String,
    body: &[u8],
    condition: Condition,
    key_id: Option<String>,
) -> Result<PutOutcome, ApiError> {
    let parse = |body: &[u8]| -> Result<Value, kiln_docs::DocError> {
        let patch: Value =
            serde_json::from_slice(body).map_err(|e| kiln_docs::DocError::malformed_json(&e))?;
        kiln_docs::check_document_patch(&patch)?;
        Ok(patch)
    };
    let patch = if body.len() <= INLINE_PARSE_BYTES {
        parse(body)?
    } else {
        let body = body.to_vec();
        blocking(move || parse(&body)).await?
    };
    database.check_id(&DocId::Given(id.clone()))?;
    if state.cluster.is_some() {
        return patch_in_cluster(state, &database, id, &patch, condition, key_id).await;
    }
    let op = WriteOp::Patch {
        id,
        patch,
        condition,
    }
    .attributed(key_id);
    match crate::routes::write(state, database, op).await? {
        BatchOutcome::Put(out) => Ok(out),
        BatchOutcome::Delete(_) => Err(mismatched_outcome()),
    }
}

/// How often the leader merges a patch again when another write to the document
/// came between its read and its log entry.
const CLUSTER_PATCH_ATTEMPTS: usize = 16;

/// A patch in a cluster: every node must apply the same document, so the leader
/// merges (the log carries no patches) and proposes a put of the result with
/// If-Match of the etag it merged into. A write that reached the log in between
/// fails that put instead of being overwritten, and the patch is merged again into
/// the document as it is now; unless the client's own If-Match named the etag,
/// when the conflict is its answer.
async fn patch_in_cluster(
    state: &AppState,
    database: &Database,
    id: String,
    patch: &Value,
    condition: Condition,
    key_id: Option<String>,
) -> Result<PutOutcome, ApiError> {
    for _ in 0..CLUSTER_PATCH_ATTEMPTS {
        let current = database
            .get(&id)?
            .ok_or_else(|| kiln_docs::DocError::DocumentNotFound { id: id.clone() })?;
        let conflict = |why: String| kiln_docs::DocError::Conflict {
            id: id.clone(),
            current: Some(current.etag),
            why,
        };
        match condition {
            Condition::IfMatch(want) if want != current.etag => {
                let why = format!("expected etag {want}, the document has {}", current.etag);
                return Err(conflict(why).into());
            }
            Condition::IfNotExists => {
                let why = format!("the document already exists (etag {})", current.etag);
                return Err(conflict(why).into());
            }
            _ => {}
        }
        let merged = kiln_docs::patch_document(&current.json, &id, patch)?;
        let body = serde_json::to_vec(&merged).map_err(|e| {
            ApiError::new(ErrorCode::InternalError, format!("encoding a patch: {e}"))
        })?;
        // The merged document's checks (size, @metadata) before it reaches the log.
        database.parse_document(&body)?;
        let read = Condition::IfMatch(current.etag);
        let op = crate::routes::cluster::logged_put(id.clone(), &body, &read)?
            .attributed(key_id.clone());
        match crate::routes::cluster::write_one(state, database.name(), op).await {
            Ok(BatchOutcome::Put(out)) => return Ok(out),
            Ok(BatchOutcome::Delete(_)) => return Err(mismatched_outcome()),
            Err(e)
                if e.code == ErrorCode::Conflict && !matches!(condition, Condition::IfMatch(_)) =>
            {
                continue
            }
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::new(
        ErrorCode::Conflict,
        format!(
            "the document {id:?} changed under each of {CLUSTER_PATCH_ATTEMPTS} attempts to \
             merge the patch: retry"
        ),
    ))
}

/// The `Location` of a document a write created.
pub(crate) fn location(db: &str, id: &str) -> String {
    format!("/dbs/{db}/docs/{}", encode_path(id))
}

fn mismatched_outcome() -> ApiError {
    ApiError::new(
        ErrorCode::InternalError,
        "a write came back with another kind of outcome",
    )
}

pub(crate) fn put_response(db: &str, out: &PutOutcome) -> Response {
    let status = if out.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut resp = json_response(status, put_answer_json(out));
    let h = resp.headers_mut();
    h.insert(header::ETAG, etag_header(out.etag));
    if out.created {
        if let Ok(v) = HeaderValue::from_str(&location(db, &out.id)) {
            h.insert(header::LOCATION, v);
        }
    }
    resp
}

/// The answer to a document's PUT or POST, on either HTTP path (and, with `op`,
/// a put's result in a batch).
#[derive(Serialize)]
pub(crate) struct PutAnswer<'a> {
    id: &'a str,
    #[serde(serialize_with = "as_text")]
    etag: Etag,
    collection: Option<&'a str>,
    created: bool,
}

impl<'a> From<&'a PutOutcome> for PutAnswer<'a> {
    fn from(out: &'a PutOutcome) -> Self {
        PutAnswer {
            id: &out.id,
            etag: out.etag,
            collection: out.collection.as_deref(),
            created: out.created,
        }
    }
}

/// An etag as JSON text (`"42-9f3a1c2b"`), written without a `String` first.
fn as_text<S: serde::Serializer>(etag: &Etag, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(etag)
}

/// `PutAnswer`'s JSON (every PUT answers with it), in one buffer sized for it.
pub(crate) fn put_answer_json(out: &PutOutcome) -> Vec<u8> {
    let mut b = Vec::with_capacity(out.id.len() + 96);
    serde_json::to_writer(&mut b, &PutAnswer::from(out)).expect("a PutAnswer serializes");
    b
}

fn put_json(out: &PutOutcome) -> Value {
    serde_json::to_value(PutAnswer::from(out)).expect("a PutAnswer serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PUT answer's bytes, exactly as the hand-written writer before it made
    /// them (the own loop's answer and the router's are this one function's).
    #[test]
    fn the_put_answer_is_its_json_byte_for_byte() {
        for (id, collection, created, expected) in [
            (
                "users/1",
                Some("users"),
                true,
                r#"{"id":"users/1","etag":"42-9f3a1c2b","collection":"users","created":true}"#,
            ),
            (
                "x \"quoted\" \\ é \u{1}",
                None,
                false,
                r#"{"id":"x \"quoted\" \\ é \u0001","etag":"42-9f3a1c2b","collection":null,"created":false}"#,
            ),
            (
                "a/b/",
                Some("a \"b\""),
                false,
                r#"{"id":"a/b/","etag":"42-9f3a1c2b","collection":"a \"b\"","created":false}"#,
            ),
        ] {
            let out = PutOutcome {
                id: id.into(),
                etag: kiln_docs::Etag {
                    incarnation: 0x9f3a_1c2b,
                    sequence: 42,
                },
                collection: collection.map(Into::into),
                last_modified_ms: 0,
                created,
            };
            assert_eq!(String::from_utf8(put_answer_json(&out)).unwrap(), expected);
            // A batch's put result: the same keys in the same order, then its op.
            let mut batch = put_json(&out);
            batch["op"] = "put".into();
            assert_eq!(
                batch.to_string(),
                format!("{},\"op\":\"put\"}}", expected.strip_suffix('}').unwrap())
            );
        }
    }
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
    let inline = bytes.len() <= INLINE_PARSE_BYTES;
    let parse = move || {
        serde_json::from_slice::<BatchJson>(&bytes)
            .map_err(|e| kiln_docs::DocError::malformed_json(&e))
    };
    let parsed = if inline {
        parse()?
    } else {
        blocking(parse).await?
    };
    let cond = |if_match: Option<String>, create_only: bool| -> Result<Condition, ApiError> {
        match (if_match, create_only) {
            (Some(_), true) => Err(ApiError::new(
                ErrorCode::InvalidPrecondition,
                "an operation may have if_match or create_only, not both",
            )),
            (Some(m), false) => condition_from_if_match(&m),
            (None, true) => Ok(Condition::IfNotExists),
            (None, false) => Ok(Condition::None),
        }
    };
    let mut ops = Vec::with_capacity(parsed.ops.len());
    for op in parsed.ops {
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
                condition: cond(if_match, create_only)?,
            },
            BatchOpJson::Delete { id, if_match } => BatchOp::Delete {
                id,
                condition: cond(if_match, false)?,
            },
        });
    }
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
    let results: Vec<Value> = outcomes
        .iter()
        .map(|o| match o {
            BatchOutcome::Put(p) => {
                let mut v = put_json(p);
                v["op"] = "put".into();
                v
            }
            BatchOutcome::Delete(d) => {
                json!({"op": "delete", "id": d.id, "deleted_etag": d.etag.to_string(), "etag": d.tombstone_etag.to_string()})
            }
        })
        .collect();
    Ok(json_value(StatusCode::OK, json!({"results": results})))
}
