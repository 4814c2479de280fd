//! `POST /dbs/{db}/bulk` (streaming NDJSON insert) end to end:
//! - 20,000 documents streamed in chunks that split lines: acks in increasing
//!   order, `done` with every document acked, all of them stored;
//! - a bad line k (malformed JSON, a document that is not an object, an invalid id):
//!   the answer ends with an error naming line k, exactly the k-1 lines before it are
//!   stored, nothing from line k on;
//! - acks stream back while the body is still being uploaded;
//! - a client that uploads its whole body before reading still gets the bad line;
//! - a client that disconnects mid-body: only whole committed batches stay, never
//!   the unterminated tail (not even a complete-looking last line);
//! - ids ending in `/` generate distinct ids under that prefix.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{seq_of, Harness};
use futures_util::{Stream, StreamExt};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Reads an NDJSON response line by line as it arrives.
struct Lines {
    stream: Pin<Box<dyn Stream<Item = reqwest::Result<Vec<u8>>> + Send>>,
    buf: Vec<u8>,
}

impl Lines {
    fn new(resp: reqwest::Response) -> Lines {
        assert_eq!(resp.status().as_u16(), 200);
        assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
        Lines {
            stream: Box::pin(resp.bytes_stream().map(|r| r.map(|b| b.to_vec()))),
            buf: Vec::new(),
        }
    }

    /// The next line as JSON, None at the end of the answer.
    async fn next(&mut self, limit: Duration) -> Option<Value> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                let text = String::from_utf8(line).unwrap();
                return Some(
                    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}")),
                );
            }
            match tokio::time::timeout(limit, self.stream.next())
                .await
                .unwrap_or_else(|_| panic!("no answer line within {limit:?}"))
            {
                Some(chunk) => self.buf.extend(chunk.expect("the answer streams")),
                None => {
                    assert!(
                        self.buf.is_empty(),
                        "an unterminated last line: {:?}",
                        String::from_utf8_lossy(&self.buf)
                    );
                    return None;
                }
            }
        }
    }

    async fn all(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(v) = self.next(Duration::from_secs(10)).await {
            out.push(v);
        }
        out
    }
}

/// A request body fed through a channel, chunk by chunk.
fn channel_body() -> (mpsc::Sender<Vec<u8>>, reqwest::Body) {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(4);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (Ok::<_, std::io::Error>(c), rx))
    });
    (tx, reqwest::Body::wrap_stream(stream))
}

fn ndjson(lines: impl IntoIterator<Item = String>) -> Vec<u8> {
    let mut out = String::new();
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out.into_bytes()
}

fn line(id: &str, doc: Value) -> String {
    json!({"id": id, "document": doc}).to_string()
}

/// Checks the ack lines (strictly increasing `acked` and etags) and returns the final
/// line.
fn check_acks(lines: &[Value]) -> &Value {
    let (last, acks) = lines.split_last().expect("an answer line");
    let mut prev = (0, 0);
    for a in acks {
        let n = a["acked"]
            .as_u64()
            .unwrap_or_else(|| panic!("not an ack: {a}"));
        let e = seq_of(a["last_etag"].as_str().unwrap_or_else(|| panic!("{a}")));
        assert!(
            n > prev.0 && e > prev.1,
            "acks must increase: {a} after {prev:?}"
        );
        prev = (n, e);
    }
    if let Some(a) = acks.last() {
        assert_eq!(
            last["acked"], a["acked"],
            "the final line repeats the last ack: {last}"
        );
        assert_eq!(last["last_etag"], a["last_etag"], "{last}");
    }
    last
}

