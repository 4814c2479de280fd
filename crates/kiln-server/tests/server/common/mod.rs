//! Shared by the integration tests: an in-process server on an ephemeral loopback
//! port over a temporary data directory, a real HTTP client, and raw-socket helpers
//! for what a well-behaved client never does (stalling, disconnecting, holding
//! connections).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer
#![allow(dead_code)]

use kiln_server::{RunningServer, ServerConfig};
use reqwest::{Client, Response, StatusCode};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A configuration on 127.0.0.1:0 with small storage files, so databases open fast.
pub fn config(data_dir: &Path) -> ServerConfig {
    let mut c = ServerConfig::new(data_dir, "127.0.0.1:0".parse().unwrap());
    c.docs.storage.journal_file_size_bytes = 1 << 20;
    c.docs.storage.data_grow_step_bytes = 1 << 20;
    c.shutdown_grace_ms = 3_000;
    c
}

/// A plain HTTP client that never goes through a proxy and never hangs a test.
pub fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

pub struct Harness {
    /// Kept so the directory outlives the server (and survives restarts).
    pub dir: tempfile::TempDir,
    pub server: RunningServer,
    pub addr: SocketAddr,
    pub http: Client,
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::start_with(|_| {}).await
    }

    /// Starts a server whose configuration `tune` may change first.
    pub async fn start_with(tune: impl FnOnce(&mut ServerConfig)) -> Harness {
        Harness::start_in(tempfile::tempdir().unwrap(), tune).await
    }

    /// Starts a server on an existing data directory (a restart, or API keys made
    /// before the start).
    pub async fn start_in(dir: tempfile::TempDir, tune: impl FnOnce(&mut ServerConfig)) -> Harness {
        let mut c = config(dir.path());
        tune(&mut c);
        let server = RunningServer::start(c).await.expect("the server starts");
        let addr = server.local_addr();
        Harness {
            dir,
            server,
            addr,
            http: client(),
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn doc_url(&self, db: &str, id: &str) -> String {
        self.url(&format!("/dbs/{db}/docs/{}", encode(id)))
    }

    pub async fn create_db(&self, db: &str) {
        let r = self
            .http
            .put(self.url(&format!("/dbs/{db}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "creating {db}");
    }

    pub async fn put(&self, db: &str, id: &str, doc: &Value) -> Response {
        self.http
            .put(self.doc_url(db, id))
            .json(doc)
            .send()
            .await
            .unwrap()
    }

    /// Puts a document that must be written; returns its etag (unquoted).
    pub async fn put_ok(&self, db: &str, id: &str, doc: &Value) -> String {
        let r = self.put(db, id, doc).await;
        let status = r.status();
        let etag = etag_of(&r);
        let body = r.text().await.unwrap();
        assert!(
            status == StatusCode::CREATED || status == StatusCode::OK,
            "PUT {id}: {status} {body}"
        );
        etag
    }

    pub async fn get(&self, db: &str, id: &str) -> Response {
        self.http.get(self.doc_url(db, id)).send().await.unwrap()
    }

    /// The document as JSON; panics unless it exists.
    pub async fn get_json(&self, db: &str, id: &str) -> Value {
        let r = self.get(db, id).await;
        assert_eq!(r.status(), StatusCode::OK, "GET {id}");
        r.json().await.unwrap()
    }

    pub async fn get_text(&self, path: &str) -> (StatusCode, String) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    }

    pub async fn shutdown(self) -> tempfile::TempDir {
        let Harness { dir, server, .. } = self;
        tokio::time::timeout(Duration::from_secs(10), server.shutdown())
            .await
            .expect("shutdown finishes within its grace period")
            .expect("shutdown succeeds");
        dir
    }
}

/// Percent-encodes every byte of an id that is not unreserved, keeping `/`.
pub fn encode(id: &str) -> String {
    let mut out = String::new();
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `ETag` header without its quotes; panics unless it is a strong, quoted etag.
pub fn etag_of(r: &Response) -> String {
    let raw = r
        .headers()
        .get("etag")
        .unwrap_or_else(|| panic!("no ETag header on a {} answer", r.status()))
        .to_str()
        .unwrap()
        .to_string();
    assert!(!raw.starts_with("W/"), "etag {raw} must be strong");
    assert!(
        raw.len() > 2 && raw.starts_with('"') && raw.ends_with('"'),
        "etag {raw} must be quoted"
    );
    raw[1..raw.len() - 1].to_string()
}

/// Checks an error answer: status, JSON content type, `error` code and a message.
/// Returns the body.
pub async fn expect_error(r: Response, status: u16, code: &str) -> Value {
    let got = r.status().as_u16();
    let ctype = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    assert_eq!(got, status, "expected {status} {code}, got {got}: {text}");
    assert_eq!(ctype.as_deref(), Some("application/json"), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["error"], code, "{text}");
    assert!(
        v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "an error needs a message: {text}"
    );
    v
}

/// A response read off a raw socket.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&self.body));
        })
    }
}

