//! SOAK's mixed load beside YCSB A (issue 55), against the same `kiln serve` and
//! database (`ycsb`):
//! - an index over `field0` of every document (`soak-field0`) and a query that uses
//!   it every 100 ms (`from index 'soak-field0' where field0 startsWith $p limit
//!   10`, a random two-character prefix), timed;
//! - a changes-feed reader on the WebSocket (`/changes/ws`, everything, live),
//!   counting changes and keeping the last etag it saw;
//! - a data subscription (`from soak`) and one worker acknowledging its batches;
//!   the documents of collection `soak` are written by a writer (a PATCH of one of
//!   256 documents every 20 ms: YCSB's ids have no `/`, so they are in no
//!   collection a subscription could follow) and by the attachments below;
//! - a full backup every `backup_interval` seconds (the first half an interval in,
//!   so the baseline interval has one too), streamed to a file beside the data
//!   directory and deleted, timed;
//! - every second a 4-7 KiB attachment put on one of 64 `soak/att-N` documents
//!   (replacing the one it had, so the attachments' bytes stay bounded) and read
//!   back, byte for byte.
//!
//! A failure of one of them (an error answer, wrong bytes, a WebSocket closed) is
//! recorded with its minute and ends that load; the soak goes on and fails at the
//! end naming it.

