//! Three `kiln serve` nodes of one cluster on loopback; 8 clients write, write
//! conditionally (`If-Match`, a compare-and-set) and read a few documents on the
//! node they believe leads (tests/common/registers.rs); the leader is killed with
//! SIGKILL several times and restarted. Every document is a register, and each
//! one's history (invocation and answer times, monotonic) must be linearizable:
//! the checker in tests/common/linearizability.rs searches for an order that
//! explains every answer and respects real time.
//!
//! A run fails with fewer than 200 operations whose answer was seen (too few to
//! tell). It prints how many were checked. Partitions, clock jumps and full
//! disks join the kills in `cluster_linearizable_faults` (slow tier).
//!
//! Cycles: KILN_CLUSTER_LIN_CYCLES (default 2); the clients' random choices:
//! KILN_CLUSTER_LIN_SEED (default random, printed).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;
#[path = "common/linearizability.rs"]
mod linearizability;
#[path = "common/registers.rs"]
mod registers;

use common::cluster::Cluster;
use common::{cycles_from_env, kill9};
use registers::{create_database, Clients};
use std::time::{Duration, Instant};

#[test]
fn registers_stay_linearizable_through_leader_kills() {
    let cycles = cycles_from_env("KILN_CLUSTER_LIN_CYCLES", 2);
    let test_started = Instant::now();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path());
    create_database(cluster.ports[&cluster.leader()]);
    let mut clients = Clients::start(&cluster.ports, Duration::from_secs(10));
    for cycle in 0..cycles {
        clients.progress(100, 25, &format!("cycle {cycle}, before the kill"));
        let leader = cluster.leader();
        let mut child = cluster.children.remove(&leader).unwrap();
        clients.note(format!("kill -9 of node {leader} (the leader)"));
        kill9(&mut child, cycle);
        let new_leader = cluster.leader();
        assert_ne!(new_leader, leader, "cycle {cycle}");
        clients.note(format!("node {new_leader} leads"));
        clients.progress(60, 15, &format!("cycle {cycle}, after the failover"));
        cluster.start(leader);
        clients.note(format!("node {leader} restarted"));
        clients.progress(60, 15, &format!("cycle {cycle}, with the node back"));
    }
    let history = clients.stop();
    let ran_for = test_started.elapsed();
    drop(cluster);
    registers::check(history, &format!("{cycles} kill -9 of the leader"), ran_for);
}
