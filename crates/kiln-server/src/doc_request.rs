//! One document's GET, PUT, POST or PATCH, defined once for both HTTP paths: the
//! router (`routes/docs.rs`) and the connection's own HTTP/1.1 loop (`http1/`)
//! each turn their request into the same calls here and render the same
//! [`DocAnswer`]; neither restates a check, a header or an order.
//!
//! A request goes through these steps, in this order, on either path:
//! 1. admission (`app::admit`: the key or the client certificate);
//! 2. for a write, [`check_write`], before any of the body is read: a POST to a
//!    whole id (405), a PATCH's media type (415), the preconditions (`If-Match`,
//!    `If-None-Match`), the database (404), the declared body size (413);
//! 3. the body, read by the transport within the same limits;
//! 4. [`read`] (a GET) or [`write`] (in a cluster, through the leader's log);
//! 5. the answer: [`DocAnswer`]'s status, headers and body, which each path writes
//!    in its own framing (the loop adds only what hyper adds: `content-length`,
//!    `date`, `connection`).

use crate::error::{ApiError, ErrorCode};
use crate::http_util::{blocking, encode_path, write_condition, HeaderLookup};
use crate::state::AppState;
use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_docs::DocumentError;
use kiln_docs::{
    BatchOutcome, Condition, Database, DocId, DocumentView, Etag, PutOutcome, WriteOp,
};
use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt::Display;
use std::sync::Arc;

/// A body up to this size is parsed where it arrived; a larger one on a blocking
/// thread. A connection thread serves many connections: a 16 MiB document parsed
/// inline would hold all of them up for tens of milliseconds.
pub(crate) const INLINE_PARSE_BYTES: usize = 64 << 10;

/// How many times the leader merges a patch again when another write to the
/// document came between its read and its log entry.
const CLUSTER_PATCH_ATTEMPTS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocMethod {
    Get,
    Put,
    /// A write to a prefix ending in `/`: a new document with a generated id.
    Post,
    /// A JSON merge patch (YCSB's updates: as hot as a PUT).
    Patch,
}

impl DocMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            DocMethod::Get => "GET",
            DocMethod::Put => "PUT",
            DocMethod::Post => "POST",
            DocMethod::Patch => "PATCH",
        }
    }

    pub fn from_name(name: &str) -> Option<DocMethod> {
        Some(match name {
            "GET" => DocMethod::Get,
            "PUT" => DocMethod::Put,
            "POST" => DocMethod::Post,
            "PATCH" => DocMethod::Patch,
            _ => return None,
        })
    }
}

/// `(db, id)` of a document path either path serves as a document request: one
/// with nothing to percent-decode, a database name and a non-empty id that does not
/// name an attachment (`routes/attachments.rs` serves those).
pub(crate) fn document_target(path: &str) -> Option<(&str, &str)> {
    let (db, id) = path.strip_prefix("/dbs/")?.split_once("/docs/")?;
    if db.is_empty()
        || db.contains('/')
        || id.is_empty()
        || path.contains('%')
        || id.contains("/attachments/")
    {
        return None;
    }
    Some((db, id))
}

/// A write that passed every check made before its body is read.
pub(crate) struct WriteReady {
    pub method: DocMethod,
    pub condition: Condition,
    pub database: Arc<Database>,
}

/// Step 2: the checks of a PUT, POST or PATCH before its body is read, in the
/// order every path makes them. `declared_bytes` is the body's Content-Length.
pub(crate) fn check_write(
    state: &AppState,
    method: DocMethod,
    db: &str,
    id: &str,
    headers: &impl HeaderLookup,
    declared_bytes: Option<u64>,
) -> Result<WriteReady, ApiError> {
    if method == DocMethod::Post && !id.ends_with('/') {
        return Err(post_to_whole_id(db, id));
    }
    if method == DocMethod::Patch {
        check_merge_patch_type(headers)?;
    }
    let condition = write_condition(headers)?;
    let database = state.store.database(db)?;
    let limits = &state.limits;
    if let Some(n) = declared_bytes.filter(|n| *n > limits.max_body_bytes as u64) {
        return Err(crate::http_util::body_too_large(Some(n), limits));
    }
    Ok(WriteReady {
        method,
        condition,
        database,
    })
}

/// POST to a whole id is refused: it would silently overwrite what PUT is for
/// (and what a retried POST must never do).
fn post_to_whole_id(db: &str, id: &str) -> ApiError {
    let mut e = ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!(
            "POST creates a document with a generated id under a prefix ending in \"/\" \
             (POST /dbs/{db}/docs/{}/); to write the document {id:?} itself, use PUT",
            id.rsplit_once('/').map_or("prefix", |(p, _)| p)
        ),
    );
    e.allow = Some("GET, PUT, PATCH, DELETE");
    e
}

