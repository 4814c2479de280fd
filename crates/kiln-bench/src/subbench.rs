//! W18: data subscriptions against a `kiln serve` child.
//!
//! - Delivery rate: `documents` (~300-byte documents, W10's bulk insert) are in the
//!   collection before the worker connects; one worker (a WebSocket, batches of 1,024)
//!   receives every one of them and acknowledges every batch. Timed from the upgrade
//!   until the acknowledgment of the batch holding the last document is confirmed.
//! - Live delivery latency: the worker then idles; a writer PUTs one matching
//!   document at a time (paced, one in flight) and the time from sending the PUT to
//!   the batch holding it arriving at the worker is recorded (so it includes the
//!   write's durable commit), p50 and p99.
//!
//! - The same against the leader of a three-node cluster (`cluster_` figures), where
//!   every acknowledgment is a Raft round trip: the worker is served by the leader,
//!   which commits each acknowledgment through the log.
//!
//! The load generator is one thread (a current-thread runtime), as in W10/W11.

use crate::httpbench::{self, ServerProcess};
use crate::run::{progress, BenchResult, Run};
use crate::serverbench::fresh_server;
use crate::stats;
use crate::streambench::{bulk_insert, Ws};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Documents per batch the worker asks for.
const BATCH_SIZE: usize = 1024;

/// W18 over `documents` (1,000,000; 100,000 with `quick`).
pub fn w18(dir: &Path, quick: bool, documents: Option<u64>) -> BenchResult<Run> {
    let documents = documents.unwrap_or(if quick { 100_000 } else { 1_000_000 });
    let live_writes: usize = if quick { 200 } else { 1_000 };
    let single = {
        let server = fresh_server(dir)?;
        on_server(&server, documents, live_writes)?
    };
    std::fs::remove_dir_all(dir)?;
    let cluster = crate::clusterbench::BenchCluster::start(&dir.join("cluster"))?;
    let clustered = on_server(cluster.leader(), documents, live_writes)?;
    drop(cluster);
    let mut extra = single.extra(documents, live_writes);
    for (k, v) in clustered.extra(documents, live_writes) {
        if !matches!(k.as_str(), "documents" | "batch_size" | "live_writes") {
            extra.insert(format!("cluster_{k}"), v);
        }
    }
    extra.insert(
        "cluster_ratio_to_single".into(),
        json!(clustered.rate / single.rate),
    );
    Ok(Run {
        ops: documents,
        commits: single.batches,
        seconds: single.seconds,
        extra,
    })
}

