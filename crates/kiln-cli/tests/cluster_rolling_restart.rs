//! A rolling restart of a three-node cluster under writes, as an upgrade does it
//! (docs/cluster.md): each follower is stopped (SIGTERM) and started again, then
//! leadership is handed to a node already restarted and the old leader goes last.
//! Writes go on all along through whichever node leads: none is refused for
//! long, and at the end every acknowledged write is on every node with the etag
//! it was given, and the three nodes hold the same documents.
//!
//! By default the same binary restarts each node: what that proves is the
//! procedure (no write lost, no long pause). With KILN_OLD_BIN naming an older
//! build's `kiln`, the three nodes start on it and each restart moves a node to
//! this build: a rolling upgrade, with an older leader replicating to newer
//! followers, then a newer leader to an older follower (docs/cluster.md records
//! the builds tried; the formats alone are covered by `kiln-cluster/src/codec.rs`'s
//! tests).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{find_leader, json, request, Cluster, NodeOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DB: &str = "roll";

/// Stops node `id` as an operator's service manager does (SIGTERM), waits for it.
fn stop(c: &mut Cluster, id: u64) {
    let mut child = c.children.remove(&id).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = child.wait().unwrap();
    assert!(exited.success(), "node {id} did not stop cleanly: {exited}");
}

fn status(port: u16) -> serde_json::Value {
    request(port, "GET", "/cluster", None, "")
        .map(|(_, t)| json(&t))
        .unwrap_or(serde_json::Value::Null)
}

/// Waits until node `id` has applied what the leader had applied when asked.
fn caught_up(c: &Cluster, id: u64) {
    let leader = c.leader();
    let target = status(c.ports[&leader])["last_applied"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(c.ports[&id])["last_applied"].as_u64().unwrap_or(0) < target {
        assert!(
            Instant::now() < deadline,
            "node {id} did not catch up: {}",
            status(c.ports[&id])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every document of node `port`: id -> etag (every page of the listing).
fn documents(port: u16) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            None => format!("/dbs/{DB}/docs?page_size=1000"),
            Some(id) => format!("/dbs/{DB}/docs?page_size=1000&start_after={id}"),
        };
        let (code, text) = request(port, "GET", &path, None, "").unwrap();
        assert_eq!(code, 200, "{text}");
        let page = json(&text);
        for d in page["results"].as_array().unwrap() {
            let m = &d["@metadata"];
            out.insert(
                m["@id"].as_str().unwrap().to_string(),
                m["@etag"].as_str().unwrap().to_string(),
            );
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return out,
        }
    }
}

#[test]
fn a_rolling_restart_under_writes_loses_nothing() {
    let root = tempfile::tempdir().unwrap();
    let old_binary = std::env::var_os("KILN_OLD_BIN").map(std::path::PathBuf::from);
    let binary = match &old_binary {
        Some(old) => (1..=3).map(|id| (id, old.clone())).collect(),
        None => BTreeMap::new(),
    };
    let mut c = Cluster::with_options(
        root.path(),
        NodeOptions {
            binary,
            ..NodeOptions::default()
        },
    );
    let leader = c.leader();
    let (code, text) = request(c.ports[&leader], "PUT", &format!("/dbs/{DB}"), None, "").unwrap();
    assert_eq!(code, 201, "{text}");

    let stop_writing = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let longest_pause = Arc::new(Mutex::new(Duration::ZERO));
    let ports = c.ports.clone();
    let writer = {
        let (stop_writing, acked, longest_pause) =
            (stop_writing.clone(), acked.clone(), longest_pause.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let mut port = ports[&leader];
            let mut last_ack = Instant::now();
            while !stop_writing.load(Ordering::SeqCst) {
                let id = format!("d/{n}");
                match request(port, "PUT", &format!("/dbs/{DB}/docs/{id}"), None, "{}") {
                    Ok((200 | 201, text)) => {
                        let etag = json(&text)["etag"].as_str().unwrap().to_string();
                        acked.lock().unwrap().insert(id, etag);
                        let mut longest = longest_pause.lock().unwrap();
                        *longest = (*longest).max(last_ack.elapsed());
                        last_ack = Instant::now();
                        n += 1;
                    }
                    // Not the leader, or stopped: the same id again (a PUT by id
                    // is idempotent) wherever the leader is now.
                    _ => {
                        std::thread::sleep(Duration::from_millis(20));
                        if let Some((_, p)) = find_leader(&ports) {
                            port = p;
                        }
                    }
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let followers: Vec<u64> = c.ports.keys().copied().filter(|id| *id != leader).collect();
    for id in &followers {
        stop(&mut c, *id);
        std::thread::sleep(Duration::from_millis(300));
        c.options.binary.remove(id);
        c.start(*id);
        caught_up(&c, *id);
    }
    // The leader last: leadership to a restarted node first.
    let (code, text) = request(
        c.ports[&leader],
        "POST",
        "/cluster/leader",
        None,
        &format!(r#"{{"id": {}}}"#, followers[0]),
    )
    .unwrap();
    assert_eq!(
        code,
        200,
        "{text}\n{}",
        c.ports
            .keys()
            .map(|id| format!("node {id}:\n{}", c.log_tail(*id, 40)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    stop(&mut c, leader);
    std::thread::sleep(Duration::from_millis(300));
    c.options.binary.remove(&leader);
    c.start(leader);
    caught_up(&c, leader);
    std::thread::sleep(Duration::from_millis(300));
    stop_writing.store(true, Ordering::SeqCst);
    writer.join().unwrap();

    let acked = acked.lock().unwrap().clone();
    let longest = *longest_pause.lock().unwrap();
    println!(
        "rolling restart{}: {} writes acknowledged, the longest time without one {longest:?}",
        old_binary.map_or(String::new(), |old| format!(" from {}", old.display())),
        acked.len()
    );
    assert!(acked.len() > 100, "too few writes: {}", acked.len());
    assert!(
        longest < Duration::from_secs(3),
        "writes paused for {longest:?}"
    );
    let now_leader = c.leader();
    for id in c.ports.keys() {
        caught_up(&c, *id);
    }
    let on_leader = documents(c.ports[&now_leader]);
    for (doc, etag) in &acked {
        assert_eq!(
            on_leader.get(doc),
            Some(etag),
            "acknowledged {doc} at {etag}"
        );
    }
    for (id, port) in &c.ports {
        assert!(
            documents(*port) == on_leader,
            "node {id} differs from the leader {now_leader}"
        );
    }
}
