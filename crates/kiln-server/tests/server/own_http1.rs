//! The server's own HTTP/1.1 loop for document requests (`src/http1/`): pipelining,
//! handing a connection to hyper mid-way, `Connection: close`, authentication,
//! shutdown, and answers that match hyper's for the same requests.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{Harness, RawResponse};
use kiln_server::auth;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw keep-alive connection that reads answers one by one, keeping the bytes of
/// the next one (pipelined answers arrive together).
struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    async fn open(h: &Harness) -> RawConn {
        RawConn {
            stream: TcpStream::connect(h.addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut chunk)).await {
            Err(_) => panic!(
                "no answer within 5 s; have {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// The next answer; `None` when the server closed the connection instead.
    async fn answer(&mut self) -> Option<RawResponse> {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            if !self.fill().await {
                assert!(self.buf.is_empty(), "closed inside a head");
                return None;
            }
        };
        let head = String::from_utf8(self.buf[..head_end].to_vec()).unwrap();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let length = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map_or(0, |(_, v)| v.parse::<usize>().unwrap());
        while self.buf.len() < head_end + 4 + length {
            assert!(self.fill().await, "closed inside a body");
        }
        let body = self.buf[head_end + 4..head_end + 4 + length].to_vec();
        self.buf.drain(..head_end + 4 + length);
        Some(RawResponse {
            status,
            headers,
            body,
        })
    }

    async fn closed_within(&mut self, limit: Duration) -> bool {
        crate::common::closed_within(&mut self.stream, limit).await
    }
}

fn put(path: &str, body: &str, extra: &str) -> String {
    format!(
        "PUT {path} HTTP/1.1\r\nHost: k\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: k\r\n{extra}\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order() {
    let h = Harness::start().await;
    h.create_db("p").await;
    let mut c = RawConn::open(&h).await;
    let script = [
        put("/dbs/p/docs/a", r#"{"n":1}"#, ""),
        put("/dbs/p/docs/b", r#"{"n":2}"#, ""),
        get("/dbs/p/docs/a", ""),
        get("/dbs/p/docs/missing", ""),
        put("/dbs/p/docs/a", r#"{"n":3}"#, ""),
        get("/dbs/p/docs/a", ""),
    ]
    .concat();
    // All at once, and again cut into small pieces that split heads and bodies.
    c.send(script.as_bytes()).await;
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..6 {
        let r = c.answer().await.expect("an answer");
        statuses.push(r.status);
        last = Some(r);
    }
    assert_eq!(statuses, [201, 201, 200, 404, 200, 200]);
    assert_eq!(last.unwrap().json()["n"], 3);

    for piece in script.as_bytes().chunks(7) {
        c.send(piece).await;
    }
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(c.answer().await.expect("an answer").status);
    }
    assert_eq!(statuses, [200, 200, 200, 404, 200, 200]);
    assert!(
        !c.closed_within(Duration::from_millis(100)).await,
        "kept alive"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_moves_to_hyper_at_the_first_other_request() {
    let h = Harness::start().await;
    h.create_db("m").await;
    let mut c = RawConn::open(&h).await;
    // A document PUT (own loop), /health (hyper takes over with the bytes already
    // read, which include the start of the next request), then documents again.
    let next = get("/dbs/m/docs/x", "");
    let (first_half, second_half) = next.split_at(10);
    c.send(
        [
            put("/dbs/m/docs/x", r#"{"v":"one"}"#, ""),
            get("/health", ""),
            first_half.to_string(),
        ]
        .concat()
        .as_bytes(),
    )
    .await;
    assert_eq!(c.answer().await.unwrap().status, 201);
    let health = c.answer().await.unwrap();
    assert_eq!(
        health.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&health.body)
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.send(second_half.as_bytes()).await;
    let doc = c.answer().await.unwrap();
    assert_eq!(doc.status, 200);
    assert_eq!(doc.json()["v"], "one");
    // Writes still work on the connection hyper now serves.
    c.send(put("/dbs/m/docs/x", r#"{"v":"two"}"#, "").as_bytes())
        .await;
    assert_eq!(c.answer().await.unwrap().status, 200);
    assert_eq!(h.get_json("m", "x").await["v"], "two");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_is_honoured_after_the_answer() {
    let h = Harness::start().await;
    h.create_db("c").await;
    h.put_ok("c", "d", &json!({"k": 1})).await;
    let mut c = RawConn::open(&h).await;
    c.send(get("/dbs/c/docs/d", "Connection: close\r\n").as_bytes())
        .await;
    let r = c.answer().await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_within(Duration::from_secs(2)).await);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_skips_its_body_and_keeps_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (_, key) =
        auth::create_api_key(dir.path(), "test", kiln_server::access::Clearance::Operator).unwrap();
    let h = Harness::start_in(dir, |c| c.require_auth = true).await;
    let r = h
        .http
        .put(h.url("/dbs/a"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let mut c = RawConn::open(&h).await;
    let bearer = format!("Authorization: Bearer {key}\r\n");
    c.send(
        [
            put(
                "/dbs/a/docs/x",
                r#"{"sneaky":true}"#,
                "X-Api-Key: kiln_wrong\r\n",
            ),
            put("/dbs/a/docs/x", r#"{"ok":true}"#, &bearer),
            get("/dbs/a/docs/x", ""),
            get("/dbs/a/docs/x", &format!("x-api-key: {key}\r\n")),
        ]
        .concat()
        .as_bytes(),
    )
    .await;
    let refused = c.answer().await.unwrap();
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["error"], "unauthorized");
    assert!(refused.header("www-authenticate").is_some());
    assert_eq!(c.answer().await.unwrap().status, 201);
    assert_eq!(c.answer().await.unwrap().status, 401);
    let r = c.answer().await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["ok"], true);

    // Authentication comes before the body's size, as on the hyper path: an
    // unauthenticated client learns nothing about the limits.
    let mut c = RawConn::open(&h).await;
    c.send(b"PUT /dbs/a/docs/z HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n{")
        .await;
    assert_eq!(c.answer().await.unwrap().status, 401);
    assert!(c.closed_within(Duration::from_secs(2)).await);
    let mut c = RawConn::open(&h).await;
    c.send(
        format!(
            "PUT /dbs/a/docs/z HTTP/1.1\r\n{bearer}Content-Length: 18446744073709551615\r\n\r\n{{"
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(c.answer().await.unwrap().status, 413);
    assert!(c.closed_within(Duration::from_secs(2)).await);

    // A refused write whose body has not all arrived: answered, then closed (the
    // rest of its body would otherwise be read as a request).
    let mut c = RawConn::open(&h).await;
    c.send(b"PUT /dbs/a/docs/y HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"a\":")
        .await;
    assert_eq!(c.answer().await.unwrap().status, 401);
    assert!(c.closed_within(Duration::from_secs(2)).await);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_end_at_shutdown_without_waiting_out_the_grace() {
    let h = Harness::start().await;
    h.create_db("s").await;
    h.put_ok("s", "d", &json!({})).await;
    let mut c = RawConn::open(&h).await;
    c.send(get("/dbs/s/docs/d", "").as_bytes()).await;
    assert_eq!(c.answer().await.unwrap().status, 200);
    let started = Instant::now();
    h.shutdown().await;
    // The harness's grace period is 3 s; an idle connection must not hold it up.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(c.closed_within(Duration::from_secs(1)).await);
}

/// What must match between the own loop and hyper: the status, the header names
/// (not `date`), and the body's shape (error codes kept, generated values not).
fn shape(r: &RawResponse) -> (u16, BTreeSet<String>, Value) {
    let names = r
        .headers
        .iter()
        .map(|(k, _)| k.clone())
        .filter(|k| k != "date")
        .collect();
    let body = if r.body.is_empty() {
        Value::Null
    } else {
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        match v {
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .map(|(k, v)| {
                        let keep = k == "error" || k == "created" || k == "n";
                        (k, if keep { v } else { Value::Null })
                    })
                    .collect(),
            ),
            other => other,
        }
    };
    (r.status, names, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_own_loop_answers_as_hyper_does() {
    let mut shapes = Vec::new();
    for own in [true, false] {
        let h = Harness::start_with(|c| {
            c.own_http1 = own;
            c.limits.max_body_bytes = 1024;
        })
        .await;
        h.create_db("e").await;
        let mut c = RawConn::open(&h).await;
        let mut etag = String::new();
        let mut seen = Vec::new();
        type Step = Box<dyn Fn(&str) -> String>;
        let steps: Vec<Step> = vec![
            Box::new(|_| put("/dbs/e/docs/u/1", r#"{"n":1}"#, "")),
            Box::new(|_| put("/dbs/e/docs/u/1", r#"{"n":2}"#, "")),
            Box::new(|_| get("/dbs/e/docs/u/1", "")),
            Box::new(|e| get("/dbs/e/docs/u/1", &format!("If-None-Match: {e}\r\n"))),
            Box::new(|e| {
                get(
                    "/dbs/e/docs/u/1",
                    &format!("If-None-Match: W/{e}, \"x\"\r\n"),
                )
            }),
            Box::new(|_| get("/dbs/e/docs/u/1", "If-None-Match: \"1-00000000\"\r\n")),
            Box::new(|_| {
                put(
                    "/dbs/e/docs/u/1",
                    r#"{"n":3}"#,
                    "If-Match: \"1-00000000\"\r\n",
                )
            }),
            Box::new(|_| put("/dbs/e/docs/u/1", r#"{"n":3}"#, "If-None-Match: *\r\n")),
            Box::new(|_| put("/dbs/e/docs/u/2", r#"{"n":3}"#, "If-Match: *\r\n")),
            Box::new(|e| {
                put(
                    "/dbs/e/docs/u/1",
                    r#"{"n":4}"#,
                    &format!("If-Match: {e}\r\n"),
                )
            }),
            Box::new(|_| {
                put(
                    "/dbs/e/docs/u/1",
                    r#"{"n":4}"#,
                    "If-Match: x\r\nIf-None-Match: *\r\n",
                )
            }),
            Box::new(|_| put("/dbs/e/docs/u/1", r#"{"n": oops}"#, "")),
            Box::new(|_| put("/dbs/e/docs/u/1", "[1,2]", "")),
            Box::new(|_| {
                "POST /dbs/e/docs/u/ HTTP/1.1\r\nContent-Length: 7\r\n\r\n{\"n\":5}".to_string()
            }),
            Box::new(|_| get("/dbs/e/docs/nothing", "")),
            // A fragment is cut off by hyper: the same document either way.
            Box::new(|_| get("/dbs/e/docs/u/1#part", "")),
            Box::new(|_| get("/dbs/nodb/docs/x", "")),
            Box::new(|_| put("/dbs/nodb/docs/x", "{}", "")),
            Box::new(|_| get("/health", "")),
            Box::new(|_| {
                put(
                    "/dbs/e/docs/big",
                    &format!("{{\"s\":\"{}\"}}", "x".repeat(2000)),
                    "",
                )
            }),
        ];
        for step in &steps {
            c.send(step(&etag).as_bytes()).await;
            let Some(r) = c.answer().await else {
                seen.push((0, BTreeSet::new(), Value::Null));
                break;
            };
            if let Some(e) = r.header("etag") {
                etag = e.to_string();
            }
            seen.push(shape(&r));
        }
        // A path `http::Uri` refuses: 400, and hyper closes the connection.
        let mut c = RawConn::open(&h).await;
        c.send(get("/dbs/e/docs/u/<1>", "").as_bytes()).await;
        seen.push(shape(&c.answer().await.expect("an answer")));
        // The own loop served the documents and gave the connection to hyper at
        // /health (as it did the client's that created the database).
        let handed = crate::common::metric(
            &h.metrics_text().await,
            "kiln_http_connections_to_hyper_total",
        )
        .expect("the counter is exported");
        assert!(if own { handed >= 2.0 } else { handed == 0.0 }, "{handed}");
        shapes.push(seen);
        h.shutdown().await;
    }
    assert_eq!(shapes[0].len(), shapes[1].len());
    // A target `http::Uri` refuses: hyper answers an empty 400 (and that is what
    // `--hyper-only` still sends); the own loop, which every connection starts
    // in, answers the JSON error every other 4xx carries.
    let own_bad = shapes[0].pop().unwrap();
    let hyper_bad = shapes[1].pop().unwrap();
    assert_eq!(
        (own_bad.0, &own_bad.2["error"]),
        (400, &Value::from("bad_request"))
    );
    assert!(own_bad.1.contains("x-request-id") && own_bad.1.contains("connection"));
    assert_eq!((hyper_bad.0, &hyper_bad.2), (400, &Value::Null));
    for (i, (own, hyper)) in shapes[0].iter().zip(&shapes[1]).enumerate() {
        assert_eq!(own, hyper, "step {i}: own loop vs hyper");
    }
    // The script did exercise what it means to: creations, 304s, conflicts, errors.
    let statuses: Vec<u16> = shapes[0].iter().map(|s| s.0).collect();
    assert_eq!(
        statuses,
        [
            201, 200, 200, 304, 304, 200, 409, 409, 409, 200, 400, 400, 400, 201, 404, 200, 404,
            404, 200, 413
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_spread_over_several_connection_threads() {
    for threads in [3, 0] {
        let h = Harness::start_with(|c| c.connection_threads = threads).await;
        h.create_db("t").await;
        let mut clients = Vec::new();
        for n in 0..12 {
            let mut c = RawConn::open(&h).await;
            clients.push(tokio::spawn(async move {
                for i in 0..20 {
                    let path = format!("/dbs/t/docs/c{n}/{i}");
                    c.send(put(&path, &format!("{{\"n\":{i}}}"), "").as_bytes())
                        .await;
                    assert_eq!(c.answer().await.unwrap().status, 201);
                    c.send(get(&path, "").as_bytes()).await;
                    let r = c.answer().await.unwrap();
                    assert_eq!(r.status, 200);
                    assert_eq!(r.json()["n"], i);
                }
            }));
        }
        for c in clients {
            c.await.unwrap();
        }
        assert_eq!(h.doc_count("t").await, 240, "{threads} connection threads");
        // Shutdown waits for the connection threads' connections, then ends them.
        h.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pipelining_connection_outlives_the_read_timeout() {
    let h = Harness::start_with(|c| c.limits.request_read_timeout_ms = 300).await;
    h.create_db("b").await;
    h.put_ok("b", "d", &json!({})).await;
    let mut c = RawConn::open(&h).await;
    // Each write ends with the start of the next request, so the buffer is never
    // empty between requests; the timeout must still count from each request.
    let request = get("/dbs/b/docs/d", "");
    let (first, rest) = request.split_at(12);
    c.send(first.as_bytes()).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1_000) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.send(format!("{rest}{first}").as_bytes()).await;
        let r = c.answer().await.expect("still open");
        assert_eq!(r.status, 200);
    }
    // An idle connection still ends after the timeout.
    c.send(rest.as_bytes()).await;
    assert_eq!(c.answer().await.unwrap().status, 200);
    assert!(c.closed_within(Duration::from_secs(2)).await);
    h.shutdown().await;
}
