//! A data subscription while `kiln serve` is SIGKILLed and its worker dies at random
//! points (before it acknowledges a batch, or right after it sent the
//! acknowledgment): a writer puts and rewrites documents all along, and at the end
//! - every document whose last version matches was processed (acknowledged by the
//!   worker) at exactly that version's etag: none skipped;
//! - every acknowledged matching write was processed at its etag or a later one of
//!   the same document (a document written again before delivery is delivered once,
//!   at its latest etag);
//! - on every connection the batches come in etag order, after the position the
//!   server announced;
//! - the position a (re)connecting worker is given is one the worker acknowledged
//!   (never a batch it did not acknowledge) and never behind one the server
//!   confirmed.
//!
//! Cycles: `KILN_SUBSCRIPTION_CRASH_CYCLES` (default 2, the fast tier; the slow
//! tier runs more).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::subscription_worker::{documents, sequence, Said, Worker};
use common::{cycles_from_env, free_port, kill9, request, spawn_serve_with};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SERVE_OPTIONS: [&str; 2] = ["--changes-heartbeat-ms", "200"];

#[derive(Default)]
struct Seen {
    /// Acknowledged writes: id -> (etag sequence, matches the filter).
    writes: BTreeMap<String, Vec<(u64, bool)>>,
    /// Documents of batches the worker acknowledged (processed): id -> sequences.
    processed: BTreeMap<String, BTreeSet<u64>>,
    /// Every `up_to` (as a sequence) the worker sent an acknowledgment for.
    acks_sent: BTreeSet<u64>,
    /// The highest position the server confirmed (`acknowledged`).
    confirmed: u64,
    connections: u64,
    batches: u64,
    worker_deaths: u64,
}

/// A PUT that reports a connection failure (the server is down) as `None`.
fn try_put(port: u16, path: &str, body: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "PUT {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    Some((status, out.split("\r\n\r\n").nth(1)?.to_string()))
}

fn writer(port: u16, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>, seed: u64) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    while !stop.load(Ordering::SeqCst) {
        let (id, keep) = if rng.gen_bool(0.85) {
            (
                format!("orders/{}", rng.gen_range(0..300)),
                rng.gen_bool(0.8),
            )
        } else {
            (format!("users/{}", rng.gen_range(0..50)), true)
        };
        let body = format!(
            r#"{{"keep": {keep}, "pad": "{}"}}"#,
            "x".repeat(rng.gen_range(0..200))
        );
        let answer = try_put(port, &format!("/dbs/shop/docs/{id}"), &body);
        match answer {
            Some((200 | 201, text)) => {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                let seq = sequence(v["etag"].as_str().unwrap());
                let matches = id.starts_with("orders/") && keep;
                seen.lock()
                    .unwrap()
                    .writes
                    .entry(id)
                    .or_default()
                    .push((seq, matches));
            }
            // The server is down or restarting: the outcome is unknown, not recorded.
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn worker(port: u16, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>, seed: u64) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    while !stop.load(Ordering::SeqCst) {
        let size = rng.gen_range(1..40);
        let Ok(mut w) = Worker::connect(
            port,
            "shop",
            "s",
            &format!("batch_size={size}&strategy=take_over"),
        ) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let Said::Json(hello) = w.next(Duration::from_secs(5)) else {
            continue; // the server died during the handshake
        };
        assert_eq!(hello["type"], "subscribed", "{hello}");
        let position = hello["position"].as_str().map_or(0, sequence);
        {
            let mut s = seen.lock().unwrap();
            s.connections += 1;
            assert!(
                position == 0 || s.acks_sent.contains(&position),
                "the server gave position {position}, which the worker never acknowledged"
            );
            assert!(
                position >= s.confirmed,
                "position {position} is behind the confirmed {}",
                s.confirmed
            );
            // The position the server gives is durable too: a worker that died
            // right after its last acknowledgment never read the `acknowledged`
            // answer, and there may be no later batch to confirm it.
            s.confirmed = position;
        }
        let mut after = position;
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let batch = match w.next(Duration::from_millis(300)) {
                Said::Json(v) if v["type"] == "batch" => v,
                Said::Json(v) if v["type"] == "acknowledged" => {
                    let p = v["position"].as_str().map_or(0, sequence);
                    let mut s = seen.lock().unwrap();
                    s.confirmed = s.confirmed.max(p);
                    continue;
                }
                Said::Json(v) => panic!("unexpected {v}"),
                Said::Nothing => continue,
                Said::Closed(..) => break, // the server died; connect again
            };
            let batch_after = batch["after"].as_str().map_or(0, sequence);
            let up_to = sequence(batch["last_etag"].as_str().unwrap());
            let docs = documents(&batch);
            assert!(batch_after >= after, "batch after {batch_after} < {after}");
            let seqs: Vec<u64> = docs.iter().map(|d| sequence(&d.1)).collect();
            assert!(
                seqs.iter().all(|s| *s > batch_after && *s <= up_to)
                    && seqs.windows(2).all(|p| p[0] < p[1]),
                "batch not in etag order after {batch_after}: {seqs:?}"
            );
            match rng.gen_range(0..20) {
                // The worker dies before it acknowledges: the batch is not processed.
                0 | 1 => {
                    seen.lock().unwrap().worker_deaths += 1;
                    break;
                }
                n => {
                    {
                        let mut s = seen.lock().unwrap();
                        for (id, etag) in &docs {
                            s.processed
                                .entry(id.clone())
                                .or_default()
                                .insert(sequence(etag));
                        }
                        s.acks_sent.insert(up_to);
                        s.batches += 1;
                    }
                    if w.ack(batch["batch"].as_u64().unwrap()).is_err() {
                        break;
                    }
                    after = up_to;
                    if n == 2 {
                        // Dies right after sending the acknowledgment.
                        seen.lock().unwrap().worker_deaths += 1;
                        break;
                    }
                }
            }
        }
    }
}

