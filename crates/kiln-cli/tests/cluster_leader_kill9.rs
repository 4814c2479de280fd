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

mod common;

use common::{cycles_from_env, free_port, healthy, kill9, TEST_JOURNAL_FILE_SIZE_MIB};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WRITERS: u64 = 8;

/// One request on its own connection; `None` when the node is not there (or
/// died mid-answer).
fn request(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    Some((
        status,
        out.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
    ))
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::Null)
}

struct Cluster {
    dirs: BTreeMap<u64, PathBuf>,
    ports: BTreeMap<u64, u16>,
    members: String,
    children: BTreeMap<u64, Child>,
}

impl Cluster {
    fn new(root: &Path) -> Cluster {
        let ports: BTreeMap<u64, u16> = (1..=3).map(|id| (id, free_port())).collect();
        let members = ports
            .iter()
            .map(|(id, port)| format!("{id}=127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",");
        let dirs = (1..=3)
            .map(|id| (id, root.join(format!("node{id}"))))
            .collect();
        let mut c = Cluster {
            dirs,
            ports,
            members,
            children: BTreeMap::new(),
        };
        for id in 1..=3 {
            c.start(id);
        }
        c
    }

    #[allow(clippy::zombie_processes)] // `stop_all` and `kill9` wait for it
    fn start(&mut self, id: u64) {
        let port = self.ports[&id];
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args([
                "serve",
                "--node-id",
                &id.to_string(),
                "--cluster",
                &self.members,
            ])
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .args([
                "--journal-file-size-mib",
                TEST_JOURNAL_FILE_SIZE_MIB,
                "--data-dir",
            ])
            .arg(&self.dirs[&id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !healthy(port) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("node {id} exited before answering /health: {status}");
            }
            assert!(Instant::now() < deadline, "node {id} did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.children.insert(id, child);
    }

    /// The leader the live nodes agree on (waits up to 20 s for one).
    fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let seen: Vec<Option<u64>> = self
                .children
                .keys()
                .map(|id| {
                    request(self.ports[id], "GET", "/cluster", "")
                        .and_then(|(_, body)| json(&body)["leader"].as_u64())
                })
                .collect();
            if let Some(Some(l)) = seen.first() {
                if self.children.contains_key(l) && seen.iter().all(|s| s == &Some(*l)) {
                    return *l;
                }
            }
            assert!(Instant::now() < deadline, "no leader agreed on: {seen:?}");
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    fn stop_all(&mut self) {
        for (_, mut child) in std::mem::take(&mut self.children) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
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
        writers.wait_for_acks(40, &format!("cycle {cycle}, before the kill"));
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
    cluster.stop_all();
}
