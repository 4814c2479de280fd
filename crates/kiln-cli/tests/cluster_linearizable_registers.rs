//! Three `kiln serve` nodes of one cluster on loopback; 8 clients write, write
//! conditionally (`If-Match`, a compare-and-set) and read a few documents on the
//! node they believe leads; the leader is killed with SIGKILL several times and
//! restarted. Every document is a register, and each one's history (invocation
//! and answer times, monotonic) must be linearizable: the checker in
//! tests/common/linearizability.rs searches for an order that explains every
//! answer and respects real time.
//!
//! - Each client picks a document at random and reads it (40%), writes it (30%),
//!   or reads it and writes it with `If-Match` on the etag it read (30%: 200 is
//!   an applied compare-and-set, 409 conflict a refused one).
//! - Every write puts a value no other write puts, so a read names the write it
//!   saw; a compare-and-set expects the value whose etag it sends. The run also
//!   checks that an etag is only ever seen with one value and a value with one
//!   etag.
//! - A write whose answer was lost (the connection died after the request was
//!   sent, a 503 other than "no leader", a timeout, any unexpected status) has an
//!   unknown outcome: it may have taken effect at any time after it was sent, or
//!   never. A write refused before it could reach the log (the connection was
//!   refused, a 307 from a follower, 503 "the cluster has no leader") is left out,
//!   as is a read that was not answered.
//! - Reads go to the node the client found leading (`GET /cluster` on that node
//!   says it leads), with `?consistency=linearizable`: that node confirms with a
//!   majority that it still leads before it answers, so a node that has just lost
//!   leadership cannot answer a stale value (without it, one can: the checker then
//!   reports a violation, with the operations and the kills and restarts around it).
//!
//! A run fails with fewer than 200 operations whose answer was seen (too few to
//! tell). It prints how many were checked.
//!
//! Cycles: KILN_CLUSTER_LIN_CYCLES (default 2; the slow tier runs 20); the clients' random choices:
//! KILN_CLUSTER_LIN_SEED (default random, printed).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;
#[path = "common/linearizability.rs"]
mod linearizability;

use common::cluster::{find_leader, json, request, Cluster, Failed};
use common::{cycles_from_env, kill9};
use linearizability::{check_from, validate_witness, Call, Operation, Outcome, Verdict};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 8;
const KEYS: usize = 5;
const DB: &str = "lin";
/// Fewer operations with a seen answer than this and the run tested too little.
const MIN_COMPLETED: usize = 200;

/// One operation as a client recorded it.
struct Record {
    key: usize,
    op: Operation,
    /// An etag the answer named with the value it holds (reads, applied writes).
    etag: Option<(String, u64)>,
}

struct Shared {
    stop: AtomicBool,
    /// Operations whose answer was seen.
    completed: AtomicU64,
    /// Writes and compare-and-sets answered as applied.
    applied: AtomicU64,
    next_value: AtomicU64,
    started: Instant,
}

impl Shared {
    fn now(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }
}

/// One client: random operations on random documents, on the node it found
/// leading, until told to stop; what it did, in order.
struct Client {
    id: usize,
    shared: Arc<Shared>,
    ports: BTreeMap<u64, u16>,
    /// The node it sends to, believed to lead.
    target: Option<(u64, u16)>,
    out: Vec<Record>,
}

