//! Three `kiln serve` nodes whose wall clocks disagree and jump: each node runs
//! under libfaketime (`LD_PRELOAD`, its offset read from a file the test rewrites),
//! at -10 s, 0 or +10 s from the real time, and every cycle each node's offset
//! changes (a jump of 10 or 20 s, backwards too) while leadership moves to
//! another node. Each cycle, the leader writes documents that expire within
//! seconds, updates documents that keep revisions, deletes one, and last tries a
//! compare-and-set that fails; then a follower is killed with SIGKILL and
//! restarted.
//!
//! The leader stamps its time into each log entry and every node applies that
//! time, so clocks may differ without the replicas differing. At the end, on
//! every node:
//! - the changes feed (every document's latest write with its body, etag and
//!   `@last-modified`, every delete) is the same, and so are the revisions;
//! - times never go back along the etags, though a new leader's clock may be
//!   20 s behind the last one's;
//! - every expiring document is gone, deleted by the leader of the moment
//!   through the log (so with the same tombstone everywhere).
//!
//! Needs libfaketime (Debian's `faketime` package; `.ci/run` installs it);
//! without it the test says so and stops (fails with KILN_REQUIRE_FAKETIME set). Cycles: KILN_CLOCK_JUMP_CYCLES
//! (default 2; the slow tier runs 8).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, ok_json, request, Cluster, NodeOptions};
use common::fake_clock::{fake_clocks, faketime_or_skip, jump_clocks, real_now_ms};
use common::replicas::{expired, quiet, revision_times_never_go_back, state, times_never_go_back};
use common::{cycles_from_env, kill9};
use kiln_docs::format_rfc3339_ms;
use serde_json::Value;
use std::time::Duration;

const DB: &str = "clock";
const HOT: [&str; 3] = ["hot/1", "hot/2", "hot/3"];

fn put(port: u16, id: &str, body: &str, if_match: Option<&str>) -> (u16, Value) {
    let (status, text) =
        request(port, "PUT", &format!("/dbs/{DB}/docs/{id}"), if_match, body).unwrap();
    (status, json(&text))
}

/// One cycle's writes through the leader at `port`.
fn write_cycle(port: u16, cycle: u64, stale_etag: &str) {
    for i in 0..10u64 {
        // Expires 1 to 4 s from now, real time: a leader whose clock is 10 s
        // ahead deletes it at once, one 10 s behind only 11 to 14 s from now.
        let expires = format_rfc3339_ms(real_now_ms() + 1_000 + i * 300);
        let body = format!(r#"{{"n": {i}, "@metadata": {{"@expires": "{expires}"}}}}"#);
        let (status, answer) = put(port, &format!("exp/{cycle}-{i}"), &body, None);
        assert!((200..300).contains(&status), "{answer}");
    }
    for (n, id) in HOT.iter().enumerate() {
        let body = format!(r#"{{"cycle": {cycle}, "n": {n}}}"#);
        let (status, answer) = put(port, id, &body, None);
        assert!((200..300).contains(&status), "{answer}");
    }
    let (status, answer) = put(port, &format!("plain/{cycle}"), r#"{"p": 1}"#, None);
    assert!((200..300).contains(&status), "{answer}");
    if cycle > 0 {
        let path = format!("/dbs/{DB}/docs/plain/{}", cycle - 1);
        let (status, text) = request(port, "DELETE", &path, None, "").unwrap();
        assert!((200..300).contains(&status), "{text}");
    }
    // Last, a while after the others, a compare-and-set that fails: an entry
    // whose only write fails still moves the write clock of every node, past
    // the last write's time (a node that reopens its database must resume from
    // there too).
    std::thread::sleep(Duration::from_millis(300));
    let (status, answer) = put(port, HOT[0], r#"{"lost": true}"#, Some(stale_etag));
    assert_eq!(status, 409, "{answer}");
}

#[test]
#[ignore = "slow tier (about 40 s): .ci/run runs it"]
fn clocks_that_disagree_and_jump_leave_every_replica_the_same() {
    let Some(lib) = faketime_or_skip() else {
        return;
    };
    let cycles = cycles_from_env("KILN_CLOCK_JUMP_CYCLES", 2);
    let root = tempfile::tempdir().unwrap();
    let mut c = Cluster::with_options(
        root.path(),
        NodeOptions {
            env: fake_clocks(root.path(), &lib),
            ..NodeOptions::args(&["--expiration-check-ms", "200"])
        },
    );
    let leader = c.ports[&c.leader()];
    ok_json(leader, "PUT", &format!("/dbs/{DB}"), "");
    let config = r#"{"collections": {"hot": {"max_revisions": 100}}}"#;
    ok_json(
        leader,
        "PUT",
        &format!("/dbs/{DB}/revisions/config"),
        config,
    );
    let (_, first) = put(leader, HOT[0], r#"{"first": true}"#, None);
    let stale_etag = first["etag"].as_str().unwrap().to_string();

    for cycle in 0..cycles {
        let offsets = jump_clocks(root.path(), cycle);
        let to = cycle % 3 + 1;
        c.transfer_to(to);
        write_cycle(c.ports[&to], cycle, &stale_etag);
        // A follower that applied the cycle restarts before the next leader, whose
        // clock may be behind, stamps anything.
        quiet(&c, to);
        let follower = (to + cycle % 2) % 3 + 1;
        let mut child = c.children.remove(&follower).unwrap();
        kill9(&mut child, cycle);
        c.start(follower);
        println!("clock jump cycle {cycle}: clocks {offsets:?} s, node {to} led");
    }

    // Every expiring document is deleted, whichever clock the leader has (at
    // most 10 s behind, plus the checks' period).
    let leader = c.leader();
    let port = c.ports[&leader];
    let expiring: Vec<String> = (0..cycles)
        .flat_map(|cycle| (0..10).map(move |i| format!("exp/{cycle}-{i}")))
        .collect();
    expired(port, DB, &expiring);
    quiet(&c, leader);
    let hot: Vec<String> = HOT.iter().map(|id| id.to_string()).collect();
    let want = state(port, DB, &hot);
    let changes = want["changes"].as_array().unwrap();
    let deletes = changes.iter().filter(|c| c["change"] == "delete").count() as u64;
    assert!(
        deletes >= cycles * 10,
        "{deletes} deletes in the changes for {cycles} cycles"
    );
    let revisions = want["revisions"].as_array().unwrap();
    for r in revisions {
        assert!(
            // Every version but the last is a revision.
            r["revisions"].as_array().unwrap().len() as u64 + 1 >= cycles,
            "too few revisions: {r}"
        );
    }
    for (id, port) in &c.ports {
        let got = state(*port, DB, &hot);
        times_never_go_back(*id, got["changes"].as_array().unwrap());
        for r in got["revisions"].as_array().unwrap() {
            revision_times_never_go_back(*id, r);
        }
        assert!(
            got == want,
            "node {id} differs from the leader {leader}:\n{got}\nleader:\n{want}"
        );
    }
    println!(
        "clock jump cycles: {cycles}; {} changes ({deletes} deletes) and the revisions the same on every node",
        changes.len()
    );
}
