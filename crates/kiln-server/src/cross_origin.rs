//! The tower-http layers of the router: CORS (`--cors-origin`) and response
//! compression, built from one [`FrontLayers`]. The own HTTP/1.1 loop asks the
//! same value which requests they could change and hands those to the router
//! (`http1::head`), so that they apply to every answer.

use axum::http::{header, HeaderValue, Method};
use axum::response::IntoResponse;
use tower_http::compression::predicate::{NotForContentType, Predicate, SizeAbove};
use tower_http::compression::CompressionLayer;

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
    /// `Accept-Encoding` as it is. With CORS on, every answer gets `Vary: Origin`
    /// (and a browser's the CORS headers): the own loop then answers nothing, and
    /// the router answers all, alike.
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

/// CORS for the browser origins given (`*` for any), as a middleware
/// ([`cors`]). None given: no CORS headers at all (browsers then refuse
/// cross-origin reads, as before), and `OPTIONS` stays a 405.
///
/// As the Fetch standard has it: a listed origin is echoed and may send
/// credentials (an `Authorization` header); `*` allows any origin but without
/// credentials (browsers refuse `*` together with credentials). The preflight
/// allows the methods and request headers the API takes and is cached for 10
/// minutes; the answers expose the headers a client reads (ETag above all).
///
/// The `Access-Control-*` headers go only on answers to a request whose `Origin`
/// is allowed: a request without one (curl, a client library, a server) or from
/// another origin gets the answer as it would without `--cors-origin`. Every
/// answer says `Vary: Origin`, so that a cache never hands one made for a page
/// (or for no page) to another.
#[derive(Clone, Debug)]
pub struct Cors {
    /// `*` was given: any origin, without credentials.
    any: bool,
    /// The origins given, without a trailing `/`.
    listed: Vec<String>,
}

/// The methods a preflight allows: every one the API takes.
pub const ALLOWED_METHODS: &str = "GET, HEAD, PUT, POST, PATCH, DELETE";

/// The request headers a preflight allows.
pub const ALLOWED_HEADERS: &str =
    "authorization, content-type, if-match, if-none-match, if-range, range, x-api-key, x-request-id";

/// The answer headers a page's script may read.
pub const EXPOSED_HEADERS: &str =
    "etag, location, last-modified, retry-after, link, www-authenticate, x-request-id";

/// How long a browser may keep a preflight's answer, in seconds.
const PREFLIGHT_MAX_AGE_S: &str = "600";

impl Cors {
    /// The CORS of `--cors-origin`: `None` when none is given.
    pub fn new(origins: &[String]) -> Option<Cors> {
        if origins.is_empty() {
            return None;
        }
        Some(Cors {
            any: origins.iter().any(|o| o == "*"),
            listed: origins
                .iter()
                .map(|o| o.trim_end_matches('/').to_string())
                .collect(),
        })
    }

    /// The `Access-Control-Allow-Origin` for a request's `Origin`, if allowed.
    fn allow_origin(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        let origin = origin?;
        if self.any {
            return Some(HeaderValue::from_static("*"));
        }
        let text = origin.to_str().ok()?;
        self.listed
            .iter()
            .any(|o| o == text)
            .then(|| origin.clone())
    }
}

/// The CORS middleware (see [`Cors`]): answers an allowed preflight itself, puts
/// the CORS headers on the answers to an allowed `Origin`, and `Vary: Origin` on
/// every answer.
pub async fn cors(
    axum::extract::State(cors): axum::extract::State<std::sync::Arc<Cors>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let allowed = cors.allow_origin(req.headers().get(header::ORIGIN));
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let Some(allow_origin) = allowed else {
        // No Origin, or one not allowed: the answer as without CORS (a preflight
        // from another origin gets the router's 405, which the browser refuses).
        let mut resp = next.run(req).await;
        resp.headers_mut()
            .append(header::VARY, HeaderValue::from_static("origin"));
        return resp;
    };
    let mut resp = if preflight {
        let mut resp = axum::http::StatusCode::OK.into_response();
        let h = resp.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOWED_METHODS),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOWED_HEADERS),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE_S),
        );
        h.append(
            header::VARY,
            HeaderValue::from_static(
                "origin, access-control-request-method, access-control-request-headers",
            ),
        );
        resp
    } else {
        let mut resp = next.run(req).await;
        let h = resp.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED_HEADERS),
        );
        h.append(header::VARY, HeaderValue::from_static("origin"));
        resp
    };
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin);
    if !cors.any {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
    resp
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
