//! Three `kiln serve` nodes of one cluster on loopback, 8 writers, and kill -9 of
//! the leader, cycle after cycle: every write a client was told succeeded is, once
//! the nodes have caught up, on every node with the etag the client was given.
//! A cycle fails unless writes were acknowledged both before the kill and after
//! the new leader took over, and unless the killed node died of the SIGKILL.
//!
//! Each write goes to a new id, so a write the client was not told about (the
//! connection died with the leader) may or may not be there, and an acknowledged
//! one must be there exactly as acknowledged. Every fourth request of a writer
//! deletes one of its acknowledged documents instead: an acknowledged delete must
//! be gone from every node (a delete whose answer was lost leaves its id
//! unchecked).
//!
//! After the last cycle and a quiet period, the three replicas are compared
//! document by document (id and etag, every page of the id listing) with their
//! applied log index: a follower that stays behind or diverged fails the test,
//! naming the documents that differ.
//!
//! Cycles: KILN_CLUSTER_CRASH_CYCLES (default 5; the slow tier runs 50).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{self, json, Cluster};
use common::{cycles_from_env, kill9};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WRITERS: u64 = 8;

/// One request on its own connection; `None` when the node is not there (or
/// died mid-answer).
fn request(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    cluster::request(port, method, path, None, body).ok()
}

/// What a document must be on every node, from the answers its writer got.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    /// Written, acknowledged with this etag.
    Etag(String),
    /// Deleted, acknowledged.
    Deleted,
    /// A delete whose answer was lost: there or not.
    Unknown,
}

