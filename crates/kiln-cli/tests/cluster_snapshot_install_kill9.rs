//! A follower that was down while the leader snapshotted and purged its log can
//! only catch up from a snapshot; this test kills it with SIGKILL while it installs
//! one (after the snapshot arrived, while the databases are being restored from
//! it), restarts it, and checks that it ends equal to the leader: every document
//! with its etag, the same full export, the same index answer, and a clean
//! `kiln check` of its data directory. The node must also not keep what the
//! interrupted install left behind (a second snapshot file, a received file).
//!
//! Three `kiln serve` processes on loopback, snapshots every 200 entries. About
//! 10 s: in the slow tier (`--ignored`). It failed before the log store held its
//! purges back to the durable snapshot (see `kiln_cluster::log_store::PurgeLimit`):
//! openraft had purged the follower's log before the install was done, and the
//! restarted node refused to start.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{self, json, Cluster};
use common::replicas;
use common::{kill9, wait_until_healthy, TEST_JOURNAL_FILE_SIZE_MIB};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SNAPSHOT_EVERY_ENTRIES: &str = "200";

fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    cluster::request(port, method, path, None, body)
        .unwrap_or_else(|e| panic!("{method} {path} on port {port}: {e:?}"))
}

/// Starts node `id` of `c` with snapshots every few entries; with `log_lines`, its
/// info log lines (the snapshot's progress) are sent there as they come.
fn start(c: &mut Cluster, id: u64, log_lines: Option<mpsc::Sender<String>>) {
    let port = c.ports[&id];
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "serve",
            "--node-id",
            &id.to_string(),
            "--cluster",
            &c.members,
        ])
        .args([
            "--election-timeout-ms",
            &cluster::ELECTION_TIMEOUT_MS.to_string(),
        ])
        .args(["--snapshot-every-entries", SNAPSHOT_EVERY_ENTRIES])
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .args(["--journal-file-size-mib", TEST_JOURNAL_FILE_SIZE_MIB])
        .arg("--data-dir")
        .arg(&c.dirs[&id])
        .env("RUST_LOG", "warn,kiln_cluster::state_machine=info")
        .stdout(Stdio::null())
        .stderr(if log_lines.is_some() {
            Stdio::piped()
        } else if let Ok(path) = std::env::var("KILN_TEST_NODE_LOG") {
            Stdio::from(std::fs::File::create(format!("{path}.{id}")).unwrap())
        } else {
            Stdio::null()
        })
        .spawn()
        .unwrap();
    if let Some(lines) = log_lines {
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
    }
    wait_until_healthy(&mut child, port, &format!("node {id}"));
    c.children.insert(id, child);
}

/// Each node's applied index, from its `GET /cluster`.
fn applied(port: u16) -> Option<u64> {
    let (status, body) = cluster::request(port, "GET", "/cluster", None, "").ok()?;
    let status_json = json(&body);
    let me = status_json["node_id"].as_u64()?;
    (status == 200)
        .then(|| {
            status_json["members"]
                .as_array()?
                .iter()
                .find(|m| m["id"].as_u64() == Some(me))?["applied"]
                .as_u64()
        })
        .flatten()
}

/// One field of node `port`'s `GET /cluster` as a number.
fn status_index(port: u16, field: &str) -> Option<u64> {
    let (status, body) = cluster::request(port, "GET", "/cluster", None, "").ok()?;
    (status == 200)
        .then(|| json(&body)[field].as_u64())
        .flatten()
}

/// Writes single documents from `first` until the leader has purged its log
/// past `index`, so that a member holding no more than that can only catch up
/// from a snapshot; returns their etags. Openraft decides on a snapshot when an
/// entry commits, one build at a time: on a slow disk the last writes can commit
/// while a build is under way, and no snapshot follows them until more writes
/// come.
fn write_until_purged_past(port: u16, index: u64, first: u64) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut etags = BTreeMap::new();
    let mut next = first;
    while status_index(port, "purged_index").is_none_or(|purged| purged <= index) {
        assert!(
            Instant::now() < deadline,
            "the leader did not purge its log past {index} in 60 s (snapshot at {:?})",
            status_index(port, "snapshot_index")
        );
        std::thread::sleep(Duration::from_millis(100));
        etags.extend(write_singles(port, next, 10));
        next += 10;
    }
    etags
}

