//! HTTP details shared by the handlers: reading a body within the limits, the
//! etag headers, JSON answers.

use crate::config::Limits;
use crate::error::{ApiError, ErrorCode};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use kiln_docs::{Condition, DocError, Etag};
use std::time::Duration;

/// Path parameters, with a bad one (e.g. percent-encoding that is not UTF-8) answered
/// as a JSON error like every other.
pub struct ApiPath<T>(pub T);

impl<S, T> axum::extract::FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(t)| ApiPath(t))
            .map_err(|e| ApiError::new(ErrorCode::InvalidPath, e.body_text()))
    }
}

/// The API key a request was let in with (`app::authenticate` puts it in the
/// request's extensions): its id is kept with the revisions a write makes. None
/// without authentication, or when a client certificate let the request in.
pub struct RequestKey(pub Option<crate::observe::KeyId>);

impl RequestKey {
    pub fn id(&self) -> Option<String> {
        self.0.as_ref().map(|k| k.0.clone())
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for RequestKey {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(RequestKey(
            parts.extensions.get::<crate::observe::KeyId>().cloned(),
        ))
    }
}

/// Header access the request logic needs, over hyper's `HeaderMap` and over the
/// raw headers that the connection's own HTTP/1.1 parser (`http1/`) leaves in its
/// buffer, so that both paths answer the same headers the same way.
pub trait HeaderLookup {
    /// The first value of the header `name` (given in lowercase), as sent.
    fn first(&self, name: &str) -> Option<&[u8]>;
}

impl HeaderLookup for HeaderMap {
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(HeaderValue::as_bytes)
    }
}

/// 413 for a body over `max_body_bytes`; `len` is its Content-Length, `None` for
/// a chunked body that passed the limit as it came.
pub fn body_too_large(len: Option<u64>, limits: &Limits) -> ApiError {
    let max = limits.max_body_bytes;
    let message = match len {
        Some(n) => format!("request body of {n} bytes exceeds the limit of {max} bytes"),
        None => format!(
            "request body exceeds the limit of {max} bytes (more than {max} bytes came, chunked)"
        ),
    };
    ApiError::new(ErrorCode::BodyTooLarge, message)
}

/// 413 for an attachment upload over `Limits::max_attachment_bytes`; `len` is
/// its Content-Length, or `None` when the streamed body passed the cap.
pub fn attachment_too_large(len: Option<u64>, limits: &Limits) -> ApiError {
    let what = match len {
        Some(n) => format!("an attachment of {n} bytes (its Content-Length)"),
        None => "the attachment's body".to_string(),
    };
    ApiError::new(
        ErrorCode::AttachmentTooLarge,
        format!(
            "{what} exceeds the server's limit of {} bytes per attachment (kiln serve \
             --max-attachment-bytes); nothing was stored",
            limits.max_attachment_bytes
        ),
    )
}

/// The cap on an attachment upload (`None`: uncapped), refusing one whose
/// Content-Length is over it before its body is read.
pub fn attachment_cap(headers: &HeaderMap, limits: &Limits) -> Result<Option<u64>, ApiError> {
    let cap = limits.max_attachment_bytes;
    if cap == 0 {
        return Ok(None);
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(len) if len > cap => Err(attachment_too_large(Some(len), limits)),
        _ => Ok(Some(cap)),
    }
}

/// 408 for a body that did not arrive within `request_read_timeout_ms`.
pub fn body_timed_out(limits: &Limits) -> ApiError {
    ApiError::new(
        ErrorCode::RequestTimeout,
        format!(
            "the request body did not arrive within {} ms",
            limits.request_read_timeout_ms
        ),
    )
}

/// 400 for a body that ended early or could not be read.
pub fn body_read_failed(why: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        ErrorCode::BodyReadFailed,
        format!("could not read the request body: {why}"),
    )
}

/// Reads the whole body, refusing more than `max_body_bytes` (413) and giving up
/// after `request_read_timeout_ms` (408). Nothing is written before this returns,
/// so a client that disconnects mid-body changes nothing.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limits: &Limits,
) -> Result<Bytes, ApiError> {
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limits.max_body_bytes as u64 {
            return Err(body_too_large(Some(len), limits));
        }
    }
    let limited = http_body_util::Limited::new(body, limits.max_body_bytes);
    let timeout = Duration::from_millis(limits.request_read_timeout_ms);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(body_timed_out(limits)),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(body_too_large(None, limits))
        }
        Ok(Err(e)) => Err(body_read_failed(e)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// The condition a write's `If-Match` / `If-None-Match` headers express.
pub fn write_condition(headers: &impl HeaderLookup) -> Result<Condition, ApiError> {
    let if_match = header_str(headers, "if-match")?;
    let if_none_match = header_str(headers, "if-none-match")?;
    match (if_match, if_none_match) {
        (Some(_), Some(_)) => Err(ApiError::new(
            ErrorCode::InvalidPrecondition,
            "send either If-Match or If-None-Match, not both",
        )),
        (Some(m), None) => condition_from_if_match(m),
        (None, Some("*")) => Ok(Condition::IfNotExists),
        (None, Some(_)) => Err(ApiError::new(
            ErrorCode::InvalidPrecondition,
            "on a write, If-None-Match may only be \"*\" (create only)",
        )),
        (None, None) => Ok(Condition::None),
    }
}

/// `*` or one strong etag (quoted or not).
pub fn condition_from_if_match(value: &str) -> Result<Condition, ApiError> {
    let v = value.trim();
    if v == "*" {
        return Ok(Condition::IfExists);
    }
    if v.starts_with("W/") {
        return Err(ApiError::new(
            ErrorCode::InvalidEtag,
            "If-Match needs a strong etag; weak etags never match",
        ));
    }
    if v.contains(',') {
        return Err(ApiError::new(
            ErrorCode::InvalidEtag,
            "If-Match takes a single etag",
        ));
    }
    let bare = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v);
    Ok(Condition::IfMatch(
        Etag::parse(bare).map_err(ApiError::from)?,
    ))
}

