//! W10 and W11 of shared/BENCHMARKS.md: the streaming parts of the document server.
//!
//! - W10 streams generated ~300-byte documents as NDJSON over ONE connection to
//!   `POST /dbs/{db}/bulk` (a chunked upload written while the acks are read), and
//!   samples the server's RSS while it runs.
//! - W11 holds thousands of idle WebSocket subscribers (heartbeats running) to
//!   measure memory per connection and idle CPU, then measures the time from a PUT's
//!   answer to its change message at a subscriber while W8-style load runs.
//!
//! The load generator is one thread (a current-thread runtime), as in W8/W9, so it
//! takes as little as possible from the server on a 2-core machine.

use crate::httpbench::{self, ServerProcess};
use crate::procstat;
use crate::run::{progress, BenchResult, Run};
use crate::serverbench::{self, doc_1k, fresh_server, fresh_server_with};
use crate::stats;
use crate::workload::SEED;
use futures_util::{SinkExt, StreamExt};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Documents per chunk of the chunked upload (~150 KB).
const UPLOAD_CHUNK_DOCS: u64 = 512;

/// What W10 measured.
pub struct BulkFigures {
    pub documents: u64,
    pub seconds: f64,
    pub extra: Map<String, Value>,
}

/// The payload length of W10's documents: lines of about 300 bytes.
pub const W10_PAYLOAD: usize = 150;

/// W10: one streaming bulk insert of generated ~300-byte documents, with W8 (PUT
/// per request) measured right before in the same run for the ratio.
pub fn w10(
    dir: &Path,
    quick: bool,
    connections: usize,
    documents: Option<u64>,
) -> BenchResult<Run> {
    let w8 = serverbench::w8_http(dir, quick, connections, None)?;
    let documents = documents.unwrap_or(if quick { 100_000 } else { 1_000_000 });
    let server = fresh_server(dir)?;
    let bulk = bulk_insert(&server, documents)?;
    drop(server);
    let mut extra = bulk.extra;
    let rate = bulk.documents as f64 / bulk.seconds;
    extra.insert("w8_requests_per_sec".into(), json!(w8.ops_per_sec()));
    extra.insert("ratio_to_w8".into(), json!(rate / w8.ops_per_sec()));
    Ok(Run {
        ops: bulk.documents,
        commits: extra["acks"].as_u64().unwrap_or(1).max(1),
        seconds: bulk.seconds,
        extra,
    })
}

/// W11: idle WebSocket subscribers (memory per connection, idle CPU with heartbeats),
/// then PUT-answer-to-notification latency with 64 subscribers under W8-style load.
pub fn w11(dir: &Path, quick: bool, connections: Option<usize>) -> BenchResult<Run> {
    // Each subscriber is a socket in this process and one in the server.
    let open_files = raise_open_file_limit();
    let wanted = connections.unwrap_or(if quick { 1_000 } else { 10_000 });
    let idle_connections = wanted.min(open_files.saturating_sub(256) as usize).max(1);
    // --quick shortens the heartbeat so the idle phase sees several in a few seconds.
    let (heartbeat_ms, idle) = if quick {
        (1_000, Duration::from_secs(4))
    } else {
        (5_000, Duration::from_secs(16))
    };
    let hb = heartbeat_ms.to_string();
    let server = fresh_server_with(dir, &["--changes-heartbeat-ms", &hb])?;
    let mut extra = Map::new();
    extra.insert("idle_connections_wanted".into(), json!(wanted));
    extra.insert("open_file_limit".into(), json!(open_files));
    idle_subscribers(&server, idle_connections, idle, heartbeat_ms, &mut extra)?;
    let per_connection = if quick { 50 } else { 200 };
    let mut rng = SmallRng::seed_from_u64(SEED);
    let start = Instant::now();
    notify_latency(&server, 64, per_connection, doc_1k(&mut rng, 0), &mut extra)?;
    let seconds = start.elapsed().as_secs_f64();
    drop(server);
    let ops = extra["live_puts"].as_u64().unwrap_or(0);
    Ok(Run {
        ops,
        commits: ops,
        seconds,
        extra,
    })
}