#[test]
fn every_matching_change_is_processed_through_kill9_and_worker_deaths() {
    let cycles = cycles_from_env("KILN_SUBSCRIPTION_CRASH_CYCLES", 2);
    let seed: u64 = std::env::var("KILN_SUBSCRIPTION_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("subscription kill -9 test: {cycles} cycles, seed {seed}");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = spawn_serve_with(dir.path(), port, &SERVE_OPTIONS);
    assert_eq!(request(port, "PUT", "/dbs/shop", "").0, 201);
    let create = r#"{"name": "s", "query": "from orders where keep = true"}"#;
    assert_eq!(
        request(port, "POST", "/dbs/shop/subscriptions", create).0,
        201
    );
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop_writer = Arc::new(AtomicBool::new(false));
    let stop_worker = Arc::new(AtomicBool::new(false));
    let w = {
        let (stop, seen) = (stop_writer.clone(), seen.clone());
        std::thread::spawn(move || writer(port, stop, seen, seed))
    };
    let k = {
        let (stop, seen) = (stop_worker.clone(), seen.clone());
        std::thread::spawn(move || worker(port, stop, seen, seed ^ 0x5eed))
    };
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ 0xc1c1e);
    for cycle in 0..cycles {
        std::thread::sleep(Duration::from_millis(rng.gen_range(150..400)));
        kill9(&mut server, cycle);
        server = spawn_serve_with(dir.path(), port, &SERVE_OPTIONS);
        eprintln!("subscription kill -9 cycle {cycle} done");
    }
    std::thread::sleep(Duration::from_millis(100));
    stop_writer.store(true, Ordering::SeqCst);
    w.join().unwrap();
    // Let the worker catch up with every write, then stop it. The position moves
    // only with an acknowledged batch, so a last write the filter refuses would
    // never move it: a last matching write marks the end.
    let (status, body) = request(
        port,
        "PUT",
        "/dbs/shop/docs/orders/end",
        r#"{"keep": true}"#,
    );
    assert_eq!(status, 201, "{body}");
    let end: serde_json::Value = serde_json::from_str(&body).unwrap();
    let last = sequence(end["etag"].as_str().unwrap());
    seen.lock()
        .unwrap()
        .writes
        .insert("orders/end".into(), vec![(last, true)]);
    let deadline = Instant::now() + Duration::from_secs(40);
    while seen.lock().unwrap().confirmed < last {
        assert!(
            Instant::now() < deadline,
            "the worker did not catch up: confirmed {} < {last}",
            seen.lock().unwrap().confirmed
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stop_worker.store(true, Ordering::SeqCst);
    k.join().unwrap();

    let s = seen.lock().unwrap();
    let mut checked = 0;
    for (id, writes) in &s.writes {
        let (_, body) = request(port, "GET", &format!("/dbs/shop/docs/{id}"), "");
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        let final_seq = sequence(doc["@metadata"]["@etag"].as_str().unwrap());
        let processed = s.processed.get(id);
        if id.starts_with("orders/") && doc["keep"] == true {
            assert!(
                processed.is_some_and(|p| p.contains(&final_seq)),
                "{id}: its last version {final_seq} was never processed ({processed:?})"
            );
            checked += 1;
        }
        if id.starts_with("users/") {
            assert!(
                processed.is_none(),
                "{id} of another collection was delivered"
            );
        }
        for (seq, matches) in writes {
            if *matches && *seq == final_seq {
                continue; // checked above
            }
            if *matches {
                assert!(
                    final_seq > *seq || processed.is_some_and(|p| p.iter().any(|p| p >= seq)),
                    "{id}: the acknowledged write {seq} was neither processed nor superseded"
                );
            }
        }
    }
    eprintln!(
        "subscription kill -9 test: {} documents checked, {} connections, {} batches, {} worker deaths",
        checked, s.connections, s.batches, s.worker_deaths
    );
    assert!(checked > 0 && s.batches > 0, "the test delivered nothing");
    server.kill().unwrap();
    server.wait().unwrap();
}
