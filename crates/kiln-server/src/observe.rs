//! What every request passes on its way out, through either HTTP path (the
//! router's middleware in `app.rs` and the own HTTP/1.1 loop in `http1/`): its
//! request id (the client's `X-Request-Id`, or one made here) echoed in the answer
//! and added to an error's JSON body, its count and latency in the metrics, and its
//! access-log line. One definition, so that the two paths cannot drift apart.

use crate::metrics::Metrics;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// A request id the client sends is kept when it is 1..=128 bytes of these (what
/// common proxies and tracers put there: UUIDs, hex, base64, dotted trace ids);
/// anything else is replaced, so that a log line or a JSON body never carries
/// bytes a reader would have to escape.
const MAX_PRESENTED_ID_BYTES: usize = 128;

fn id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(&b)
}

/// The id of one request. A made one is kept inline: the own loop makes one per
/// request, and an allocation there is measurable under W9.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestId {
    Made([u8; 16]),
    Given(Box<str>),
}

impl RequestId {
    /// The client's id if it is a usable one, else a new one.
    pub fn from_presented(presented: Option<&[u8]>) -> RequestId {
        match presented {
            Some(v)
                if !v.is_empty()
                    && v.len() <= MAX_PRESENTED_ID_BYTES
                    && v.iter().all(|&b| id_byte(b)) =>
            {
                // All ASCII, checked just above.
                RequestId::Given(String::from_utf8_lossy(v).into())
            }
            _ => RequestId::new(),
        }
    }

    /// A new id: unique within the process (a counter) and unlikely to repeat
    /// across restarts (a random start), 16 hex digits.
    pub fn new() -> RequestId {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let start = *START.get_or_init(rand::random::<u64>);
        let n = NEXT.fetch_add(1, Relaxed);
        let value = start.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut hex = [0u8; 16];
        for (i, digit) in hex.iter_mut().enumerate() {
            let nibble = (value >> (60 - 4 * i)) & 0xf;
            *digit = b"0123456789abcdef"[nibble as usize];
        }
        RequestId::Made(hex)
    }

    pub fn as_str(&self) -> &str {
        match self {
            // Hex digits: always UTF-8.
            RequestId::Made(hex) => std::str::from_utf8(hex).unwrap_or_default(),
            RequestId::Given(id) => id,
        }
    }
}

/// The API key (its id, never its secret) a request was let in with.
#[derive(Clone, Debug)]
pub struct KeyId(pub String);

/// `--access-log`: a line per request, as text or as JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessLog {
    Off,
    Text,
    Json,
}

/// One answered request, as the metrics and the access log see it.
pub struct Exchange<'a> {
    /// The route template (`/dbs/{db}/docs/{*id}`): the metrics' label.
    pub route: &'a str,
    pub method: &'a str,
    /// The path as requested (the access log's).
    pub path: &'a str,
    pub status: u16,
    /// The answer's body bytes, when known before it is sent (not for a stream).
    pub bytes: Option<u64>,
    pub elapsed: Duration,
    pub request_id: &'a RequestId,
    pub key_id: Option<&'a str>,
}

/// Counts the request and writes its access-log line (`log`, as configured).
pub fn finished(metrics: &Metrics, log: AccessLog, x: &Exchange<'_>) {
    metrics.record_request(x.route, x.method, x.status, x.elapsed);
    match log {
        AccessLog::Off => {}
        AccessLog::Text => {
            let bytes = x.bytes.map_or_else(|| "-".to_string(), |b| b.to_string());
            tracing::info!(
                target: "kiln::access",
                "{} {} {} {}B {}us id={} key={}",
                x.method,
                x.path,
                x.status,
                bytes,
                x.elapsed.as_micros(),
                x.request_id.as_str(),
                x.key_id.unwrap_or("-")
            );
        }
        AccessLog::Json => {
            tracing::info!(
                target: "kiln::access",
                method = x.method,
                path = x.path,
                status = x.status,
                bytes = x.bytes,
                micros = x.elapsed.as_micros() as u64,
                request_id = x.request_id.as_str(),
                key_id = x.key_id,
                "request"
            );
        }
    }
}

/// An error's JSON body (`{"error": ..., "message": ...}`) with `"request_id"`
/// added at its end; `None` when `body` is not a JSON object.
pub fn error_body_with_id(body: &[u8], id: &RequestId) -> Option<Vec<u8>> {
    let trimmed = body.trim_ascii_end();
    let inner = trimmed.strip_suffix(b"}")?;
    if !body.starts_with(b"{") {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() + 40);
    out.extend_from_slice(inner);
    if inner.trim_ascii() != b"{" {
        out.push(b',');
    }
    // The id holds only bytes that need no escaping (see `id_byte`).
    out.extend_from_slice(b"\"request_id\":\"");
    out.extend_from_slice(id.as_str().as_bytes());
    out.extend_from_slice(b"\"}");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_presented_id_is_kept_only_when_it_is_safe_to_log() {
        let kept = RequestId::from_presented(Some(b"abc-123.trace:9"));
        assert_eq!(kept.as_str(), "abc-123.trace:9");
        for bad in [
            &b""[..],
            b"has space",
            b"quote\"",
            b"back\\slash",
            &[b'a'; 129],
        ] {
            let made = RequestId::from_presented(Some(bad));
            assert_eq!(made.as_str().len(), 16, "{bad:?} replaced by a new id");
        }
        assert_ne!(RequestId::new(), RequestId::new());
    }

    #[test]
    fn the_id_is_added_to_an_error_body() {
        let id = RequestId::from_presented(Some(b"r1"));
        let body = br#"{"error":"conflict","message":"no"}"#;
        let with = error_body_with_id(body, &id).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&with).unwrap();
        assert_eq!(v["error"], "conflict");
        assert_eq!(v["request_id"], "r1");
        let v: serde_json::Value =
            serde_json::from_slice(&error_body_with_id(b"{}", &id).unwrap()).unwrap();
        assert_eq!(v["request_id"], "r1");
        assert_eq!(error_body_with_id(b"not json", &id), None);
        assert_eq!(error_body_with_id(b"[1]", &id), None);
    }
}
