//! A follower cut off from the others, then healed, over and over while a client
//! writes to the leader: the leader stays the leader, its term does not move, and
//! every write is acknowledged. Without pre-votes (`kiln-cluster/src/prevote.rs`)
//! the cut-off follower stood for election at every timeout, its term climbing;
//! once healed, its answers carried that term and the leader stepped down, and
//! writes paused for an election.
//!
//! Cycles: `KILN_CLUSTER_HEAL_CYCLES` (default 3, the fast tier; the slow tier
//! runs 20). Each cut lasts three times the leader's lease, time for the follower
//! to have stood for election several times.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, request_within, Cluster, ELECTION_TIMEOUT_MS};
use common::cycles_from_env;
use common::relay::Fault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The leader's lease: twice `--election-timeout-ms` (its maximum).
const LEASE: Duration = Duration::from_millis(2 * ELECTION_TIMEOUT_MS);

fn status(port: u16) -> serde_json::Value {
    match request_within(port, "GET", "/cluster", None, "", Duration::from_secs(2)) {
        Ok((200, body)) => json(&body),
        other => panic!("GET /cluster on {port}: {other:?}"),
    }
}

#[test]
fn a_healed_follower_leaves_the_leader_alone() {
    let cycles = cycles_from_env("KILN_CLUSTER_HEAL_CYCLES", 3);
    let root = tempfile::tempdir().unwrap();
    let (cluster, relays) = Cluster::behind_relays(root.path());
    let ports = cluster.ports.clone();
    let leader = cluster.leader();
    let port = ports[&leader];
    let (code, body) =
        request_within(port, "PUT", "/dbs/h", None, "", Duration::from_secs(10)).unwrap();
    assert_eq!(code, 201, "{body}");
    let term_before = status(port)["term"].as_u64().unwrap();

    // One client writing to the leader all along: every write's time.
    let stop = Arc::new(AtomicBool::new(false));
    let times: Arc<Mutex<Vec<(Instant, Duration)>>> = Arc::default();
    let writer = {
        let (stop, times) = (stop.clone(), times.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let sent = Instant::now();
                let path = format!("/dbs/h/docs/d{n}");
                let answer =
                    request_within(port, "PUT", &path, None, "{}", Duration::from_secs(10));
                assert!(
                    matches!(answer, Ok((201, _))),
                    "PUT {path} to the leader: {answer:?}"
                );
                times.lock().unwrap().push((sent, sent.elapsed()));
                n += 1;
            }
        })
    };
    let followers: Vec<u64> = ports.keys().copied().filter(|id| *id != leader).collect();
    let mut cut_at = Vec::new();
    for cycle in 0..cycles {
        let follower = followers[cycle as usize % 2];
        let fault = if cycle % 2 == 0 {
            Fault::Cut
        } else {
            Fault::Hold
        };
        relays.isolate(follower, fault);
        let cut = Instant::now();
        std::thread::sleep(LEASE * 3);
        // Cut off, it knows of no leader any more (it says so; it redirects nothing).
        let seen = status(ports[&follower]);
        assert!(
            seen["leader"].is_null(),
            "cycle {cycle}: node {follower}, cut off for {:?}: {seen}",
            cut.elapsed()
        );
        relays.heal_all();
        cut_at.push(cut);
        // Healed, it follows the same leader again.
        let deadline = Instant::now() + Duration::from_secs(5);
        while status(ports[&follower])["leader"].as_u64() != Some(leader) {
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: node {follower} healed, but follows no leader: {}",
                status(ports[&follower])
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let now = status(port);
        assert_eq!(
            now["leader"].as_u64(),
            Some(leader),
            "cycle {cycle}: the leader changed: {now}"
        );
        assert_eq!(
            now["term"].as_u64(),
            Some(term_before),
            "cycle {cycle}: the term moved: {now}"
        );
        std::thread::sleep(LEASE);
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    let times = times.lock().unwrap();
    let longest = times.iter().map(|(_, t)| *t).max().unwrap();
    let mut sorted: Vec<Duration> = times.iter().map(|(_, t)| *t).collect();
    sorted.sort();
    let p99 = sorted[sorted.len() * 99 / 100];
    println!(
        "healed follower cycles: {cycles}, {} writes, p99 {p99:?}, longest {longest:?}, term {term_before} throughout",
        times.len()
    );
    assert!(
        times.len() as u64 > 20 * cycles,
        "too few writes: {}",
        times.len()
    );
    // An election would pause writes for the lease and more (and move the term,
    // checked above); a loaded machine's
    // fsync stalls stay well under it.
    assert!(longest < LEASE * 3, "a write waited {longest:?}");
}
