//! `kiln serve --expiration-check-ms 100`: documents whose `@metadata.@expires`
//! passes are deleted within the check period, as deletes the changes feed shows
//! (a tombstone each) and `/metrics` counts; documents that expire later, never,
//! or were rewritten without `@expires` before their time stay; an `@expires`
//! that is not an RFC 3339 time is a 400. In a cluster, the leader deletes them
//! through the log: every node ends without them, with the same tombstone etags.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{Cluster, NodeOptions};
use common::{free_port, request, spawn_serve_with};
use kiln_docs::format_rfc3339_ms;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How far ahead the expiring documents expire: long enough to write them all
/// (and rewrite one) before, short enough for the fast tier.
const EXPIRES_IN_MS: u64 = 1_000;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn doc(expires: Option<&str>) -> String {
    match expires {
        Some(at) => json!({"v": 1, "@metadata": {"@expires": at}}).to_string(),
        None => json!({"v": 1}).to_string(),
    }
}

fn put(port: u16, id: &str, expires: Option<&str>) {
    let (status, body) = request(port, "PUT", &format!("/dbs/exp/docs/{id}"), &doc(expires));
    assert!(status == 201 || status == 200, "PUT {id}: {status} {body}");
}

fn status_of(port: u16, id: &str) -> u16 {
    request(port, "GET", &format!("/dbs/exp/docs/{id}"), "").0
}

/// Waits (10 s at most) until every id in `ids` answers 404 on `port`.
fn wait_until_gone(port: u16, ids: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while ids.iter().any(|id| status_of(port, id) != 404) {
        assert!(Instant::now() < deadline, "{ids:?} still there on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The changes feed's latest entry per id: (kind, etag).
fn changes(port: u16) -> BTreeMap<String, (String, String)> {
    let (status, body) = request(port, "GET", "/dbs/exp/changes?limit=1000", "");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = |k: &str| c[k].as_str().unwrap().to_string();
            (text("id"), (text("change"), text("etag")))
        })
        .collect()
}

fn expired_metric(port: u16) -> u64 {
    let (_, text) = request(port, "GET", "/metrics", "");
    text.lines()
        .find_map(|l| l.strip_prefix("kiln_documents_expired_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no kiln_documents_expired_total in\n{text}"))
}

#[test]
fn expired_documents_are_deleted_and_the_others_stay() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = spawn_serve_with(dir.path(), port, &["--expiration-check-ms", "100"]);
    assert_eq!(request(port, "PUT", "/dbs/exp", "").0, 201);
    let soon_ms = now_ms() + EXPIRES_IN_MS;
    let soon = format_rfc3339_ms(soon_ms);
    let expiring = ["soon/1", "soon/2", "soon/3"];
    for id in expiring {
        put(port, id, Some(&soon));
    }
    put(
        port,
        "later/1",
        Some(&format_rfc3339_ms(now_ms() + 3_600_000)),
    );
    put(port, "plain/1", None);
    // Rewritten without `@expires` before its time: it no longer expires.
    put(port, "rescued/1", Some(&soon));
    put(port, "rescued/1", None);
    let (status, body) = request(port, "PUT", "/dbs/exp/docs/bad", &doc(Some("tomorrow")));
    assert_eq!(status, 400, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"], "invalid_document", "{body}");
    assert!(
        error["message"].as_str().unwrap().contains("@expires"),
        "{body}"
    );
    assert_eq!(status_of(port, "soon/1"), 200, "deleted before its time");

    wait_until_gone(port, &expiring);
    assert!(now_ms() >= soon_ms, "deleted before {soon}");
    for id in ["later/1", "plain/1", "rescued/1"] {
        assert_eq!(status_of(port, id), 200, "{id}");
    }
    let feed = changes(port);
    for id in expiring {
        assert_eq!(feed[id].0, "delete", "{id}: {feed:?}");
    }
    assert_eq!(feed["rescued/1"].0, "put");
    assert_eq!(expired_metric(port), 3);
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn in_a_cluster_every_node_deletes_them_with_the_same_tombstones() {
    let root = tempfile::tempdir().unwrap();
    // Each node checks for expired documents every 100 ms.
    let c = Cluster::with_options(
        root.path(),
        NodeOptions::args(&["--expiration-check-ms", "100"]),
    );
    let leader = c.ports[&c.leader()];
    assert_eq!(request(leader, "PUT", "/dbs/exp", "").0, 201);
    let soon = format_rfc3339_ms(now_ms() + EXPIRES_IN_MS);
    let expiring = ["soon/1", "soon/2", "soon/3"];
    for id in expiring {
        put(leader, id, Some(&soon));
    }
    put(
        leader,
        "later/1",
        Some(&format_rfc3339_ms(now_ms() + 3_600_000)),
    );
    let mut tombstones = Vec::new();
    for port in c.ports.values() {
        // Applied on a follower as the leader logged it (reads there may lag). First
        // the last put: before it, a 404 may be the database's, not yet created on a
        // lagging follower, and would pass for an expired document's.
        let deadline = Instant::now() + Duration::from_secs(10);
        while status_of(*port, "later/1") != 200 {
            assert!(Instant::now() < deadline, "later/1 missing on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        wait_until_gone(*port, &expiring);
        let feed = changes(*port);
        let deletes: BTreeMap<&str, String> = expiring
            .iter()
            .map(|id| {
                assert_eq!(feed[*id].0, "delete", "{id} on {port}: {feed:?}");
                (*id, feed[*id].1.clone())
            })
            .collect();
        tombstones.push(deletes);
    }
    assert!(
        tombstones.windows(2).all(|w| w[0] == w[1]),
        "{tombstones:?}"
    );
    let counted: u64 = c.ports.values().map(|p| expired_metric(*p)).sum();
    assert_eq!(counted, 3, "only the leader deletes (and counts)");
}
