//! Attachments: `PUT/GET/HEAD/DELETE /dbs/{db}/docs/{id}/attachments/{name}` and
//! `POST /dbs/{db}/attachments` (bytes staged for a batch). Bodies stream both ways
//! through a blocking thread and a small channel: a large file never sits in memory.
//!
//! The document route takes every path under `/dbs/{db}/docs/`; its handlers are
//! these dispatchers, which send a path whose id has an `/attachments/{name}` tail
//! here (`attachment_target`) and any other to `routes/docs.rs`. So a document
//! whose id contains `/attachments/` cannot be read or written by its URL.
//!
//! A plain blob's file is sent as it is (`file_body::send_file`: `O_DIRECT`, hashed
//! as it goes); an encrypted database's sealed blob is decrypted chunk by chunk as
//! it is sent (`send_sealed`), ranges included.
//!
//! In a cluster, an upload and a delete go through the log (`routes/cluster.rs`:
//! the bytes in chunks, then the attachment's entry); reads (an attachment, the
//! blob list, a blob) are served by the node asked, from its own copy. Staging
//! for a batch goes through the log too, staged and expired at the leader's time.

use crate::error::{ApiError, ErrorCode};
use crate::file_body::send_file;
use crate::http_util::{
    attachment_cap, attachment_too_large, blocking, body_read_failed, etag_header, write_condition,
};
use crate::routes::cluster;
use crate::routes::docs as routes_docs;
use crate::state::{AppState, SharedState};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use kiln_docs::DocumentError;
use kiln_docs::{AttachmentInfo, Database, PutOutcome, StagedBlob};
use serde_json::json;
use std::sync::Arc;

/// Chunks between the connection and the file's thread: at most this many are in
/// flight, so memory stays flat whatever the file's size.
const CHANNEL_CHUNKS: usize = 8;

/// `(db, id, name)` of an attachment path (`/dbs/{db}/docs/{id}/attachments/{name}`),
/// percent-decoded; `None` for any other path. The last `/attachments/` splits.
pub(crate) fn attachment_target(path: &str) -> Option<(String, String, String)> {
    let (db, rest) = path.strip_prefix("/dbs/")?.split_once("/docs/")?;
    let (id, name) = rest.rsplit_once("/attachments/")?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|c| c.into_owned())
    };
    Some((decode(db)?, decode(id)?, decode(name)?))
}

fn bad_path(path: &str) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidPath,
        format!("{path:?}: an attachment path is /dbs/{{db}}/docs/{{id}}/attachments/{{name}} with UTF-8 percent-encoding"),
    )
}

/// The document route's GET (and HEAD): an attachment, or a document.
pub async fn get(State(state): State<SharedState>, req: Request) -> Response {
    match req.uri().path().contains("/attachments/") {
        true => get_attachment(state, req).await.into_response(),
        false => Handler::<_, SharedState>::call(routes_docs::get_document, req, state).await,
    }
}

pub async fn put(State(state): State<SharedState>, req: Request) -> Response {
    match req.uri().path().contains("/attachments/") {
        true => put_attachment(state, req).await.into_response(),
        false => Handler::<_, SharedState>::call(routes_docs::put_document, req, state).await,
    }
}

/// The document route's POST: an attachment takes none (405, with what it takes).
pub async fn post(State(state): State<SharedState>, req: Request) -> Response {
    match req.uri().path().contains("/attachments/") {
        true => not_allowed_on_attachment(),
        false => Handler::<_, SharedState>::call(routes_docs::post_document, req, state).await,
    }
}

/// The document route's PATCH: an attachment is replaced whole (PUT), not patched.
pub async fn patch(State(state): State<SharedState>, req: Request) -> Response {
    match req.uri().path().contains("/attachments/") {
        true => not_allowed_on_attachment(),
        false => Handler::<_, SharedState>::call(routes_docs::patch_document, req, state).await,
    }
}