impl Client {
    fn run(mut self, seed: u64) -> Vec<Record> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(self.id as u64));
        while !self.shared.stop.load(Ordering::Relaxed) {
            if self.target.is_none() {
                self.target = find_leader(&self.ports);
                if self.target.is_none() {
                    pause();
                    continue;
                }
            }
            let key = rng.gen_range(0..KEYS);
            match rng.gen_range(0..10) {
                0..=3 => {
                    self.read(key);
                }
                4..=6 => {
                    self.write(key, None);
                }
                // A compare-and-set on what a read just answered.
                _ => {
                    if let Some(seen) = self.read(key) {
                        self.write(key, Some(seen));
                    }
                }
            }
        }
        self.out
    }

    fn now(&self) -> u64 {
        self.shared.now()
    }

    /// Reads `key` on the target node; the etag and value it answered, if any.
    fn read(&mut self, key: usize) -> Option<(String, u64)> {
        let (node, port) = self.target?;
        // A linearizable read: the leader confirms with a majority that it still
        // leads and has applied what was committed (a follower answers 307).
        let path = format!("/dbs/{DB}/docs/r{key}?consistency=linearizable");
        let invoke = self.now();
        let answer = request(port, "GET", &path, None, "");
        let at = self.now();
        let seen = match answer {
            Ok((200, body)) => {
                let doc = json(&body);
                let value = doc["v"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("a read of {path} answered {body}"));
                let etag = doc["@metadata"]["@etag"].as_str().unwrap().to_string();
                Some((etag, value))
            }
            Ok((404, body)) if json(&body)["error"] == "document_not_found" => None,
            // Not answered: a read that says nothing.
            _ => {
                self.target = None;
                pause();
                return None;
            }
        };
        self.shared.completed.fetch_add(1, Ordering::Relaxed);
        let op = Operation::read(self.id, invoke, at, seen.as_ref().map(|s| s.1))
            .with_note(format!("node {node}"));
        self.out.push(Record {
            key,
            op,
            etag: seen.clone(),
        });
        seen
    }

    /// Writes a new value to `key`, conditionally when `expected` (etag and value)
    /// is given.
    fn write(&mut self, key: usize, expected: Option<(String, u64)>) {
        let Some((node, port)) = self.target else {
            return;
        };
        let path = format!("/dbs/{DB}/docs/r{key}");
        let value = self.shared.next_value.fetch_add(1, Ordering::Relaxed);
        let call = match &expected {
            Some((_, e)) => Call::Cas {
                expected: *e,
                new: value,
            },
            None => Call::Write(value),
        };
        let if_match = expected.as_ref().map(|(etag, _)| etag.as_str());
        let invoke = self.now();
        let answer = request(port, "PUT", &path, if_match, &format!(r#"{{"v":{value}}}"#));
        let at = self.now();
        let (outcome, note, etag) = match answer {
            Ok((200 | 201, body)) => {
                let etag = json(&body)["etag"]
                    .as_str()
                    .unwrap_or_else(|| panic!("a write answered {body}"))
                    .to_string();
                self.shared.applied.fetch_add(1, Ordering::Relaxed);
                (
                    Outcome::Ok { at },
                    format!("node {node}"),
                    Some((etag, value)),
                )
            }
            Ok((409, body)) if expected.is_some() && json(&body)["error"] == "conflict" => {
                (Outcome::CasFailed { at }, format!("node {node}"), None)
            }
            // Refused before the log: it did not happen.
            Ok((307, _)) | Err(Failed::NotSent) => {
                self.target = None;
                return;
            }
            Ok((503, body))
                if json(&body)["error"] == "no_quorum"
                    && body.contains("has no leader at the moment") =>
            {
                self.target = None;
                pause();
                return;
            }
            Ok((status, body)) => {
                self.target = None;
                pause();
                let code = json(&body)["error"].as_str().unwrap_or("").to_string();
                let note = format!("node {node}, answered {status} {code}");
                (Outcome::Unknown, note, None)
            }
            Err(Failed::Lost(why)) => {
                self.target = None;
                pause();
                (Outcome::Unknown, format!("node {node}, {why}"), None)
            }
        };
        if outcome != Outcome::Unknown {
            self.shared.completed.fetch_add(1, Ordering::Relaxed);
        }
        let op = Operation::new(self.id, invoke, call, outcome).with_note(note);
        self.out.push(Record { key, op, etag });
    }
}

fn pause() {
    std::thread::sleep(Duration::from_millis(20));
}

fn wait_for(shared: &Shared, completed: u64, applied: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (c, a) = (
            shared.completed.load(Ordering::Relaxed),
            shared.applied.load(Ordering::Relaxed),
        );
        if c >= completed && a >= applied {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {c} operations answered (waiting for {completed}), {a} writes applied (waiting for {applied})"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn seconds(ns: u64) -> String {
    format!("{:.6} s", ns as f64 / 1e9)
}

#[test]
fn registers_stay_linearizable_through_leader_kills() {
    let cycles = cycles_from_env("KILN_CLUSTER_LIN_CYCLES", 2);
    let seed: u64 = std::env::var("KILN_CLUSTER_LIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    let test_started = Instant::now();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path());
    let leader = cluster.leader();
    let (status, body) = request(
        cluster.ports[&leader],
        "PUT",
        &format!("/dbs/{DB}"),
        None,
        "",
    )
    .expect("create the database");
    assert_eq!(status, 201, "{body}");

    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        completed: AtomicU64::new(0),
        applied: AtomicU64::new(0),
        next_value: AtomicU64::new(1),
        started: Instant::now(),
    });
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (shared, ports) = (shared.clone(), cluster.ports.clone());
            let client = Client {
                id: c,
                shared,
                ports,
                target: None,
                out: Vec::new(),
            };
            std::thread::spawn(move || client.run(seed))
        })
        .collect();

    // What happened to the nodes, on the clients' clock.
    let mut timeline: Vec<(u64, String)> = Vec::new();
    let counts = |s: &Shared| {
        (
            s.completed.load(Ordering::Relaxed),
            s.applied.load(Ordering::Relaxed),
        )
    };
    for cycle in 0..cycles {
        let (c, a) = counts(&shared);
        wait_for(
            &shared,
            c + 100,
            a + 25,
            &format!("cycle {cycle}, before the kill"),
        );
        let leader = cluster.leader();
        let mut child = cluster.children.remove(&leader).unwrap();
        timeline.push((
            shared.now(),
            format!("kill -9 of node {leader} (the leader)"),
        ));
        kill9(&mut child, cycle);
        let new_leader = cluster.leader();
        assert_ne!(new_leader, leader, "cycle {cycle}");
        timeline.push((shared.now(), format!("node {new_leader} leads")));
        let (c, a) = counts(&shared);
        wait_for(
            &shared,
            c + 60,
            a + 15,
            &format!("cycle {cycle}, after the failover"),
        );
        cluster.start(leader);
        timeline.push((shared.now(), format!("node {leader} restarted")));
        let (c, a) = counts(&shared);
        wait_for(
            &shared,
            c + 60,
            a + 15,
            &format!("cycle {cycle}, with the node back"),
        );
    }
    shared.stop.store(true, Ordering::Relaxed);
    let records: Vec<Record> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("a client panicked"))
        .collect();
    let ran_for = test_started.elapsed();
    drop(cluster);

    // An etag names one write: one value per etag, one etag per value.
    let mut value_of: HashMap<&str, u64> = HashMap::new();
    let mut etag_of: HashMap<u64, &str> = HashMap::new();
    for r in &records {
        if let Some((etag, value)) = &r.etag {
            let v = *value_of.entry(etag).or_insert(*value);
            assert_eq!(
                v, *value,
                "etag {etag} seen with values {v} and {value}: {}",
                r.op
            );
            let e = *etag_of.entry(*value).or_insert(etag);
            assert_eq!(
                e, etag,
                "value {value} seen with etags {e} and {etag}: {}",
                r.op
            );
        }
    }

    let timeline_text = timeline
        .iter()
        .map(|(t, what)| format!("  {}: {what}\n", seconds(*t)))
        .collect::<String>();
    let mut per_key: Vec<Vec<Operation>> = vec![Vec::new(); KEYS];
    for r in records {
        per_key[r.key].push(r.op);
    }
    let check_started = Instant::now();
    let (mut completed, mut unknown, mut reads, mut writes, mut cas_applied, mut cas_refused) =
        (0, 0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    for (key, history) in per_key.iter().enumerate() {
        for op in history {
            match (op.call, op.outcome) {
                (_, Outcome::Unknown) => unknown += 1,
                (Call::Read, _) => reads += 1,
                (Call::Write(_), _) => writes += 1,
                (Call::Cas { .. }, Outcome::Ok { .. }) => cas_applied += 1,
                (Call::Cas { .. }, _) => cas_refused += 1,
            }
        }
        completed += history.iter().filter(|o| o.response().is_some()).count();
        match check_from(None, history, 20_000_000) {
            Verdict::Linearizable { order } => {
                if let Err(e) = validate_witness(None, history, &order) {
                    failures.push(format!(
                        "document r{key}: the checker's witness is wrong: {e}"
                    ));
                }
            }
            Verdict::NotLinearizable(report) => failures.push(format!(
                "document r{key} ({} operations): {report}",
                history.len()
            )),
            Verdict::GaveUp { steps } => failures.push(format!(
                "document r{key} ({} operations): the checker gave up after {steps} steps",
                history.len()
            )),
        }
    }
    let summary = format!(
        "{cycles} kill -9 of the leader, seed {seed}: {completed} answered operations checked on {KEYS} documents \
         ({reads} reads, {writes} writes, {cas_applied} compare-and-set applied, {cas_refused} refused) \
         and {unknown} writes or compare-and-sets with an unknown outcome; cluster run {:.1} s, check {:.0} ms",
        ran_for.as_secs_f64(),
        check_started.elapsed().as_secs_f64() * 1e3
    );
    println!("{summary}");
    assert!(
        failures.is_empty(),
        "{summary}\n{}\nwhat happened to the nodes:\n{timeline_text}",
        failures.join("\n")
    );
    assert!(
        completed >= MIN_COMPLETED,
        "{summary}: fewer than {MIN_COMPLETED} answered operations, too few to tell"
    );
}
