//! Two routes that go through a three-node cluster's log: bytes staged for a
//! batch (`POST /dbs/{db}/attachments`) on the leader, a batch naming them by
//! hash, the attachment read back byte for byte from every node (a bad hash
//! answered as a single server answers it); and a purge of tombstones
//! (`DELETE /dbs/{db}/tombstones`) with an age counted at the leader's time:
//! every node then reports the same tombstones and the same changes feed.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, request, Cluster};
use std::time::{Duration, Instant};

/// One request with a binary body on its own connection: status and body.
fn raw(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let answer = common::raw_http::raw(port, method, path, &[], body);
    (answer.status, answer.body)
}

/// Waits until `check` holds (a follower applies a moment after the leader).
fn eventually(what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match check() {
            Ok(()) => return,
            Err(why) if Instant::now() > deadline => panic!("{what}: {why}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[test]
fn staging_for_a_batch_and_purging_tombstones_are_replicated() {
    let root = tempfile::tempdir().unwrap();
    let c = Cluster::new(root.path());
    let leader_id = c.leader();
    let leader = c.ports[&leader_id];
    let follower = c.follower_of(leader_id);
    let ok = common::cluster::ok_json;
    ok(leader, "PUT", "/dbs/s", "");
    // An index: every node's index consumer reads the change log.
    ok(
        leader,
        "PUT",
        "/dbs/s/indexes/by_n",
        r#"{"collection":"t","fields":["n"]}"#,
    );

    // Staged bytes of two log chunks and a bit (256 KiB each).
    let data = common::raw_http::pseudo_random_bytes((2 << 18) + 999, 5);
    let (status, _) = raw(follower, "POST", "/dbs/s/attachments", &data);
    assert_eq!(status, 307, "a follower sends staging to the leader");
    let (status, body) = raw(leader, "POST", "/dbs/s/attachments", &data);
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let staged = json(&String::from_utf8_lossy(&body));
    assert_eq!(staged["size"], data.len() as u64, "{staged}");
    assert_eq!(
        staged["staged_for_ms"],
        kiln_docs::STAGED_TTL_MS,
        "{staged}"
    );
    let hash = staged["hash"].as_str().unwrap().to_string();
    // Every node holds the staged blob, named by no document yet.
    for port in c.ports.values() {
        eventually("the staged blob on every node", || {
            let (_, text) = request(*port, "GET", "/dbs/s/attachments", None, "").unwrap();
            let blobs = json(&text)["blobs"].clone();
            match blobs.as_array().is_some_and(|b| {
                b.iter()
                    .any(|b| b["hash"] == hash.as_str() && b["refs"] == 0)
            }) {
                true => Ok(()),
                false => Err(format!("node on {port}: {blobs}")),
            }
        });
    }
    let batch = serde_json::json!({"ops": [{"op": "put", "id": "t/1", "document": {
        "n": 1,
        "@metadata": {"@attachments": [{"name": "s.bin", "hash": hash, "content_type": "x/y"}]}
    }}]});
    ok(leader, "POST", "/dbs/s/batch", &batch.to_string());
    // A hash the database does not hold: refused alike, on every node nothing.
    let other = "ab".repeat(32);
    let bad = serde_json::json!({"ops": [{"op": "put", "id": "t/2", "document": {
        "@metadata": {"@attachments": [{"name": "x", "hash": other}]}
    }}]});
    let (status, text) = request(leader, "POST", "/dbs/s/batch", None, &bad.to_string()).unwrap();
    assert_eq!(status, 400, "{text}");
    let etag = ok(leader, "GET", "/dbs/s/docs/t/1", "")["@metadata"]["@etag"].clone();
    for port in c.ports.values() {
        eventually("the staged attachment read back", || {
            let (status, body) = raw(*port, "GET", "/dbs/s/docs/t/1/attachments/s.bin", b"");
            if status != 200 || body != data {
                return Err(format!("node on {port}: {status}, {} bytes", body.len()));
            }
            Ok(())
        });
        let doc = ok(*port, "GET", "/dbs/s/docs/t/1", "");
        assert_eq!(doc["@metadata"]["@etag"], etag, "{doc}");
        let (status, _) = request(*port, "GET", "/dbs/s/docs/t/2", None, "").unwrap();
        assert_eq!(status, 404);
    }

    // Tombstones: two old deletes, one young, one the etag bound leaves.
    for i in 0..5 {
        ok(leader, "PUT", &format!("/dbs/s/docs/t/d{i}"), r#"{"n": 2}"#);
    }
    ok(leader, "DELETE", "/dbs/s/docs/t/d0", "");
    ok(leader, "DELETE", "/dbs/s/docs/t/d1", "");
    std::thread::sleep(Duration::from_millis(1500));
    let young = ok(leader, "DELETE", "/dbs/s/docs/t/d2", "");
    let (status, _) = request(follower, "DELETE", "/dbs/s/tombstones", None, "").unwrap();
    assert_eq!(status, 307, "a follower sends a purge to the leader");
    let (status, text) = request(
        leader,
        "DELETE",
        "/dbs/s/tombstones?before=nonsense",
        None,
        "",
    )
    .unwrap();
    assert_eq!(status, 400, "a bad etag: {text}");
    let purged = ok(leader, "DELETE", "/dbs/s/tombstones?older_than_ms=1000", "");
    assert_eq!(purged["purged"], 2, "{purged}");
    assert_eq!(purged["tombstones"], 1, "{purged}");
    assert_eq!(purged["oldest_etag"], young["etag"], "{purged}");
    assert!(purged["purged_below_etag"].is_string(), "{purged}");
    let leader_stats = ok(leader, "GET", "/dbs/s/tombstones", "");
    let leader_feed = ok(leader, "GET", "/dbs/s/changes?since=0", "")["results"].clone();
    let deletes: Vec<&str> = leader_feed
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["change"] == "delete")
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(deletes, vec!["t/d2"], "{leader_feed}");
    for port in c.ports.values() {
        eventually("the same tombstones and feed on every node", || {
            let stats = ok(*port, "GET", "/dbs/s/tombstones", "");
            let feed = ok(*port, "GET", "/dbs/s/changes?since=0", "")["results"].clone();
            let same = stats["tombstones"] == leader_stats["tombstones"]
                && stats["oldest_etag"] == leader_stats["oldest_etag"]
                && stats["oldest_at"] == leader_stats["oldest_at"]
                && feed == leader_feed;
            match same {
                true => Ok(()),
                false => Err(format!("node on {port}: {stats} {feed}")),
            }
        });
    }
    // The rest, by etag: the young one too; the feed then holds no delete.
    let all = ok(
        leader,
        "DELETE",
        &format!("/dbs/s/tombstones?before={}", json_str(&young["etag"])),
        "",
    );
    assert_eq!(
        (all["purged"].clone(), all["tombstones"].clone()),
        (0.into(), 1.into()),
        "{all}"
    );
    let all = ok(leader, "DELETE", "/dbs/s/tombstones", "");
    assert_eq!(
        (all["purged"].clone(), all["tombstones"].clone()),
        (1.into(), 0.into()),
        "{all}"
    );
    for port in c.ports.values() {
        eventually("no tombstone left on any node", || {
            let stats = ok(*port, "GET", "/dbs/s/tombstones", "");
            match stats["tombstones"] == 0 {
                true => Ok(()),
                false => Err(format!("node on {port}: {stats}")),
            }
        });
    }
}

fn json_str(v: &serde_json::Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}