/// One NDJSON line of about `payload + 150` bytes (W10: ~300, its document ~270),
/// made from `n` alone.
fn bulk_line(rng: &mut SmallRng, n: u64, payload: usize, out: &mut Vec<u8>) {
    let payload: String = (0..payload)
        .map(|_| (b'a' + rng.gen_range(0..26)) as char)
        .collect();
    let line = json!({
        "id": format!("items/{n:09}"),
        "document": {
            "name": format!("item-{n}"),
            "n": n,
            "tag": format!("tag-{}", n % 100),
            "email": format!("user{n}@example.com"),
            "active": !n.is_multiple_of(3),
            "payload": payload,
        }
    });
    serde_json::to_writer(&mut *out, &line).expect("serializable");
    out.push(b'\n');
}

/// RSS of a process in bytes, from /proc.
fn rss_bytes(pid: u32) -> io::Result<u64> {
    procstat::status_bytes(pid, "VmRSS:")
}

/// The anonymous part of a process's RSS: its heap, without the pages of files it
/// maps (the data file is read through a map, and the page cache pages it touches
/// count in VmRSS although the kernel can drop them at will).
fn rss_anon_bytes(pid: u32) -> io::Result<u64> {
    procstat::status_bytes(pid, "RssAnon:")
}

/// Samples a process's RSS (whole and anonymous) every 50 ms on a thread of its own;
/// `finish` returns the highest values seen.
struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<[AtomicU64; 2]>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> io::Result<RssSampler> {
        let peak = Arc::new([
            AtomicU64::new(rss_bytes(pid)?),
            AtomicU64::new(rss_anon_bytes(pid)?),
        ]);
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let (Ok(rss), Ok(anon)) = (rss_bytes(pid), rss_anon_bytes(pid)) {
                    p[0].fetch_max(rss, Ordering::Relaxed);
                    p[1].fetch_max(anon, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Ok(RssSampler {
            stop,
            peak,
            thread: Some(thread),
        })
    }

    /// (peak RSS, peak anonymous RSS)
    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.peak[0].load(Ordering::Relaxed),
            self.peak[1].load(Ordering::Relaxed),
        )
    }
}

/// W10: `documents` generated documents streamed to `/dbs/bench/bulk` of `server`.
pub fn bulk_insert(server: &ServerProcess, documents: u64) -> BenchResult<BulkFigures> {
    bulk_insert_sized(server, documents, W10_PAYLOAD, "W10")
}

/// `documents` generated documents with a random payload of `payload` letters each
/// (a line is ~150 bytes more) streamed to `/dbs/bench/bulk` of `server` (W10, and
/// the data of W14); `label` names the progress bar.
pub fn bulk_insert_sized(
    server: &ServerProcess,
    documents: u64,
    payload: usize,
    label: &str,
) -> BenchResult<BulkFigures> {
    let pid = server.pid();
    let rss_before = rss_bytes(pid)?;
    let anon_before = rss_anon_bytes(pid)?;
    let sampler = RssSampler::start(pid)?;
    let cpu_before = server.cpu_seconds()?;
    let pb = progress(documents, label);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let start = Instant::now();
    let acks = rt.block_on(stream_bulk(server.addr, documents, payload, &pb))?;
    let seconds = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let server_cpu = server.cpu_seconds()? - cpu_before;
    let (peak, peak_anon) = sampler.finish();
    let rss_after = rss_bytes(pid)?;

    let stats = check_bulk_insert(server, &acks, documents)?;
    let mut extra = Map::new();
    extra.insert("documents".into(), json!(documents));
    extra.insert("acks".into(), json!(acks.len()));
    extra.insert(
        "avg_docs_per_ack".into(),
        json!(documents as f64 / acks.len().max(1) as f64),
    );
    extra.insert(
        "peak_rss_growth_bytes".into(),
        json!(peak.saturating_sub(rss_before)),
    );
    extra.insert(
        "peak_rss_anon_growth_bytes".into(),
        json!(peak_anon.saturating_sub(anon_before)),
    );
    extra.insert("rss_before_bytes".into(), json!(rss_before));
    extra.insert("rss_after_bytes".into(), json!(rss_after));
    extra.insert(
        "server_cpu_us_per_doc".into(),
        json!(server_cpu * 1e6 / documents as f64),
    );
    // The rate in each tenth of the insert: a decline past the write buffer or the
    // first checkpoint shows here.
    let tenths = segment_rates(&acks, documents, 10);
    let first = tenths.first().copied().unwrap_or(f64::NAN);
    let last = tenths.last().copied().unwrap_or(f64::NAN);
    extra.insert("docs_per_sec_by_tenth".into(), json!(tenths));
    extra.insert("last_tenth_to_first".into(), json!(last / first));
    for k in [
        "journal_writes",
        "journal_bytes",
        "checkpoints",
        "data_syncs",
    ] {
        extra.insert(k.into(), stats["engine"][k].clone());
    }
    Ok(BulkFigures {
        documents,
        seconds,
        extra,
    })
}

