//! Answers written straight into the connection's output buffer: the document
//! GET and PUT answers without building a `Response`, and any other `Response`
//! (errors, refusals) rendered as hyper would send it.

use crate::doc_request::{DocAnswer, HeaderText};
use crate::observe::RequestId;
use axum::http::{header, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;
use std::cell::RefCell;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// What an answer was, for the metrics and the access log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answered {
    pub status: StatusCode,
    pub body_bytes: u64,
}

fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
}

/// `date:` (RFC 9110 wants it on every answer), formatted once a second per thread
/// as hyper does.
fn date_header(out: &mut Vec<u8>) {
    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != second {
            *c = (second, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(c.1.as_bytes());
        out.extend_from_slice(b"\r\n");
    });
}

/// The headers every answer ends with (the request id among them, as the
/// router's `observe` sends it), then the body.
fn finish(
    out: &mut Vec<u8>,
    status: StatusCode,
    id: &RequestId,
    body: Option<&[u8]>,
    close: bool,
) -> Answered {
    out.extend_from_slice(b"x-request-id: ");
    out.extend_from_slice(id.as_str().as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(body) = body {
        let _ = write!(out, "content-length: {}\r\n", body.len());
        // The router's compression layer says an answer this long could have been
        // encoded for another client (caches must keep them apart): so does this.
        if body.len() >= usize::from(crate::cross_origin::COMPRESSION_MIN_BYTES) {
            out.extend_from_slice(b"vary: accept-encoding\r\n");
        }
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    date_header(out);
    out.extend_from_slice(b"\r\n");
    if let Some(body) = body {
        out.extend_from_slice(body);
    }
    Answered {
        status,
        body_bytes: body.map_or(0, |b| b.len() as u64),
    }
}

/// A document request's answer (`doc_request::DocAnswer`: the router renders the
/// same one), with the framing headers hyper would add.
pub fn document(
    out: &mut Vec<u8>,
    answer: &DocAnswer<'_>,
    id: &RequestId,
    close: bool,
) -> Answered {
    let status = answer.status();
    status_line(out, status);
    answer.headers(|name, value| {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        match value {
            HeaderText::Static(text) => out.extend_from_slice(text.as_bytes()),
            other => {
                let _ = write!(out, "{other}");
            }
        }
        out.extend_from_slice(b"\r\n");
    });
    finish(out, status, id, answer.body().as_deref(), close)
}

/// Any other answer (an error, a refusal), with its body read in full: those
/// bodies are small and already in memory. The request id goes in as the
/// router's `observe` puts it (header, and into an error's JSON body).
pub async fn response(out: &mut Vec<u8>, resp: Response, id: &RequestId, close: bool) -> Answered {
    let resp = crate::app::with_request_id(resp, id).await;
    let (parts, body) = resp.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            tracing::warn!(error = %e, "an error answer's body could not be read");
            Default::default()
        }
    };
    status_line(out, parts.status);
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH
            || name == header::CONNECTION
            || name == header::DATE
            || name.as_str() == crate::observe::REQUEST_ID_HEADER
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let no_body = parts.status == StatusCode::NOT_MODIFIED
        || parts.status == StatusCode::NO_CONTENT
        || parts.status.is_informational();
    finish(
        out,
        parts.status,
        id,
        (!no_body).then_some(&body[..]),
        close,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ApiError, ErrorCode};
    use axum::response::IntoResponse;
    use kiln_docs::{Document, DocumentView, Etag};

    fn text(out: &[u8]) -> String {
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn a_document_answer_has_its_headers_and_length() {
        let doc = Document {
            id: "users/1".into(),
            etag: Etag {
                incarnation: 0xa,
                sequence: 3,
            },
            last_modified_ms: 1_700_000_000_000,
            collection: Some("users".into()),
            json: br#"{"name":"Ada"}"#.to_vec(),
        };
        let view = || DocumentView {
            etag: doc.etag,
            last_modified_ms: doc.last_modified_ms,
            collection: doc.collection.as_deref(),
            json: &doc.json,
        };
        let answer = |not_modified| DocAnswer::Document {
            doc: view(),
            not_modified,
        };
        let mut out = Vec::new();
        let id = RequestId::from_presented(Some(b"r-1"));
        assert_eq!(
            document(&mut out, &answer(false), &id, false).status,
            StatusCode::OK
        );
        let t = text(&out);
        assert!(t.starts_with("HTTP/1.1 200 OK\r\n"), "{t}");
        assert!(t.contains(&format!("etag: \"{}\"\r\n", doc.etag)), "{t}");
        assert!(
            t.contains("last-modified: Tue, 14 Nov 2023 22:13:20 GMT\r\n"),
            "{t}"
        );
        assert!(t.contains("content-length: 14\r\n"), "{t}");
        assert!(t.contains("x-request-id: r-1\r\n"), "{t}");
        assert!(!t.contains("connection: close"), "{t}");
        assert!(t.ends_with("\r\n\r\n{\"name\":\"Ada\"}"), "{t}");

        let mut out = Vec::new();
        assert_eq!(
            document(&mut out, &answer(true), &id, true).status,
            StatusCode::NOT_MODIFIED
        );
        let t = text(&out);
        assert!(t.starts_with("HTTP/1.1 304 Not Modified\r\n"), "{t}");
        assert!(!t.contains("content-length"), "{t}");
        assert!(t.contains("connection: close\r\n"), "{t}");
        assert!(t.ends_with("\r\n\r\n"), "{t}");
    }

    #[tokio::test]
    async fn an_error_answer_is_rendered_with_its_body_and_headers() {
        let mut e = ApiError::new(ErrorCode::Conflict, "no");
        e.current_etag = Some(Etag {
            incarnation: 1,
            sequence: 2,
        });
        let id = RequestId::from_presented(Some(b"r-2"));
        let body = String::from_utf8(
            crate::observe::error_body_with_id(e.body_json().as_bytes(), &id).unwrap(),
        )
        .unwrap();
        let mut out = Vec::new();
        let answered = response(&mut out, e.into_response(), &id, false).await;
        assert_eq!(answered.status, StatusCode::CONFLICT);
        assert_eq!(answered.body_bytes, body.len() as u64);
        let t = text(&out);
        assert!(t.starts_with("HTTP/1.1 409 Conflict\r\n"), "{t}");
        assert!(t.contains("content-type: application/json\r\n"), "{t}");
        assert!(t.contains("etag: \"2-"), "{t}");
        assert!(
            t.contains(&format!("content-length: {}\r\n", body.len())),
            "{t}"
        );
        assert!(t.ends_with(&format!("\r\n\r\n{body}")), "{t}");
    }
}
