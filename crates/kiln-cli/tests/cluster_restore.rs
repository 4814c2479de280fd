//! Restore into a three-node cluster (`POST /dbs/{db}/restore`, `kiln restore
//! --url`): the backup's bytes go through the log and every node restores the
//! same database from them, so every node holds the same documents with the same
//! etags; writes after it replicate (the restored database takes the restore's log
//! index, whatever the backup recorded); a follower redirects the restore to the
//! leader, and `kiln restore --url <follower>` sends it there; a damaged backup is
//! refused on every node and leaves no database behind; an existing database is
//! refused without `--force` and replaced with it; a database a follower's changes
//! feed holds open is replaced and deleted there all the same.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, request, Cluster};
use common::{kiln, text};
use std::path::Path;
use std::time::{Duration, Instant};

/// A backup of database `shop` with `n` documents, made offline.
fn backup_of(dir: &Path, n: usize, out: &Path) {
    let data = dir.join("source");
    for i in 0..n {
        let body = format!(r#"{{"n": {i}, "note": "restored {i}"}}"#);
        let o = kiln(&[
            "put",
            "--data-dir",
            data.to_str().unwrap(),
            "shop",
            &format!("items/{i:03}"),
            &body,
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = kiln(&[
        "backup",
        "--data-dir",
        data.to_str().unwrap(),
        "--db",
        "shop",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

fn restore(port: u16, backup: &Path, extra: &[&str]) -> std::process::Output {
    let url = format!("http://127.0.0.1:{port}");
    let mut args = vec![
        "restore",
        backup.to_str().unwrap(),
        "--url",
        &url,
        "--db",
        "shop",
    ];
    args.extend_from_slice(extra);
    kiln(&args)
}

/// Every document of `shop` on the node at `port` with its etag (its change log),
/// once the node has `want` of them (a follower applies a moment after the leader answered).
fn documents(port: u16, want: usize) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = request(
            port,
            "GET",
            "/dbs/shop/docs?prefix=items/&page_size=1000",
            None,
            "",
        )
        .unwrap();
        let page = json(&body);
        let items = page["results"].as_array().cloned().unwrap_or_default();
        if status == 200 && items.len() == want {
            return items
                .iter()
                .map(|d| {
                    let meta = &d["@metadata"];
                    (
                        meta["@id"].as_str().unwrap_or_default().to_string(),
                        meta["@etag"].to_string(),
                    )
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "node {port}: {status} {} documents, want {want}",
            items.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_restore_reaches_every_node_with_the_same_etags() {
    let root = tempfile::tempdir().unwrap();
    let backup = root.path().join("shop.kbak");
    backup_of(root.path(), 30, &backup);
    let cluster_dir = root.path().join("cluster");
    std::fs::create_dir_all(&cluster_dir).unwrap();
    let c = Cluster::new(&cluster_dir);
    let leader_id = c.leader();
    let leader = c.ports[&leader_id];
    let follower = c.follower_of(leader_id);

    // A follower answers the request itself with 307; `kiln restore --url` asks
    // it which node leads and sends the backup there.
    let (status, _) = request(follower, "POST", "/dbs/shop/restore", None, "").unwrap();
    assert_eq!(status, 307);
    let o = restore(follower, &backup, &["--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let on_leader = documents(leader, 30);
    for port in c.ports.values() {
        assert_eq!(documents(*port, 30), on_leader, "node {port}");
    }

    // Writes after it replicate, on every node.
    let (status, body) = request(
        leader,
        "PUT",
        "/dbs/shop/docs/items/999",
        None,
        r#"{"n": 999}"#,
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    let after = documents(leader, 31);
    for port in c.ports.values() {
        assert_eq!(documents(*port, 31), after, "node {port}");
    }

    // An existing database: refused without --force, replaced with it.
    let o = restore(leader, &backup, &[]);
    assert!(
        !o.status.success() && text(&o).contains("database_exists"),
        "{}",
        text(&o)
    );
    let o = restore(leader, &backup, &["--force"]);
    assert!(o.status.success(), "{}", text(&o));
    for port in c.ports.values() {
        assert_eq!(documents(*port, 30), on_leader, "node {port} after --force");
    }

    // A follower whose changes feed holds the database open (a 30 s long poll)
    // still replaces it when the log's restore comes, and deletes it when the
    // log's delete comes: the feed lets go at once, instead of the node giving up
    // after `delete_wait_ms` (10 s) and keeping what the others no longer have.
    let poll = long_poll(follower);
    std::thread::sleep(Duration::from_millis(300));
    let o = restore(leader, &backup, &["--force"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(documents(follower, 30), on_leader);
    let (status, seconds) = poll.join().unwrap();
    assert!(
        status == 200 && seconds < 8.0,
        "the long poll held on: {status} after {seconds:.1} s"
    );
    let poll = long_poll(follower);
    std::thread::sleep(Duration::from_millis(300));
    let deleted = request(leader, "DELETE", "/dbs/shop", None, "").unwrap();
    assert_eq!(deleted.0, 200, "{}", deleted.1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while request(follower, "GET", "/dbs/shop", None, "").unwrap().0 != 404 {
        assert!(
            Instant::now() < deadline,
            "the follower keeps the deleted database"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, seconds) = poll.join().unwrap();
    assert!(seconds < 8.0, "the long poll held on for {seconds:.1} s");

    // A damaged backup: refused, and no database of the name on any node.
    let mut bytes = std::fs::read(&backup).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    let damaged = root.path().join("damaged.kbak");
    std::fs::write(&damaged, bytes).unwrap();
    let url = format!("http://127.0.0.1:{leader}");
    let o = kiln(&[
        "restore",
        damaged.to_str().unwrap(),
        "--url",
        &url,
        "--db",
        "other",
    ]);
    assert!(!o.status.success(), "{}", text(&o));
    std::thread::sleep(Duration::from_millis(500));
    for port in c.ports.values() {
        let (status, _) = request(*port, "GET", "/dbs/other", None, "").unwrap();
        assert_eq!(
            status, 404,
            "node {port} kept the database of a refused restore"
        );
    }
}

/// `kiln export` of `shop` on the node at `port`; with `want`, retried until it
/// is that (a restarted follower catches up a moment later, and its database is
/// replaced meanwhile when it applies the restore again).
fn export_at(port: u16, want: Option<&str>, out: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = format!("http://127.0.0.1:{port}");
    loop {
        let o = kiln(&[
            "export",
            "--url",
            &url,
            "--db",
            "shop",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ]);
        let got = if o.status.success() {
            std::fs::read_to_string(out).unwrap()
        } else {
            text(&o)
        };
        if want.is_none_or(|w| w == got) {
            assert!(o.status.success(), "{got}");
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "node {port} does not export the leader's documents: {}",
            &got[..got.len().min(300)]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Kill -9 of a follower at a different moment of each restore of a 20,000
/// document backup (while the chunks arrive, while it restores, after): once
/// restarted it ends with the leader's export, and the next write replicates.
/// Slow tier (`--ignored`; KILN_CLUSTER_RESTORE_KILL_CYCLES, default 6).
#[test]
#[ignore]
fn a_follower_killed_during_a_restore_ends_equal_to_the_leader() {
    let cycles = common::cycles_from_env("KILN_CLUSTER_RESTORE_KILL_CYCLES", 6);
    let root = tempfile::tempdir().unwrap();
    let cluster_dir = root.path().join("cluster");
    std::fs::create_dir_all(&cluster_dir).unwrap();
    let mut c = Cluster::new(&cluster_dir);
    let leader_id = c.leader();
    let leader_url = format!("http://127.0.0.1:{}", c.ports[&leader_id]);
    // The backup: 20,000 documents imported into the cluster, backed up from it.
    let input = root.path().join("in.ndjson");
    let lines: String = (0..20_000)
        .map(|i| {
            format!(
                "{{\"id\":\"items/{i:05}\",\"document\":{{\"n\":{i},\"pad\":\"{}\"}}}}\n",
                "x".repeat(150)
            )
        })
        .collect();
    std::fs::write(&input, lines).unwrap();
    let o = kiln(&[
        "import",
        "--url",
        &leader_url,
        "--db",
        "src",
        input.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let backup = root.path().join("src.kbak");
    let o = kiln(&[
        "backup",
        "--url",
        &leader_url,
        "--db",
        "src",
        "--out",
        backup.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));

    for cycle in 0..cycles {
        let leader = c.leader();
        let leader_port = c.ports[&leader];
        let victim = *c.ports.keys().find(|id| **id != leader).unwrap();
        let restoring = {
            let (backup, port) = (backup.clone(), leader_port);
            std::thread::spawn(move || restore(port, &backup, &["--force"]))
        };
        std::thread::sleep(Duration::from_millis(cycle * 97 % 500));
        let mut child = c.children.remove(&victim).unwrap();
        common::kill9(&mut child, cycle);
        let o = restoring.join().unwrap();
        assert!(o.status.success(), "cycle {cycle}: {}", text(&o));
        c.start(victim);
        let (status, body) = request(
            leader_port,
            "PUT",
            "/dbs/shop/docs/after",
            None,
            &format!(r#"{{"cycle": {cycle}}}"#),
        )
        .unwrap();
        assert_eq!(status, 201, "cycle {cycle}: {body}");
        let want = export_at(leader_port, None, &root.path().join("leader.ndjson"));
        assert_eq!(want.lines().count(), 20_001, "cycle {cycle}");
        assert!(
            want.contains(&format!(r#""cycle":{cycle}"#)),
            "cycle {cycle}"
        );
        let stats = |port: u16| {
            let (_, body) = request(port, "GET", "/dbs/shop", None, "").unwrap();
            let v = json(&body);
            (v["documents"].clone(), v["last_etag"].clone())
        };
        for (id, port) in &c.ports {
            let out = root.path().join(format!("node{id}.ndjson"));
            export_at(*port, Some(&want), &out);
            // Exports leave etags out: the same count and last etag as the leader.
            assert_eq!(stats(*port), stats(leader_port), "cycle {cycle}, node {id}");
        }
        println!(
            "restore kill -9 cycle {cycle}: node {victim} killed after {} ms, equal to the leader",
            cycle * 97 % 500
        );
    }
}

/// A long poll on the changes of `shop` at `port`, from its last etag, in a
/// thread: (status, seconds it took).
fn long_poll(port: u16) -> std::thread::JoinHandle<(u16, f64)> {
    let (_, stats) = request(port, "GET", "/dbs/shop", None, "").unwrap();
    let since = json(&stats)["last_etag"].as_str().unwrap().to_string();
    std::thread::spawn(move || {
        let started = Instant::now();
        let path = format!("/dbs/shop/changes?since={since}&wait_ms=30000");
        let answer =
            common::cluster::request_within(port, "GET", &path, None, "", Duration::from_secs(40));
        (
            answer.map_or(0, |(status, _)| status),
            started.elapsed().as_secs_f64(),
        )
    })
}