/// Checks that the acks and the database both count all `documents`; the
/// database's statistics (`GET /dbs/bench`).
fn check_bulk_insert(
    server: &ServerProcess,
    acks: &[(f64, u64)],
    documents: u64,
) -> BenchResult<Value> {
    let done = acks.last().map(|a| a.1).unwrap_or(0);
    if done != documents {
        return Err(format!("bulk insert acknowledged {done} of {documents} documents").into());
    }
    let (status, stats) = httpbench::blocking_request(server.addr, "GET", "/dbs/bench", b"")?;
    let stats: Value = serde_json::from_slice(&stats)?;
    if status != 200 || stats["documents"].as_u64() != Some(documents) {
        return Err(format!("after the bulk insert the database reports {stats}").into());
    }
    Ok(stats)
}

/// Documents per second within each of `parts` equal shares of the documents, from
/// the (seconds, acknowledged) points of the acks.
fn segment_rates(acks: &[(f64, u64)], documents: u64, parts: u64) -> Vec<f64> {
    let mut rates = Vec::new();
    let (mut t0, mut n0) = (0.0, 0u64);
    for k in 1..=parts {
        let goal = documents * k / parts;
        if let Some(&(t, n)) = acks.iter().find(|a| a.1 >= goal) {
            if t > t0 {
                rates.push((n - n0) as f64 / (t - t0));
            }
            (t0, n0) = (t, n);
        }
    }
    rates
}

/// Uploads the NDJSON body with chunked encoding while reading the acks; returns the
/// (seconds since start, acknowledged documents) of every ack. Raw HTTP on purpose:
/// W10's load generator, as light on the shared CPU as the one of W8/W9.
async fn stream_bulk(
    addr: SocketAddr,
    documents: u64,
    payload: usize,
    pb: &indicatif::ProgressBar,
) -> BenchResult<Vec<(f64, u64)>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut reader, mut writer) = stream.into_split();
    let upload = async move {
        writer
            .write_all(
                b"POST /dbs/bench/bulk HTTP/1.1\r\nhost: kiln\r\n\
                  content-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n",
            )
            .await?;
        let mut rng = SmallRng::seed_from_u64(SEED);
        let mut lines = Vec::with_capacity(256 << 10);
        let mut n = 0;
        while n < documents {
            lines.clear();
            let end = (n + UPLOAD_CHUNK_DOCS).min(documents);
            while n < end {
                bulk_line(&mut rng, n, payload, &mut lines);
                n += 1;
            }
            let mut chunk = format!("{:x}\r\n", lines.len()).into_bytes();
            chunk.extend_from_slice(&lines);
            chunk.extend_from_slice(b"\r\n");
            writer.write_all(&chunk).await?;
        }
        writer.write_all(b"0\r\n\r\n").await?;
        Ok::<_, io::Error>(writer)
    };
    let start = Instant::now();
    let read_acks = async {
        let mut body = ChunkedLines::default();
        let mut acks = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = reader.read(&mut buf).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the bulk answer before its last line",
                ));
            }
            for line in body.push(&buf[..n])? {
                let v: Value = serde_json::from_slice(&line)
                    .map_err(|e| io::Error::other(format!("bad ack line: {e}")))?;
                if v.get("error").is_some() {
                    return Err(io::Error::other(format!("the bulk insert failed: {v}")));
                }
                let acked = v["acked"].as_u64().unwrap_or(0);
                acks.push((start.elapsed().as_secs_f64(), acked));
                pb.set_position(acked);
                if v.get("done").is_some() {
                    return Ok(acks);
                }
            }
        }
    };
    // The upload and the acks go on at once: the server answers while reading.
    let (uploaded, acks) = tokio::join!(upload, read_acks);
    uploaded?;
    Ok(acks?)
}