/// A PATCH body is read as a JSON merge patch whatever its Content-Type says (as
/// a PUT's body is read as JSON: `curl -d` sends form-urlencoded), except a JSON
/// Patch (RFC 6902, `application/json-patch+json`): another patch format, refused
/// with 415 rather than misread.
fn check_merge_patch_type(headers: &impl HeaderLookup) -> Result<(), ApiError> {
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

/// Step 4 of a GET: the document `id` of `db`, borrowed from the read snapshot
/// while `render` makes the answer of it (304 when the request's `conditions`
/// name its etag in If-None-Match, or, without one, have an If-Modified-Since no
/// older than its Last-Modified), or why there is none.
pub(crate) fn read<R>(
    state: &AppState,
    db: &str,
    id: &str,
    conditions: &impl HeaderLookup,
    render: impl FnOnce(DocAnswer<'_>) -> R,
) -> Result<R, ApiError> {
    let database = state.store.database(db)?;
    // A read is a snapshot lookup in the memory map (`read_offload.rs` says where
    // it runs).
    database
        .get_with(id, |doc| {
            let not_modified = crate::http_util::none_match_hits(conditions, doc.etag)
                || crate::http_util::unmodified_since(conditions, doc.last_modified_ms);
            render(DocAnswer::Document { doc, not_modified })
        })?
        .ok_or_else(|| {
            ApiError::from(kiln_docs::DocError::Document(DocumentError::NotFound {
                id: id.to_string(),
            }))
        })
}

/// Step 4 of a write: the body parsed and written to `id` (a new id under it for a
/// POST or a PUT to a prefix ending in `/`) durably; `key_id` is the API key
/// making the write, if known.
pub(crate) async fn write(
    state: &AppState,
    ready: WriteReady,
    id: String,
    body: &[u8],
    key_id: Option<String>,
) -> Result<PutOutcome, ApiError> {
    let WriteReady {
        method,
        condition,
        database,
    } = ready;
    match method {
        DocMethod::Patch => patch(state, database, id, body, condition, key_id).await,
        _ => put(state, database, id, body, condition, key_id).await,
    }
}

/// Parses `body` as the document and writes it to `id` (a new id under it when it
/// ends in `/`), durably: a PUT, a POST, and a revision's revert.
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
        let op = logged_put(id, body, &condition)?.attributed(key_id);
        return put_outcome(crate::routes::cluster::write_one(state, database.name(), op).await?);
    }
    let op = WriteOp::Put {
        id: target,
        document,
        condition,
    }
    .attributed(key_id);
    put_outcome(crate::routes::write(state, database, op).await?)
}

/// A document's put as a cluster's log carries it: its id and its JSON text.
fn logged_put(
    id: String,
    json: &[u8],
    condition: &Condition,
) -> Result<kiln_cluster::LoggedOp, ApiError> {
    let json = String::from_utf8(json.to_vec())
        .map_err(|_| ApiError::new(ErrorCode::MalformedJson, "the document is not UTF-8"))?;
    Ok(kiln_cluster::LoggedOp::Put {
        id,
        json,
        condition: kiln_cluster::LoggedCondition::from_condition(condition),
    })
}

