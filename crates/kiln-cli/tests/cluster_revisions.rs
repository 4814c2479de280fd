//! Document revisions in a three-node cluster: the configuration, the writes that
//! make revisions (puts, a delete, a revert) and a purge all go through the log,
//! so every node ends with the same revisions (etags, times, bodies) and the same
//! configuration; a follower sends the configuration's change to the leader.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, request, Cluster};
use serde_json::Value;
use std::time::{Duration, Instant};

fn ok(port: u16, method: &str, path: &str, if_match: Option<&str>, body: &str) -> Value {
    let (status, text) = request(port, method, path, if_match, body).unwrap();
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {text}"
    );
    json(&text)
}

/// What a node holds: the configuration and the revisions of `c/1` and `c/2`.
fn state(port: u16) -> Value {
    let get = |path: &str| {
        let (status, text) = request(port, "GET", path, None, "").unwrap();
        assert_eq!(status, 200, "GET {path} on {port}: {text}");
        json(&text)
    };
    serde_json::json!({
        "config": get("/dbs/rev/revisions/config"),
        "c/1": get("/dbs/rev/revisions/docs/c/1"),
        "c/2": get("/dbs/rev/revisions/docs/c/2"),
        "doc": get("/dbs/rev/docs/c/1"),
    })
}

#[test]
fn every_node_keeps_the_same_revisions() {
    let root = tempfile::tempdir().unwrap();
    let c = Cluster::new(root.path());
    let leader_id = c.leader();
    let leader = c.ports[&leader_id];
    let follower = *c.ports.iter().find(|(id, _)| **id != leader_id).unwrap().1;
    ok(leader, "PUT", "/dbs/rev", None, "");
    let config = r#"{"collections": {"c": {"max_revisions": 3}}}"#;
    // A follower sends the change to the leader.
    let (status, _) = request(follower, "PUT", "/dbs/rev/revisions/config", None, config).unwrap();
    assert_eq!(status, 307);
    ok(leader, "PUT", "/dbs/rev/revisions/config", None, config);
    let mut etags = Vec::new();
    for v in 1..=5 {
        let body = format!(r#"{{"v": {v}}}"#);
        let put = ok(leader, "PUT", "/dbs/rev/docs/c/1", None, &body);
        etags.push(put["etag"].as_str().unwrap().to_string());
    }
    ok(leader, "DELETE", "/dbs/rev/docs/c/1", None, "");
    // Back from the revision of version 3 (the oldest of the three kept).
    let revert = format!("/dbs/rev/revisions/revert/c/1?etag={}", etags[2]);
    ok(leader, "POST", &revert, None, "");
    for v in 1..=3 {
        ok(
            leader,
            "PUT",
            "/dbs/rev/docs/c/2",
            None,
            &format!(r#"{{"v": {v}}}"#),
        );
    }
    let purged = ok(leader, "DELETE", "/dbs/rev/revisions/docs/c/2", None, "");
    assert_eq!(purged["purged"], 2);

    let want = state(leader);
    let kept: Vec<Value> = want["c/1"]["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| serde_json::json!([r["document"]["v"], r["deleted"]]))
        .collect();
    let expected = serde_json::json!([[5, true], [4, false], [3, false]]);
    assert_eq!(Value::from(kept), expected, "{want}");
    assert_eq!(want["doc"]["v"], 3);
    assert_eq!(want["c/2"]["revisions"], serde_json::json!([]));
    // Followers apply what the leader applied (their reads may lag a moment).
    for (id, port) in &c.ports {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = state(*port);
            if got == want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} differs:\n{got}\nleader:\n{want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
