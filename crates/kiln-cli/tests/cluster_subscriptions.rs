//! Data subscriptions in a three-node cluster. Their definitions and positions go
//! through the log, and the worker is served by the leader, so:
//! - a subscription made (or deleted) through the leader is on every node, and a
//!   follower sends its creation, and a worker, to the leader (307);
//! - a worker that loses its leader (kill -9, or a leadership transfer: close
//!   4307) connects to the new one and is told the position it last acknowledged
//!   (or one it sent an acknowledgment for that the cluster still committed), then
//!   gets the batches after it, in etag order: every acknowledged write is
//!   delivered at least once, while a writer goes on writing through the leader.
//!
//! Cycles of killing the leader: `KILN_CLUSTER_SUBSCRIPTION_CYCLES` (default 1,
//! the fast tier; the slow tier runs more).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, ok_json, request, Cluster};
use common::subscription_worker::{documents, sequence, Said, Worker};
use common::{cycles_from_env, kill9, kiln};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DB: &str = "shop";
const SUBSCRIPTION: &str = "big-orders";

/// What the worker went through, checked as it goes and at the end.
#[derive(Default)]
struct Consumer {
    /// Every `up_to` (as a sequence) the worker sent an acknowledgment for.
    acks_sent: BTreeSet<u64>,
    /// The highest position a server confirmed (`acknowledged`).
    confirmed: u64,
    /// Ids of documents in batches the worker acknowledged.
    processed: BTreeSet<String>,
    connections: u64,
}