/// Decodes an HTTP/1.1 answer with a chunked body into its NDJSON lines.
#[derive(Default)]
struct ChunkedLines {
    raw: Vec<u8>,
    head_done: bool,
    line: Vec<u8>,
}

impl ChunkedLines {
    fn push(&mut self, bytes: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
        self.raw.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut at = 0;
        if !self.head_done {
            let Some(end) = find(&self.raw, b"\r\n\r\n") else {
                return Ok(out);
            };
            let head = String::from_utf8_lossy(&self.raw[..end]).to_string();
            if !head.starts_with("HTTP/1.1 200") {
                return Err(bad(format!("bulk answer: {head}")));
            }
            self.head_done = true;
            at = end + 4;
        }
        while let Some(eol) = find(&self.raw[at..], b"\r\n") {
            let size_text = String::from_utf8_lossy(&self.raw[at..at + eol]).to_string();
            let size = usize::from_str_radix(size_text.trim(), 16)
                .map_err(|_| bad(format!("bad chunk size {size_text:?}")))?;
            let data = at + eol + 2;
            if self.raw.len() < data + size + 2 {
                break;
            }
            for &b in &self.raw[data..data + size] {
                if b == b'\n' {
                    out.push(std::mem::take(&mut self.line));
                } else {
                    self.line.push(b);
                }
            }
            at = data + size + 2;
            if size == 0 {
                break;
            }
        }
        self.raw.drain(..at);
        Ok(out)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A WebSocket client connection (W11's subscribers, W18's worker).
pub(crate) type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn ws_subscribe(addr: SocketAddr, subscribe: &Value) -> BenchResult<Ws> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut ws, _) = tokio_tungstenite::client_async(
        format!("ws://{addr}/dbs/bench/changes/ws"),
        MaybeTlsStream::Plain(stream),
    )
    .await?;
    ws.send(Message::Text(subscribe.to_string().into())).await?;
    loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            Err(_) => return Err("no answer to a subscribe within 30 s".into()),
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(t.as_str())?;
                if v["type"] == "subscribed" {
                    return Ok(ws);
                }
                if v["type"] == "error" {
                    return Err(format!("subscribe refused: {v}").into());
                }
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) => return Err("the server closed a WebSocket at subscribe".into()),
        }
    }
}

/// Raises this process's open-file limit to its hard limit (children inherit it) and
/// returns it.
pub fn raise_open_file_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid resource and a pointer to a valid struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
        lim.rlim_cur
    }
}

/// W11 part 1: `connections` idle subscribers; server memory per connection and its
/// CPU while idle for `idle` with heartbeats every `heartbeat_ms`.
pub fn idle_subscribers(
    server: &ServerProcess,
    connections: usize,
    idle: Duration,
    heartbeat_ms: u64,
    extra: &mut Map<String, Value>,
) -> BenchResult<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pb = progress(connections as u64, "W11 idle");
    rt.block_on(async {
        let sockets = open_idle_subscribers(server, connections, &pb, extra).await?;
        idle_with_heartbeats(server, sockets, connections, idle, heartbeat_ms, extra).await
    })
}

