//! A cluster's logs as an operator reads them (`kiln serve`'s default filter): a
//! follower killed, down for two seconds under writes, and restarted logs no ERROR
//! line on any node; the node that lost it says so once (WARN) and once that it
//! answers again (INFO), instead of openraft's ERROR at every retry; the restarted
//! node says it rejoins with the state it has.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, ok_json, request, Cluster};
use std::time::{Duration, Instant};

#[test]
fn a_follower_down_and_back_is_a_warning_and_an_info_line_never_an_error() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path());
    let leader = cluster.leader();
    let leader_port = cluster.ports[&leader];
    ok_json(leader_port, "PUT", "/dbs/logs", "");
    let follower = *cluster.ports.keys().find(|id| **id != leader).unwrap();

    let mut child = cluster.children.remove(&follower).unwrap();
    common::kill9(&mut child, 0);
    // Writes while it is down: every append and heartbeat to it fails.
    let mut written = 0;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let leader_now = cluster.leader();
        let path = format!("/dbs/logs/docs/d{written}");
        if request(cluster.ports[&leader_now], "PUT", &path, None, r#"{"n":1}"#)
            .is_ok_and(|(status, _)| status == 201 || status == 200)
        {
            written += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        written > 5,
        "only {written} writes while a follower was down"
    );
    cluster.start(follower);
    wait_until_caught_up(&cluster, follower);
    let paths: Vec<(u64, std::path::PathBuf)> = cluster
        .dirs
        .keys()
        .map(|id| (*id, cluster.log_path(*id)))
        .collect();
    drop(cluster); // stops the nodes
    let logs: Vec<(u64, String)> = paths
        .into_iter()
        .map(|(id, path)| (id, std::fs::read_to_string(path).unwrap()))
        .collect();

    for (id, log) in &logs {
        for line in log.lines() {
            assert!(
                !line.contains(" ERROR ") && !line.contains("openraft"),
                "node {id} logged, with a follower down and back:\n{line}\n--- its whole log:\n{log}"
            );
        }
    }
    let peer = format!("peer={follower}");
    let count = |what: &str| {
        logs.iter()
            .flat_map(|(_, log)| log.lines())
            .filter(|l| l.contains(what) && l.contains(&peer))
            .count()
    };
    let all = || {
        logs.iter()
            .map(|(id, log)| format!("--- node {id}:\n{log}"))
            .collect::<String>()
    };
    // One line per node that was sending to it (the leader; a second node only if it
    // called an election meanwhile), however many messages failed.
    let unreachable = count("peer unreachable");
    assert!(
        (1..=2).contains(&unreachable),
        "{unreachable} 'peer unreachable' lines for node {follower}:\n{}",
        all()
    );
    assert!(
        count("peer answers again") >= 1,
        "no 'peer answers again' line for node {follower}:\n{}",
        all()
    );
    let restarted = &logs.iter().find(|(id, _)| *id == follower).unwrap().1;
    assert!(
        restarted.contains("rejoining the cluster"),
        "the restarted node did not say it rejoins:\n{restarted}"
    );
}

/// Waits (20 s at most) until the leader reports `follower` with no lag.
fn wait_until_caught_up(cluster: &Cluster, follower: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let leader = cluster.leader();
        let status = request(cluster.ports[&leader], "GET", "/cluster", None, "")
            .map(|(_, body)| json(&body))
            .unwrap_or_default();
        let lag = status["members"].as_array().and_then(|members| {
            members
                .iter()
                .find(|m| m["id"].as_u64() == Some(follower))
                .and_then(|m| m["lag"].as_u64())
        });
        if lag == Some(0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {follower} did not catch up: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
