//! The web studio is embedded at build time and served at /studio: index.html for the
//! studio's own routes, hashed assets cached for good, ETag/304, gzip when accepted, a
//! Content-Security-Policy, and no key needed for the static files under --auth.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::Harness;
use kiln_server::auth;
use reqwest::StatusCode;

/// The hashed script that index.html names.
fn script_path(html: &str) -> String {
    let start = html
        .find("/studio/assets/")
        .expect("index.html names an asset");
    let end = start + html[start..].find('"').expect("a quoted path");
    html[start..end].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn studio_pages_assets_and_caching() {
    let h = Harness::start().await;

    // / redirects to the studio.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .unwrap();
    let r = http.get(h.url("/")).send().await.unwrap();
    assert!(r.status().is_redirection());
    assert_eq!(r.headers()["location"], "/studio/");

    let r = h.http.get(h.url("/studio/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(r.headers()["cache-control"], "no-cache");
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    let etag = r.headers()["etag"].clone();
    let html = r.text().await.unwrap();
    assert!(html.contains("<div id=\"app\">"), "{html}");
    assert!(!html.contains("<script>"), "no inline script under the CSP");

    // Client-side routes get index.html; 304 with the ETag.
    for path in [
        "/studio/live",
        "/studio/db/shop/doc/users%2Fada",
        "/studio/db/x/query",
    ] {
        let r = h.http.get(h.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        assert_eq!(r.text().await.unwrap(), html, "{path}");
    }
    let r = h
        .http
        .get(h.url("/studio/"))
        .header("if-none-match", etag.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);

    // The hashed script: JavaScript, immutable, gzip when asked for.
    let script = script_path(&html);
    let plain = h.http.get(h.url(&script)).send().await.unwrap();
    assert_eq!(plain.status(), StatusCode::OK);
    assert_eq!(
        plain.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert!(plain.headers()["cache-control"]
        .to_str()
        .unwrap()
        .contains("immutable"));
    assert!(plain.headers().get("content-encoding").is_none());
    let plain_len = plain.bytes().await.unwrap().len();
    let gz = h
        .http
        .get(h.url(&script))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(gz.headers()["content-encoding"], "gzip");
    assert_eq!(gz.headers()["vary"], "accept-encoding");
    let gz_len = gz.bytes().await.unwrap().len();
    assert!(gz_len * 2 < plain_len, "gzip {gz_len} B of {plain_len} B");

    // A hashed file that does not exist is a 404, not index.html.
    let r = h
        .http
        .get(h.url("/studio/assets/index-gone.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn studio_files_need_no_key_but_the_api_does() {
    let dir = tempfile::tempdir().unwrap();
    let (_, key) = auth::create_api_key(
        dir.path(),
        "studio",
        kiln_server::access::Clearance::Operator,
    )
    .unwrap();
    let h = Harness::start_in(dir, |c| c.require_auth = true).await;
    let r = h.http.get(h.url("/studio/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let script = script_path(&r.text().await.unwrap());
    let r = h.http.get(h.url(&script)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // What the studio reads stays behind the key.
    let r = h.http.get(h.url("/stats")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = h
        .http
        .get(h.url("/stats"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_carry_the_live_figures() {
    let h = Harness::start().await;
    h.create_db("live").await;
    for i in 0..3 {
        let r = h
            .http
            .put(h.doc_url("live", &format!("a/{i}")))
            .body("{\"n\":1}")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let s: serde_json::Value = h
        .http
        .get(h.url("/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let db = &s["databases"][0];
    assert_eq!(db["name"], "live");
    assert_eq!(db["documents"], 3);
    assert_eq!(db["documents_written"], 3);
    assert!(db["commits"].as_u64().unwrap() >= 1);
    assert!(db["journal_writes"].as_u64().unwrap() >= 1);
    assert!(db["commit_units"].as_u64().unwrap() >= 1);
    assert!(db["journal_write_p99_us"].as_u64().unwrap() > 0);
    assert!(db["data_file_bytes"].as_u64().unwrap() > 0);
    for k in ["data_syncs", "pages_written_back", "pages_unflushed"] {
        assert!(db[k].is_u64(), "{k}");
    }
    assert!(s["http_requests_by_status"]["2xx"].as_u64().unwrap() >= 4);
    assert!(s["connections_open"].as_u64().unwrap() >= 1);
    assert!(s["resident_memory_bytes"].as_u64().unwrap() > 0);
}
