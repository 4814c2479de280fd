//! Attachments in a three-node cluster: an upload of several log chunks to the
//! leader is read back byte for byte from every node; a second document with the
//! same bytes shares the blob on every node; deletes free it on every node; a
//! follower sends an upload to the leader (307); an If-Match conflict and a missing
//! document answer as a single server does; the leader killed -9 right after an
//! acknowledged upload: the new leader serves it, and the old one, restarted, too.
//! An encrypted cluster (`--encryption-key-file`, one key on every node): documents
//! and an attachment holding a marker are served by every node, a follower that
//! missed purged log entries catches up from a (sealed) snapshot, and then no file
//! under any node's data directory holds the marker, `kiln encryption status` finds
//! every environment (the Raft log's too) encrypted under the key, and a node
//! refuses to start without it.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, request, Cluster, NodeOptions};
use common::raw_http::{files_under, pseudo_random_bytes, raw, Answer};
use common::{kill9, kiln, text, TEST_JOURNAL_FILE_SIZE_MIB};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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

/// Snapshots of the encrypted cluster: every this many log entries.
const SNAPSHOT_EVERY_ENTRIES: &str = "20";

/// Stops node `id` of `c` with SIGTERM (a graceful stop: flushed and closed) and
/// waits (30 s at most) for it to exit successfully.
fn stop(c: &mut Cluster, id: u64) {
    let mut child = c.children.remove(&id).unwrap();
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("node {id} did not stop on SIGTERM in 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "node {id} stopped with {status}");
}

/// One numeric field of node `port`'s `GET /cluster`.
fn cluster_field(port: u16, field: &str) -> Option<u64> {
    let (status, body) = request(port, "GET", "/cluster", None, "").ok()?;
    (status == 200)
        .then(|| json(&body)[field].as_u64())
        .flatten()
}

/// Document `n` of the encrypted cluster: the marker in its body (never in a path:
/// file names and logs stay in clear).
fn marked_document(marker: &str, n: u64) -> String {
    format!(
        r#"{{"n":{n},"text":"{marker} {n}","pad":"{}"}}"#,
        "y".repeat(512)
    )
}

/// Waits until node `port` serves document `n` with the marker.
fn serves_marked(port: u16, marker: &str, n: u64) {
    let path = format!("/dbs/enc/docs/notes/{n}");
    eventually(port, &format!("serves notes/{n}"), || {
        let (status, body) = request(port, "GET", &path, None, "").map_err(|e| format!("{e:?}"))?;
        match status == 200 && json(&body)["text"] == format!("{marker} {n}").as_str() {
            true => Ok(()),
            false => Err(format!("{status}: {body}")),
        }
    });
}

/// The files under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| {
            std::fs::read(p)
                .map(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
                .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
        })
        .collect()
}