/// Opens `connections` subscribers to every change; the server's memory before
/// and after them, and the time they took to open, into `extra`.
async fn open_idle_subscribers(
    server: &ServerProcess,
    connections: usize,
    pb: &indicatif::ProgressBar,
    extra: &mut Map<String, Value>,
) -> BenchResult<Vec<Ws>> {
    let pid = server.pid();
    // One subscriber first, so that what every connection shares (the database's
    // hub, its task) is not counted per connection.
    let everything = json!({"op": "subscribe", "sub": "all"});
    let first = ws_subscribe(server.addr, &everything).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_before = rss_bytes(pid)?;
    let mut sockets = Vec::with_capacity(connections);
    sockets.push(first);
    let connect_start = Instant::now();
    while sockets.len() < connections {
        // A few handshakes in flight at a time.
        let batch = (connections - sockets.len()).min(64);
        let opened = futures_util::future::join_all(
            (0..batch).map(|_| ws_subscribe(server.addr, &everything)),
        )
        .await;
        for ws in opened {
            sockets.push(ws?);
        }
        pb.set_position(sockets.len() as u64);
    }
    pb.finish_and_clear();
    let connect_seconds = connect_start.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = rss_bytes(pid)?;
    let per_connection =
        rss_after.saturating_sub(rss_before) as f64 / (connections - 1).max(1) as f64;
    extra.insert("idle_connections".into(), json!(connections));
    extra.insert("connect_seconds".into(), json!(connect_seconds));
    extra.insert("bytes_per_connection".into(), json!(per_connection));
    extra.insert("rss_before_bytes".into(), json!(rss_before));
    extra.insert("rss_with_connections_bytes".into(), json!(rss_after));
    Ok(sockets)
}