/// Writes `orders/N` (N counting up) through whichever node leads, following the
/// leader across failovers; the ids whose write was acknowledged.
fn writer(ports: Vec<u16>, stop: Arc<AtomicBool>, written: Arc<Mutex<BTreeSet<String>>>) {
    let mut n = 0u64;
    let mut port = ports[0];
    while !stop.load(Ordering::SeqCst) {
        let id = format!("orders/{n}");
        let body = format!(r#"{{"total": {}}}"#, 100 + n % 7);
        match request(port, "PUT", &format!("/dbs/{DB}/docs/{id}"), None, &body) {
            Ok((200 | 201, _)) => {
                written.lock().unwrap().insert(id);
                n += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
            // Another node leads (307), none does yet, or this one is down: the
            // same id again on the next node (a PUT by id is idempotent).
            _ => {
                port = ports[(ports.iter().position(|p| *p == port).unwrap() + 1) % ports.len()];
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Connects a worker to the leader: a follower's answer must be a 307 naming it.
fn connect_to_leader(c: &Cluster, consumer: &mut Consumer) -> (Worker, u64) {
    let leader_id = c.leader();
    let leader = c.ports[&leader_id];
    let follower = c.follower_of(leader_id);
    let query = "batch_size=25&strategy=wait";
    match Worker::connect(follower, DB, SUBSCRIPTION, query) {
        Err((307, body)) => assert!(
            body.contains(&format!("127.0.0.1:{leader}/dbs/{DB}/subscriptions/")),
            "{body}"
        ),
        Err(other) => panic!("a follower answered a worker with {other:?}"),
        Ok(_) => panic!("a follower served a worker"),
    }
    let mut worker = Worker::connect(leader, DB, SUBSCRIPTION, query).unwrap();
    consumer.connections += 1;
    let hello = worker.expect("subscribed", Duration::from_secs(10));
    let position = hello["position"].as_str().map_or(0, sequence);
    // Told where the worker left off: what the cluster last confirmed, or an
    // acknowledgment sent whose answer was lost with the leader.
    assert!(
        position == consumer.confirmed
            || (position > consumer.confirmed && consumer.acks_sent.contains(&position)),
        "connection {}: position {position}, but the worker's last confirmed is {} (acks sent {:?})",
        consumer.connections,
        consumer.confirmed,
        consumer.acks_sent.range(consumer.confirmed..).collect::<Vec<_>>()
    );
    consumer.confirmed = position;
    (worker, leader_id)
}

/// Takes batches until `until` says enough, or the connection ends (the close code;
/// 0 for a connection that broke).
fn consume(
    worker: &mut Worker,
    consumer: &mut Consumer,
    mut until: impl FnMut(&Consumer) -> bool,
) -> Option<u16> {
    let mut after = consumer.confirmed;
    while !until(consumer) {
        match next_but_errors(worker) {
            Said::Json(v) if v["type"] == "batch" => {
                let batch_after = v["after"].as_str().map_or(0, sequence);
                assert_eq!(
                    batch_after, after,
                    "a batch starts where the last ended: {v}"
                );
                let mut last = after;
                for (id, etag) in documents(&v) {
                    let seq = sequence(&etag);
                    assert!(seq > last, "etag order: {etag} after sequence {last}");
                    last = seq;
                    consumer.processed.insert(id);
                }
                let up_to = sequence(v["last_etag"].as_str().unwrap());
                consumer.acks_sent.insert(up_to);
                if worker.ack(v["batch"].as_u64().unwrap()).is_err() {
                    return Some(0);
                }
                match next_but_errors(worker) {
                    Said::Json(a) if a["type"] == "acknowledged" => {
                        let confirmed = a["position"].as_str().map_or(0, sequence);
                        assert_eq!(confirmed, up_to, "{a}");
                        consumer.confirmed = confirmed;
                    }
                    Said::Closed(code, _) => return Some(code),
                    other => panic!("expected an acknowledgment, got {other:?}"),
                }
                after = up_to;
            }
            Said::Json(v) => panic!("unexpected message {v}"),
            Said::Closed(code, _) => return Some(code),
            Said::Nothing => {}
        }
    }
    None
}

/// The next message other than an error frame (which comes before a close: the
/// close code is what the test checks).
fn next_but_errors(worker: &mut Worker) -> Said {
    loop {
        match worker.next(Duration::from_secs(10)) {
            Said::Json(v) if v["type"] == "error" => continue,
            said => return said,
        }
    }
}

/// What node `port` holds of the subscription (waits for it to apply up to the
/// leader's position: a follower may lag a little).
fn position_on(port: u16, want: &serde_json::Value) -> serde_json::Value {
    let path = format!("/dbs/{DB}/subscriptions/{SUBSCRIPTION}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, text) = request(port, "GET", &path, None, "").unwrap();
        let got = json(&text);
        if status == 200 && &got["position"] == want || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
}

#[test]
fn a_subscriptions_worker_follows_the_leader_and_misses_nothing() {
    let cycles = cycles_from_env("KILN_CLUSTER_SUBSCRIPTION_CYCLES", 1);
    let root = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(root.path());
    let leader_id = c.leader();
    let leader = c.ports[&leader_id];
    ok_json(leader, "PUT", &format!("/dbs/{DB}"), "");
    let create =
        format!(r#"{{"name": "{SUBSCRIPTION}", "query": "from orders where total >= 100"}}"#);
    let path = format!("/dbs/{DB}/subscriptions");
    let (status, _) = request(c.follower_of(leader_id), "POST", &path, None, &create).unwrap();
    assert_eq!(status, 307, "a follower sends a creation to the leader");
    ok_json(leader, "POST", &path, &create);
    let (status, text) = request(leader, "POST", &path, None, &create).unwrap();
    assert_eq!(status, 409, "{text}");
    // A bad query is refused before it enters the log.
    let bad = r#"{"name": "x", "query": "from orders where"}"#;
    let (status, text) = request(leader, "POST", &path, None, bad).unwrap();
    assert_eq!(status, 400, "{text}");
    for port in c.ports.values() {
        let got = position_on(*port, &serde_json::Value::Null);
        assert_eq!(got["query"], "from orders where total >= 100", "{got}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(Mutex::new(BTreeSet::new()));
    let ports: Vec<u16> = c.ports.values().copied().collect();
    let w = {
        let (stop, written) = (stop.clone(), written.clone());
        std::thread::spawn(move || writer(ports, stop, written))
    };
    let mut consumer = Consumer::default();
    for cycle in 1..=cycles {
        let (mut worker, leader_id) = connect_to_leader(&c, &mut consumer);
        // Some batches on this leader, then it dies under the worker.
        let target = consumer.processed.len() + 150;
        let ended = consume(&mut worker, &mut consumer, |s| s.processed.len() >= target);
        assert_eq!(
            ended, None,
            "cycle {cycle}: the worker lost its leader early"
        );
        let mut child = c.children.remove(&leader_id).unwrap();
        kill9(&mut child, cycle);
        match consume(&mut worker, &mut consumer, |_| false) {
            Some(_) => {}
            None => unreachable!("consume ends only by its condition or a close"),
        }
        c.start(leader_id);
        println!(
            "cluster subscription cycle {cycle}: leader {leader_id} killed; {} documents processed over {} connections, position {}",
            consumer.processed.len(),
            consumer.connections,
            consumer.confirmed
        );
    }

    // A leadership transfer lets the worker go with 4307; it goes on at the new one.
    let (mut worker, leader_id) = connect_to_leader(&c, &mut consumer);
    let to = c.ports.keys().copied().find(|id| *id != leader_id).unwrap();
    let body = format!(r#"{{"id": {to}}}"#);
    ok_json(c.ports[&leader_id], "POST", "/cluster/leader", &body);
    assert_eq!(
        consume(&mut worker, &mut consumer, |_| false),
        Some(4307),
        "a worker on a node that stopped leading is closed with 4307"
    );
    let (mut worker, _) = connect_to_leader(&c, &mut consumer);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    w.join().unwrap();
    let written: BTreeSet<String> = written.lock().unwrap().clone();
    assert!(
        written.len() > 150 * cycles as usize,
        "too few writes: {}",
        written.len()
    );
    let ended = consume(&mut worker, &mut consumer, |s| {
        written.is_subset(&s.processed)
    });
    assert_eq!(ended, None);
    let missed: Vec<&String> = written.difference(&consumer.processed).take(5).collect();
    assert!(
        missed.is_empty(),
        "acknowledged writes never delivered: {missed:?}"
    );

    // Every node holds the position the leader confirmed.
    let leader_id = c.leader();
    let want = position_on(c.ports[&leader_id], &serde_json::Value::Null)["position"].clone();
    assert!(want.is_string());
    let positions: BTreeMap<u64, serde_json::Value> = c
        .ports
        .iter()
        .map(|(id, port)| (*id, position_on(*port, &want)["position"].clone()))
        .collect();
    assert!(
        positions.values().all(|p| p == &want),
        "{positions:?}, leader has {want}"
    );

    // A delete (by the CLI, through a follower: it follows the 307) reaches every
    // node and lets the worker go with 4004.
    let url = format!("http://127.0.0.1:{}", c.follower_of(leader_id));
    let out = kiln(&[
        "subscriptions",
        "delete",
        "--url",
        &url,
        "--db",
        DB,
        SUBSCRIPTION,
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert_eq!(consume(&mut worker, &mut consumer, |_| false), Some(4004));
    for port in c.ports.values() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let gone = loop {
            let (status, _) =
                request(*port, "GET", &format!("{path}/{SUBSCRIPTION}"), None, "").unwrap();
            if status == 404 || Instant::now() > deadline {
                break status;
            }
            std::thread::sleep(Duration::from_millis(30));
        };
        assert_eq!(gone, 404, "the subscription is still on the node at {port}");
    }
}
