//! What a cluster's nodes hold, to compare replicas: a database's changes feed
//! with bodies, documents' revisions, exports, and the checks that times never
//! go back along the etags.
#![allow(dead_code)] // each test binary uses its own part of this module
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use super::cluster::{json, ok_json, request, Cluster};
use super::{kiln, text};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// Every change of database `db` on the node at `port`, with bodies, in etag
/// order.
pub fn changes(port: u16, db: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut since = "0".to_string();
    loop {
        let path = format!("/dbs/{db}/changes?since={since}&limit=1000&include_docs=true");
        let page = ok_json(port, "GET", &path, "");
        let results = page["results"].as_array().unwrap();
        if results.is_empty() {
            return all;
        }
        all.extend(results.iter().cloned());
        since = page["last_etag"].as_str().unwrap().to_string();
    }
}

/// What a node holds of `db`: its changes and the revisions of the documents
/// `ids`.
pub fn state(port: u16, db: &str, ids: &[String]) -> Value {
    let revisions: Vec<Value> = ids
        .iter()
        .map(|id| ok_json(port, "GET", &format!("/dbs/{db}/revisions/docs/{id}"), ""))
        .collect();
    serde_json::json!({"changes": changes(port, db), "revisions": revisions})
}

/// A node's `GET /cluster` (null when it does not answer).
pub fn status(port: u16) -> Value {
    request(port, "GET", "/cluster", None, "")
        .map(|(_, text)| json(&text))
        .unwrap_or(Value::Null)
}

/// Waits (30 s at most) until every node has applied what the leader has.
pub fn quiet(c: &Cluster, leader: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let target = status(c.ports[&leader])["last_log_index"].as_u64().unwrap();
    for (id, port) in &c.ports {
        while status(*port)["last_applied"].as_u64().unwrap_or(0) < target {
            assert!(
                Instant::now() < deadline,
                "node {id} did not apply up to {target}: {}",
                status(*port)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The `@last-modified` times of the changes' documents never go back along the
/// etags.
pub fn times_never_go_back(node: u64, changes: &[Value]) {
    let mut last = String::new();
    for change in changes {
        let Some(modified) = change["document"]["@metadata"]["@last-modified"].as_str() else {
            continue;
        };
        assert!(
            modified >= last.as_str(),
            "node {node}: {} at {modified} after a write at {last}",
            change["etag"]
        );
        last = modified.to_string();
    }
}

/// A document's revisions (every version it had, with the time it was written
/// and the time it was replaced), in etag order: times never go back.
pub fn revision_times_never_go_back(node: u64, revisions: &Value) {
    let sequence = |r: &Value| -> u64 {
        let etag = r["etag"].as_str().unwrap();
        etag.split('-').next().unwrap().parse().unwrap()
    };
    let mut list: Vec<&Value> = revisions["revisions"].as_array().unwrap().iter().collect();
    list.sort_by_key(|r| sequence(r));
    let mut last = "";
    for r in list {
        let (written, replaced) = (
            r["last_modified"].as_str().unwrap(),
            r["replaced_at"].as_str().unwrap(),
        );
        assert!(
            written >= last && replaced >= written,
            "node {node}: revision {} written at {written}, replaced at {replaced}, after a write at {last}",
            r["etag"]
        );
        last = replaced;
    }
}

/// Waits until every document of `ids` in `db` is gone on the node at `port` (40 s
/// at most): deleted as expired by the leader of the moment, through the log,
/// whichever clock it has (at most 10 s behind, plus the checks' period).
pub fn expired(port: u16, db: &str, ids: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(40);
    for id in ids {
        let path = format!("/dbs/{db}/docs/{id}");
        while request(port, "GET", &path, None, "").unwrap().0 != 404 {
            assert!(Instant::now() < deadline, "{id} never expired");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `kiln export --url` of database `db` from the node at `port` into `out`; the
/// export's text.
pub fn export(port: u16, db: &str, out: &Path) -> String {
    let url = format!("http://127.0.0.1:{port}");
    let done = kiln(&[
        "export",
        "--url",
        &url,
        "--db",
        db,
        "-q",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(done.status.success(), "kiln export: {}", text(&done));
    std::fs::read_to_string(out).unwrap()
}

/// `kiln check` of a stopped node's data directory succeeds.
pub fn check_offline(node: u64, dir: &Path) {
    let checked = kiln(&["check", dir.to_str().unwrap()]);
    assert!(
        checked.status.success(),
        "kiln check of node {node}: {}",
        text(&checked)
    );
}
