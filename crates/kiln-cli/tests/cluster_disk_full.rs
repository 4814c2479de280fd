//! A full disk on one node of a three-node cluster (its data directory on a small
//! tmpfs the test fills): the other two go on taking writes, and when space comes
//! back the node catches up without a restart, with the documents the others have.
//! - A follower's disk: no write fails, the leader stays, the follower's Raft does
//!   not stop (it waits for space: its applied index stops, then reaches the
//!   leader's once the filler file is removed) and it calls no elections meanwhile.
//! - The leader's disk: it cannot append, the other two elect a leader and writes
//!   resume there; when space comes back the old leader rejoins as a follower.
//! - The leader's disk with its Raft log elsewhere: it can append but not apply,
//!   so it answers no write though its heartbeats go on: it must hand leadership
//!   over itself.
//!
//! Needs the right to mount a tmpfs; without it the test says so and stops. The
//! slow tier runs it (`--ignored --test-threads=1`: two clusters at once on two
//! cores would stretch every timing).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{find_leader, json, request, Cluster};
use common::tmpfs::Tmpfs;
use std::time::{Duration, Instant};

const DB: &str = "full";
const FULL_NODE: u64 = 3;

/// Document `i`: `words` × 16 hex digits (about half of it stays after the
/// journal's compression).
fn body(i: u64, words: usize) -> String {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ i;
    let text: String = (0..words)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{:016x}", x)
        })
        .collect();
    format!(r#"{{"i": {i}, "pad": "{text}"}}"#)
}

fn status(port: u16) -> serde_json::Value {
    request(port, "GET", "/cluster", None, "")
        .map(|(_, text)| json(&text))
        .unwrap_or(serde_json::Value::Null)
}

/// A document of ~2 KiB.
const SMALL: usize = 128;
/// A document of ~64 KiB: the leader's disk fills after a few thousand.
const LARGE: usize = 4096;

