//! Partitions of three `kiln serve` nodes on loopback, through a fault proxy of the
//! test's own (common/relay.rs: a TCP relay in front of each node, which the
//! other nodes reach it through; the test's clients talk to the nodes directly).
//!
//! Under 4 writers, each cycle:
//! - cuts the leader off from both followers (both ways): it refuses writes once
//!   a majority has been silent for its bound (twice the election timeout, twice), and
//!   acknowledges none sent after the cut; the other two elect a leader among
//!   themselves, which takes writes; then heals: the old leader follows;
//! - cuts a follower off: the leader goes on with the other one, and the follower
//!   takes no write (it redirects to the leader, or answers `no_quorum` once it has
//!   no leader); then heals.
//!
//! At the end, once the three nodes have applied the same index: every
//! acknowledged write is on every node with its etag, no write sent to a cut-off
//! node and not acknowledged is anywhere (the old leader's unacknowledged tail was
//! discarded: the test checks it had one), and the three nodes hold the same
//! documents, document by document.
//!
//! The first cycle cuts the leader's links (connections closed at once) and holds
//! the follower's (nothing goes through, nothing is closed); the next cycles
//! alternate. Cycles: KILN_CLUSTER_PARTITION_CYCLES (default 1).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, request_within, Cluster, Failed, ELECTION_TIMEOUT_MS};
use common::cycles_from_env;
use common::relay::Fault;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const WRITERS: usize = 4;

/// How long a client waits for a write's answer. A cut-off leader holds a write
/// it took 5 s before answering `no_quorum`: the writers give up before that (the
/// write is then neither acknowledged nor refused) and look for the leader again.
const WRITE_PATIENCE: Duration = Duration::from_millis(700);

/// The writes a probe sends to a node cut off wait this long for an answer: a
/// leader that finds a majority silent waits the election timeout's maximum
/// (twice `--election-timeout-ms`) more before it refuses, and 0.25 s for a
/// loaded machine.
const PROBE_PATIENCE: Duration = Duration::from_millis(2 * ELECTION_TIMEOUT_MS + 250);

/// A leader cut off must refuse writes (before they enter its log) within this
/// of the cut. It does once a majority has been silent for the election
/// timeout's maximum (0.4 s) and stayed silent for as long again, a probe that
/// waits out its patience included: twice that, and 0.7 s for a loaded machine.
const REFUSES_WITHIN: Duration = Duration::from_millis(8 * ELECTION_TIMEOUT_MS + 700);

/// A follower cut off has no leader within this: it stands for election after
/// the leader's lease (the election timeout's maximum) and its own election
/// timeout (at most that maximum again), and after twice that maximum more when
/// it has seen a longer log than its own (openraft's timers).
const LEADERLESS_WITHIN: Duration = Duration::from_millis(8 * ELECTION_TIMEOUT_MS + 1_000);

/// Acknowledged writes to wait for in each phase.
const ACKS_PER_PHASE: usize = 15;

#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    /// 201, with the etag given.
    Acked(String),
    /// Another status, and the error code of the body.
    Answered(u16, String),
    /// The connection was refused: never sent.
    NotSent,
    /// No full answer in time: it may or may not be applied.
    Lost,
}

/// One write and what came of it.
#[derive(Clone, Debug)]
struct Attempt {
    id: String,
    node: u64,
    sent: Instant,
    answered: Instant,
    outcome: Outcome,
}

