//! Clients that use a cluster's documents as registers, and the check of what
//! they saw (tests/common/linearizability.rs), shared by the linearizability
//! tests (leader kills; every fault at once).
//!
//! - Each client picks a document at random and reads it (40%), writes it (30%),
//!   or reads it and writes it with `If-Match` on the etag it read (30%: 200 is
//!   an applied compare-and-set, 409 conflict a refused one).
//! - Every write puts a value no other write puts, so a read names the write it
//!   saw; a compare-and-set expects the value whose etag it sends. The check
//!   also asserts that an etag is only ever seen with one value and a value with
//!   one etag.
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
//!   reports a violation, with the operations and the faults around it).
#![allow(dead_code)] // each test binary uses its own part of this module
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::cluster::{find_leader, json, request_within, Failed};
use crate::linearizability::{check_from, validate_witness, Call, Operation, Outcome, Verdict};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const CLIENTS: usize = 8;
pub const KEYS: usize = 5;
pub const DB: &str = "lin";
/// Fewer operations with a seen answer than this and the run tested too little.
const MIN_COMPLETED: usize = 200;
/// The checker's search budget per document.
const MAX_STEPS: u64 = 20_000_000;

/// One operation as a client recorded it.
pub struct Record {
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
    /// How long it waits for an answer before the request counts as lost.
    patience: Duration,
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
        let path = format!("/dbs/{DB}/docs/r/{key}?consistency=linearizable");
        let invoke = self.now();
        let answer = request_within(port, "GET", &path, None, "", self.patience);
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
        let path = format!("/dbs/{DB}/docs/r/{key}");
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
        let body = format!(r#"{{"v":{value}}}"#);
        let answer = request_within(port, "PUT", &path, if_match, &body, self.patience);
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

fn seconds(ns: u64) -> String {
    format!("{:.6} s", ns as f64 / 1e9)
}

/// The clients at work, and what happened to the nodes meanwhile (on the
/// clients' clock, for a failure's report).
pub struct Clients {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<Vec<Record>>>,
    timeline: Vec<(u64, String)>,
    pub seed: u64,
}

/// What the clients did, once stopped.
pub struct History {
    records: Vec<Record>,
    timeline: Vec<(u64, String)>,
    seed: u64,
}

impl Clients {
    /// [`CLIENTS`] clients on the nodes at `ports`, each giving up on an answer
    /// after `patience`; their random choices from `seed` (KILN_CLUSTER_LIN_SEED,
    /// random by default: printed in the summary).
    pub fn start(ports: &BTreeMap<u64, u16>, patience: Duration) -> Clients {
        let seed: u64 = std::env::var("KILN_CLUSTER_LIN_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| rand::thread_rng().gen());
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            completed: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            next_value: AtomicU64::new(1),
            started: Instant::now(),
        });
        let threads = (0..CLIENTS)
            .map(|id| {
                let client = Client {
                    id,
                    shared: shared.clone(),
                    ports: ports.clone(),
                    patience,
                    target: None,
                    out: Vec::new(),
                };
                std::thread::spawn(move || client.run(seed))
            })
            .collect();
        Clients {
            shared,
            threads,
            timeline: Vec::new(),
            seed,
        }
    }

    /// Notes what happened to the nodes now.
    pub fn note(&mut self, what: impl Into<String>) {
        self.timeline.push((self.shared.now(), what.into()));
    }

    /// Waits (30 s at most) until `answered` more operations were answered, of
    /// them `applied` writes applied, from now: the cluster makes progress.
    pub fn progress(&self, answered: u64, applied: u64, what: &str) {
        let counts = || {
            (
                self.shared.completed.load(Ordering::Relaxed),
                self.shared.applied.load(Ordering::Relaxed),
            )
        };
        let (c0, a0) = counts();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (c, a) = counts();
            if c >= c0 + answered && a >= a0 + applied {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {} operations answered (waiting for {answered}), {} writes applied (waiting for {applied})\nwhat happened to the nodes:\n{}",
                c - c0,
                a - a0,
                timeline_text(&self.timeline)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn stop(self) -> History {
        self.shared.stop.store(true, Ordering::Relaxed);
        let records = self
            .threads
            .into_iter()
            .flat_map(|t| t.join().expect("a client panicked"))
            .collect();
        History {
            records,
            timeline: self.timeline,
            seed: self.seed,
        }
    }
}

fn timeline_text(timeline: &[(u64, String)]) -> String {
    timeline
        .iter()
        .map(|(t, what)| format!("  {}: {what}\n", seconds(*t)))
        .collect()
}

/// Creates the registers' database through the node at `port`.
pub fn create_database(port: u16) {
    let (status, body) = request_within(
        port,
        "PUT",
        &format!("/dbs/{DB}"),
        None,
        "",
        Duration::from_secs(10),
    )
    .expect("create the database");
    assert_eq!(status, 201, "{body}");
}

/// An etag names one write: one value per etag, one etag per value.
fn etags_name_one_write(records: &[Record]) {
    let mut value_of: HashMap<&str, u64> = HashMap::new();
    let mut etag_of: HashMap<u64, &str> = HashMap::new();
    for r in records {
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
}

/// How many operations of each kind a history holds.
#[derive(Default)]
struct Tally {
    answered: usize,
    unknown: usize,
    reads: usize,
    writes: usize,
    cas_applied: usize,
    cas_refused: usize,
}

impl Tally {
    fn add(&mut self, history: &[Operation]) {
        for op in history {
            match (op.call, op.outcome) {
                (_, Outcome::Unknown) => self.unknown += 1,
                (Call::Read, _) => self.reads += 1,
                (Call::Write(_), _) => self.writes += 1,
                (Call::Cas { .. }, Outcome::Ok { .. }) => self.cas_applied += 1,
                (Call::Cas { .. }, _) => self.cas_refused += 1,
            }
        }
        self.answered += history.iter().filter(|o| o.response().is_some()).count();
    }
}

/// Checks every document's history linearizable (and the etags), panicking with
/// the failures, the faults (`faults`, e.g. "20 kill -9 of the leader") and what
/// happened to the nodes; returns the summary line, which it also prints.
pub fn check(history: History, faults: &str, ran_for: Duration) -> String {
    etags_name_one_write(&history.records);
    let mut per_key: Vec<Vec<Operation>> = vec![Vec::new(); KEYS];
    for r in history.records {
        per_key[r.key].push(r.op);
    }
    let check_started = Instant::now();
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for (key, ops) in per_key.iter().enumerate() {
        tally.add(ops);
        match check_from(None, ops, MAX_STEPS) {
            Verdict::Linearizable { order } => {
                if let Err(e) = validate_witness(None, ops, &order) {
                    failures.push(format!(
                        "document r/{key}: the checker's witness is wrong: {e}"
                    ));
                }
            }
            Verdict::NotLinearizable(report) => failures.push(format!(
                "document r/{key} ({} operations): {report}",
                ops.len()
            )),
            Verdict::GaveUp { steps } => failures.push(format!(
                "document r/{key} ({} operations): the checker gave up after {steps} steps",
                ops.len()
            )),
        }
    }
    let Tally {
        answered,
        unknown,
        reads,
        writes,
        cas_applied,
        cas_refused,
    } = tally;
    let summary = format!(
        "{faults}, seed {}: {answered} answered operations checked on {KEYS} documents \
         ({reads} reads, {writes} writes, {cas_applied} compare-and-set applied, {cas_refused} refused) \
         and {unknown} writes or compare-and-sets with an unknown outcome; cluster run {:.1} s, check {:.0} ms",
        history.seed,
        ran_for.as_secs_f64(),
        check_started.elapsed().as_secs_f64() * 1e3
    );
    println!("{summary}");
    assert!(
        failures.is_empty(),
        "{summary}\n{}\nwhat happened to the nodes:\n{}",
        failures.join("\n"),
        timeline_text(&history.timeline)
    );
    assert!(
        answered >= MIN_COMPLETED,
        "{summary}: fewer than {MIN_COMPLETED} answered operations, too few to tell"
    );
    summary
}