/// Writes documents `from..to` of `words` (`body`) through whichever node leads
/// (following it across a failover); every write must be acknowledged within
/// `patience` of the first try. The longest time one write took.
fn write_all(c: &Cluster, from: u64, to: u64, words: usize, patience: Duration) -> Duration {
    let mut longest = Duration::ZERO;
    // (Not `c.leader()`: a node whose Raft core waits in a log append can go on
    // calling itself leader.)
    let mut port = find_leader(&c.ports).map_or(c.ports[&1], |(_, p)| p);
    for i in from..to {
        let started = Instant::now();
        loop {
            let path = format!("/dbs/{DB}/docs/d/{i}");
            match request(port, "PUT", &path, None, &body(i, words)) {
                Ok((200 | 201, _)) => break,
                other => {
                    assert!(
                        started.elapsed() < patience,
                        "PUT {path} not acknowledged within {patience:?}: {other:?}"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                    if let Some((_, p)) = find_leader(&c.ports) {
                        port = p;
                    }
                }
            }
        }
        longest = longest.max(started.elapsed());
    }
    longest
}

/// Waits until node `id` has applied at least `index`; its applied index.
fn applied_reaches(c: &Cluster, id: u64, index: u64, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    loop {
        let applied = status(c.ports[&id])["last_applied"].as_u64().unwrap_or(0);
        if applied >= index || Instant::now() > deadline {
            return applied;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every document `0..count` has the same etag on node `id` as on `leader`.
fn same_documents(c: &Cluster, id: u64, leader: u64, count: u64) {
    for i in (0..count).step_by(97).chain([count - 1]) {
        let path = format!("/dbs/{DB}/docs/d/{i}");
        let (s1, a) = request(c.ports[&leader], "GET", &path, None, "").unwrap();
        let (s2, b) = request(c.ports[&id], "GET", &path, None, "").unwrap();
        assert_eq!((s1, s2), (200, 200), "{path}: {a} / {b}");
        assert_eq!(
            json(&a)["@metadata"]["@etag"],
            json(&b)["@metadata"]["@etag"],
            "{path} on node {id} and on the leader {leader}"
        );
    }
}

/// Waits up to 60 s for the full node (`who`) to apply `index`; fails with its
/// status and the last lines of its log.
fn catches_up_once_space_is_back(c: &Cluster, index: u64, who: &str) {
    let caught_up = applied_reaches(c, FULL_NODE, index, Duration::from_secs(60));
    assert!(
        caught_up >= index,
        "node {FULL_NODE} ({who}) did not catch up after space came back: {}\n{}",
        status(c.ports[&FULL_NODE]),
        log_tail(c)
    );
}

/// The last lines of the full node's log, for a failure's message.
fn log_tail(c: &Cluster) -> String {
    c.log_tail(FULL_NODE, 30)
}

/// The full node leads, its disk fills up under writes (documents from `first` on):
/// the other two must take over, and the full node catch up once space is back.
/// Whether the full leader handed leadership over itself (its applying waited
/// while its log had room) rather than stop its heartbeats (its log append
/// waited).
fn the_full_leader_hands_over(c: &Cluster, fs: &Tmpfs, first: u64) -> bool {
    // Its files may have room left inside them (a data file grows 64 MiB at a
    // time), so large documents are written until leadership moves: by 6000 of
    // them (~190 MiB after compression, on a 256 MiB tmpfs) it must have.
    c.transfer_to(FULL_NODE);
    let filler = fs.fill(1 << 20);
    let mut written = first;
    while find_leader(&c.ports).map(|(id, _)| id) == Some(FULL_NODE) {
        assert!(
            written < first + 6000,
            "node {FULL_NODE} still leads after {} writes on a full disk: {}\n{}",
            written - first,
            status(c.ports[&FULL_NODE]),
            log_tail(c)
        );
        write_all(c, written, written + 100, LARGE, Duration::from_secs(20));
        written += 100;
    }
    let large = written - first;
    let longest = write_all(c, written, written + 500, SMALL, Duration::from_secs(20));
    written += 500;
    let new_leader = c.leader_among(&[1, 2]);
    let handed_over = std::fs::read_to_string(c.log_path(FULL_NODE))
        .unwrap_or_default()
        .contains("stepped down while the disk waits");
    println!("disk full cluster test: the leader's disk full, node {new_leader} leads after {large} large writes (handed over by the old leader: {handed_over}); the longest write after took {longest:?}");
    std::fs::remove_file(&filler).unwrap();
    let last = status(c.ports[&new_leader])["last_applied"]
        .as_u64()
        .unwrap();
    catches_up_once_space_is_back(c, last, "the old leader");
    same_documents(c, FULL_NODE, new_leader, written);
    handed_over
}

#[test]
#[ignore = "slow tier (about 25 s): .ci/run runs it"]
fn a_leader_that_cannot_apply_hands_leadership_over() {
    // The Raft log on the real disk, the databases on the tmpfs: the leader's
    // appends go on while its applying waits, so its heartbeats would keep the
    // others from electing anyone.
    let fs = match Tmpfs::mount(256) {
        Ok(fs) => fs,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let root = tempfile::tempdir().unwrap();
    let data = fs.path().join("node");
    let raft_elsewhere = root.path().join("node3-raft");
    std::fs::create_dir_all(data.join("cluster")).unwrap();
    std::fs::create_dir_all(&raft_elsewhere).unwrap();
    std::os::unix::fs::symlink(&raft_elsewhere, data.join("cluster").join("raft")).unwrap();
    let c = Cluster::with_dir(root.path(), FULL_NODE, data);
    let (status_code, text) =
        request(c.ports[&c.leader()], "PUT", &format!("/dbs/{DB}"), None, "").unwrap();
    assert!((200..300).contains(&status_code), "{text}");
    write_all(&c, 0, 100, SMALL, Duration::from_secs(10));
    assert!(
        the_full_leader_hands_over(&c, &fs, 100),
        "node {FULL_NODE} did not hand leadership over:\n{}",
        log_tail(&c)
    );
}

#[test]
#[ignore = "slow tier (about 25 s): .ci/run runs it"]
fn a_full_disk_stops_neither_the_other_nodes_nor_the_node_for_good() {
    let fs = match Tmpfs::mount(256) {
        Ok(fs) => fs,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let root = tempfile::tempdir().unwrap();
    let data = fs.path().join("node");
    let c = Cluster::with_dir(root.path(), FULL_NODE, data);
    c.transfer_to(1);
    let (status_code, text) = request(c.ports[&1], "PUT", &format!("/dbs/{DB}"), None, "").unwrap();
    assert!((200..300).contains(&status_code), "{text}");
    write_all(&c, 0, 100, SMALL, Duration::from_secs(10));

    // A follower's disk fills up.
    let leader_before = status(c.ports[&1]);
    let filler = fs.fill(1 << 20);
    let longest = write_all(&c, 100, 3000, SMALL, Duration::from_secs(10));
    let leader_after = status(c.ports[&1]);
    assert_eq!(
        leader_after["leader"], 1,
        "the leader changed: {leader_after}"
    );
    assert_eq!(
        leader_after["term"], leader_before["term"],
        "{leader_after}"
    );
    let last = leader_after["last_applied"].as_u64().unwrap();
    let stuck = applied_reaches(&c, FULL_NODE, last, Duration::from_secs(2));
    assert!(
        stuck < last,
        "node {FULL_NODE} applied everything: its disk never filled (applied {stuck} of {last})"
    );
    println!("disk full cluster test: a follower's disk full, the longest write took {longest:?}; node {FULL_NODE} stopped at {stuck} of {last}");
    let waiting = status(c.ports[&FULL_NODE]);
    assert_eq!(waiting["waiting_for_disk"], true, "{waiting}");
    assert_eq!(waiting["leader"], serde_json::Value::Null, "{waiting}");
    std::fs::remove_file(&filler).unwrap();
    catches_up_once_space_is_back(&c, last, "the follower");
    same_documents(&c, FULL_NODE, 1, 3000);
    let back = status(c.ports[&FULL_NODE]);
    assert_eq!(back["waiting_for_disk"], false, "{back}");
    assert_eq!(
        back["term"], leader_after["term"],
        "node {FULL_NODE} called elections while it waited: {back}"
    );

    // The leader's disk fills up: the other two take over.
    the_full_leader_hands_over(&c, &fs, 3000);
    let log = std::fs::read_to_string(c.log_path(FULL_NODE)).unwrap();
    assert!(
        log.contains("disk is full"),
        "node {FULL_NODE} did not say why it waited"
    );
}