pub(crate) fn not_allowed_on_attachment() -> Response {
    let mut resp = ApiError::new(
        ErrorCode::MethodNotAllowed,
        "an attachment takes GET, HEAD, PUT and DELETE",
    )
    .into_response();
    resp.headers_mut().insert(
        axum::http::header::ALLOW,
        axum::http::HeaderValue::from_static("GET, HEAD, PUT, DELETE"),
    );
    resp
}

pub async fn delete(State(state): State<SharedState>, req: Request) -> Response {
    match req.uri().path().contains("/attachments/") {
        true => delete_attachment(state, req).await.into_response(),
        false => Handler::<_, SharedState>::call(routes_docs::delete_document, req, state).await,
    }
}

/// The path's database, id and name, checked.
fn target(state: &AppState, req: &Request) -> Result<(Arc<Database>, String, String), ApiError> {
    let path = req.uri().path();
    let (db, id, name) = attachment_target(path).ok_or_else(|| bad_path(path))?;
    kiln_docs::validate_attachment_name(&name)?;
    Ok((state.store.database(&db)?, id, name))
}

/// Streams a request body into a blob writer on a blocking thread: hashed,
/// counted and fsynced there, never held whole. A body passing `cap` (413) stops
/// the upload; its temporary file is removed.
async fn receive(
    state: &AppState,
    database: Arc<Database>,
    body: Body,
    cap: Option<u64>,
) -> Result<StagedBlob, ApiError> {
    let mut writer = database.attachment_writer()?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
    let file_thread = tokio::task::spawn_blocking(move || {
        while let Some(chunk) = rx.blocking_recv() {
            writer.write(&chunk)?;
        }
        Ok::<_, kiln_docs::DocError>(writer)
    });
    let mut stream = body.into_data_stream();
    let mut failed = None;
    let mut received_bytes = 0u64;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => {
                received_bytes += bytes.len() as u64;
                if cap.is_some_and(|c| received_bytes > c) {
                    failed = Some(attachment_too_large(None, &state.limits));
                    break;
                }
                if tx.send(bytes).await.is_err() {
                    break; // The file thread failed: its error is below.
                }
            }
            Err(e) => {
                failed = Some(body_read_failed(e));
                break;
            }
        }
    }
    drop(tx);
    let writer = match file_thread.await {
        Ok(r) => r?,
        Err(e) => {
            return Err(ApiError::new(
                ErrorCode::InternalError,
                format!("the upload's worker failed: {e}"),
            ))
        }
    };
    if let Some(e) = failed {
        return Err(e); // Dropping the writer removes its temporary file.
    }
    blocking(move || writer.finish()).await
}

fn content_type(headers: &HeaderMap) -> Result<String, ApiError> {
    let ct = match headers.get(header::CONTENT_TYPE) {
        None => "application/octet-stream",
        Some(v) => v.to_str().map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidHeader,
                "Content-Type must be visible ASCII",
            )
        })?,
    };
    Ok(ct.to_string())
}

async fn put_attachment(state: SharedState, req: Request) -> Result<Response, ApiError> {
    let (database, id, name) = target(&state, &req)?;
    let (parts, body) = req.into_parts();
    let cap = attachment_cap(&parts.headers, &state.limits)?;
    let condition = write_condition(&parts.headers)?;
    let content_type = content_type(&parts.headers)?;
    kiln_docs::validate_attachment_name(&name)?;
    // The document must exist before the bytes are read (an If-Match is checked
    // again in the write's transaction).
    if database.get_with(&id, |_| ())?.is_none() {
        return Err(kiln_docs::DocError::Document(DocumentError::NotFound { id }).into());
    }
    if state.cluster.is_some() {
        // Through the log (this node leads: `front_door` sent a follower's
        // request to the leader).
        let target = (id, name, content_type);
        let (out, info) =
            cluster::put_attachment(&state, database.name(), target, &condition, body, cap).await?;
        return Ok(written(StatusCode::CREATED, &out, Some(&info)));
    }
    let staged = receive(&state, database.clone(), body, cap).await?;
    let (hash, size) = (staged.hash_hex(), staged.size_bytes);
    let db = database.clone();
    let (id2, name2, ct2) = (id.clone(), name.clone(), content_type.clone());
    let out = blocking(move || db.put_attachment(&id2, &name2, &ct2, staged, condition)).await?;
    let info = AttachmentInfo {
        name,
        hash,
        size_bytes: size,
        content_type,
    };
    Ok(written(StatusCode::CREATED, &out, Some(&info)))
}