/// `PUT` of a new document `id` on `node`'s own port.
fn write(ports: &BTreeMap<u64, u16>, node: u64, id: &str, patience: Duration) -> Attempt {
    let sent = Instant::now();
    let body = format!(r#"{{"id":"{id}"}}"#);
    let path = format!("/dbs/k/docs/{id}");
    let outcome = match request_within(ports[&node], "PUT", &path, None, &body, patience) {
        Ok((201, answer)) => Outcome::Acked(json(&answer)["etag"].as_str().unwrap().to_string()),
        Ok((status, answer)) => Outcome::Answered(
            status,
            json(&answer)["error"].as_str().unwrap_or("").to_string(),
        ),
        Err(Failed::NotSent) => Outcome::NotSent,
        Err(Failed::Lost(_)) => Outcome::Lost,
    };
    Attempt {
        id: id.to_string(),
        node,
        sent,
        answered: Instant::now(),
        outcome,
    }
}

/// `GET /cluster` of a node.
fn status(port: u16) -> Option<Value> {
    match request_within(port, "GET", "/cluster", None, "", Duration::from_secs(2)) {
        Ok((200, body)) => Some(json(&body)),
        _ => None,
    }
}

/// The last log index of the node on `port`.
fn last_log_index(port: u16) -> u64 {
    status(port).unwrap()["last_log_index"]
        .as_u64()
        .unwrap_or(0)
}

/// The term of the node on `port`.
fn term(port: u16) -> u64 {
    status(port).unwrap()["term"].as_u64().unwrap_or(0)
}

/// The node that says it leads in the highest term (a leader cut off may still
/// say it leads, in an older term).
fn leader_by_term(ports: &BTreeMap<u64, u16>) -> Option<u64> {
    ports
        .iter()
        .filter_map(|(&id, &port)| {
            let v = status(port)?;
            (v["state"] == "leader" && v["leader"].as_u64() == Some(id))
                .then(|| (v["term"].as_u64().unwrap_or(0), id))
        })
        .max()
        .map(|(_, id)| id)
}

/// Threads that write new documents until stopped, recording every attempt.
struct Writers {
    stop: Arc<AtomicBool>,
    attempts: Arc<Mutex<Vec<Attempt>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Writers {
    /// The writers: each to the leader it found, looking again after a failure.
    fn start(ports: &BTreeMap<u64, u16>) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..WRITERS)
            .map(|w| {
                let (stop, attempts, ports) = (stop.clone(), attempts.clone(), ports.clone());
                std::thread::spawn(move || {
                    let mut target = None;
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let Some(node) = target.or_else(|| leader_by_term(&ports)) else {
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        };
                        n += 1;
                        let a = write(&ports, node, &format!("w{w}-{n}"), WRITE_PATIENCE);
                        target = matches!(a.outcome, Outcome::Acked(_)).then_some(node);
                        if target.is_none() {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        attempts.lock().unwrap().push(a);
                    }
                })
            })
            .collect();
        Writers {
            stop,
            attempts,
            threads,
        }
    }

    /// Waits (20 s at most) until `n` writes that `counts` were acknowledged.
    fn wait_for(&self, n: usize, what: &str, counts: impl Fn(&Attempt) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let seen = self
                .attempts
                .lock()
                .unwrap()
                .iter()
                .filter(|a| matches!(a.outcome, Outcome::Acked(_)) && counts(a))
                .count();
            if seen >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {seen} acknowledged writes of {n}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop(self) -> Vec<Attempt> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        std::mem::take(&mut *self.attempts.lock().unwrap())
    }
}

/// A thread that writes new documents to one node (cut off) until stopped.
struct Probe {
    stop: Arc<AtomicBool>,
    attempts: Arc<Mutex<Vec<Attempt>>>,
    thread: JoinHandle<()>,
}

impl Probe {
    fn start(ports: &BTreeMap<u64, u16>, node: u64, prefix: String) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let (s, sent, ports) = (stop.clone(), attempts.clone(), ports.clone());
        let thread = std::thread::spawn(move || {
            for n in 0.. {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let a = write(&ports, node, &format!("{prefix}-{n}"), PROBE_PATIENCE);
                sent.lock().unwrap().push(a);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Probe {
            stop,
            attempts,
            thread,
        }
    }

    /// When the first write answered `no_quorum` was answered.
    fn first_refusal(&self) -> Option<Instant> {
        let attempts = self.attempts.lock().unwrap();
        let refused = attempts.iter().find(|a| a.outcome == no_quorum());
        refused.map(|a| a.answered)
    }

    fn answers(&self) -> BTreeMap<String, usize> {
        answers(&self.attempts.lock().unwrap())
    }

    fn stop(self) -> Vec<Attempt> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        std::mem::take(&mut *self.attempts.lock().unwrap())
    }
}

fn no_quorum() -> Outcome {
    Outcome::Answered(503, "no_quorum".into())
}

/// How many writes got each kind of answer.
fn answers(attempts: &[Attempt]) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for a in attempts {
        let answer = match &a.outcome {
            Outcome::Acked(_) => "201".to_string(),
            Outcome::Answered(307, _) => "307 redirect".to_string(),
            Outcome::Answered(status, code) => format!("{status} {code}"),
            other => format!("{other:?}"),
        };
        *seen.entry(answer).or_default() += 1;
    }
    seen
}