use crate::ycsb::KilnConn;
use anyhow::{anyhow, bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// The YCSB database (bench/src/ycsb.rs's `KILN_DB`).
pub(crate) const DB: &str = "ycsb";
const INDEX: &str = "soak-field0";
const SUBSCRIPTION: &str = "soak-sub";
const WRITER_DOCS: u64 = 256;
const ATTACHMENT_DOCS: u64 = 64;
const QUERY_EVERY: Duration = Duration::from_millis(100);
const WRITE_EVERY: Duration = Duration::from_millis(20);
const ATTACH_EVERY: Duration = Duration::from_secs(1);
/// How long the changes reader may take, once the writes have stopped, to reach
/// the database's last etag.
pub(crate) const DRAIN: Duration = Duration::from_secs(10);

/// What the side loads did: the interval's part (taken by the sampler) and totals.
#[derive(Default)]
pub(crate) struct Side {
    pub t0: Cell<Option<Instant>>,
    query_lat: RefCell<Vec<u32>>,
    backups: Cell<u64>,
    backup_secs: RefCell<Vec<f64>>,
    backup_bytes: Cell<u64>,
    changes: Cell<u64>,
    pub changes_total: Cell<u64>,
    /// The sequence of the last etag the changes reader saw.
    pub last_change_seq: Cell<u64>,
    sub_docs: Cell<u64>,
    pub sub_docs_total: Cell<u64>,
    attachment_ops: Cell<u64>,
    soak_writes: Cell<u64>,
    pub backups_total: Cell<u64>,
    pub failures: RefCell<Vec<String>>,
}

/// The side loads' figures of one interval.
#[derive(Debug, Default, Clone)]
pub(crate) struct SideInterval {
    /// Query latencies (µs), sorted.
    pub query_lat: Vec<u32>,
    pub backups: u64,
    /// The longest backup that ended in the interval (s).
    pub backup_max_secs: f64,
    pub backup_bytes: u64,
    pub changes: u64,
    pub sub_docs: u64,
    pub attachment_ops: u64,
    pub soak_writes: u64,
}

impl Side {
    pub(crate) fn take_interval(&self) -> SideInterval {
        let mut query_lat = std::mem::take(&mut *self.query_lat.borrow_mut());
        query_lat.sort_unstable();
        let secs = std::mem::take(&mut *self.backup_secs.borrow_mut());
        SideInterval {
            query_lat,
            backups: self.backups.take(),
            backup_max_secs: secs.iter().copied().fold(0.0, f64::max),
            backup_bytes: self.backup_bytes.take(),
            changes: self.changes.take(),
            sub_docs: self.sub_docs.take(),
            attachment_ops: self.attachment_ops.take(),
            soak_writes: self.soak_writes.take(),
        }
    }

    fn minute(&self) -> f64 {
        self.t0
            .get()
            .map_or(0.0, |t| t.elapsed().as_secs_f64() / 60.0)
    }

    /// Records that `what` failed (and so stopped).
    fn fail(&self, what: &str, e: &anyhow::Error) {
        let msg = format!(
            "{what} failed at minute {:.2}: {}",
            self.minute(),
            format!("{e:#}").replace('\n', " ")
        );
        eprintln!("SOAK: {msg}");
        self.failures.borrow_mut().push(msg);
    }
}

fn micros(t: Instant) -> u32 {
    t.elapsed().as_micros().min(u32::MAX as u128) as u32
}

/// The sequence of an etag (`<sequence>-<incarnation>`, maybe quoted).
fn etag_seq(etag: &str) -> Option<u64> {
    etag.trim_matches('"').split('-').next()?.parse().ok()
}

/// Sleeps until `deadline`, or less once `stop` is set.
async fn sleep_until(deadline: Instant, stop: &Cell<bool>) {
    while !stop.get() {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        tokio::time::sleep((deadline - now).min(Duration::from_millis(200))).await;
    }
}

/// The index, filled; the documents of collection `soak`; the subscription.
pub(crate) async fn setup(port: u16) -> Result<()> {
    let mut c = KilnConn::connect(port).await?;
    let t = Instant::now();
    let def = serde_json::to_vec(&json!({ "fields": ["field0"] }))?;
    c.expect(
        hyper::Method::PUT,
        &format!("/dbs/{DB}/indexes/{INDEX}"),
        Some("application/json"),
        def,
        &[200, 201],
    )
    .await?;
    // Wait for it to cover the load, so that the first interval is the soak's.
    let body = query_body("a", Some(30_000))?;
    let answer = c
        .expect(
            hyper::Method::POST,
            &format!("/dbs/{DB}/queries"),
            Some("application/json"),
            body,
            &[200],
        )
        .await?;
    let v: Value = serde_json::from_slice(&answer)?;
    if v["stale"] == json!(true) {
        bail!("index {INDEX} was still stale after 30 s");
    }
    for i in 0..WRITER_DOCS {
        c.expect(
            hyper::Method::PUT,
            &format!("/dbs/{DB}/docs/soak/w-{i}"),
            Some("application/json"),
            serde_json::to_vec(&json!({ "n": 0 }))?,
            &[200, 201],
        )
        .await?;
    }
    for i in 0..ATTACHMENT_DOCS {
        c.expect(
            hyper::Method::PUT,
            &format!("/dbs/{DB}/docs/soak/att-{i}"),
            Some("application/json"),
            serde_json::to_vec(&json!({ "k": i }))?,
            &[200, 201],
        )
        .await?;
    }
    c.expect(
        hyper::Method::POST,
        &format!("/dbs/{DB}/subscriptions"),
        Some("application/json"),
        serde_json::to_vec(&json!({ "name": SUBSCRIPTION, "query": "from soak" }))?,
        &[201],
    )
    .await?;
    eprintln!(
        "SOAK: index {INDEX} filled and {} soak documents written in {:.1} s; subscription {SUBSCRIPTION} made",
        WRITER_DOCS + ATTACHMENT_DOCS,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn query_body(prefix: &str, wait_ms: Option<u64>) -> Result<Vec<u8>> {
    let mut q = json!({
        "query": format!("from index '{INDEX}' where field0 startsWith $p limit 10"),
        "params": { "p": prefix },
    });
    if let Some(ms) = wait_ms {
        q["wait_for_non_stale_ms"] = json!(ms);
    }
    Ok(serde_json::to_vec(&q)?)
}

/// A query every 100 ms until `stop`, each one's latency in `side`.
pub(crate) async fn queries(port: u16, seed: u64, side: &Side, stop: &Cell<bool>) {
    if let Err(e) = queries_inner(port, seed, side, stop).await {
        side.fail("the index query", &e);
    }
}

async fn queries_inner(port: u16, seed: u64, side: &Side, stop: &Cell<bool>) -> Result<()> {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x51);
    let mut c = KilnConn::connect(port).await?;
    let mut next = Instant::now();
    while !stop.get() {
        let p: String = (0..2)
            .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
            .collect();
        let t = Instant::now();
        let answer = c
            .expect(
                hyper::Method::POST,
                &format!("/dbs/{DB}/queries"),
                Some("application/json"),
                query_body(&p, None)?,
                &[200],
            )
            .await?;
        let lat = micros(t);
        let v: Value = serde_json::from_slice(&answer)?;
        if v["index"].as_str() != Some(INDEX) || !v["results"].is_array() {
            bail!(
                "the query was not answered from {INDEX}: {}",
                String::from_utf8_lossy(&answer[..answer.len().min(200)])
            );
        }
        side.query_lat.borrow_mut().push(lat);
        next += QUERY_EVERY;
        sleep_until(next, stop).await;
    }
    Ok(())
}

/// A PATCH of one of the `soak/w-N` documents every 20 ms until `stop` (what
/// the subscription delivers).
pub(crate) async fn soak_writer(port: u16, side: &Side, stop: &Cell<bool>) {
    if let Err(e) = soak_writer_inner(port, side, stop).await {
        side.fail("the soak collection's writer", &e);
    }
}

async fn soak_writer_inner(port: u16, side: &Side, stop: &Cell<bool>) -> Result<()> {
    let mut c = KilnConn::connect(port).await?;
    let mut next = Instant::now();
    let mut n = 0u64;
    while !stop.get() {
        n += 1;
        c.expect(
            hyper::Method::PATCH,
            &format!("/dbs/{DB}/docs/soak/w-{}", n % WRITER_DOCS),
            Some("application/merge-patch+json"),
            serde_json::to_vec(&json!({ "n": n }))?,
            &[200],
        )
        .await?;
        side.soak_writes.set(side.soak_writes.get() + 1);
        next += WRITE_EVERY;
        sleep_until(next, stop).await;
    }
    Ok(())
}

/// Every second an attachment put and read back until `stop`.
pub(crate) async fn attachments(port: u16, seed: u64, side: &Side, stop: &Cell<bool>) {
    if let Err(e) = attachments_inner(port, seed, side, stop).await {
        side.fail("attachments", &e);
    }
}

async fn attachments_inner(port: u16, seed: u64, side: &Side, stop: &Cell<bool>) -> Result<()> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xa7);
    let mut c = KilnConn::connect(port).await?;
    let mut next = Instant::now();
    let mut n = 0u64;
    while !stop.get() {
        let path = format!(
            "/dbs/{DB}/docs/soak/att-{}/attachments/blob.bin",
            n % ATTACHMENT_DOCS
        );
        let mut bytes = vec![0u8; 4096 + (n % 4) as usize * 1024];
        rng.fill_bytes(&mut bytes);
        c.expect(
            hyper::Method::PUT,
            &path,
            Some("application/octet-stream"),
            bytes.clone(),
            &[200, 201],
        )
        .await?;
        let back = c
            .expect(hyper::Method::GET, &path, None, Vec::new(), &[200])
            .await?;
        if back[..] != bytes[..] {
            bail!(
                "GET {path} answered {} bytes that are not the {} put",
                back.len(),
                bytes.len()
            );
        }
        side.attachment_ops.set(side.attachment_ops.get() + 2);
        n += 1;
        next += ATTACH_EVERY;
        sleep_until(next, stop).await;
    }
    Ok(())
}

