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
use common::{cycles_from_env, kill9};
use kiln_docs::format_rfc3339_ms;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const DB: &str = "clock";
const HOT: [&str; 3] = ["hot/1", "hot/2", "hot/3"];
/// Each node's clock offset, in seconds, is one of these.
const OFFSETS_S: [i64; 3] = [-10, 0, 10];

fn faketime_library() -> Option<PathBuf> {
    let lib = std::fs::read_dir("/usr/lib").ok()?.find_map(|entry| {
        let path = entry.ok()?.path().join("faketime/libfaketime.so.1");
        path.exists().then_some(path)
    });
    lib.or_else(|| {
        let path = PathBuf::from("/usr/lib/faketime/libfaketime.so.1");
        path.exists().then_some(path)
    })
}

fn real_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The file node `id`'s libfaketime reads its offset from.
fn clock_file(root: &Path, id: u64) -> PathBuf {
    root.join(format!("clock{id}"))
}

/// Sets the nodes' clocks for `cycle` (each node a different offset, all three
/// changing at every cycle), and waits until libfaketime has read them (it
/// caches the file for a second).
fn jump_clocks(root: &Path, cycle: u64) -> BTreeMap<u64, i64> {
    let offsets: BTreeMap<u64, i64> = (1..=3u64)
        .map(|id| (id, OFFSETS_S[((cycle + id) % 3) as usize]))
        .collect();
    for (id, offset) in &offsets {
        std::fs::write(clock_file(root, *id), format!("{offset:+}\n")).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1_200));
    offsets
}

/// Each node under libfaketime, its offset in its own file.
fn fake_clocks(root: &Path, lib: &Path) -> BTreeMap<u64, Vec<(String, String)>> {
    (1..=3u64)
        .map(|id| {
            std::fs::write(clock_file(root, id), "+0\n").unwrap();
            let vars = [
                ("LD_PRELOAD", lib.to_str().unwrap().to_string()),
                (
                    "FAKETIME_TIMESTAMP_FILE",
                    clock_file(root, id).to_str().unwrap().to_string(),
                ),
                // Timers and timeouts keep the real monotonic clock: only the wall
                // clock (what a leader stamps) is moved.
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
                ("FAKETIME_CACHE_DURATION", "1".to_string()),
            ];
            let vars = vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            (id, vars)
        })
        .collect()
}

/// Moves leadership to `to` (asked of the current leader).
fn transfer_to(c: &Cluster, to: u64) {
    let leader = c.leader();
    if leader != to {
        let body = format!(r#"{{"id": {to}}}"#);
        let (status, text) =
            request(c.ports[&leader], "POST", "/cluster/leader", None, &body).unwrap();
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(c.leader(), to);
}

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

/// Every change of the database on the node at `port`, with bodies, in etag
/// order.
fn changes(port: u16) -> Vec<Value> {
    let mut all = Vec::new();
    let mut since = "0".to_string();
    loop {
        let path = format!("/dbs/{DB}/changes?since={since}&limit=1000&include_docs=true");
        let page = ok_json(port, "GET", &path, "");
        let results = page["results"].as_array().unwrap();
        if results.is_empty() {
            return all;
        }
        all.extend(results.iter().cloned());
        since = page["last_etag"].as_str().unwrap().to_string();
    }
}

/// What a node holds: its changes and the hot documents' revisions.
fn state(port: u16) -> Value {
    let revisions: Vec<Value> = HOT
        .iter()
        .map(|id| ok_json(port, "GET", &format!("/dbs/{DB}/revisions/docs/{id}"), ""))
        .collect();
    serde_json::json!({"changes": changes(port), "revisions": revisions})
}

fn status(port: u16) -> Value {
    request(port, "GET", "/cluster", None, "")
        .map(|(_, text)| json(&text))
        .unwrap_or(Value::Null)
}

/// Waits until every node has applied what the leader has.
fn quiet(c: &Cluster, leader: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let target = status(c.ports[&leader])["last_log_index"].as_u64().unwrap();
    for (id, port) in &c.ports {
        while status(*port)["last_applied"].as_u64().unwrap_or(0) < target {
            assert!(
                Instant::now() < deadline,
                "node {id} did not apply up to {target}: {}",
                status(*port)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The `@last-modified` times of the changes' documents never go back along the
/// etags.
fn times_never_go_back(node: u64, changes: &[Value]) {
    let mut last = String::new();
    for change in changes {
        let Some(modified) = change["document"]["@metadata"]["@last-modified"].as_str() else {
            continue;
        };
        assert!(
            modified >= last.as_str(),
            "node {node}: {} at {modified} after a write at {last}",
            change["etag"]
        );
        last = modified.to_string();
    }
}

/// A document's revisions (every version it had, with the time it was written
/// and the time it was replaced), in etag order: times never go back.
fn revision_times_never_go_back(node: u64, revisions: &Value) {
    let sequence = |r: &Value| -> u64 {
        let etag = r["etag"].as_str().unwrap();
        etag.split('-').next().unwrap().parse().unwrap()
    };
    let mut list: Vec<&Value> = revisions["revisions"].as_array().unwrap().iter().collect();
    list.sort_by_key(|r| sequence(r));
    let mut last = "";
    for r in list {
        let (written, replaced) = (
            r["last_modified"].as_str().unwrap(),
            r["replaced_at"].as_str().unwrap(),
        );
        assert!(
            written >= last && replaced >= written,
            "node {node}: revision {} written at {written}, replaced at {replaced}, after a write at {last}",
            r["etag"]
        );
        last = replaced;
    }
}

#[test]
#[ignore = "slow tier (about 40 s): .ci/run runs it"]
fn clocks_that_disagree_and_jump_leave_every_replica_the_same() {
    let Some(lib) = faketime_library() else {
        let why = "libfaketime is not installed (Debian: apt-get install faketime)";
        assert!(std::env::var_os("KILN_REQUIRE_FAKETIME").is_none(), "{why}");
        println!("skipped: {why}");
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
        transfer_to(&c, to);
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
    let deadline = Instant::now() + Duration::from_secs(40);
    for cycle in 0..cycles {
        for i in 0..10 {
            let path = format!("/dbs/{DB}/docs/exp/{cycle}-{i}");
            while request(port, "GET", &path, None, "").unwrap().0 != 404 {
                assert!(Instant::now() < deadline, "{path} never expired");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    quiet(&c, leader);
    let want = state(port);
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
        let got = state(*port);
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
