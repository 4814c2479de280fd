//! `PATCH /dbs/{db}/docs/{id}` (a JSON merge patch, RFC 7396) against real `kiln
//! serve` processes: one server (the connection's own HTTP/1.1 loop serves it),
//! concurrent patches of one document from many connections losing nothing, the
//! error answers; and a three-node cluster, where the leader turns each patch into
//! a conditional put of the merged document: every node ends with the same
//! document, and concurrent patches through the leader lose nothing either.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, request, Cluster};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;

fn ok(port: u16, method: &str, path: &str, if_match: Option<&str>, body: &str) -> Value {
    let (status, text) = request(port, method, path, if_match, body).unwrap();
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {text}"
    );
    json(&text)
}

/// A PATCH with a Content-Type of our choosing: the status and body.
fn patch_as(port: u16, path: &str, content_type: &str, body: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "PATCH {path} HTTP/1.1\r\nhost: x\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    (
        status,
        json(out.split_once("\r\n\r\n").map_or("", |(_, b)| b)),
    )
}

/// `threads` clients, each patching its own `per_thread` fields of `path` on
/// `port` one request at a time.
fn patch_concurrently(port: u16, path: &str, threads: usize, per_thread: usize) {
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in 0..per_thread {
                    ok(
                        port,
                        "PATCH",
                        path,
                        None,
                        &format!(r#"{{"t{t}_{i}": {i}}}"#),
                    );
                }
            });
        }
    });
}

fn fields(doc: &Value) -> usize {
    doc.as_object().map_or(0, |o| o.len() - 1) // less @metadata
}

#[test]
fn a_patch_merges_and_concurrent_patches_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut server = common::spawn_serve(dir.path(), port);
    ok(port, "PUT", "/dbs/p", None, "");
    let put = ok(
        port,
        "PUT",
        "/dbs/p/docs/users/1",
        None,
        r#"{"name":"Ada","address":{"city":"London","zip":"N1"}}"#,
    );
    let etag = put["etag"].as_str().unwrap().to_string();
    let (status, answer) = patch_as(
        port,
        "/dbs/p/docs/users/1",
        "application/merge-patch+json",
        r#"{"address":{"zip":null},"age":36}"#,
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["created"], false);
    assert_ne!(answer["etag"].as_str().unwrap(), etag);
    let doc = ok(port, "GET", "/dbs/p/docs/users/1", None, "");
    assert_eq!(doc["address"], serde_json::json!({"city": "London"}));
    assert_eq!(
        (doc["name"].as_str(), doc["age"].as_i64()),
        (Some("Ada"), Some(36))
    );

    // The etag it was written with is stale now; the document did not change.
    let stale = request(port, "PATCH", "/dbs/p/docs/users/1", Some(&etag), "{}").unwrap();
    assert_eq!(stale.0, 409, "{}", stale.1);
    assert_eq!(json(&stale.1)["error"], "conflict");
    let missing = request(port, "PATCH", "/dbs/p/docs/users/2", None, "{}").unwrap();
    assert_eq!(missing.0, 404, "{}", missing.1);
    for (body, code) in [
        ("[1]", "invalid_document"),
        (
            r#"{"@metadata":{"@etag":"1-00000000"}}"#,
            "invalid_document",
        ),
        ("{not json", "malformed_json"),
    ] {
        let (status, text) = request(port, "PATCH", "/dbs/p/docs/users/1", None, body).unwrap();
        assert_eq!(
            (status, json(&text)["error"].as_str()),
            (400, Some(code)),
            "{body}"
        );
    }
    let (status, answer) = patch_as(
        port,
        "/dbs/p/docs/users/1",
        "application/json-patch+json",
        "[]",
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (415, Some("unsupported_media_type"))
    );

    ok(port, "PUT", "/dbs/p/docs/hot", None, "{}");
    patch_concurrently(port, "/dbs/p/docs/hot", 8, 10);
    assert_eq!(fields(&ok(port, "GET", "/dbs/p/docs/hot", None, "")), 80);
    server.kill().unwrap();
    server.wait().unwrap();
}

#[test]
fn in_a_cluster_every_node_applies_the_same_patched_document() {
    let root = tempfile::tempdir().unwrap();
    let c = Cluster::new(root.path());
    let leader_id = c.leader();
    let leader = c.ports[&leader_id];
    let follower = *c.ports.iter().find(|(id, _)| **id != leader_id).unwrap().1;
    ok(leader, "PUT", "/dbs/p", None, "");
    ok(
        leader,
        "PUT",
        "/dbs/p/docs/c/1",
        None,
        r#"{"a":1,"b":{"c":2}}"#,
    );
    // A follower sends a patch to the leader.
    let (status, _) = request(follower, "PATCH", "/dbs/p/docs/c/1", None, r#"{"a":2}"#).unwrap();
    assert_eq!(status, 307);
    ok(
        leader,
        "PATCH",
        "/dbs/p/docs/c/1",
        None,
        r#"{"a":null,"b":{"d":3}}"#,
    );
    // Concurrent patches through the leader: the ones whose conditional put met
    // another write merge again, and none is lost.
    patch_concurrently(leader, "/dbs/p/docs/c/1", 4, 5);
    let want = ok(leader, "GET", "/dbs/p/docs/c/1", None, "");
    assert_eq!(want["b"], serde_json::json!({"c": 2, "d": 3}));
    assert!(want.get("a").is_none());
    assert_eq!(fields(&want), 1 + 20);
    // Every node applies the log up to the leader's last write.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for port in c.ports.values() {
        loop {
            let (status, text) = request(*port, "GET", "/dbs/p/docs/c/1", None, "").unwrap();
            if status == 200 && json(&text) == want {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node on {port} has {text}, the leader {want}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}
