//! What every answer gets, whichever path serves it (the own HTTP/1.1 loop or the
//! router): a request id (echoed, or made) that is also in every error body; CORS
//! for the origins `--cors-origin` lists, preflight included, and none otherwise;
//! compression by `Accept-Encoding` above a size threshold, on the API and
//! `/metrics`; `Link: rel="next"` on pages that have a next one.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{expect_error, Harness};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_echoed_or_made_and_in_every_error_body() {
    let h = Harness::start().await;
    h.create_db("r").await;
    // The own loop (a plain document PUT and GET) and the router (a listing)
    // both echo the client's id.
    let put = h
        .http
        .put(h.doc_url("r", "a"))
        .header("x-request-id", "client-1")
        .body(r#"{"n":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(put.headers()["x-request-id"], "client-1");
    for url in [h.doc_url("r", "a"), h.url("/dbs/r/docs")] {
        let r = h
            .http
            .get(&url)
            .header("x-request-id", "client-2")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["x-request-id"], "client-2", "{url}");
    }
    // Made when absent (or unusable): 16 hex digits, different each time.
    let made: Vec<String> = futures_util::future::join_all((0..2).map(|_| async {
        let r = h
            .http
            .get(h.doc_url("r", "a"))
            .header("x-request-id", "has space")
            .send()
            .await
            .unwrap();
        r.headers()["x-request-id"].to_str().unwrap().to_string()
    }))
    .await;
    assert!(made.iter().all(|id| id.len() == 16), "{made:?}");
    assert_ne!(made[0], made[1]);
    // Errors from both paths, the fallback and a refused query included, carry it
    // in the body as in the header.
    for (method, path) in [
        ("GET", "/dbs/r/docs/missing"),    // own loop: 404
        ("PUT", "/dbs/nodb/docs/x"),       // own loop: 404 before the body
        ("GET", "/dbs/r/docs?prefx=a"),    // router: 400
        ("GET", "/no/such/route"),         // router fallback: 404
        ("DELETE", "/dbs/r/docs/missing"), // router: 404
    ] {
        let r = h
            .http
            .request(method.parse().unwrap(), h.url(path))
            .header("x-request-id", "err-1")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["x-request-id"], "err-1", "{method} {path}");
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert!(status >= 400, "{method} {path}: {status}");
        assert_eq!(v["request_id"], "err-1", "{method} {path}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_listed_origins_only() {
    let h = Harness::start_with(|c| {
        c.cors_origins = vec!["https://app.example".into(), "http://localhost:3000".into()];
    })
    .await;
    h.create_db("c").await;
    h.put_ok("c", "a", &json!({"n": 1})).await;

    // Preflight: answered before authentication would look, with what the API takes.
    let r = h
        .http
        .request(reqwest::Method::OPTIONS, h.doc_url("c", "a"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "PUT")
        .header("access-control-request-headers", "if-match, content-type")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let hd = r.headers();
    assert_eq!(hd["access-control-allow-origin"], "https://app.example");
    assert_eq!(hd["access-control-allow-credentials"], "true");
    let methods = hd["access-control-allow-methods"].to_str().unwrap();
    assert!(
        methods.contains("PUT") && methods.contains("DELETE") && methods.contains("PATCH"),
        "{methods}"
    );
    let allowed = hd["access-control-allow-headers"].to_str().unwrap();
    assert!(
        allowed.contains("if-match") && allowed.contains("authorization"),
        "{allowed}"
    );

    // An actual request from the page (a document GET: the own loop hands it to
    // the router): the origin echoed, ETag exposed so that script can read it.
    let r = h
        .http
        .get(h.doc_url("c", "a"))
        .header("origin", "https://app.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let exposed = r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap();
    assert!(
        exposed.contains("etag") && exposed.contains("x-request-id"),
        "{exposed}"
    );
    assert!(r.headers()["vary"].to_str().unwrap().contains("origin"));

    // Another origin: no allow header (the browser refuses to show the answer).
    let r = h
        .http
        .get(h.doc_url("c", "a"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    assert!(r
        .headers()
        .get("access-control-allow-credentials")
        .is_none());
    assert!(r.headers()["vary"].to_str().unwrap().contains("origin"));

    // No Origin at all (curl, a client library): no CORS header, but `Vary:
    // Origin`, so that no cache gives this answer to a page.
    for r in [
        h.http.get(h.doc_url("c", "a")).send().await.unwrap(),
        h.http.get(h.doc_url("c", "none")).send().await.unwrap(),
        h.http.get(h.url("/dbs")).send().await.unwrap(),
    ] {
        let cors: Vec<_> = r
            .headers()
            .keys()
            .filter(|k| k.as_str().starts_with("access-control-"))
            .collect();
        assert!(cors.is_empty(), "{} {cors:?}", r.url());
        let vary: Vec<_> = r.headers().get_all("vary").iter().collect();
        assert!(
            vary.iter().any(|v| v.to_str().unwrap().contains("origin")),
            "{vary:?}"
        );
    }

    // A merge patch from the page: preflight, then the PATCH.
    let r = h
        .http
        .request(reqwest::Method::OPTIONS, h.doc_url("c", "a"))
        .header("origin", "http://localhost:3000")
        .header("access-control-request-method", "PATCH")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:3000"
    );
    let r = h
        .http
        .patch(h.doc_url("c", "a"))
        .header("origin", "http://localhost:3000")
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"m": 2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:3000"
    );
    h.shutdown().await;

    // `*`: any origin, without credentials; still nothing without an Origin.
    let any = Harness::start_with(|c| c.cors_origins = vec!["*".into()]).await;
    any.create_db("c").await;
    let r = any
        .http
        .get(any.url("/dbs/c/docs/a"))
        .header("origin", "https://anyone.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    assert!(r
        .headers()
        .get("access-control-allow-credentials")
        .is_none());
    let r = any.http.get(any.url("/dbs/c/docs/a")).send().await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    any.shutdown().await;

    // Without --cors-origin: no CORS header at all, and OPTIONS is not allowed.
    let plain = Harness::start().await;
    plain.create_db("c").await;
    let r = plain
        .http
        .request(reqwest::Method::OPTIONS, plain.url("/dbs/c/docs/a"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "PUT")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    expect_error(r, 405, "method_not_allowed").await;
    plain.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_are_compressed_as_the_client_accepts() {
    let h = Harness::start().await;
    h.create_db("z").await;
    let big = json!({"text": "kiln ".repeat(2000)});
    h.put_ok("z", "big", &big).await;
    h.put_ok("z", "small", &json!({"n": 1})).await;
    for (accept, encoding) in [
        ("gzip", "gzip"),
        ("br", "br"),
        ("zstd", "zstd"),
        ("br;q=1, gzip;q=0.5", "br"),
    ] {
        for path in ["/dbs/z/docs/big", "/dbs/z/docs?page_size=5", "/metrics"] {
            let r = h
                .http
                .get(h.url(path))
                .header("accept-encoding", accept)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{path}");
            assert_eq!(
                r.headers()
                    .get("content-encoding")
                    .map(|v| v.to_str().unwrap()),
                Some(encoding),
                "{path} with {accept}"
            );
            let body = r.bytes().await.unwrap();
            if encoding == "gzip" {
                assert_eq!(&body[..2], &[0x1f, 0x8b], "{path}: a gzip stream");
            }
        }
    }
    // Below the threshold, or not asked for: as it is.
    let r = h
        .http
        .get(h.doc_url("z", "small"))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("content-encoding").is_none());
    let r = h.http.get(h.doc_url("z", "big")).send().await.unwrap();
    assert!(r.headers().get("content-encoding").is_none());
    assert_eq!(r.json::<Value>().await.unwrap()["text"], big["text"]);
    // A backup is lz4-compressed already: never encoded again.
    let r = h
        .http
        .get(h.url("/dbs/z/backup"))
        .header("accept-encoding", "gzip, br, zstd")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers().get("content-encoding").is_none(),
        "{:?}",
        r.headers()
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_link_to_the_next_one() {
    let h = Harness::start().await;
    h.create_db("p").await;
    for i in 0..5 {
        h.put_ok("p", &format!("users/{i}"), &json!({"i": i})).await;
    }
    let mut next = Some(h.url("/dbs/p/docs?prefix=users%2F&page_size=2"));
    let mut seen = 0;
    while let Some(url) = next.take() {
        let r = h.http.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200, "{url}");
        next = r.headers().get("link").map(|l| {
            let l = l.to_str().unwrap();
            assert!(l.ends_with(">; rel=\"next\""), "{l}");
            h.url(&l[1..l.find('>').unwrap()])
        });
        seen += r.json::<Value>().await.unwrap()["results"]
            .as_array()
            .unwrap()
            .len();
        assert!(seen <= 5);
    }
    assert_eq!(seen, 5, "following Link visits every document once");
    // The changes feed links to its next page while pages are full.
    let r = h
        .http
        .get(h.url("/dbs/p/changes?limit=2"))
        .send()
        .await
        .unwrap();
    let link = r.headers()["link"].to_str().unwrap().to_string();
    assert!(link.starts_with("</dbs/p/changes?limit=2&since="), "{link}");
    h.shutdown().await;
}