/// The answer to an attachment write: the document's new etag (for the next
/// `If-Match`) and the attachment's entry.
fn written(status: StatusCode, out: &PutOutcome, info: Option<&AttachmentInfo>) -> Response {
    let mut body = json!({"id": out.id, "etag": out.etag.to_string()});
    if let Some(a) = info {
        body["attachment"] = json!({
            "name": a.name, "hash": a.hash, "size": a.size_bytes, "content_type": a.content_type,
        });
    }
    let mut resp = crate::http_util::json_response(status, body.to_string());
    resp.headers_mut()
        .insert(header::ETAG, etag_header(out.etag));
    resp
}

async fn delete_attachment(state: SharedState, req: Request) -> Result<Response, ApiError> {
    let (database, id, name) = target(&state, &req)?;
    let condition = write_condition(req.headers())?;
    if state.cluster.is_some() {
        let out = cluster::delete_attachment(&state, database.name(), id, name, &condition).await?;
        return Ok(written(StatusCode::OK, &out, None));
    }
    let out = blocking(move || database.delete_attachment(&id, &name, condition)).await?;
    Ok(written(StatusCode::OK, &out, None))
}

/// `POST /dbs/{db}/attachments`: bytes kept for an hour for a batch to name by
/// hash in a document's `@metadata.@attachments`.
pub async fn stage(
    State(state): State<SharedState>,
    axum::extract::Path(db): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let cap = attachment_cap(&headers, &state.limits)?;
    let database = state.store.database(&db)?;
    let (hash, size) = if state.cluster.is_some() {
        // Through the log, staged at the leader's time; it expires at the
        // leader's time too, by the log (`uploads::expire` in kiln-cluster).
        cluster::stage_attachment(&state, database.name(), body, cap).await?
    } else {
        let staged = receive(&state, database.clone(), body, cap).await?;
        blocking(move || database.stage_attachment(staged)).await?
    };
    let body = json!({"hash": hash, "size": size, "staged_for_ms": kiln_docs::STAGED_TTL_MS});
    Ok(crate::http_util::json_response(
        StatusCode::CREATED,
        body.to_string(),
    ))
}

/// `GET /dbs/{db}/attachments`: every blob the database holds (hash and size),
/// for `kiln backup` to copy.
pub async fn list_blobs(
    State(state): State<SharedState>,
    axum::extract::Path(db): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let blobs = blocking(move || database.attachment_blobs()).await?;
    let blobs: Vec<_> = blobs
        .into_iter()
        .map(|(hash, size, refs)| json!({"hash": hash, "size": size, "refs": refs}))
        .collect();
    Ok(crate::http_util::json_response(
        StatusCode::OK,
        json!({ "blobs": blobs }).to_string(),
    ))
}

/// `GET /dbs/{db}/attachments/{hash}`: a blob's bytes by hash, streamed and
/// checked as they go (for `kiln backup`).
pub async fn get_blob(
    State(state): State<SharedState>,
    axum::extract::Path((db, hash)): axum::extract::Path<(String, String)>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let hash2 = hash.clone();
    let opened = blocking(move || match database.open_attachment_blob(&hash2) {
        Ok(b) => Ok(Some(b)),
        Err(kiln_docs::DocError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    })
    .await?;
    let Some(blob) = opened else {
        return Err(ApiError::new(
            ErrorCode::AttachmentNotFound,
            format!("the database holds no attachment bytes with hash {hash}"),
        ));
    };
    let len = blob.len();
    let etag = format!("\"{hash}\"");
    let body = match blob.into_plain_file() {
        Ok(file) => send_file(file, 0, len, Some(hash)),
        Err(sealed) => send_sealed(sealed, 0, len),
    };
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len)
        .header(header::ETAG, etag)
        .body(body)
        .expect("a valid response"))
}