/// Every document of database `k` on the node at `port`, by id (`?consistency=
/// linearizable` sends each page through the leader's check).
fn documents(port: u16, consistency: &str) -> BTreeMap<String, Value> {
    let mut docs = BTreeMap::new();
    let mut next = Some(format!("/dbs/k/docs?page_size=1024{consistency}"));
    while let Some(path) = next {
        let (status, body) =
            request_within(port, "GET", &path, None, "", Duration::from_secs(10)).unwrap();
        assert_eq!(status, 200, "GET {path} on port {port}: {body}");
        let page = json(&body);
        for doc in page["results"].as_array().unwrap() {
            let id = doc["@metadata"]["@id"].as_str().unwrap().to_string();
            docs.insert(id, doc.clone());
        }
        // `next`: the id to start after (the test's ids need no escaping).
        next = page["next"]
            .as_str()
            .map(|after| format!("/dbs/k/docs?page_size=1024&start_after={after}{consistency}"));
    }
    docs
}

/// Waits (20 s at most) until the three nodes hold the same log and have applied
/// all of it; the index they applied.
fn wait_for_same_applied_index(ports: &BTreeMap<u64, u16>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen: Vec<(Option<u64>, Option<u64>)> = ports
            .values()
            .map(|p| {
                status(*p).map_or((None, None), |v| {
                    (v["last_log_index"].as_u64(), v["last_applied"].as_u64())
                })
            })
            .collect();
        if let Some((Some(log), Some(applied))) = seen.first() {
            if log == applied && seen.iter().all(|s| s == &seen[0]) {
                return *applied;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the nodes did not converge: (last log index, last applied) {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a cycle saw, for the report.
struct CycleReport {
    old_leader: u64,
    refused_within: Duration,
    tail: u64,
    new_leader: u64,
    new_leader_after: Duration,
    follower: u64,
    leaderless_after: Duration,
    follower_answers: BTreeMap<String, usize>,
    /// The leader and its term when the follower was cut off, and once healed.
    leader_after_heal: ((u64, u64), (u64, u64)),
    /// From that heal to the first write acknowledged after it.
    writes_again_after: Duration,
}

#[test]
fn partitions_lose_nothing_acknowledged_and_a_minority_takes_no_write() {
    let started = Instant::now();
    let cycles = cycles_from_env("KILN_CLUSTER_PARTITION_CYCLES", 1);
    let root = tempfile::tempdir().unwrap();
    let (cluster, relays) = Cluster::behind_relays(root.path());
    let ports = cluster.ports.clone();
    let all: Vec<u64> = ports.keys().copied().collect();
    let leader = cluster.leader();
    let (status_code, body) = request_within(
        ports[&leader],
        "PUT",
        "/dbs/k",
        None,
        "",
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(status_code, 201, "{body}");
    let writers = Writers::start(&ports);
    let mut probes: Vec<Attempt> = Vec::new();
    let mut reports = Vec::new();
    // (node, cut at, healed at): a write sent to the node in between must not be
    // acknowledged, nor be anywhere at the end.
    let mut cut_off: Vec<(u64, Instant, Instant)> = Vec::new();

    for cycle in 0..cycles {
        let (leader_fault, follower_fault) = if cycle % 2 == 0 {
            (Fault::Cut, Fault::Hold)
        } else {
            (Fault::Hold, Fault::Cut)
        };
        let old_leader = cluster.leader();
        let leader = old_leader;
        let since = Instant::now();
        writers.wait_for(ACKS_PER_PHASE, &format!("cycle {cycle}, before"), |a| {
            a.sent >= since
        });

        // The leader cut off from both followers (its messages took the relays).
        for to in all.iter().filter(|to| **to != leader) {
            let through = relays.counts(leader, *to).forwarded;
            assert!(
                through > 0,
                "node {leader} sent nothing to {to} through the relay"
            );
        }
        relays.isolate(leader, leader_fault);
        let cut = Instant::now();
        let probe = Probe::start(&ports, leader, format!("c{cycle}-old-leader"));
        // It refuses writes before they enter its log, within its bound (the writes it takes before
        // wait for a majority that does not come: they are its tail).
        let refused_within = loop {
            if let Some(at) = probe.first_refusal() {
                break at - cut;
            }
            assert!(
                cut.elapsed() < REFUSES_WITHIN,
                "cycle {cycle}: the leader {leader}, cut off, did not refuse writes within \
                 {REFUSES_WITHIN:?}: answers {:?}",
                probe.answers()
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        // The others elect one of them, which takes writes.
        let majority: Vec<u64> = all.iter().copied().filter(|id| *id != leader).collect();
        let new_leader = cluster.leader_among(&majority);
        let new_leader_after = cut.elapsed();
        writers.wait_for(
            ACKS_PER_PHASE,
            &format!("cycle {cycle}, the majority without node {leader}"),
            |a| a.sent >= cut && a.node != leader,
        );
        let old = status(ports[&leader]).unwrap();
        // Still calling itself leader (it has not heard of the new term), it says
        // it has no quorum.
        if old["state"] == "leader" {
            assert_eq!(
                old["has_quorum"], false,
                "cycle {cycle}: the cut-off leader: {old}"
            );
        }
        let tail =
            old["last_log_index"].as_u64().unwrap_or(0) - old["last_applied"].as_u64().unwrap_or(0);
        let sent_to_old_leader = probe.stop();
        relays.heal_all();
        let healed = Instant::now();
        cut_off.push((leader, cut, healed));
        assert!(
            tail > 0,
            "cycle {cycle}: the old leader {leader} had no entries beyond those it applied: {old}"
        );
        probes.extend(sent_to_old_leader);
        cluster.leader();
        writers.wait_for(ACKS_PER_PHASE, &format!("cycle {cycle}, healed"), |a| {
            a.sent >= healed
        });

        // A follower cut off: one of the majority that is not the leader now.
        let leader = cluster.leader();
        let follower = *majority.iter().find(|id| **id != leader).unwrap();
        relays.isolate(follower, follower_fault);
        let cut = Instant::now();
        let probe = Probe::start(&ports, follower, format!("c{cycle}-follower"));
        let log_at_cut = last_log_index(ports[&follower]);
        writers.wait_for(
            ACKS_PER_PHASE,
            &format!("cycle {cycle}, without the follower {follower}"),
            |a| a.sent >= cut && a.node != follower,
        );
        // It redirects writes to the leader it knew until it has not heard from
        // it for an election timeout (and the leader's lease): then it has none,
        // and refuses them.
        let deadline = cut + LEADERLESS_WITHIN;
        while status(ports[&follower]).is_none_or(|v| !v["leader"].is_null()) {
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: the follower {follower}, cut off, still has a leader after {:?}",
                cut.elapsed()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let leaderless_after = cut.elapsed();
        std::thread::sleep(Duration::from_millis(150));
        let sent_to_follower = probe.stop();
        let follower_log = last_log_index(ports[&follower]);
        let leader_log = last_log_index(ports[&leader]);
        let term_before = term(ports[&leader]);
        relays.heal_all();
        let healed = Instant::now();
        cut_off.push((follower, cut, healed));
        // Its log did not follow the leader's while it was cut off.
        assert!(
            leader_log >= follower_log + ACKS_PER_PHASE as u64,
            "cycle {cycle}: the follower {follower}, cut off, went from index {log_at_cut} to \
             {follower_log}; the leader is at {leader_log}"
        );
        let follower_answers = answers(&sent_to_follower);
        assert!(
            sent_to_follower
                .iter()
                .any(|a| a.sent >= cut + leaderless_after && a.outcome == no_quorum()),
            "cycle {cycle}: the follower {follower} had no leader and did not refuse writes: \
             {follower_answers:?}"
        );
        probes.extend(sent_to_follower);
        let back = cluster.leader();
        writers.wait_for(1, &format!("cycle {cycle}, healed again"), |a| {
            a.sent >= healed
        });
        let writes_again_after = healed.elapsed();
        let term_after = term(ports[&back]);
        writers.wait_for(
            ACKS_PER_PHASE,
            &format!("cycle {cycle}, healed again"),
            |a| a.sent >= healed,
        );
        reports.push(CycleReport {
            old_leader,
            refused_within,
            tail,
            new_leader,
            new_leader_after,
            follower,
            leaderless_after,
            follower_answers,
            leader_after_heal: ((leader, term_before), (back, term_after)),
            writes_again_after,
        });
    }
    let mut attempts = writers.stop();
    attempts.extend(probes);

    let applied = wait_for_same_applied_index(&ports);
    let leader = cluster.leader();
    let on: BTreeMap<u64, BTreeMap<String, Value>> = ports
        .iter()
        .map(|(id, port)| (*id, documents(*port, "")))
        .collect();
    let linearizable = documents(ports[&leader], "&consistency=linearizable");
    assert!(
        linearizable == on[&leader],
        "node {leader}: its listing differs from its linearizable one"
    );
    for (id, docs) in &on {
        for (other, other_docs) in &on {
            if other > id {
                let differ: Vec<&String> = docs
                    .keys()
                    .chain(other_docs.keys())
                    .filter(|d| docs.get(*d) != other_docs.get(*d))
                    .collect();
                assert!(
                    differ.is_empty(),
                    "nodes {id} and {other} differ (applied index {applied}) on {differ:?}"
                );
            }
        }
    }
    let docs = &on[&leader];
    let mut acknowledged = 0;
    let mut discarded = 0;
    for a in &attempts {
        let etag = docs
            .get(&a.id)
            .and_then(|d| d["@metadata"]["@etag"].as_str());
        if let Outcome::Acked(acked) = &a.outcome {
            acknowledged += 1;
            assert_eq!(
                etag,
                Some(acked.as_str()),
                "{} was acknowledged by node {} with etag {acked}",
                a.id,
                a.node
            );
        }
        // A write sent to a node while it was cut off: not acknowledged, and
        // nowhere (its id went to that node only).
        if cut_off
            .iter()
            .any(|(node, cut, healed)| a.node == *node && a.sent >= *cut && a.sent < *healed)
        {
            assert!(
                !matches!(a.outcome, Outcome::Acked(_)) && etag.is_none(),
                "{} was sent to node {} while it was cut off, and is acknowledged or there \
                 ({etag:?}): {a:?}",
                a.id,
                a.node
            );
            discarded += 1;
        }
    }
    for r in &reports {
        println!(
            "node {} cut off: refused writes after {:?}, {} entries not applied in its log; \
             node {} led after {:?}; node {} cut off: no leader after {:?}, answered {:?}; \
             healed: node {} led in term {} (node {} in term {} before), writes again after {:?}",
            r.old_leader,
            r.refused_within,
            r.tail,
            r.new_leader,
            r.new_leader_after,
            r.follower,
            r.leaderless_after,
            r.follower_answers,
            r.leader_after_heal.1 .0,
            r.leader_after_heal.1 .1,
            r.leader_after_heal.0 .0,
            r.leader_after_heal.0 .1,
            r.writes_again_after
        );
    }
    println!(
        "{cycles} cycles in {:?}: {acknowledged} writes acknowledged, each on all three nodes \
         with its etag; {discarded} sent to cut-off nodes, none there; {} documents, the same \
         on the three nodes (applied index {applied})",
        started.elapsed(),
        docs.len()
    );
}
