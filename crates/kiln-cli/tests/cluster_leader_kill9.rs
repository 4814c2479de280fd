//! Three `kiln serve` nodes of one cluster on loopback, 8 writers, and kill -9 of
//! the leader, cycle after cycle: every write a client was told succeeded is, once
//! the nodes have caught up, on every node with the etag the client was given.
//! A cycle fails unless writes were acknowledged both before the kill and after
//! the new leader took over, and unless the killed node died of the SIGKILL.
//!
//! Each write goes to a new id, so a write the client was not told about (the
//! connection died with the leader) may or may not be there, and an acknowledged
//! one must be there exactly as acknowledged.
//!
//! Cycles: KILN_CLUSTER_CRASH_CYCLES (default 5; the slow tier runs 50).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{self, json, Cluster};
use common::{cycles_from_env, kill9};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WRITERS: u64 = 8;

/// One request on its own connection; `None` when the node is not there (or
/// died mid-answer).
fn request(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    cluster::request(port, method, path, None, body).ok()
}

/// Writers: each PUTs new documents to the node it believes leads, and records
/// the etag of every write that was acknowledged.
struct Writers {
    stop: Arc<AtomicBool>,
    /// The port writes go to; a writer that fails looks for the leader again.
    leader_port: Arc<AtomicU64>,
    acknowledged: Arc<Mutex<Vec<(String, String)>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Writers {
    fn start(cycle: u64, leader_port: u16, ports: Vec<u16>) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let port = Arc::new(AtomicU64::new(u64::from(leader_port)));
        let acknowledged = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..WRITERS)
            .map(|w| {
                let (stop, port, acked, ports) = (
                    stop.clone(),
                    port.clone(),
                    acknowledged.clone(),
                    ports.clone(),
                );
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let id = format!("c{cycle}-w{w}-{n}");
                        let body = format!(r#"{{"writer":{w},"n":{n}}}"#);
                        let target = port.load(Ordering::Relaxed) as u16;
                        match request(target, "PUT", &format!("/dbs/k/docs/{id}"), &body) {
                            Some((201, answer)) => {
                                let etag = json(&answer)["etag"].as_str().unwrap().to_string();
                                acked.lock().unwrap().push((id, etag));
                            }
                            // A follower, no quorum, or the node is gone: find the leader.
                            _ => {
                                std::thread::sleep(Duration::from_millis(50));
                                if let Some(p) = find_leader_port(&ports) {
                                    port.store(u64::from(p), Ordering::Relaxed);
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        Writers {
            stop,
            leader_port: port,
            acknowledged,
            threads,
        }
    }

    fn acked(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
    }

    fn wait_for_acks(&self, at_least: usize, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.acked() < at_least {
            assert!(
                Instant::now() < deadline,
                "{what}: {} acknowledged writes",
                self.acked()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop(self) -> Vec<(String, String)> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let _ = self.leader_port;
        Arc::try_unwrap(self.acknowledged)
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

fn find_leader_port(ports: &[u16]) -> Option<u16> {
    for &p in ports {
        if let Some((200, body)) = request(p, "GET", "/cluster", "") {
            let v = json(&body);
            let leader = v["leader"].as_u64()?;
            let address = v["members"]
                .as_array()?
                .iter()
                .find(|m| m["id"].as_u64() == Some(leader))?["address"]
                .as_str()?
                .to_string();
            return address.rsplit_once(':')?.1.parse().ok();
        }
    }
    None
}

/// Every acknowledged write on `port`'s node, with its etag (waits for catch-up).
fn check_node(port: u16, acknowledged: &[(String, String)], when: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for (id, etag) in acknowledged {
        loop {
            let got = request(port, "GET", &format!("/dbs/k/docs/{id}"), "")
                .filter(|(status, _)| *status == 200)
                .and_then(|(_, body)| json(&body)["@metadata"]["@etag"].as_str().map(String::from));
            if got.as_deref() == Some(etag.as_str()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{when}: node on port {port} has {id} at {got:?}, acknowledged at {etag}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn acknowledged_writes_survive_kill9_of_the_leader() {
    let cycles = cycles_from_env("KILN_CLUSTER_CRASH_CYCLES", 5);
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path());
    let leader = cluster.leader();
    let (status, body) = request(cluster.ports[&leader], "PUT", "/dbs/k", "").unwrap();
    assert_eq!(status, 201, "{body}");
    let ports: Vec<u16> = cluster.ports.values().copied().collect();
    let mut acknowledged = Vec::new();
    for cycle in 0..cycles {
        let leader = cluster.leader();
        let writers = Writers::start(cycle, cluster.ports[&leader], ports.clone());
        writers.wait_for_acks(20, &format!("cycle {cycle}, before the kill"));
        let before_kill = writers.acked();
        let mut child = cluster.children.remove(&leader).unwrap();
        kill9(&mut child, cycle);
        let new_leader = cluster.leader();
        assert_ne!(new_leader, leader, "cycle {cycle}");
        writers.wait_for_acks(
            before_kill + 40,
            &format!("cycle {cycle}, after the failover"),
        );
        cluster.start(leader);
        writers.wait_for_acks(
            before_kill + 80,
            &format!("cycle {cycle}, with the old leader back"),
        );
        let this_cycle = writers.stop();
        for (id, port) in &cluster.ports {
            check_node(*port, &this_cycle, &format!("cycle {cycle}, node {id}"));
        }
        acknowledged.extend(this_cycle);
    }
    // And everything again, at the end: nothing acknowledged earlier went away.
    for (id, port) in &cluster.ports {
        check_node(
            *port,
            &acknowledged,
            &format!("after the last cycle, node {id}"),
        );
    }
    println!(
        "{cycles} kill -9 of the leader, {} acknowledged writes, each on all three nodes with its etag",
        acknowledged.len()
    );
}