/// Plaintext bytes per chunk of a sealed blob's body (a few of its sealed chunks).
const SEALED_SEND_BYTES: usize = 256 << 10;

/// A body of `len` plaintext bytes of a sealed blob from `start`, decrypted by a
/// blocking thread as it goes, at most `CHANNEL_CHUNKS` chunks in flight. Not
/// hashed: every sealed chunk authenticates as it is opened, and the blob's last
/// chunk binds its hash (opened when the blob was). A chunk that does not is
/// logged and ends the body with an error (the status was sent: the client sees
/// a short body). The plaintext of a chunk is wiped once the connection has
/// written it.
fn send_sealed(mut blob: kiln_docs::BlobReader, start: u64, len: u64) -> Body {
    use std::io::{Read, Seek, SeekFrom};
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(CHANNEL_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let sent = (|| {
            blob.seek(SeekFrom::Start(start))?;
            let mut left = len;
            while left > 0 {
                let n = left.min(SEALED_SEND_BYTES as u64) as usize;
                let mut chunk = Wiped(vec![0u8; n]);
                blob.read_exact(&mut chunk.0)?;
                left -= n as u64;
                if tx.blocking_send(Ok(Bytes::from_owner(chunk))).is_err() {
                    break; // The client went away.
                }
            }
            Ok::<_, std::io::Error>(())
        })();
        if let Err(e) = sent {
            tracing::error!(file = %blob.path().display(), error = %e,
                "attachment: a sealed blob could not be read; connection cut (run kiln check)");
            let _ = tx.blocking_send(Err(e));
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Body::from_stream(stream)
}

/// Plaintext handed to the connection, overwritten when it is done with it.
struct Wiped(Vec<u8>);

impl AsRef<[u8]> for Wiped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Wiped {
    fn drop(&mut self) {
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

/// A single byte range of a `size`-byte body: `Ok(None)` for the whole body (no
/// Range, several ranges, or one this server does not parse: RFC 9110 lets a
/// server ignore Range), `Err` for an unsatisfiable one.
fn byte_range(headers: &HeaderMap, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("bytes="))
    else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let num = |s: &str| s.trim().parse::<u64>().ok();
    let (start, end) = match (a.trim().is_empty(), num(a), num(b)) {
        // bytes=-n: the last n bytes.
        (true, _, Some(n)) if n > 0 => (size.saturating_sub(n), size.saturating_sub(1)),
        (true, _, Some(_)) => return Err(()),
        (false, Some(start), None) if b.trim().is_empty() => (start, size.saturating_sub(1)),
        (false, Some(start), Some(end)) if end >= start => (start, end.min(size.saturating_sub(1))),
        _ => return Ok(None),
    };
    if start >= size {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// Whether a `Range` may be served as a range (RFC 9110 §13.1.5): no `If-Range`,
/// or one naming the attachment as it is now, a strong entity-tag equal to its
/// hash. A weak tag never matches, and neither does a date: an attachment has no
/// `Last-Modified` (its ETag, the SHA-256 of its bytes, is its only validator).
/// When this is false the whole attachment is sent, with 200.
fn if_range_holds(headers: &HeaderMap, hash: &str) -> bool {
    let Some(value) = headers.get(header::IF_RANGE) else {
        return true;
    };
    value
        .to_str()
        .ok()
        .map(str::trim)
        .and_then(|v| v.strip_prefix('"'))
        .and_then(|v| v.strip_suffix('"'))
        .is_some_and(|tag| tag == hash)
}

fn none_match(headers: &HeaderMap, hash: &str) -> bool {
    headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',').map(str::trim).any(|tag| {
                let tag = tag.strip_prefix("W/").unwrap_or(tag);
                tag == "*" || tag.trim_matches('"') == hash
            })
        })
}

async fn get_attachment(state: SharedState, req: Request) -> Result<Response, ApiError> {
    let (database, id, name) = target(&state, &req)?;
    let head = req.method() == Method::HEAD;
    let headers = req.headers();
    let reader = blocking(move || database.open_attachment(&id, &name)).await?;
    let info = reader.info;
    let size = info.size_bytes;
    let etag = HeaderValue::from_str(&format!("\"{}\"", info.hash)).expect("hex is ASCII");
    let mut builder = Response::builder()
        .header(header::ETAG, etag)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CACHE_CONTROL, "no-cache");
    if none_match(headers, &info.hash) {
        return Ok(builder
            .status(StatusCode::NOT_MODIFIED)
            .body(Body::empty())
            .expect("a valid response"));
    }
    // A failed If-Range means "send it all": the Range is then ignored, even an
    // unsatisfiable one.
    let ranged = if if_range_holds(headers, &info.hash) {
        byte_range(headers, size)
    } else {
        Ok(None)
    };
    let range = match ranged {
        Ok(r) => r,
        Err(()) => {
            let mut e = ApiError::new(
                ErrorCode::RangeNotSatisfiable,
                format!("the range is outside the attachment's {size} bytes"),
            )
            .into_response();
            let cr = HeaderValue::from_str(&format!("bytes */{size}")).expect("ASCII");
            e.headers_mut().insert(header::CONTENT_RANGE, cr);
            return Ok(e);
        }
    };
    let (status, start, len) = match range {
        Some((a, b)) => {
            let cr = format!("bytes {a}-{b}/{size}");
            builder = builder.header(header::CONTENT_RANGE, cr);
            (StatusCode::PARTIAL_CONTENT, a, b - a + 1)
        }
        None => (StatusCode::OK, 0, size),
    };
    let ct = HeaderValue::from_str(&info.content_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let builder = builder
        .status(status)
        .header(header::CONTENT_TYPE, ct)
        .header(header::CONTENT_LENGTH, len);
    if head {
        return Ok(builder.body(Body::empty()).expect("a valid response"));
    }
    // A whole plain body is checked against its hash as it goes; a range cannot
    // be. A sealed one authenticates chunk by chunk (`send_sealed`).
    let verify = range.is_none().then_some(info.hash);
    let body = match reader.file.into_plain_file() {
        Ok(file) => send_file(file, start, len, verify),
        Err(sealed) => send_sealed(sealed, start, len),
    };
    Ok(builder.body(body).expect("a valid response"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(v: &str, size: u64) -> Result<Option<(u64, u64)>, ()> {
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, HeaderValue::from_str(v).unwrap());
        byte_range(&h, size)
    }

    #[test]
    fn ranges() {
        assert_eq!(range("bytes=0-9", 100), Ok(Some((0, 9))));
        assert_eq!(range("bytes=90-", 100), Ok(Some((90, 99))));
        assert_eq!(range("bytes=-10", 100), Ok(Some((90, 99))));
        assert_eq!(range("bytes=-200", 100), Ok(Some((0, 99))));
        assert_eq!(range("bytes=50-500", 100), Ok(Some((50, 99))));
        assert_eq!(range("bytes=100-", 100), Err(()));
        assert_eq!(range("bytes=-0", 100), Err(()));
        assert_eq!(range("bytes=0-1,5-6", 100), Ok(None));
        assert_eq!(range("bytes=5-1", 100), Ok(None));
        assert_eq!(range("items=0-1", 100), Ok(None));
        assert_eq!(range("bytes=0-0", 0), Err(()));
    }

    #[test]
    fn if_range_needs_the_strong_current_etag() {
        let holds = |v: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = v {
                h.insert(header::IF_RANGE, HeaderValue::from_str(v).unwrap());
            }
            if_range_holds(&h, "ab12")
        };
        assert!(holds(None));
        assert!(holds(Some("\"ab12\"")));
        assert!(!holds(Some("\"ff00\"")));
        assert!(!holds(Some("W/\"ab12\"")));
        assert!(!holds(Some("ab12")));
        assert!(!holds(Some("Wed, 21 Oct 2015 07:28:00 GMT")));
    }

    #[test]
    fn targets() {
        assert_eq!(
            attachment_target("/dbs/d/docs/users/1/attachments/a%20b.txt"),
            Some(("d".into(), "users/1".into(), "a b.txt".into()))
        );
        assert_eq!(attachment_target("/dbs/d/docs/users/1"), None);
    }
}