async fn list_prefix(h: &Harness, db: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("/dbs/{db}/docs?prefix={prefix}&page_size=1000");
        if let Some(a) = &after {
            url.push_str(&format!("&start_after={}", crate::common::encode(a)));
        }
        let (status, text) = h.get_text(&url).await;
        assert_eq!(status.as_u16(), 200, "{text}");
        let page: Value = serde_json::from_str(&text).unwrap();
        let ids: Vec<String> = page["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                d["@metadata"]["@id"]
                    .as_str()
                    .or(d["id"].as_str())
                    .unwrap()
                    .to_string()
            })
            .collect();
        if ids.is_empty() {
            return out;
        }
        after = ids.last().cloned();
        out.extend(ids);
        if page["next"].is_null() {
            return out;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_documents_stream_in_with_increasing_acks_and_all_are_stored() {
    let h = Harness::start().await;
    h.create_db("bulk").await;
    let body = ndjson((0..20_000).map(|i| {
        line(
            &format!("docs/{i:05}"),
            json!({"i": i, "name": format!("n{i}")}),
        )
    }));
    let (tx, req_body) = channel_body();
    let feeder = tokio::spawn(async move {
        // Chunks of an odd size: most lines are split across two chunks.
        for chunk in body.chunks(7_919) {
            tx.send(chunk.to_vec()).await.unwrap();
        }
    });
    let t = std::time::Instant::now();
    let resp = h
        .http
        .post(h.url("/dbs/bulk/bulk"))
        .body(req_body)
        .send()
        .await
        .unwrap();
    let lines = Lines::new(resp).all().await;
    feeder.await.unwrap();
    let last = check_acks(&lines);
    assert_eq!(last["done"], true, "{last}");
    assert_eq!(last["acked"], 20_000, "{last}");
    assert!(lines.len() >= 2, "at least one ack before done: {lines:?}");
    eprintln!(
        "20,000 documents in {:?}, {} batches",
        t.elapsed(),
        lines.len() - 1
    );

    for i in [0, 1, 7_777, 19_999] {
        let d = h.get_json("bulk", &format!("docs/{i:05}")).await;
        assert_eq!(d["i"], i);
        assert_eq!(d["name"], format!("n{i}"));
        assert_eq!(d["@metadata"]["@collection"], "docs");
    }
    assert_eq!(h.doc_count("bulk").await, 20_000);
    let (status, text) = h.get_text("/dbs/bulk").await;
    assert_eq!(status.as_u16(), 200);
    let stats: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(stats["last_etag"], last["last_etag"], "{stats}");
    let m = h.metrics_text().await;
    assert_eq!(
        crate::common::metric(&m, "kiln_bulk_documents_total"),
        Some(20_000.0)
    );
    assert_eq!(
        crate::common::metric(&m, "kiln_bulk_inserts_running"),
        Some(0.0)
    );
    h.shutdown().await;
}

const BAD_LINE_OF: u64 = 3_000;

/// Sends 3,000 lines with `bad` as line k and checks the answer and the database.
async fn bad_line_case(h: &Harness, name: &str, k: u64, bad: String, code: &str) {
    let n = BAD_LINE_OF;
    h.create_db(name).await;
    let body = ndjson((1..=n).map(|i| {
        if i == k {
            bad.clone()
        } else {
            line(&format!("rows/{i:05}"), json!({"i": i}))
        }
    }));
    // A client of its own that never reuses the connection: the server closes it after
    // an early error without saying so (see the ignored test at the end of the file).
    let once = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let resp = once
        .post(h.url(&format!("/dbs/{name}/bulk")))
        .body(body)
        .send()
        .await
        .unwrap();
    let lines = Lines::new(resp).all().await;
    let last = check_acks(&lines);
    assert_eq!(last["error"], code, "{name}: {last}");
    assert_eq!(
        last["line"], k,
        "{name}: the error must name line {k}: {last}"
    );
    assert_eq!(last["acked"], k - 1, "{name}: {last}");
    assert!(
        last["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{last}"
    );
    assert!(last["note"].is_string(), "{last}");
    assert_eq!(
        h.doc_count(name).await,
        k - 1,
        "{name}: exactly the lines before {k} are stored"
    );
    if k > 1 {
        assert_eq!(
            h.get(name, &format!("rows/{:05}", k - 1))
                .await
                .status()
                .as_u16(),
            200,
            "{name}"
        );
    }
    for i in [k, k + 1, n] {
        if i <= n {
            assert_eq!(
                h.get(name, &format!("rows/{i:05}")).await.status().as_u16(),
                404,
                "{name}: rows/{i:05}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_line_k_stops_the_stream_with_k_minus_1_documents_committed() {
    let h = Harness::start().await;
    let bad = r#"{"id": "rows/01500", "document": {"a": 1,}"#.to_string();
    bad_line_case(&h, "malformed", 1_500, bad, "malformed_json").await;
    bad_line_case(
        &h,
        "malformed-first",
        1,
        "not json at all".into(),
        "malformed_json",
    )
    .await;
    let bad = r#"{"id": "rows/03000", "docu"#.to_string();
    bad_line_case(&h, "malformed-last", BAD_LINE_OF, bad, "malformed_json").await;
    let bad = line("rows/02222", json!([1, 2, 3]));
    bad_line_case(&h, "not-object", 2_222, bad, "invalid_document").await;
    let bad = r#"{"id": "rows/00777", "document": {}, "extra": 1}"#.to_string();
    bad_line_case(&h, "unknown-field", 777, bad, "malformed_json").await;
    h.shutdown().await;
}

// An id is checked when its line is parsed (it once was checked only when its batch
// was written, which refused the whole batch and named the last line read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_id_on_line_k_stops_the_stream_with_k_minus_1_documents_committed() {
    let h = Harness::start().await;
    bad_line_case(
        &h,
        "empty-id",
        1_234,
        line("", json!({"a": 1})),
        "invalid_id",
    )
    .await;
    let bad = line("rows/\u{1}bad", json!({"a": 1}));
    bad_line_case(&h, "control-id", 2_500, bad, "invalid_id").await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_stream_back_while_the_body_is_still_uploading() {
    let h = Harness::start().await;
    h.create_db("slow").await;
    let (tx, body) = channel_body();
    tx.send(ndjson(
        (0..1_000).map(|i| line(&format!("s/{i:04}"), json!({}))),
    ))
    .await
    .unwrap();
    let resp = tokio::time::timeout(
        Duration::from_secs(5),
        h.http.post(h.url("/dbs/slow/bulk")).body(body).send(),
    )
    .await
    .expect("the answer starts before the upload ends")
    .unwrap();
    let mut lines = Lines::new(resp);
    // The first half must be acked while the second has not been sent.
    let mut acked = 0;
    while acked < 1_000 {
        let v = lines
            .next(Duration::from_secs(5))
            .await
            .expect("an ack before the body ends");
        acked = v["acked"].as_u64().unwrap_or_else(|| panic!("{v}"));
        assert!(v.get("done").is_none() && v.get("error").is_none(), "{v}");
    }
    assert_eq!(acked, 1_000);
    assert_eq!(
        h.doc_count("slow").await,
        1_000,
        "committed while the upload goes on"
    );
    // A trickle: each part is acked before the next is sent.
    for part in 0..3 {
        tx.send(ndjson(
            (0..10).map(|i| line(&format!("t/{part}/{i}"), json!({}))),
        ))
        .await
        .unwrap();
        let v = lines
            .next(Duration::from_secs(5))
            .await
            .expect("an ack for the part");
        assert_eq!(v["acked"], 1_000 + 10 * (part + 1), "{v}");
    }
    drop(tx);
    let v = lines.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        (v["done"].as_bool(), v["acked"].as_u64()),
        (Some(true), Some(1_030)),
        "{v}"
    );
    assert!(lines.next(Duration::from_secs(5)).await.is_none());
    assert_eq!(h.doc_count("slow").await, 1_030);
    h.shutdown().await;
}

/// Writes one HTTP/1.1 chunk.
async fn write_chunk(s: &mut TcpStream, data: &[u8]) {
    s.write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(data).await.unwrap();
    s.write_all(b"\r\n").await.unwrap();
}

/// Reads from the raw connection until the answer shows an ack of at least `n`;
/// returns the highest ack seen.
async fn wait_for_ack(s: &mut TcpStream, seen: &mut Vec<u8>, n: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(seen).to_string();
        let best = text
            .split('\n')
            .filter_map(|l| l.trim().strip_prefix("{\"acked\":"))
            .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        if best >= n {
            return best;
        }
        let mut buf = [0u8; 4096];
        let r = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no ack of {n} yet: {text}"))
            .unwrap();
        assert!(r > 0, "the server closed the connection: {text}");
        seen.extend_from_slice(&buf[..r]);
    }
}

/// Waits until the database's count stops changing (and no bulk insert runs).
async fn settled_count(h: &Harness, db: &str) -> u64 {
    let mut last = u64::MAX;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let m = h.metrics_text().await;
        let n = h.doc_count(db).await;
        if n == last && crate::common::metric(&m, "kiln_bulk_inserts_running") == Some(0.0) {
            return n;
        }
        last = n;
    }
    panic!("the bulk insert never ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_body_keeps_only_whole_committed_batches() {
    let h = Harness::start().await;
    // The tail after the last newline: a partial line, and a complete-looking
    // document whose newline and chunked terminator never came.
    for (db, tail) in [
        ("cut-partial", r#"{"id": "cut/tail", "document": {"a": "#),
        ("cut-complete", r#"{"id": "cut/tail", "document": {}}"#),
    ] {
        h.create_db(db).await;
        let mut s = TcpStream::connect(h.addr).await.unwrap();
        s.write_all(
            format!(
                "POST /dbs/{db}/bulk HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/x-ndjson\r\n\
                 Transfer-Encoding: chunked\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let first = ndjson((0..100).map(|i| line(&format!("cut/{i:03}"), json!({"i": i}))));
        write_chunk(&mut s, &first).await;
        let mut seen = Vec::new();
        let acked = wait_for_ack(&mut s, &mut seen, 100).await;
        assert_eq!(acked, 100);
        let mut second = ndjson((100..200).map(|i| line(&format!("cut/{i:03}"), json!({"i": i}))));
        second.extend_from_slice(tail.as_bytes());
        write_chunk(&mut s, &second).await;
        drop(s); // no terminating chunk: the upload was cut

        let count = settled_count(&h, db).await;
        eprintln!("{db}: {count} documents stayed");
        assert!(
            count == 100 || count == 200,
            "{db}: {count} documents is not a whole number of batches"
        );
        assert!(count >= acked);
        let ids = list_prefix(&h, db, "cut/").await;
        let want: Vec<String> = (0..count).map(|i| format!("cut/{i:03}")).collect();
        assert_eq!(
            ids, want,
            "{db}: the stored documents are the first {count} lines"
        );
        assert_eq!(
            h.get(db, "cut/tail").await.status().as_u16(),
            404,
            "{db}: the cut tail was stored"
        );
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_ending_in_a_slash_generate_distinct_ids_under_the_prefix() {
    let h = Harness::start().await;
    h.create_db("gen").await;
    let body = ndjson(
        (0..300)
            .map(|i| line("items/", json!({"i": i})))
            .chain((0..5).map(|i| line(&format!("items/fixed-{i}"), json!({"fixed": i})))),
    );
    let resp = h
        .http
        .post(h.url("/dbs/gen/bulk"))
        .body(body)
        .send()
        .await
        .unwrap();
    let lines = Lines::new(resp).all().await;
    let last = check_acks(&lines);
    assert_eq!(
        (last["done"].as_bool(), last["acked"].as_u64()),
        (Some(true), Some(305)),
        "{last}"
    );
    let ids = list_prefix(&h, "gen", "items/").await;
    assert_eq!(ids.len(), 305, "{ids:?}");
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 305);
    assert!(ids.iter().all(|id| id.len() > "items/".len()), "{ids:?}");
    let generated: Vec<&String> = ids
        .iter()
        .filter(|id| !id.starts_with("items/fixed-"))
        .collect();
    assert_eq!(generated.len(), 300);
    // Each generated document is its own line's document.
    let mut seen_i = HashSet::new();
    for id in generated.iter().take(300) {
        let d = h.get_json("gen", id).await;
        assert!(seen_i.insert(d["i"].as_u64().unwrap()), "{id}: {d}");
        assert_eq!(d["@metadata"]["@collection"], "items");
    }
    assert_eq!(seen_i.len(), 300);
    h.shutdown().await;
}

// A bulk answer goes out before the body is read, and a bad line leaves the rest of
// the body unread: the head must say `Connection: close` (or the connection must keep
// serving), else a pooling client reuses a connection the server is closing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_answer_that_leaves_the_body_unread_announces_connection_close() {
    let h = Harness::start().await;
    h.create_db("early").await;
    let body = ndjson((1..=3000).map(|i| {
        if i == 5 {
            "garbage".to_string()
        } else {
            line(&format!("r/{i}"), json!({}))
        }
    }));
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    let head = format!(
        "POST /dbs/early/bulk HTTP/1.1\r\nHost: kiln\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let _ = s.write_all(&body).await; // the server may stop reading: that is the point
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    while !seen.ends_with(b"0\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("the answer ends")
            .unwrap_or(0);
        assert!(
            n > 0,
            "closed inside the answer: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen).to_string();
    assert!(text.contains("\"error\":\"malformed_json\""), "{text}");
    let answer_head = text.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    if answer_head.contains("connection: close") {
        return;
    }
    // Not announced: then the connection must still serve the next request.
    let w = s
        .write_all(b"GET /health HTTP/1.1\r\nHost: kiln\r\n\r\n")
        .await;
    let mut next = Vec::new();
    if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
        next.extend_from_slice(&buf[..n]);
    }
    assert!(
        w.is_ok() && next.starts_with(b"HTTP/1.1 200"),
        "the answer did not say `connection: close` ({answer_head:?}) yet the connection \
         does not serve the next request (write: {w:?}, read: {:?})",
        String::from_utf8_lossy(&next)
    );
}

// A client that sends its whole body before it reads the answer (a browser's fetch
// does) still gets the error naming the bad line: the server reads on past it (up to
// 64 MiB or 2 s) instead of closing under the upload, which made the client's writes
// fail with a broken pipe and lose the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_uploads_everything_before_reading_gets_the_bad_line() {
    let h = Harness::start().await;
    h.create_db("late").await;
    // 24 MiB after the bad line: more than loopback's socket buffers hold.
    let filler = line("f", json!({"pad": "x".repeat(1000)}));
    let mut body = b"garbage\n".to_vec();
    while body.len() < 24 << 20 {
        body.extend_from_slice(filler.as_bytes());
        body.push(b'\n');
    }
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    let head = format!(
        "POST /dbs/late/bulk HTTP/1.1\r\nHost: kiln\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), s.write_all(&body))
        .await
        .expect("the upload is read")
        .expect("the server reads the body to its end, not closing under the upload");
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut seen))
        .await
        .expect("the answer ends")
        .unwrap();
    let text = String::from_utf8_lossy(&seen).to_string();
    assert!(
        text.contains("\"error\":\"malformed_json\"") && text.contains("\"line\":1"),
        "{text}"
    );
    assert_eq!(
        settled_count(&h, "late").await,
        0,
        "nothing from the bad line on is written"
    );
}

// A body that arrives as one large piece holds more lines than a batch may: the
// batches still stay within the database's batch limit (they once grew to the whole
// piece and failed with `batch_too_long`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_in_one_piece_is_cut_into_batches_within_the_batch_limit() {
    let h = Harness::start_with(|c| c.docs.max_batch_ops = 500).await;
    h.create_db("big").await;
    let body = ndjson((0..5_000).map(|i| line(&format!("b/{i:05}"), json!({"i": i}))));
    let resp = h
        .http
        .post(h.url("/dbs/big/bulk"))
        .body(body)
        .send()
        .await
        .unwrap();
    let answer = Lines::new(resp).all().await;
    let last = answer.last().unwrap();
    assert_eq!(
        (last["done"].as_bool(), last["acked"].as_u64()),
        (Some(true), Some(5_000)),
        "{last}"
    );
    let mut previous = 0;
    for ack in &answer {
        let acked = ack["acked"].as_u64().unwrap();
        assert!(
            acked - previous <= 500,
            "a batch of {} documents: {answer:?}",
            acked - previous
        );
        previous = acked;
    }
    assert_eq!(h.doc_count("big").await, 5_000);
    h.shutdown().await;
}

// A client that shuts down its sending side after the body still gets the whole
// answer (hyper's half-close: without it the server dropped the streamed answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_the_body_still_reads_the_whole_answer() {
    let h = Harness::start().await;
    h.create_db("half").await;
    let body = ndjson((0..3_000).map(|i| line(&format!("h/{i}"), json!({}))));
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    let head = format!(
        "POST /dbs/half/bulk HTTP/1.1\r\nHost: kiln\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body).await.unwrap();
    s.shutdown().await.unwrap(); // half-close: nothing more will be sent
    let mut seen = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut seen))
        .await
        .expect("the answer ends");
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.contains("\"done\":true") && text.contains("\"acked\":3000"),
        "{text}"
    );
    assert_eq!(h.doc_count("half").await, 3_000);
    h.shutdown().await;
}
