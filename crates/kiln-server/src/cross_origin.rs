//! The tower-http layers of the router: CORS (`--cors-origin`) and response
//! compression, built from one [`FrontLayers`]. The own HTTP/1.1 loop asks the
//! same value which requests they could change and hands those to the router
//! (`http1::head`), so that they apply to every answer.

use axum::http::{header, HeaderName, HeaderValue, Method};
use std::time::Duration;
use tower_http::compression::predicate::{NotForContentType, Predicate, SizeAbove};
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};

/// Answers at least this large are compressed (smaller ones gain nothing worth
/// the CPU: a document PUT's answer is ~100 bytes).
pub const COMPRESSION_MIN_BYTES: u16 = 1024;

/// The router's front layers as configured: the router builds them from this,
/// and the own HTTP/1.1 loop derives from it which requests it may answer itself
/// (those no layer would change).
#[derive(Clone, Debug, Default)]
pub struct FrontLayers {
    /// `--cors-origin`: none, no CORS layer.
    pub cors_origins: Vec<String>,
}

impl FrontLayers {
    /// Whether the layers leave an answer to a request without `Origin` or
    /// `Accept-Encoding` as it is. With CORS on, the CORS layer puts headers on
    /// every answer (`Vary`, the exposed headers), not only on a browser's: the
    /// own loop then answers nothing.
    pub fn leave_plain_answers_alone(&self) -> bool {
        self.cors_origins.is_empty()
    }

    /// Whether a request header lets a layer change the answer, which makes the
    /// request the router's: an `Origin` with CORS on, an `Accept-Encoding` that
    /// names an encoding the compression layer uses (a document, or a write's
    /// answer with a long id, may be long enough to compress).
    pub fn header_changes_answer(&self, name: &str, value: &[u8]) -> bool {
        if name.eq_ignore_ascii_case("origin") {
            return !self.cors_origins.is_empty();
        }
        name.eq_ignore_ascii_case("accept-encoding") && !accepts_identity_only(value)
    }
}

/// An `Accept-Encoding` that names no encoding the compression layer would use.
fn accepts_identity_only(value: &[u8]) -> bool {
    value.split(|&b| b == b',').all(|coding| {
        let name = coding
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        name.is_empty() || name.eq_ignore_ascii_case(b"identity")
    })
}

/// CORS for the browser origins given (`*` for any). None given: no CORS headers
/// at all (browsers then refuse cross-origin reads, as before), and `OPTIONS`
/// stays a 405.
///
/// As the Fetch standard has it: a listed origin is echoed (with `Vary: Origin`)
/// and may send credentials (an `Authorization` header); `*` allows any origin but
/// without credentials (browsers refuse `*` together with credentials). The
/// preflight allows the methods and request headers the API takes and is cached
/// for 10 minutes; the answers expose the headers a client reads (ETag above all).
pub fn layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let exposed = [
        header::ETAG,
        header::LOCATION,
        header::LAST_MODIFIED,
        header::RETRY_AFTER,
        header::LINK,
        header::WWW_AUTHENTICATE,
        HeaderName::from_static(crate::observe::REQUEST_ID_HEADER),
    ];
    let cors = CorsLayer::new()
        .allow_methods([
            Method::GET,
            Method::HEAD,
            Method::PUT,
            Method::POST,
            Method::DELETE,
        ])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::IF_MATCH,
            header::IF_NONE_MATCH,
            HeaderName::from_static("x-api-key"),
            HeaderName::from_static(crate::observe::REQUEST_ID_HEADER),
        ])
        .expose_headers(exposed)
        .max_age(Duration::from_secs(600));
    if origins.iter().any(|o| o == "*") {
        return Some(cors.allow_origin(AllowOrigin::any()));
    }
    let listed: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok())
        .collect();
    Some(
        cors.allow_origin(AllowOrigin::list(listed))
            .allow_credentials(true),
    )
}

/// A `--cors-origin` value that is not an origin.
#[derive(Debug, thiserror::Error)]
#[error("--cors-origin {origin:?}: {problem}")]
pub struct InvalidOrigin {
    pub origin: String,
    pub problem: &'static str,
}

/// Checks `--cors-origin` values: `*`, or `scheme://host[:port]` as browsers send
/// it in `Origin`.
pub fn check_origins(origins: &[String]) -> Result<(), InvalidOrigin> {
    for o in origins {
        if o == "*" {
            continue;
        }
        let o = o.trim_end_matches('/');
        let bad = |problem| InvalidOrigin {
            origin: o.to_string(),
            problem,
        };
        let Some((scheme, rest)) = o.split_once("://") else {
            return Err(bad("give an origin as a browser sends it, e.g. https://app.example.com or http://localhost:3000, or *"));
        };
        if !(scheme == "http" || scheme == "https") || rest.is_empty() || rest.contains('/') {
            return Err(bad("an origin is scheme://host[:port], without a path"));
        }
        HeaderValue::from_str(o).map_err(|_| bad("not a valid header value"))?;
    }
    Ok(())
}

/// gzip, br or zstd by `Accept-Encoding`, for answers of at least
/// [`COMPRESSION_MIN_BYTES`]; never for streams a client reads as they come
/// (bulk progress lines) nor for backups (lz4-compressed already).
pub fn compression() -> CompressionLayer<impl Predicate> {
    let predicate = SizeAbove::new(COMPRESSION_MIN_BYTES)
        .and(NotForContentType::const_new("application/x-ndjson"))
        .and(NotForContentType::const_new("application/octet-stream"))
        .and(NotForContentType::const_new("application/vnd.kiln.backup"))
        .and(NotForContentType::GRPC)
        .and(NotForContentType::IMAGES)
        .and(NotForContentType::SSE)
        // Attachments (they answer `Accept-Ranges`) go as stored: a byte range and
        // Content-Length are of the stored bytes.
        .and(
            |_: axum::http::StatusCode,
             _: axum::http::Version,
             h: &axum::http::HeaderMap,
             _: &axum::http::Extensions| {
                !h.contains_key(axum::http::header::ACCEPT_RANGES)
            },
        );
    CompressionLayer::new()
        .gzip(true)
        .br(true)
        .zstd(true)
        .no_deflate()
        .compress_when(predicate)
}