/// Waits until `follower` has applied what `leader` has.
fn wait_caught_up(c: &Cluster, leader: u64, follower: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let target = applied(c.ports[&leader]).expect("the leader's applied index");
        if applied(c.ports[&follower]).is_some_and(|a| a >= target) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {follower} did not catch up with node {leader} (applied {target}) in 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A 2 KiB document.
fn document(n: u64) -> String {
    format!(r#"{{"n":{n},"text":"{}"}}"#, "x".repeat(2048))
}

/// Writes `count` documents from `first` in batches of 100 (one log entry each);
/// returns their etags.
fn write_batches(port: u16, first: u64, count: u64) -> BTreeMap<String, String> {
    let mut etags = BTreeMap::new();
    for start in (first..first + count).step_by(100) {
        let ops: Vec<String> = (start..(start + 100).min(first + count))
            .map(|n| {
                format!(
                    r#"{{"op":"put","id":"items/{n}","document":{}}}"#,
                    document(n)
                )
            })
            .collect();
        let (status, body) = request(
            port,
            "POST",
            "/dbs/k/batch",
            &format!(r#"{{"ops":[{}]}}"#, ops.join(",")),
        );
        assert_eq!(status, 200, "batch: {body}");
        for result in json(&body)["results"].as_array().expect("results") {
            let id = result["id"].as_str().unwrap().to_string();
            etags.insert(id, result["etag"].as_str().unwrap().to_string());
        }
    }
    etags
}

/// Writes single documents (one log entry each); returns their etags.
fn write_singles(port: u16, first: u64, count: u64) -> BTreeMap<String, String> {
    (first..first + count)
        .map(|n| {
            let (status, body) =
                request(port, "PUT", &format!("/dbs/k/docs/items/{n}"), &document(n));
            assert!(
                status == 201 || status == 200,
                "PUT items/{n}: {status} {body}"
            );
            (
                format!("items/{n}"),
                json(&body)["etag"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn query_total(port: u16) -> u64 {
    let (status, body) = request(
        port,
        "POST",
        "/dbs/k/queries",
        r#"{"query":"from items where n >= 1000 limit 1","wait_for_non_stale_ms":10000}"#,
    );
    assert_eq!(status, 200, "query: {body}");
    json(&body)["total"].as_u64().expect("total")
}

#[test]
#[ignore = "slow tier: about 10 s (.ci/run runs it)"]
fn a_follower_killed_while_installing_a_snapshot_ends_equal_to_the_leader() {
    let root = tempfile::tempdir().unwrap();
    let ports: BTreeMap<u64, u16> = (1..=3).map(|id| (id, common::free_port())).collect();
    let members = cluster::members(&ports);
    let mut c = Cluster {
        dirs: (1..=3)
            .map(|id| (id, root.path().join(format!("node{id}"))))
            .collect(),
        ports,
        members,
        children: BTreeMap::new(),
        options: Default::default(),
    };
    for id in 1..=3 {
        start(&mut c, id, None);
    }
    let leader = c.leader();
    let port = c.ports[&leader];
    assert_eq!(request(port, "PUT", "/dbs/k", "").0, 201);
    let (status, body) = request(
        port,
        "PUT",
        "/dbs/k/indexes/by_n",
        r#"{"collection":"items","fields":["n"]}"#,
    );
    assert!(status == 201 || status == 200, "index: {body}");
    let mut etags = write_batches(port, 0, 3_000);

    // The follower goes down; the leader takes enough entries to snapshot and
    // purge the log past it.
    let follower = *c.ports.keys().find(|id| **id != leader).unwrap();
    let follower_holds =
        status_index(c.ports[&follower], "last_log_index").expect("follower's log");
    kill9(c.children.get_mut(&follower).unwrap(), 0);
    c.children.remove(&follower);
    etags.extend(write_batches(port, 3_000, 3_000));
    etags.extend(write_singles(port, 6_000, 500));
    etags.extend(write_until_purged_past(port, follower_holds, 100_000));

    // Restart it and kill it as soon as it starts installing the snapshot.
    let (lines_tx, lines) = mpsc::channel();
    start(&mut c, follower, Some(lines_tx));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the follower never started installing a snapshot");
        assert!(
            !line.contains("snapshot installed"),
            "installed before the kill: {line}"
        );
        if line.contains("installing a snapshot") {
            break;
        }
    }
    kill9(c.children.get_mut(&follower).unwrap(), 1);
    c.children.remove(&follower);
    let installed_before_kill = lines.try_iter().any(|l| l.contains("snapshot installed"));
    assert!(
        !installed_before_kill,
        "the install finished before the kill landed"
    );

    // Writes go on meanwhile; then the follower comes back and catches up.
    etags.extend(write_singles(port, 6_500, 50));
    start(&mut c, follower, None);
    wait_caught_up(&c, leader, follower);
    let follower_port = c.ports[&follower];
    for (id, etag) in &etags {
        let (status, body) = request(follower_port, "GET", &format!("/dbs/k/docs/{id}"), "");
        assert_eq!(status, 200, "{id} missing on node {follower}: {body}");
        let got = json(&body)["@metadata"]["@etag"]
            .as_str()
            .map(str::to_string);
        assert_eq!(
            got.as_deref(),
            Some(etag.as_str()),
            "{id}: etag on node {follower}"
        );
    }
    let leader_export = replicas::export(port, "k", &root.path().join("leader.ndjson"));
    let follower_export =
        replicas::export(follower_port, "k", &root.path().join("follower.ndjson"));
    assert_eq!(leader_export.lines().count(), etags.len());
    assert!(
        leader_export == follower_export,
        "the exports of leader and follower differ"
    );
    assert_eq!(query_total(follower_port), query_total(port));
    // items/0 to items/999 have n < 1000.
    assert_eq!(query_total(port), etags.len() as u64 - 1_000);

    // What the interrupted install left is gone: one snapshot file at most.
    let snapshots = c.dirs[&follower].join("cluster").join("snapshots");
    let left: Vec<String> = std::fs::read_dir(&snapshots)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.len() <= 1 && left.iter().all(|f| f.ends_with(".snap")),
        "left in {}: {left:?}",
        snapshots.display()
    );
    drop(c); // stops the nodes
    replicas::check_offline(follower, &root.path().join(format!("node{follower}")));
}