/// A full backup half an interval in, then every `every` seconds, until `stop`;
/// each streamed to `dir/soak-backup.kbak`, timed, then deleted.
pub(crate) async fn backups(
    port: u16,
    dir: &Path,
    first: Duration,
    every: Duration,
    side: &Side,
    stop: &Cell<bool>,
) {
    let file = dir.join("soak-backup.kbak");
    let start = Instant::now();
    let mut due = start + first;
    loop {
        sleep_until(due, stop).await;
        if stop.get() {
            return;
        }
        let t = Instant::now();
        match backup_once(port, &file).await {
            Ok(bytes) => {
                side.backups.set(side.backups.get() + 1);
                side.backups_total.set(side.backups_total.get() + 1);
                side.backup_secs
                    .borrow_mut()
                    .push(t.elapsed().as_secs_f64());
                side.backup_bytes.set(bytes);
                let _ = std::fs::remove_file(&file);
            }
            Err(e) => {
                let _ = std::fs::remove_file(&file);
                side.fail("a backup", &e);
                return;
            }
        }
        due += every;
    }
}

/// One `GET /dbs/{db}/backup` streamed to `file`: its bytes.
async fn backup_once(port: u16, file: &PathBuf) -> Result<u64> {
    use http_body_util::BodyExt;
    use std::io::Write;
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Empty<bytes::Bytes>,
    >(hyper_util::rt::TokioIo::new(stream))
    .await?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    let req = hyper::Request::get(format!("/dbs/{DB}/backup"))
        .header(hyper::header::HOST, "127.0.0.1")
        .body(http_body_util::Empty::new())?;
    let resp = send.send_request(req).await?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    if status != 200 {
        let text = body.collect().await?.to_bytes();
        bail!(
            "GET /dbs/{DB}/backup: {status} {}",
            String::from_utf8_lossy(&text[..text.len().min(300)])
        );
    }
    let mut out = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(file).with_context(|| format!("creating {}", file.display()))?,
    );
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.context("the backup's body broke off")?;
        if let Ok(data) = frame.into_data() {
            out.write_all(&data)?;
            n += data.len() as u64;
        }
    }
    out.flush()?;
    if n == 0 {
        bail!("GET /dbs/{DB}/backup answered an empty body");
    }
    Ok(n)
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_connect(port: u16, path: &str) -> Result<Ws> {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port}{path}"))
        .await
        .with_context(|| format!("WebSocket {path}"))?;
    Ok(ws)
}