#[test]
fn an_encrypted_cluster_leaves_no_clear_marker_on_disk_and_needs_its_key() {
    let began = Instant::now();
    let root = tempfile::tempdir().unwrap();
    let key = root.path().join("master.key");
    let made = kiln(&["encryption", "new-key", "--out", key.to_str().unwrap()]);
    assert!(made.status.success(), "{}", text(&made));
    // Unique to this run; only ever in request bodies.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let marker = format!("CLEAR-MARKER-{nanos:x}-{}", std::process::id());

    let key_arg = key.to_str().unwrap();
    let mut c = Cluster::with_options(
        root.path(),
        NodeOptions::args(&[
            "--snapshot-every-entries",
            SNAPSHOT_EVERY_ENTRIES,
            "--encryption-key-file",
            key_arg,
        ]),
    );
    let leader_id = c.leader();
    let leader = c.ports[&leader_id];
    let ok = common::cluster::ok_json;
    ok(leader, "PUT", "/dbs/enc", "");
    for n in 0..5 {
        ok(
            leader,
            "PUT",
            &format!("/dbs/enc/docs/notes/{n}"),
            &marked_document(&marker, n),
        );
    }
    // An attachment of three log chunks (256 KiB each), the marker throughout.
    let mut blob = Vec::new();
    for i in 0..3 * 4 {
        blob.extend_from_slice(marker.as_bytes());
        blob.extend_from_slice(&pseudo_random_bytes(1 << 16, i));
    }
    let blob_path = "/dbs/enc/docs/notes/0/attachments/marked.bin";
    let put = put_attachment(leader, blob_path, None, &blob);
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    for port in c.ports.values() {
        for n in 0..5 {
            serves_marked(*port, &marker, n);
        }
        eventually(*port, "reads the attachment", || {
            read_back(*port, blob_path, &blob)
        });
    }
    eprintln!("written and replicated: {:?}", began.elapsed());

    // A follower down while the leader snapshots and purges its log past all the
    // follower holds catches up from a snapshot (a sealed backup container).
    let follower_id = *c.ports.keys().find(|id| **id != leader_id).unwrap();
    kill9(c.children.get_mut(&follower_id).unwrap(), 0);
    c.children.remove(&follower_id);
    let held = cluster_field(leader, "last_log_index").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next = 5;
    while cluster_field(leader, "purged_index").is_none_or(|purged| purged <= held) {
        assert!(
            Instant::now() < deadline,
            "the leader did not purge its log past {held} in 60 s (snapshot at {:?})",
            cluster_field(leader, "snapshot_index")
        );
        for n in next..next + 10 {
            ok(
                leader,
                "PUT",
                &format!("/dbs/enc/docs/notes/{n}"),
                &marked_document(&marker, n),
            );
        }
        next += 10;
        std::thread::sleep(Duration::from_millis(50));
    }
    let newest = next - 1;
    c.start(follower_id);
    for port in c.ports.values() {
        serves_marked(*port, &marker, newest);
        serves_marked(*port, &marker, 0);
        read_back(*port, blob_path, &blob).unwrap();
    }
    eprintln!(
        "node {follower_id} caught up past the purged index {held} ({newest} documents): {:?}",
        began.elapsed()
    );

    for id in 1..=3 {
        stop(&mut c, id);
    }

    // Without the key a node does not start.
    let refused_log = root.path().join("refused.stderr");
    let mut refused = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--node-id", "1", "--cluster", &c.members])
        .args(["--bind", &format!("127.0.0.1:{}", c.ports[&1])])
        .args(["--journal-file-size-mib", TEST_JOURNAL_FILE_SIZE_MIB])
        .arg("--data-dir")
        .arg(&c.dirs[&1])
        .env_remove("KILN_ENCRYPTION_KEY_FILE")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&refused_log).unwrap()))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = refused.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = refused.kill();
            let _ = refused.wait();
            panic!("node 1 without its key was still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = std::fs::read_to_string(&refused_log).unwrap();
    assert!(
        !status.success() && said.contains("encrypted"),
        "without the key: {status}: {said}"
    );

    for (id, dir) in &c.dirs {
        let files = files_under(dir);
        assert!(files.len() > 10, "node {id}: only {files:?}");
        let clear = files_holding(dir, marker.as_bytes());
        assert!(
            clear.is_empty(),
            "node {id}: the marker in clear in {clear:?}"
        );
        let status = kiln(&[
            "encryption",
            "status",
            "--data-dir",
            dir.to_str().unwrap(),
            "--encryption-key-file",
            key.to_str().unwrap(),
            "--json",
        ]);
        assert!(status.status.success(), "node {id}: {}", text(&status));
        let environments: Vec<serde_json::Value> = String::from_utf8_lossy(&status.stdout)
            .lines()
            .map(json)
            .collect();
        for env in &environments {
            assert_eq!(env["encrypted"], true, "node {id}: {env}");
            assert_eq!(env["key_opens"], true, "node {id}: {env}");
        }
        let named = |part: &str| {
            environments
                .iter()
                .any(|e| e["environment"].as_str().is_some_and(|n| n.contains(part)))
        };
        assert!(named("raft"), "node {id}: no Raft log in {environments:?}");
        assert!(
            named("enc"),
            "node {id}: no database enc in {environments:?}"
        );
    }
    eprintln!("done: {:?}", began.elapsed());
}