/// What came back on a raw connection.
#[derive(Debug)]
pub enum RawOutcome {
    Response(RawResponse),
    /// The server closed (or reset) the connection without answering.
    Closed,
}

/// Reads one HTTP/1.1 response (headers, then a `Content-Length` body or whatever
/// arrives before the close), waiting at most `limit`. Panics on a timeout.
pub async fn read_response(stream: &mut TcpStream, limit: Duration) -> RawOutcome {
    tokio::time::timeout(limit, read_response_inner(stream))
        .await
        .unwrap_or_else(|_| panic!("no response and no close within {limit:?}"))
}

async fn read_response_inner(stream: &mut TcpStream) -> RawOutcome {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) if buf.is_empty() => return RawOutcome::Closed,
            Ok(0) | Err(_) => panic!(
                "connection closed inside the response head: {:?}",
                String::from_utf8_lossy(&buf)
            ),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).expect("an ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = buf[head_end + 4..].to_vec();
    let length = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse::<usize>().unwrap());
    loop {
        if length.is_some_and(|l| body.len() >= l) {
            break;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    if let Some(l) = length {
        assert_eq!(
            body.len(),
            l,
            "short body: {:?}",
            String::from_utf8_lossy(&body)
        );
    }
    RawOutcome::Response(RawResponse {
        status,
        headers,
        body,
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Sends `request` on a new connection and reads the answer.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> RawOutcome {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    read_response(&mut s, Duration::from_secs(5)).await
}

/// Whether the peer has closed the connection (EOF or reset) within `limit`.
pub async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut b = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// The value of the Prometheus sample whose line starts with `series ` exactly.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

// ---- Changes feed and bulk insert helpers (changes_feed.rs, bulk_insert.rs) ----

/// The sequence part of an etag `"<sequence>-<incarnation>"`; panics on anything else.
pub fn seq_of(etag: &str) -> u64 {
    etag.split_once('-')
        .and_then(|(s, _)| s.parse().ok())
        .unwrap_or_else(|| panic!("not an etag: {etag:?}"))
}

impl Harness {
    /// `GET /dbs/{db}/changes?{query}`; panics unless it answers 200. Returns the body.
    pub async fn changes(&self, db: &str, query: &str) -> Value {
        let r = self
            .http
            .get(self.url(&format!("/dbs/{db}/changes?{query}")))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, StatusCode::OK, "changes?{query}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    /// Every entry of the change log after `since` (an etag or ""), read in pages of
    /// `limit` with `extra` query parameters; also returns the final `last_etag`.
    pub async fn all_changes(
        &self,
        db: &str,
        since: &str,
        limit: usize,
        extra: &str,
    ) -> (Vec<Value>, String) {
        let mut since = since.to_string();
        let mut out = Vec::new();
        for _ in 0..100_000 {
            let page = self
                .changes(db, &format!("since={since}&limit={limit}{extra}"))
                .await;
            let results = page["results"].as_array().unwrap().clone();
            assert!(results.len() <= limit, "a page over its limit: {page}");
            let last = page["last_etag"].as_str().unwrap().to_string();
            if results.is_empty() {
                return (out, last);
            }
            assert_ne!(last, since, "a non-empty page must move last_etag: {page}");
            since = last;
            out.extend(results);
        }
        panic!("the change log never ended");
    }

    /// `DELETE /dbs/{db}/docs/{id}` that must succeed; returns its JSON answer.
    pub async fn delete_ok(&self, db: &str, id: &str) -> Value {
        let r = self.http.delete(self.doc_url(db, id)).send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, StatusCode::OK, "DELETE {id}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// `GET /dbs/{db}` stats' `documents`.
    pub async fn doc_count(&self, db: &str) -> u64 {
        let (status, text) = self.get_text(&format!("/dbs/{db}")).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        v["documents"]
            .as_u64()
            .unwrap_or_else(|| panic!("no document count: {v}"))
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        let (status, text) = self.get_text("/metrics").await;
        assert_eq!(status, StatusCode::OK);
        text
    }
}

// ---- Differential tests (own_loop_matches_router.rs) ----

/// Copies a directory tree (a stopped server's data directory), so that two
/// servers start from byte-identical data: the same databases with the same
/// incarnations, so the same etags, documents and `@last-modified` times.
pub fn copy_dir_all(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir_all(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

impl Harness {
    /// Starts a server on a fresh copy of the (stopped) data directory `seed`.
    pub async fn start_on_copy(seed: &Path, tune: impl FnOnce(&mut ServerConfig)) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        copy_dir_all(seed, dir.path());
        Harness::start_in(dir, tune).await
    }
}