/// The next text frame as JSON; `None` once `done` is set and nothing came for
/// 250 ms; an error if the connection closed or broke.
async fn next_json(ws: &mut Ws, done: &Cell<bool>) -> Result<Option<Value>> {
    loop {
        let msg = match tokio::time::timeout(Duration::from_millis(250), ws.next()).await {
            Err(_) if done.get() => return Ok(None),
            Err(_) => continue,
            Ok(None) => bail!("the connection ended"),
            Ok(Some(m)) => m.context("the connection broke")?,
        };
        match msg {
            Message::Text(t) => return Ok(Some(serde_json::from_str(t.as_str())?)),
            Message::Close(f) => bail!(
                "closed by the server: {}",
                f.map_or("no close frame".into(), |f| format!(
                    "{} {}",
                    u16::from(f.code),
                    f.reason
                ))
            ),
            _ => {}
        }
    }
}

/// The changes feed's reader: everything, live, until `done`.
pub(crate) async fn changes_reader(port: u16, side: &Side, done: &Cell<bool>) {
    if let Err(e) = changes_reader_inner(port, side, done).await {
        side.fail("the changes-feed reader", &e);
    }
}

async fn changes_reader_inner(port: u16, side: &Side, done: &Cell<bool>) -> Result<()> {
    let mut ws = ws_connect(port, &format!("/dbs/{DB}/changes/ws")).await?;
    ws.send(Message::text(
        json!({ "op": "subscribe", "sub": "soak" }).to_string(),
    ))
    .await?;
    while let Some(v) = next_json(&mut ws, done).await? {
        match v["type"].as_str() {
            Some("change") => {
                side.changes.set(side.changes.get() + 1);
                side.changes_total.set(side.changes_total.get() + 1);
                if let Some(seq) = v["etag"].as_str().and_then(etag_seq) {
                    side.last_change_seq
                        .set(side.last_change_seq.get().max(seq));
                }
            }
            Some("error") => bail!("error frame: {v}"),
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    Ok(())
}

/// The data subscription's worker: each batch counted, then acknowledged, until
/// `done`.
pub(crate) async fn subscription_worker(port: u16, side: &Side, done: &Cell<bool>) {
    if let Err(e) = subscription_worker_inner(port, side, done).await {
        side.fail("the subscription worker", &e);
    }
}

async fn subscription_worker_inner(port: u16, side: &Side, done: &Cell<bool>) -> Result<()> {
    let mut ws = ws_connect(
        port,
        &format!("/dbs/{DB}/subscriptions/{SUBSCRIPTION}/ws?batch_size=256"),
    )
    .await?;
    let mut pending = 0u64;
    while let Some(v) = next_json(&mut ws, done).await? {
        match v["type"].as_str() {
            Some("batch") => {
                let batch = v["batch"]
                    .as_u64()
                    .ok_or_else(|| anyhow!("a batch without a number: {v}"))?;
                pending = v["documents"].as_array().map_or(0, |d| d.len() as u64);
                ws.send(Message::text(
                    json!({ "op": "ack", "batch": batch }).to_string(),
                ))
                .await?;
            }
            Some("acknowledged") => {
                side.sub_docs.set(side.sub_docs.get() + pending);
                side.sub_docs_total.set(side.sub_docs_total.get() + pending);
                pending = 0;
            }
            Some("error") => bail!("error frame: {v}"),
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    Ok(())
}

/// The sequence of the database's last etag.
pub(crate) async fn database_seq(port: u16) -> Result<u64> {
    let mut c = KilnConn::connect(port).await?;
    let body = c
        .expect(
            hyper::Method::GET,
            &format!("/dbs/{DB}"),
            None,
            Vec::new(),
            &[200],
        )
        .await?;
    let v: Value = serde_json::from_slice(&body)?;
    v["last_etag"]
        .as_str()
        .and_then(etag_seq)
        .ok_or_else(|| anyhow!("GET /dbs/{DB} has no last_etag: {v}"))
}