/// Parses `body` as a merge patch (RFC 7396) and applies it to `id`, read and
/// written in one transaction (`kiln_docs::WriteOp::Patch`): 404 when the
/// document does not exist.
async fn patch(
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
    put_outcome(crate::routes::write(state, database, op).await?)
}

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
        let current = database.get(&id)?.ok_or_else(|| {
            kiln_docs::DocError::Document(DocumentError::NotFound { id: id.clone() })
        })?;
        let conflict = |why: String| {
            kiln_docs::DocError::Document(DocumentError::Conflict {
                id: id.clone(),
                current: Some(current.etag),
                why,
            })
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
        let op = logged_put(id.clone(), &body, &read)?.attributed(key_id.clone());
        match crate::routes::cluster::write_one(state, database.name(), op).await {
            Ok(outcome) => return put_outcome(outcome),
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

fn put_outcome(outcome: BatchOutcome) -> Result<PutOutcome, ApiError> {
    match outcome {
        BatchOutcome::Put(out) => Ok(out),
        BatchOutcome::Delete(_) => Err(ApiError::new(
            ErrorCode::InternalError,
            "a write came back with another kind of outcome",
        )),
    }
}

/// Step 5: a document request's answer, before either path writes it.
pub(crate) enum DocAnswer<'a> {
    /// A GET: the document (its JSON borrowed from the read snapshot), or 304.
    Document {
        doc: DocumentView<'a>,
        not_modified: bool,
    },
    /// A PUT, POST or PATCH that was written.
    Written {
        db: &'a str,
        outcome: &'a PutOutcome,
    },
}

impl DocAnswer<'_> {
    pub fn status(&self) -> StatusCode {
        match self {
            DocAnswer::Document {
                not_modified: true, ..
            } => StatusCode::NOT_MODIFIED,
            DocAnswer::Document { .. } => StatusCode::OK,
            DocAnswer::Written { outcome, .. } if outcome.created => StatusCode::CREATED,
            DocAnswer::Written { .. } => StatusCode::OK,
        }
    }

    /// Every header of the answer but the framing ones, in the order sent.
    pub fn headers(&self, mut header: impl FnMut(HeaderName, HeaderText<'_>)) {
        match self {
            DocAnswer::Document { doc, not_modified } => {
                if !not_modified {
                    header(header::CONTENT_TYPE, HeaderText::Static("application/json"));
                }
                header(header::ETAG, HeaderText::Etag(doc.etag));
                header(
                    header::LAST_MODIFIED,
                    HeaderText::Date(last_modified_date(doc.last_modified_ms)),
                );
                header(header::CACHE_CONTROL, HeaderText::Static("no-cache"));
            }
            DocAnswer::Written { db, outcome } => {
                header(header::CONTENT_TYPE, HeaderText::Static("application/json"));
                header(header::ETAG, HeaderText::Etag(outcome.etag));
                if outcome.created {
                    header(header::LOCATION, HeaderText::Location(db, &outcome.id));
                }
            }
        }
    }

    /// The body: the stored JSON as it is, a write's `PutAnswer`, none for a 304.
    pub fn body(&self) -> Option<Cow<'_, [u8]>> {
        match self {
            DocAnswer::Document {
                not_modified: true, ..
            } => None,
            DocAnswer::Document { doc, .. } => Some(Cow::Borrowed(doc.json)),
            DocAnswer::Written { outcome, .. } => Some(Cow::Owned(put_answer_json(outcome))),
        }
    }

    /// The answer as the router sends it.
    pub fn to_response(&self) -> Response {
        let mut resp = match self.body() {
            None => self.status().into_response(),
            Some(body) => (self.status(), Body::from(body.into_owned())).into_response(),
        };
        let h = resp.headers_mut();
        self.headers(|name, value| {
            let value = match value {
                HeaderText::Static(text) => HeaderValue::from_static(text),
                other => match HeaderValue::from_str(&other.to_string()) {
                    Ok(v) => v,
                    Err(_) => return,
                },
            };
            h.insert(name, value);
        });
        resp
    }
}

/// A header's value in an answer, written as text by either path (the own loop
/// copies a static one as it is and formats the others in place).
pub(crate) enum HeaderText<'a> {
    Static(&'static str),
    /// An etag, in quotes.
    Etag(Etag),
    Date(httpdate::HttpDate),
    /// The path of a document a write created: its database, its id.
    Location(&'a str, &'a str),
}

impl Display for HeaderText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderText::Static(text) => f.write_str(text),
            HeaderText::Etag(etag) => write!(f, "\"{etag}\""),
            HeaderText::Date(date) => write!(f, "{date}"),
            HeaderText::Location(db, id) => write!(f, "/dbs/{db}/docs/{}", encode_path(id)),
        }
    }
}

/// `Last-Modified` of a document written at `doc_ms`.
fn last_modified_date(doc_ms: u64) -> httpdate::HttpDate {
    (std::time::UNIX_EPOCH + std::time::Duration::from_millis(doc_ms)).into()
}

/// The answer to a document's PUT or POST (and, with `op`, a put's result in a
/// batch).
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