/// W18's two parts against `server` (a single node, or a cluster's leader).
fn on_server(server: &ServerProcess, documents: u64, live_writes: usize) -> BenchResult<Figures> {
    // W10's documents: ids `items/<n>`, so the collection is `items`.
    bulk_insert(server, documents)?;
    let create = json!({"name": "w18", "query": "from items"}).to_string();
    let (status, body) = httpbench::blocking_request(
        server.addr,
        "POST",
        "/dbs/bench/subscriptions",
        create.as_bytes(),
    )?;
    if status != 201 {
        return Err(format!(
            "creating the subscription: {status} {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(server, documents, live_writes))
}

struct Figures {
    rate: f64,
    seconds: f64,
    batches: u64,
    latencies_ms: Vec<f64>,
}

impl Figures {
    /// The run's JSON figures.
    fn extra(&self, documents: u64, live_writes: usize) -> Map<String, Value> {
        let mut extra = Map::new();
        extra.insert("documents".into(), documents.into());
        extra.insert("batch_size".into(), (BATCH_SIZE as u64).into());
        extra.insert("batches".into(), self.batches.into());
        extra.insert("delivered_docs_per_sec".into(), json!(self.rate));
        extra.insert("live_writes".into(), (live_writes as u64).into());
        let mut lat = self.latencies_ms.clone();
        lat.sort_by(f64::total_cmp);
        extra.insert(
            "live_latency_p50_ms".into(),
            json!(stats::quantile(&lat, 0.5)),
        );
        extra.insert(
            "live_latency_p99_ms".into(),
            json!(stats::quantile(&lat, 0.99)),
        );
        extra
    }
}

async fn run(server: &ServerProcess, documents: u64, live_writes: usize) -> BenchResult<Figures> {
    let url = format!(
        "ws://{}/dbs/bench/subscriptions/w18/ws?batch_size={BATCH_SIZE}",
        server.addr
    );
    let start = Instant::now();
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await?;
    let pb = progress(documents, "W18 delivery");
    let (received, batches) = bulk_delivery(&mut ws, documents, &pb).await?;
    let seconds = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    if received != documents {
        return Err(format!("delivered {received} documents, expected {documents}").into());
    }
    let latencies_ms = live_delivery(server, &mut ws, live_writes).await?;
    let _ = ws.close(None).await;
    Ok(Figures {
        rate: documents as f64 / seconds,
        seconds,
        batches,
        latencies_ms,
    })
}

/// Bulk delivery: every batch received and acknowledged until every document was
/// received and the last ack confirmed; (documents received, batches).
async fn bulk_delivery(
    ws: &mut Ws,
    documents: u64,
    pb: &indicatif::ProgressBar,
) -> BenchResult<(u64, u64)> {
    let mut received = 0u64;
    let mut batches = 0u64;
    let mut last_acked: Option<u64> = None;
    loop {
        let Some(msg) = ws.next().await else {
            return Err("the server closed the subscription's connection".into());
        };
        let Message::Text(text) = msg? else { continue };
        let v: Value = serde_json::from_str(&text)?;
        match v["type"].as_str() {
            Some("batch") => {
                let n = v["batch"].as_u64().unwrap_or(0);
                received += v["documents"].as_array().map_or(0, |d| d.len() as u64);
                batches += 1;
                pb.set_position(received);
                ws.send(Message::text(format!(r#"{{"op":"ack","batch":{n}}}"#)))
                    .await?;
                if received >= documents {
                    last_acked = Some(n);
                }
            }
            Some("acknowledged") if last_acked.is_some() && v["batch"].as_u64() == last_acked => {
                break
            }
            Some("error") => return Err(format!("the server said {v}").into()),
            _ => {}
        }
    }
    Ok((received, batches))
}

/// Live writes: one at a time, the worker reading on the same thread; the
/// latency of each from sending its PUT to the batch holding it arriving, in ms.
async fn live_delivery(
    server: &ServerProcess,
    ws: &mut Ws,
    live_writes: usize,
) -> BenchResult<Vec<f64>> {
    let mut conn = httpbench::Conn::connect(server.addr).await?;
    let mut sent_at: HashMap<String, Instant> = HashMap::new();
    let mut latencies_ms = Vec::with_capacity(live_writes);
    for i in 0..live_writes {
        let id = format!("items/live-{i}");
        let body = json!({"live": i}).to_string();
        let request = httpbench::request_bytes(
            "PUT",
            &format!("/dbs/bench/docs/{id}"),
            &[("content-type", "application/json")],
            body.as_bytes(),
        );
        sent_at.insert(id.clone(), Instant::now());
        let put = conn.send(&request);
        let mut put = std::pin::pin!(put);
        let mut answered = false;
        let mut delivered = false;
        while !(answered && delivered) {
            tokio::select! {
                r = &mut put, if !answered => {
                    let (status, _) = r?;
                    if status != 201 {
                        return Err(format!("live PUT answered {status}").into());
                    }
                    answered = true;
                }
                msg = ws.next() => {
                    let Some(msg) = msg else {
                        return Err("the server closed the subscription's connection".into());
                    };
                    let Message::Text(text) = msg? else { continue };
                    let v: Value = serde_json::from_str(&text)?;
                    if v["type"] != "batch" {
                        continue;
                    }
                    let now = Instant::now();
                    for d in v["documents"].as_array().into_iter().flatten() {
                        let got = d["@metadata"]["@id"].as_str().unwrap_or("");
                        if let Some(t) = sent_at.remove(got) {
                            latencies_ms.push(now.duration_since(t).as_secs_f64() * 1e3);
                            delivered |= got == id;
                        }
                    }
                    let n = v["batch"].as_u64().unwrap_or(0);
                    ws.send(Message::text(format!(r#"{{"op":"ack","batch":{n}}}"#))).await?;
                }
            }
        }
        // Paced: a live write arrives on an idle subscription, not in a burst.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(latencies_ms)
}