/// Writers: each PUTs new documents to the node it believes leads, and deletes
/// some it wrote, recording what every acknowledged request left.
struct Writers {
    stop: Arc<AtomicBool>,
    /// The port writes go to; a writer that fails looks for the leader again.
    leader_port: Arc<AtomicU64>,
    acknowledged: Arc<Mutex<Vec<(String, Expected)>>>,
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
                    let mut written: Vec<String> = Vec::new();
                    let find_leader = || {
                        std::thread::sleep(Duration::from_millis(50));
                        if let Some(p) = find_leader_port(&ports) {
                            port.store(u64::from(p), Ordering::Relaxed);
                        }
                    };
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let target = port.load(Ordering::Relaxed) as u16;
                        if n.is_multiple_of(4) && !written.is_empty() {
                            let id = written.swap_remove((n as usize / 4) % written.len());
                            match request(target, "DELETE", &format!("/dbs/k/docs/{id}"), "") {
                                Some((200, _)) => {
                                    acked.lock().unwrap().push((id, Expected::Deleted))
                                }
                                // Refused before its log: the document stays, and may be
                                // deleted again later.
                                Some((_, answer)) if answer.contains("not_written") => {
                                    written.push(id);
                                    find_leader();
                                }
                                _ => {
                                    acked.lock().unwrap().push((id, Expected::Unknown));
                                    find_leader();
                                }
                            }
                            continue;
                        }
                        let id = format!("c{cycle}-w{w}-{n}");
                        let body = format!(r#"{{"writer":{w},"n":{n}}}"#);
                        match request(target, "PUT", &format!("/dbs/k/docs/{id}"), &body) {
                            Some((201, answer)) => {
                                let etag = json(&answer)["etag"].as_str().unwrap().to_string();
                                acked
                                    .lock()
                                    .unwrap()
                                    .push((id.clone(), Expected::Etag(etag)));
                                written.push(id);
                            }
                            // A follower, no quorum, or the node is gone: find the leader.
                            _ => find_leader(),
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

    fn stop(self) -> Vec<(String, Expected)> {
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

/// The last acknowledged state of each id, in the order the answers came.
fn final_states(events: &[(String, Expected)]) -> BTreeMap<String, Expected> {
    events.iter().cloned().collect()
}

/// Every acknowledged write on `port`'s node with its etag, and every acknowledged
/// delete gone (waits for catch-up).
fn check_node(port: u16, expected: &BTreeMap<String, Expected>, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for (id, want) in expected {
        let want = match want {
            Expected::Etag(etag) => Some(etag.as_str()),
            Expected::Deleted => None,
            Expected::Unknown => continue,
        };
        loop {
            let answer = request(port, "GET", &format!("/dbs/k/docs/{id}"), "");
            let got = match &answer {
                Some((200, body)) => {
                    Some(json(body)["@metadata"]["@etag"].as_str().map(String::from))
                }
                Some((404, _)) => Some(None),
                _ => None, // no answer: ask again
            };
            if got.as_ref().is_some_and(|g| g.as_deref() == want) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{when}: node on port {port} has {id} at {got:?} (Some(None): absent), acknowledged as {want:?} (None: deleted)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A node's documents (id -> etag, every page of the id listing) and the log index
/// it has applied, or why it could not be read.
fn replica(port: u16) -> Result<(u64, BTreeMap<String, String>), String> {
    let applied = request(port, "GET", "/cluster", "")
        .and_then(|(_, body)| json(&body)["last_applied"].as_u64())
        .ok_or("no last_applied in GET /cluster")?;
    let mut docs = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            None => "/dbs/k/docs?page_size=1000".to_string(),
            Some(id) => format!("/dbs/k/docs?page_size=1000&start_after={id}"),
        };
        let (status, body) = request(port, "GET", &path, "").ok_or("no answer")?;
        if status != 200 {
            return Err(format!("GET {path}: {status} {body}"));
        }
        let page = json(&body);
        for doc in page["results"].as_array().ok_or("no results")? {
            let id = doc["@metadata"]["@id"]
                .as_str()
                .ok_or("a result without an id")?;
            let etag = doc["@metadata"]["@etag"]
                .as_str()
                .ok_or("a result without an etag")?;
            docs.insert(id.to_string(), etag.to_string());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return Ok((applied, docs)),
        }
    }
}

/// What one node holds (its applied log index and every document's etag), or why
/// it could not be read.
type Replica = Result<(u64, BTreeMap<String, String>), String>;

/// After the writes stopped: waits (30 s at most) until every node has applied the
/// same log index and holds the same documents at the same etags; fails naming the
/// documents that differ otherwise.
fn replicas_converge(ports: &BTreeMap<u64, u16>) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen: Vec<(u64, Replica)> = ports
            .iter()
            .map(|(id, port)| (*id, replica(*port)))
            .collect();
        let same = seen.windows(2).all(|pair| match (&pair[0].1, &pair[1].1) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        });
        if same {
            if let Some((_, Ok((_, docs)))) = seen.first() {
                return docs.len();
            }
        }
        if Instant::now() >= deadline {
            panic!(
                "the replicas differ 30 s after the writes stopped:\n{}",
                differences(&seen)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn differences(seen: &[(u64, Replica)]) -> String {
    let mut out = String::new();
    let mut ids = std::collections::BTreeSet::new();
    for (node, replica) in seen {
        match replica {
            Ok((applied, docs)) => {
                out += &format!(
                    "node {node}: applied index {applied}, {} documents\n",
                    docs.len()
                );
                ids.extend(docs.keys().cloned());
            }
            Err(e) => out += &format!("node {node}: {e}\n"),
        }
    }
    let etag_on = |replica: &Result<(u64, BTreeMap<String, String>), String>, id: &str| {
        replica
            .as_ref()
            .ok()
            .and_then(|(_, docs)| docs.get(id).cloned())
    };
    let differing: Vec<&String> = ids
        .iter()
        .filter(|id| {
            seen.windows(2)
                .any(|p| etag_on(&p[0].1, id) != etag_on(&p[1].1, id))
        })
        .collect();
    out += &format!("{} documents differ", differing.len());
    for id in differing.iter().take(10) {
        let per_node: Vec<String> = seen
            .iter()
            .map(|(node, r)| format!("node {node}: {:?}", etag_on(r, id)))
            .collect();
        out += &format!("\n  {id}: {}", per_node.join(", "));
    }
    out
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
    let mut acknowledged: BTreeMap<String, Expected> = BTreeMap::new();
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
        let this_cycle = final_states(&writers.stop());
        for (id, port) in &cluster.ports {
            check_node(*port, &this_cycle, &format!("cycle {cycle}, node {id}"));
        }
        acknowledged.extend(this_cycle);
    }
    // And everything again, at the end: nothing acknowledged earlier went away, and
    // the replicas are the same, document by document.
    for (id, port) in &cluster.ports {
        check_node(
            *port,
            &acknowledged,
            &format!("after the last cycle, node {id}"),
        );
    }
    let documents = replicas_converge(&cluster.ports);
    let deletes = acknowledged
        .values()
        .filter(|e| **e == Expected::Deleted)
        .count();
    assert!(deletes > 0, "no delete was acknowledged in {cycles} cycles");
    println!(
        "{cycles} kill -9 of the leader, {} acknowledged writes and deletes ({deletes} deletes), each on all three nodes as acknowledged; the three replicas equal ({documents} documents, same applied index)",
        acknowledged.len()
    );
}