/// A batch's put result: `PutAnswer` as a JSON value.
pub(crate) fn put_json(out: &PutOutcome) -> Value {
    serde_json::to_value(PutAnswer::from(out)).expect("a PutAnswer serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_target_is_a_plain_document_path() {
        assert_eq!(
            document_target("/dbs/bench/docs/users/1"),
            Some(("bench", "users/1"))
        );
        assert_eq!(document_target("/dbs/b/docs/users/"), Some(("b", "users/")));
        assert_eq!(
            document_target("/dbs/b/docs/a/docs/c"),
            Some(("b", "a/docs/c"))
        );
        // Left to the router: percent-encoding, other routes, and paths the route
        // template would not match as such.
        assert_eq!(document_target("/dbs/b/docs/a%20b"), None);
        assert_eq!(document_target("/dbs/b/docs"), None);
        assert_eq!(document_target("/dbs/b/docs/"), None);
        assert_eq!(document_target("/dbs//docs/x"), None);
        assert_eq!(document_target("/dbs/a/b/docs/x"), None);
        assert_eq!(document_target("/dbs/b/collections"), None);
        assert_eq!(document_target("/dbs/b/docs/a/attachments/x"), None);
    }

    fn outcome(created: bool) -> PutOutcome {
        PutOutcome {
            id: "users/a b".into(),
            etag: Etag {
                incarnation: 0x9f3a_1c2b,
                sequence: 42,
            },
            collection: Some("users".into()),
            last_modified_ms: 0,
            created,
        }
    }

    /// The router's rendering of an answer has the status, headers and body the
    /// answer says (the own loop's is checked in `http1/answer.rs`).
    #[test]
    fn a_written_answer_renders_as_a_response() {
        let created = outcome(true);
        let answer = DocAnswer::Written {
            db: "shop",
            outcome: &created,
        };
        let resp = answer.to_response();
        assert_eq!(resp.status(), StatusCode::CREATED);
        let h = resp.headers();
        assert_eq!(h[header::ETAG], crate::http_util::etag_header(created.etag));
        assert_eq!(h[header::LOCATION], "/dbs/shop/docs/users/a%20b");
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        let replaced = outcome(false);
        let answer = DocAnswer::Written {
            db: "shop",
            outcome: &replaced,
        };
        assert_eq!(answer.status(), StatusCode::OK);
        assert!(!answer
            .to_response()
            .headers()
            .contains_key(header::LOCATION));
    }

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

    fn headers_of(answer: &DocAnswer<'_>) -> Vec<(String, String)> {
        let mut out = Vec::new();
        answer.headers(|name, value| out.push((name.to_string(), value.to_string())));
        out
    }

    /// A GET's answer: the stored JSON with its etag, its write time to the second
    /// and `no-cache`; the 304 the same headers but the content type, and no body.
    #[test]
    fn a_document_answer_and_its_304() {
        let view = || DocumentView {
            etag: Etag {
                incarnation: 0x9f3a_1c2b,
                sequence: 42,
            },
            last_modified_ms: 1_764_198_023_379,
            collection: Some("users"),
            json: br#"{"a":1}"#,
        };
        let fresh = DocAnswer::Document {
            doc: view(),
            not_modified: false,
        };
        let validators = [
            ("etag", "\"42-9f3a1c2b\""),
            ("last-modified", "Wed, 26 Nov 2025 23:00:23 GMT"),
            ("cache-control", "no-cache"),
        ];
        let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(fresh.status(), StatusCode::OK);
        let mut expected = owned(&[("content-type", "application/json")]);
        expected.extend(owned(&validators));
        assert_eq!(headers_of(&fresh), expected);
        assert_eq!(fresh.body().as_deref(), Some(&br#"{"a":1}"#[..]));

        let not_modified = DocAnswer::Document {
            doc: view(),
            not_modified: true,
        };
        assert_eq!(not_modified.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(headers_of(&not_modified), owned(&validators));
        assert!(not_modified.body().is_none());
        // The router's rendering: the same, and an empty body.
        let resp = not_modified.to_response();
        assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
        assert!(!resp.headers().contains_key(header::CONTENT_TYPE));
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-cache");
        assert_eq!(
            resp.headers()[header::LAST_MODIFIED],
            "Wed, 26 Nov 2025 23:00:23 GMT"
        );
    }

    /// A POST to a whole id: 405, naming the methods the id takes and the prefix
    /// a POST would go to.
    #[test]
    fn a_post_to_a_whole_id_is_refused_with_what_the_id_takes() {
        let e = post_to_whole_id("shop", "users/1");
        assert_eq!(e.code, ErrorCode::MethodNotAllowed);
        assert_eq!(e.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(e.allow, Some("GET, PUT, PATCH, DELETE"));
        assert!(
            e.message.contains("POST /dbs/shop/docs/users/")
                && e.message.contains("\"users/1\"")
                && e.message.contains("use PUT"),
            "{}",
            e.message
        );
    }

    /// A PATCH body is a merge patch whatever its type says, but a JSON Patch.
    #[test]
    fn only_a_json_patch_is_refused_as_a_patch_type() {
        let with = |content_type: Option<&'static str>| {
            let mut h = axum::http::HeaderMap::new();
            if let Some(v) = content_type {
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            }
            check_merge_patch_type(&h)
        };
        for fine in [
            None,
            Some("application/merge-patch+json"),
            Some("application/json"),
            Some("application/x-www-form-urlencoded"),
            Some("text/plain"),
        ] {
            assert!(with(fine).is_ok(), "{fine:?}");
        }
        for refused in [
            "application/json-patch+json",
            "Application/JSON-Patch+JSON; charset=utf-8",
            " application/json-patch+json ;q=1",
        ] {
            let e = with(Some(refused)).unwrap_err();
            assert_eq!(e.code, ErrorCode::UnsupportedMediaType, "{refused}");
            assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        }
    }
}
