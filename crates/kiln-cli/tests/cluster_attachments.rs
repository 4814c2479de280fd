//! Attachments in a three-node cluster: an upload of several log chunks to the
//! leader is read back byte for byte from every node; a second document with the
//! same bytes shares the blob on every node; deletes free it on every node; a
//! follower sends an upload to the leader (307); an If-Match conflict and a missing
//! document answer as a single server does; the leader killed -9 right after an
//! acknowledged upload: the new leader serves it, and the old one, restarted, too.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, request, Cluster};
use common::kill9;
use common::raw_http::{files_under, pseudo_random_bytes, raw, Answer};
use std::path::Path;
use std::time::{Duration, Instant};

fn put_attachment(port: u16, path: &str, if_match: Option<&str>, body: &[u8]) -> Answer {
    let condition = if_match.map(|e| format!("\"{e}\""));
    let mut headers = vec![("content-type", "application/x-test")];
    if let Some(c) = &condition {
        headers.push(("if-match", c));
    }
    raw(port, "PUT", path, &headers, body)
}

/// Waits until `check` holds on node `port` (a follower applies a moment later).
fn eventually(port: u16, what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match check() {
            Ok(()) => return,
            Err(why) if Instant::now() > deadline => panic!("node on {port}: {what}: {why}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn read_back(port: u16, path: &str, want: &[u8]) -> Result<(), String> {
    let got = raw(port, "GET", path, &[], b"");
    if got.status != 200 {
        return Err(format!(
            "{}: {}",
            got.status,
            String::from_utf8_lossy(&got.body)
        ));
    }
    if got.body != want {
        return Err(format!(
            "{} bytes, not the {} uploaded",
            got.body.len(),
            want.len()
        ));
    }
    Ok(())
}

/// The blobs node `port` holds in database `att`: (hash, size).
fn blobs(port: u16) -> Vec<(String, u64)> {
    let (status, body) = request(port, "GET", "/dbs/att/attachments", None, "").unwrap();
    assert_eq!(status, 200, "{body}");
    json(&body)["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["hash"].as_str().unwrap().to_string(),
                b["size"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Files under `dir` (recursively) whose path contains `part`.
fn files_containing(dir: &Path, part: &str) -> Vec<String> {
    files_under(dir)
        .into_iter()
        .map(|p| p.display().to_string())
        .filter(|p| p.contains(part))
        .collect()
}

#[test]
fn attachments_are_replicated_shared_freed_and_survive_the_leaders_kill9() {
    let root = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(root.path());
    let leader_id = c.leader();
    let leader = c.ports[&leader_id];
    let follower = c.follower_of(leader_id);
    let ok = common::cluster::ok_json;
    ok(leader, "PUT", "/dbs/att", "");
    ok(leader, "PUT", "/dbs/att/docs/a/1", r#"{"n": 1}"#);
    ok(leader, "PUT", "/dbs/att/docs/a/2", r#"{"n": 2}"#);

    // Six log chunks and a bit (256 KiB each).
    let data = pseudo_random_bytes((6 << 18) + 12_345, 1);
    let path1 = "/dbs/att/docs/a/1/attachments/big.bin";
    let path2 = "/dbs/att/docs/a/2/attachments/copy.bin";
    let redirected = put_attachment(follower, path1, None, &data);
    assert_eq!(redirected.status, 307, "{}", redirected.head);
    let put = put_attachment(leader, path1, None, &data);
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    let put = json(&String::from_utf8_lossy(&put.body));
    assert_eq!(put["attachment"]["size"], data.len() as u64, "{put}");
    let hash = put["attachment"]["hash"].as_str().unwrap().to_string();
    let etag1 = put["etag"].as_str().unwrap().to_string();
    for port in c.ports.values() {
        eventually(*port, "reads the attachment", || {
            read_back(*port, path1, &data)
        });
        // Across the first chunk's end.
        let range = raw(
            *port,
            "GET",
            path1,
            &[("range", "bytes=262140-262150")],
            b"",
        );
        assert_eq!(range.status, 206, "{}", range.head);
        assert_eq!(range.body, &data[262_140..=262_150]);
        // The document's entry and etag are the leader's.
        let doc = ok(*port, "GET", "/dbs/att/docs/a/1", "");
        assert_eq!(doc["@metadata"]["@etag"], etag1.as_str(), "{doc}");
        assert_eq!(doc["@metadata"]["@attachments"][0]["hash"], hash.as_str());
    }

    // The same bytes on another document: one blob on every node.
    let put = put_attachment(leader, path2, None, &data);
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    for port in c.ports.values() {
        eventually(*port, "reads the copy", || read_back(*port, path2, &data));
        assert_eq!(blobs(*port), vec![(hash.clone(), data.len() as u64)]);
    }

    // As a single server answers: a stale If-Match, a missing document.
    let stale = put_attachment(leader, path1, Some(&etag1), b"other bytes");
    assert_eq!(
        stale.status,
        201,
        "{}",
        String::from_utf8_lossy(&stale.body)
    );
    let conflict = put_attachment(leader, path1, Some(&etag1), b"more bytes");
    assert_eq!(
        conflict.status,
        409,
        "{}",
        String::from_utf8_lossy(&conflict.body)
    );
    let missing = put_attachment(leader, "/dbs/att/docs/none/attachments/x", None, b"x");
    assert_eq!(
        missing.status,
        404,
        "{}",
        String::from_utf8_lossy(&missing.body)
    );
    for port in c.ports.values() {
        eventually(*port, "reads the replaced attachment", || {
            read_back(*port, path1, b"other bytes")
        });
    }

    // Deletes free the bytes on every node once no document names them.
    let (status, text) = request(follower, "DELETE", path2, None, "").unwrap();
    assert_eq!(status, 307, "{text}");
    ok(leader, "DELETE", path2, "");
    let (status, text) = request(leader, "DELETE", path2, None, "").unwrap();
    assert_eq!(status, 404, "{text}");
    for (id, port) in &c.ports {
        eventually(*port, "frees the shared blob", || {
            match blobs(*port).iter().any(|(h, _)| *h == hash) {
                false => Ok(()),
                true => Err(format!("node {id} still holds {hash}")),
            }
        });
        let gone = raw(*port, "GET", path2, &[], b"");
        assert_eq!(gone.status, 404, "{}", gone.head);
    }

    // An acknowledged upload survives the leader's kill -9 at once.
    let last = pseudo_random_bytes((3 << 18) + 7, 2);
    let put = put_attachment(leader, path2, None, &last);
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    kill9(c.children.get_mut(&leader_id).unwrap(), 0);
    c.children.remove(&leader_id);
    let new_leader = c.leader();
    assert_ne!(new_leader, leader_id);
    read_back(c.ports[&new_leader], path2, &last).unwrap();
    // The old leader, back, has it too (and left no upload file behind).
    c.start(leader_id);
    for (id, port) in &c.ports {
        eventually(*port, "reads the last upload", || {
            read_back(*port, path2, &last)
        });
        let blob_count = blobs(*port).len();
        assert_eq!(blob_count, 2, "node {id}: {:?}", blobs(*port));
    }
    for (id, dir) in &c.dirs {
        let left = files_containing(dir, "/attachments/uploads/");
        assert!(left.is_empty(), "node {id} kept uploads: {left:?}");
        let tmp = files_containing(dir, "/attachments/tmp/");
        assert!(tmp.is_empty(), "node {id} kept temporary files: {tmp:?}");
    }
}