/// Idle: every connection of `sockets` (`connections` of them) reads (and
/// counts) its heartbeats for `idle`; the server's CPU meanwhile and the
/// heartbeats per connection into `extra`. Fails if a connection missed its
/// heartbeats.
async fn idle_with_heartbeats(
    server: &ServerProcess,
    sockets: Vec<Ws>,
    connections: usize,
    idle: Duration,
    heartbeat_ms: u64,
    extra: &mut Map<String, Value>,
) -> BenchResult<()> {
    let heartbeats = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = sockets
        .into_iter()
        .map(|mut ws| {
            let beats = heartbeats.clone();
            tokio::spawn(async move {
                while let Some(Ok(m)) = ws.next().await {
                    if let Message::Text(t) = m {
                        if t.as_str().contains("\"heartbeat\"") {
                            beats.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let cpu_before = server.cpu_seconds()?;
    let t = Instant::now();
    tokio::time::sleep(idle).await;
    let cpu = server.cpu_seconds()? - cpu_before;
    let wall = t.elapsed().as_secs_f64();
    let beats = heartbeats.load(Ordering::Relaxed);
    extra.insert("idle_seconds".into(), json!(wall));
    extra.insert("idle_cpu_percent".into(), json!(cpu / wall * 100.0));
    extra.insert("heartbeat_ms".into(), json!(heartbeat_ms));
    let per_connection = beats as f64 / connections as f64;
    extra.insert("heartbeats_per_connection".into(), json!(per_connection));
    // Each connection must have had its heartbeats: a figure of idle CPU without
    // them would measure nothing.
    let expected = (wall * 1e3 / heartbeat_ms as f64).floor() - 1.0;
    if per_connection < expected {
        return Err(format!(
            "{beats} heartbeats over {connections} connections in {wall:.1} s \
             (expected at least {expected} each)"
        )
        .into());
    }
    for r in readers {
        r.abort();
    }
    Ok(())
}

/// W11 part 2: `connections` subscribers, each watching the documents of one of
/// `connections` PUT connections (prefix `users/{c}-`), `per_connection` PUTs each;
/// the time from a PUT's answer to the arrival of its change message.
pub fn notify_latency(
    server: &ServerProcess,
    connections: usize,
    per_connection: usize,
    body: Vec<u8>,
    extra: &mut Map<String, Value>,
) -> BenchResult<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let load = LiveLoad {
        addr: server.addr,
        connections,
        per_connection,
    };
    let total = load.puts();
    let answered: Stamps = Arc::new(Mutex::new(vec![None; total]));
    let notified: Stamps = Arc::new(Mutex::new(vec![None; total]));
    let pb = progress(total as u64, "W11 live");
    let body = Arc::new(body);
    let (requests, seconds) = rt.block_on(async {
        let readers = subscribe_every_connection(load, &notified).await?;
        let start = Instant::now();
        put_from_every_connection(load, &body, &answered, &pb).await?;
        let seconds = start.elapsed().as_secs_f64();
        // Every change must arrive; give the last ones a moment.
        wait_for_every_change(&notified, Instant::now() + Duration::from_secs(10)).await;
        for r in readers {
            r.abort();
        }
        Ok::<_, Box<dyn std::error::Error>>((total, seconds))
    })?;
    pb.finish_and_clear();
    let answered = answered.lock().expect("not poisoned");
    let notified = notified.lock().expect("not poisoned");
    let missing = notified.iter().filter(|n| n.is_none()).count();
    if missing > 0 {
        return Err(format!("{missing} of {total} changes never reached their subscriber").into());
    }
    let deltas_us = answer_to_change_us(&answered, &notified);
    let q = |p: f64| stats::quantile(&deltas_us, p).unwrap_or(f64::NAN) / 1e3;
    extra.insert("live_subscribers".into(), json!(connections));
    extra.insert("live_puts".into(), json!(requests));
    extra.insert("live_puts_per_sec".into(), json!(requests as f64 / seconds));
    extra.insert("notify_p50_ms".into(), json!(q(0.5)));
    extra.insert("notify_p99_ms".into(), json!(q(0.99)));
    extra.insert("notify_max_ms".into(), json!(q(1.0)));
    extra.insert(
        "notified_before_answer_fraction".into(),
        json!(deltas_us.iter().filter(|d| **d < 0.0).count() as f64 / deltas_us.len() as f64),
    );
    Ok(())
}

/// W11 part 2's PUTs: PUT `i` of connection `c` writes document `users/{c}-{i}`,
/// whose times go to slot `c * per_connection + i` of the [`Stamps`].
#[derive(Clone, Copy)]
struct LiveLoad {
    addr: SocketAddr,
    connections: usize,
    per_connection: usize,
}

impl LiveLoad {
    fn puts(self) -> usize {
        self.connections * self.per_connection
    }
}

/// An instant per PUT, by slot: when its answer was read, or when its change
/// reached its subscriber (the first time, if it came twice).
type Stamps = Arc<Mutex<Vec<Option<Instant>>>>;

/// One subscriber per PUT connection, each on a task of its own that stamps when
/// its changes arrive.
async fn subscribe_every_connection(
    load: LiveLoad,
    notified: &Stamps,
) -> BenchResult<Vec<tokio::task::JoinHandle<()>>> {
    let mut subscribers = Vec::with_capacity(load.connections);
    for c in 0..load.connections {
        let sub =
            json!({"op": "subscribe", "sub": format!("c{c}"), "prefix": format!("users/{c}-")});
        subscribers.push(ws_subscribe(load.addr, &sub).await?);
    }
    Ok(subscribers
        .into_iter()
        .map(|ws| {
            tokio::spawn(stamp_change_arrivals(
                ws,
                notified.clone(),
                load.per_connection,
            ))
        })
        .collect())
}

/// A subscriber's reader: stamps each change of a W11 document when it arrives,
/// before parsing it, so that the parse is not counted in the latency.
async fn stamp_change_arrivals(mut ws: Ws, notified: Stamps, per_connection: usize) {
    while let Some(Ok(m)) = ws.next().await {
        let Message::Text(t) = m else { continue };
        let arrived = Instant::now();
        let Ok(v) = serde_json::from_str::<Value>(t.as_str()) else {
            continue;
        };
        if let Some(i) = v["id"]
            .as_str()
            .and_then(|id| parse_w11_id(id, per_connection))
        {
            if let Some(slot) = notified.lock().expect("not poisoned").get_mut(i) {
                slot.get_or_insert(arrived);
            }
        }
    }
}

/// Every connection's PUTs, the connections concurrently; the first error fails.
async fn put_from_every_connection(
    load: LiveLoad,
    body: &Arc<Vec<u8>>,
    answered: &Stamps,
    pb: &indicatif::ProgressBar,
) -> BenchResult<()> {
    let writers: Vec<_> = (0..load.connections)
        .map(|c| {
            tokio::spawn(put_documents(
                load,
                c,
                body.clone(),
                answered.clone(),
                pb.clone(),
            ))
        })
        .collect();
    for w in writers {
        w.await.map_err(io::Error::other)??;
    }
    Ok(())
}

/// Connection `c`'s PUTs, one after the other, each stamped when its answer is read.
async fn put_documents(
    load: LiveLoad,
    c: usize,
    body: Arc<Vec<u8>>,
    answered: Stamps,
    pb: indicatif::ProgressBar,
) -> io::Result<()> {
    let mut conn = httpbench::Conn::connect(load.addr).await?;
    for i in 0..load.per_connection {
        let req = httpbench::request_bytes(
            "PUT",
            &format!("/dbs/bench/docs/users/{c}-{i}"),
            &[("content-type", "application/json")],
            &body,
        );
        let (status, answer) = conn.send(&req).await?;
        let at = Instant::now();
        if status != 201 {
            return Err(io::Error::other(format!(
                "PUT answered {status}: {}",
                String::from_utf8_lossy(&answer)
            )));
        }
        answered.lock().expect("not poisoned")[c * load.per_connection + i] = Some(at);
        if i % 16 == 15 {
            pb.inc(16);
        }
    }
    Ok(())
}

/// Until every slot is stamped or `deadline` passes, polling every 20 ms.
async fn wait_for_every_change(notified: &Stamps, deadline: Instant) {
    while notified
        .lock()
        .expect("not poisoned")
        .iter()
        .any(Option::is_none)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each PUT's time from its answer to its change's arrival, in microseconds,
/// sorted. Signed: a notification may arrive before the PUT's own answer is read.
fn answer_to_change_us(answered: &[Option<Instant>], notified: &[Option<Instant>]) -> Vec<f64> {
    let mut deltas_us: Vec<f64> = answered
        .iter()
        .zip(notified.iter())
        .filter_map(|(a, n)| {
            let (a, n) = ((*a)?, (*n)?);
            Some(if n >= a {
                (n - a).as_secs_f64() * 1e6
            } else {
                -((a - n).as_secs_f64() * 1e6)
            })
        })
        .collect();
    deltas_us.sort_by(f64::total_cmp);
    deltas_us
}

/// `users/{c}-{i}` -> its slot.
fn parse_w11_id(id: &str, per_connection: usize) -> Option<usize> {
    let (c, i) = id.strip_prefix("users/")?.split_once('-')?;
    let (c, i): (usize, usize) = (c.parse().ok()?, i.parse().ok()?);
    (i < per_connection).then_some(c * per_connection + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_lines_are_decoded_across_any_split() {
        let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
            6\r\n{\"a\":1\r\n3\r\n}\n{\r\nb\r\n\"done\":true\r\n1\r\n}\r\n1\r\n\n\r\n0\r\n\r\n";
        for split in 1..answer.len() {
            let mut d = ChunkedLines::default();
            let mut lines = d.push(&answer[..split]).unwrap();
            lines.extend(d.push(&answer[split..]).unwrap());
            assert_eq!(
                lines,
                vec![b"{\"a\":1}".to_vec(), b"{\"done\":true}".to_vec()],
                "split at {split}"
            );
        }
    }

    #[test]
    fn segment_rates_split_by_documents() {
        let acks = [(0.5, 50), (1.0, 100), (3.0, 200)];
        assert_eq!(segment_rates(&acks, 200, 2), vec![100.0, 50.0]);
    }

    #[test]
    fn bulk_lines_are_about_300_bytes() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut out = Vec::new();
        bulk_line(&mut rng, 123_456, W10_PAYLOAD, &mut out);
        assert!((250..350).contains(&out.len()), "{}", out.len());
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(parse_w11_id("users/12-7", 100), Some(1207));
        assert_eq!(parse_w11_id("users/12-700", 100), None);
    }
}
