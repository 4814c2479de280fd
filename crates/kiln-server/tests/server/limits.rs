//! Limits and misbehaving clients: oversized bodies (with a length and chunked),
//! oversized documents and ids, bad JSON, the connection limit, slow clients and
//! clients that vanish mid-request.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{
    closed_within, expect_error, raw_exchange, read_response, Harness, RawOutcome, RawResponse,
};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A client without a connection pool: with short server timeouts an idle pooled
/// connection may be closed under it.
fn unpooled() -> Client {
    Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn response(out: RawOutcome) -> RawResponse {
    match out {
        RawOutcome::Response(r) => r,
        RawOutcome::Closed => panic!("the server closed the connection without answering"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_documents_and_ids_over_the_limits() {
    let h = Harness::start_with(|c| {
        c.limits.max_body_bytes = 4096;
        c.docs.max_document_bytes = 1024;
        c.docs.max_id_bytes = 32;
    })
    .await;
    h.create_db("lim").await;

    // Over max_body_bytes with a Content-Length.
    let big = json!({"s": "x".repeat(5000)});
    let r = h.put("lim", "big/1", &big).await;
    let v = expect_error(r, 413, "body_too_large").await;
    assert!(v["message"].as_str().unwrap().contains("4096"), "{v}");
    expect_error(h.get("lim", "big/1").await, 404, "document_not_found").await;
    let r = h
        .http
        .post(h.url("/dbs/lim/batch"))
        .json(&json!({"ops": [{"op": "put", "id": "big/2", "document": big}]}))
        .send()
        .await
        .unwrap();
    expect_error(r, 413, "body_too_large").await;
    expect_error(h.get("lim", "big/2").await, 404, "document_not_found").await;

    // Chunked: within the limit it is written, over the limit refused.
    let chunked = |id: &str, chunks: &[String]| {
        let mut req = format!(
            "PUT /dbs/lim/docs/{id} HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        for c in chunks {
            req.extend_from_slice(format!("{:x}\r\n{c}\r\n", c.len()).as_bytes());
        }
        req.extend_from_slice(b"0\r\n\r\n");
        req
    };
    let small = chunked(
        "chunked/ok",
        &[
            "{\"a\":".into(),
            "\"hello\",".into(),
            "\"b\":[1,2,3]}".into(),
        ],
    );
    let r = response(raw_exchange(h.addr, &small).await);
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let doc = h.get_json("lim", "chunked/ok").await;
    assert_eq!(doc["a"], "hello");
    assert_eq!(doc["b"], json!([1, 2, 3]));
    let part = "y".repeat(2000);
    let large = chunked(
        "chunked/big",
        &[
            format!("{{\"s\":\"{part}"),
            part.clone(),
            format!("{part}\"}}"),
        ],
    );
    let r = response(raw_exchange(h.addr, &large).await);
    assert_eq!(r.status, 413, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["error"], "body_too_large");
    let said = r.json()["message"].as_str().unwrap().to_string();
    assert!(
        said.contains("exceeds the limit of 4096 bytes") && !said.contains("that bytes"),
        "the limit in bytes, no made-up length: {said}"
    );
    expect_error(h.get("lim", "chunked/big").await, 404, "document_not_found").await;

    // Within the body limit but over max_document_bytes.
    let r = h
        .put("lim", "doc/big", &json!({"s": "z".repeat(2000)}))
        .await;
    let v = expect_error(r, 413, "document_too_large").await;
    assert!(v["message"].as_str().unwrap().contains("1024"), "{v}");
    expect_error(h.get("lim", "doc/big").await, 404, "document_not_found").await;
    h.put_ok("lim", "doc/fits", &json!({"s": "z".repeat(900)}))
        .await;

    // Ids up to max_id_bytes.
    let id32 = format!("ids/{}", "a".repeat(28));
    let id33 = format!("ids/{}", "a".repeat(29));
    assert_eq!((id32.len(), id33.len()), (32, 33));
    let r = h.put("lim", &id33, &json!({})).await;
    expect_error(r, 400, "invalid_id").await;
    expect_error(h.get("lim", &id33).await, 400, "invalid_id").await;
    let r = h.put("lim", &id32, &json!({})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    // Multi-byte characters count in bytes: 4 + 14 * 2 + 1 = 33 bytes.
    let wide = format!("ids/{}a", "é".repeat(14));
    expect_error(h.put("lim", &wide, &json!({})).await, 400, "invalid_id").await;
    let r = h
        .http
        .put(h.doc_url("lim", "ctl/a\u{1}b"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "invalid_id").await;

    // Malformed JSON names its position; non-objects are not documents.
    let bad = |body: &'static str| {
        h.http
            .put(h.doc_url("lim", "json/bad"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let v = expect_error(
        bad("{\n  \"a\": tru }").await.unwrap(),
        400,
        "malformed_json",
    )
    .await;
    let msg = v["message"].as_str().unwrap();
    assert!(msg.contains("line 2, column 11"), "{msg}");
    let v = expect_error(bad("{\"a\": 1,}").await.unwrap(), 400, "malformed_json").await;
    assert!(v["message"].as_str().unwrap().contains("line 1"), "{v}");
    expect_error(bad("").await.unwrap(), 400, "malformed_json").await;
    expect_error(bad("[1, 2]").await.unwrap(), 400, "invalid_document").await;
    expect_error(bad("\"text\"").await.unwrap(), 400, "invalid_document").await;
    expect_error(bad("42").await.unwrap(), 400, "invalid_document").await;
    expect_error(
        bad("{\"@metadata\": 5}").await.unwrap(),
        400,
        "invalid_document",
    )
    .await;
    expect_error(h.get("lim", "json/bad").await, 404, "document_not_found").await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_get_429() {
    let h = Harness::start_with(|c| c.limits.max_connections = 2).await;
    let health = b"GET /health HTTP/1.1\r\nHost: kiln\r\n\r\n";

    // Two connections, each proven accepted by a served request, held open.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(h.addr).await.unwrap();
        s.write_all(health).await.unwrap();
        let r = response(read_response(&mut s, Duration::from_secs(5)).await);
        assert_eq!(r.status, 200);
        held.push(s);
    }

    // A third is answered 429 and closed.
    let mut third = TcpStream::connect(h.addr).await.unwrap();
    let r = response(read_response(&mut third, Duration::from_secs(5)).await);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["error"], "too_many_connections");
    // A request id as on every answer, though no request was read.
    let id = r.header("x-request-id").expect("a request id").to_string();
    assert_eq!(r.json()["request_id"], id.as_str());
    assert!(closed_within(&mut third, Duration::from_secs(2)).await);

    // The held connections still work.
    for s in &mut held {
        s.write_all(health).await.unwrap();
        let r = response(read_response(s, Duration::from_secs(5)).await);
        assert_eq!(r.status, 200);
    }

    // Once one closes, a new connection is served again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut fresh = loop {
        let mut s = TcpStream::connect(h.addr).await.unwrap();
        s.write_all(health).await.unwrap();
        let r = response(read_response(&mut s, Duration::from_secs(5)).await);
        if r.status == 200 {
            break s;
        }
        assert_eq!(r.status, 429);
        assert!(Instant::now() < deadline, "the freed slot is never reused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    fresh
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: kiln\r\n\r\n")
        .await
        .unwrap();
    let r = response(read_response(&mut fresh, Duration::from_secs(5)).await);
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body).unwrap();
    assert!(
        crate::common::metric(&text, "kiln_http_connections_refused_total").unwrap() >= 1.0,
        "{text}"
    );
    drop(fresh);
    drop(held);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_and_writes_nothing() {
    let mut h = Harness::start_with(|c| c.limits.request_read_timeout_ms = 300).await;
    h.http = unpooled();
    h.create_db("slow").await;

    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(
        b"PUT /dbs/slow/docs/stalled HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"a\":\"123",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let r = response(read_response(&mut s, Duration::from_secs(5)).await);
    let waited = started.elapsed();
    assert_eq!(r.status, 408, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"], "request_timeout");
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    // Sending the rest now is too late.
    let _ = s.write_all(&[b' '; 90]).await;
    drop(s);
    tokio::time::sleep(Duration::from_millis(50)).await;
    expect_error(h.get("slow", "stalled").await, 404, "document_not_found").await;

    // A body that arrives in pieces, all within the timeout, is written.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    let body = br#"{"pieces": "one two three"}"#;
    s.write_all(
        format!(
            "PUT /dbs/slow/docs/pieces HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    for piece in body.chunks(10) {
        tokio::time::sleep(Duration::from_millis(40)).await;
        s.write_all(piece).await.unwrap();
    }
    let r = response(read_response(&mut s, Duration::from_secs(5)).await);
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        h.get_json("slow", "pieces").await["pieces"],
        "one two three"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_headers_close_the_connection() {
    let mut h = Harness::start_with(|c| c.limits.request_read_timeout_ms = 300).await;
    h.http = unpooled();
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: ki")
        .await
        .unwrap();
    let started = Instant::now();
    match read_response(&mut s, Duration::from_secs(5)).await {
        RawOutcome::Closed => {}
        RawOutcome::Response(r) => assert_eq!(r.status, 408),
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    // An idle keep-alive connection is closed after the same time.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: kiln\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        response(read_response(&mut s, Duration::from_secs(5)).await).status,
        200
    );
    assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    let r = h.http.get(h.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_body_changes_nothing() {
    let mut h = Harness::start().await;
    h.http = unpooled();
    h.create_db("gone").await;
    let head =
        b"PUT /dbs/gone/docs/partial HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n\
                 Content-Length: 100\r\n\r\n{\"a\":\"123";

    // Vanishes.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(head).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(s);

    // Half-closes: the server sees the body end early.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(head).await.unwrap();
    s.shutdown().await.unwrap();
    match read_response(&mut s, Duration::from_secs(5)).await {
        RawOutcome::Closed => {}
        RawOutcome::Response(r) => {
            assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
            assert_eq!(r.json()["error"], "body_read_failed");
        }
    }
    drop(s);

    tokio::time::sleep(Duration::from_millis(100)).await;
    expect_error(h.get("gone", "partial").await, 404, "document_not_found").await;
    let r = h.http.get(h.url("/dbs/gone")).send().await.unwrap();
    let stats: Value = r.json().await.unwrap();
    assert_eq!(stats["documents"], 0);
    assert_eq!(
        stats["last_etag"],
        Value::Null,
        "no etag was ever handed out"
    );
    // The server still serves writes.
    h.put_ok("gone", "partial", &json!({"a": "complete"})).await;
    assert_eq!(h.get_json("gone", "partial").await["a"], "complete");
    h.shutdown().await;
}
