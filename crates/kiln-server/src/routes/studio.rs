//! `/studio`: the web studio, embedded at build time (see `build.rs`). Static files
//! need no authentication: they hold no data, and the studio asks for an API key
//! before it calls the API. Hashed files under `assets/` are cached for a year;
//! `index.html` and anything else is revalidated (ETag, 304). Unknown paths under
//! `/studio/` get `index.html`: the studio routes on the client.

use crate::http_util::ApiPath;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

/// One embedded file.
pub struct Asset {
    /// Relative to `studio/dist`, '/'-separated.
    pub path: &'static str,
    pub content_type: &'static str,
    /// Strong ETag, quoted.
    pub etag: &'static str,
    pub body: &'static [u8],
    /// The gzip copy, when it is smaller.
    pub gzip: Option<&'static [u8]>,
}

include!(concat!(env!("OUT_DIR"), "/studio_assets.rs"));

/// No inline scripts or styles, nothing from another origin; the API and the changes
/// WebSocket are on this origin (`'self'` covers ws: and wss: there).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";
const CACHE_IMMUTABLE: &str = "public, max-age=31536000, immutable";
const CACHE_REVALIDATE: &str = "no-cache";
const INDEX: &str = "index.html";

/// `GET /`: the studio is the server's front page.
pub async fn root() -> Redirect {
    Redirect::to("/studio/")
}

pub async fn index(headers: HeaderMap) -> Response {
    serve(INDEX, &headers)
}

/// A path that does not decode (percent-encoding that is not UTF-8) is a JSON 400
/// `invalid_path`, as on every other route.
pub async fn file(ApiPath(path): ApiPath<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers)
}

fn find(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let asset = match find(path) {
        Some(a) => a,
        // A missing hashed file is a stale page asking for an old build: 404, not HTML.
        None if path.starts_with("assets/") => return not_found(),
        None => match find(INDEX) {
            Some(a) => a,
            None => return not_built(),
        },
    };
    let immutable = asset.path.starts_with("assets/");
    let mut resp = if etag_matches(headers, asset.etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        match asset.gzip.filter(|_| accepts_gzip(headers)) {
            Some(gz) => {
                let mut r = (StatusCode::OK, gz).into_response();
                r.headers_mut()
                    .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                r
            }
            None => (StatusCode::OK, asset.body).into_response(),
        }
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(header::ETAG, HeaderValue::from_static(asset.etag));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if immutable {
            CACHE_IMMUTABLE
        } else {
            CACHE_REVALIDATE
        }),
    );
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    security_headers(h);
    resp
}

fn security_headers(h: &mut HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

fn etag_matches(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
        })
}

/// `Accept-Encoding` names gzip (or `*`) without `q=0`.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    let Some(v) = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    v.split(',').any(|item| {
        let mut parts = item.split(';').map(str::trim);
        let coding = parts.next().unwrap_or("");
        let refused = parts.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q == 0.0)
        });
        (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
    })
}

fn not_found() -> Response {
    let mut r = (StatusCode::NOT_FOUND, "no such studio file").into_response();
    security_headers(r.headers_mut());
    r
}

fn not_built() -> Response {
    let mut r = (
        StatusCode::SERVICE_UNAVAILABLE,
        "this kiln binary was built without the studio: run `npm ci && npm run build` in studio/, then rebuild",
    )
        .into_response();
    security_headers(r.headers_mut());
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: header::HeaderName, v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn gzip_is_chosen_only_when_accepted() {
        assert!(accepts_gzip(&with(
            header::ACCEPT_ENCODING,
            "gzip, deflate, br"
        )));
        assert!(accepts_gzip(&with(
            header::ACCEPT_ENCODING,
            "br;q=1.0, GZIP;q=0.5"
        )));
        assert!(accepts_gzip(&with(header::ACCEPT_ENCODING, "*")));
        assert!(!accepts_gzip(&with(header::ACCEPT_ENCODING, "gzip;q=0")));
        assert!(!accepts_gzip(&with(
            header::ACCEPT_ENCODING,
            "br, identity"
        )));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn etags_match_strong_weak_and_lists() {
        let tag = "\"abc\"";
        assert!(etag_matches(&with(header::IF_NONE_MATCH, "\"abc\""), tag));
        assert!(etag_matches(
            &with(header::IF_NONE_MATCH, "\"x\", W/\"abc\""),
            tag
        ));
        assert!(!etag_matches(&with(header::IF_NONE_MATCH, "\"abcd\""), tag));
        assert!(!etag_matches(&HeaderMap::new(), tag));
    }
}