/// Whether `If-None-Match` names this etag (weak comparison, lists and `*` allowed).
pub fn none_match_hits(headers: &impl HeaderLookup, etag: Etag) -> bool {
    let Some(v) = headers.first("if-none-match").and_then(visible_ascii) else {
        return false;
    };
    let want = etag.to_string();
    v.split(',').map(str::trim).any(|tag| {
        let tag = tag.strip_prefix("W/").unwrap_or(tag);
        tag == "*" || tag.trim_matches('"') == want
    })
}

/// Whether `If-Modified-Since` says the client's copy of something last modified
/// at `modified_ms` is current (RFC 9110, 13.1.3): only without `If-None-Match`
/// (which takes precedence), only for a valid HTTP date, and never for something
/// without a modification time (0). HTTP dates have whole seconds: a write within
/// the second the client saw counts as not newer, as with any HTTP server.
pub fn unmodified_since(headers: &impl HeaderLookup, modified_ms: u64) -> bool {
    if modified_ms == 0 || headers.first("if-none-match").is_some() {
        return false;
    }
    let Some(since) = headers
        .first("if-modified-since")
        .and_then(visible_ascii)
        .and_then(|v| httpdate::parse_http_date(v.trim()).ok())
    else {
        return false;
    };
    let Ok(since) = since.duration_since(std::time::UNIX_EPOCH) else {
        return false;
    };
    modified_ms / 1000 <= since.as_secs()
}

/// A header value as text, if it is visible ASCII (and tabs), as `HeaderValue::to_str`
/// accepts.
pub fn visible_ascii(v: &[u8]) -> Option<&str> {
    if v.iter().all(|&b| b == b'\t' || (32..127).contains(&b)) {
        std::str::from_utf8(v).ok()
    } else {
        None
    }
}

fn header_str<'h>(headers: &'h impl HeaderLookup, name: &str) -> Result<Option<&'h str>, ApiError> {
    match headers.first(name) {
        None => Ok(None),
        Some(v) => visible_ascii(v)
            .map(|s| Some(s.trim()))
            .ok_or_else(|| ApiError::new(ErrorCode::InvalidHeader, format!("{name} is not ASCII"))),
    }
}

pub fn etag_header(etag: Etag) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{etag}\"")).expect("etags are ASCII")
}

pub fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = (status, body.into()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub fn json_value(status: StatusCode, v: serde_json::Value) -> Response {
    json_response(status, v.to_string())
}

/// What a path keeps as it is: RFC 3986's unreserved characters, and `/` (an id's
/// separator stays readable).
const PATH_KEEPS: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// What a query value keeps as it is: the unreserved characters only.
const QUERY_VALUE_KEEPS: &percent_encoding::AsciiSet = &PATH_KEEPS.add(b'/');

/// Percent-encodes an id for a `Location` header, keeping `/` readable.
pub fn encode_path(id: &str) -> String {
    percent_encoding::utf8_percent_encode(id, PATH_KEEPS).to_string()
}

/// Percent-encodes a query parameter's value.
pub fn encode_query_value(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, QUERY_VALUE_KEEPS).to_string()
}

/// `Link: <target>; rel="next"` (RFC 8288) on a page that has a next one.
pub fn link_next(resp: &mut Response, target: &str) {
    if let Ok(v) = HeaderValue::from_str(&format!("<{target}>; rel=\"next\"")) {
        resp.headers_mut().insert(header::LINK, v);
    }
}

/// Runs a storage call off the async workers (writes wait for a durable commit).
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DocError> + Send + 'static,
) -> Result<T, ApiError> {
    // The request's span (traces on) goes along to the blocking thread.
    let span = tracing::Span::current();
    match tokio::task::spawn_blocking(move || span.in_scope(f)).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            ErrorCode::InternalError,
            format!("the request's worker failed: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn preconditions() {
        let e = Etag {
            incarnation: 1,
            sequence: 7,
        };
        assert_eq!(write_condition(&headers(&[])).unwrap(), Condition::None);
        assert_eq!(
            write_condition(&headers(&[("if-match", "\"7-00000001\"")])).unwrap(),
            Condition::IfMatch(e)
        );
        assert_eq!(
            write_condition(&headers(&[("if-match", "*")])).unwrap(),
            Condition::IfExists
        );
        assert_eq!(
            write_condition(&headers(&[("if-none-match", "*")])).unwrap(),
            Condition::IfNotExists
        );
        assert!(write_condition(&headers(&[("if-match", "W/\"7-00000001\"")])).is_err());
        assert!(write_condition(&headers(&[("if-match", "\"a\", \"b\"")])).is_err());
        assert!(write_condition(&headers(&[("if-match", "garbage")])).is_err());
        assert!(write_condition(&headers(&[("if-none-match", "\"7-00000001\"")])).is_err());
        assert!(none_match_hits(
            &headers(&[("if-none-match", "\"1-00000001\", W/\"7-00000001\"")]),
            e
        ));
        assert!(!none_match_hits(
            &headers(&[("if-none-match", "\"7-00000002\"")]),
            e
        ));
        assert!(none_match_hits(&headers(&[("if-none-match", "*")]), e));
        assert_eq!(encode_path("users/a b?é"), "users/a%20b%3F%C3%A9");
    }
}
