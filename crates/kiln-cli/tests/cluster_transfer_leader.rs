//! `kiln cluster transfer-leader --to N`: the named voter leads afterwards, every
//! node agrees, and writes acknowledged before, during and after the hand-over are
//! on every node. A node that is not a voter is refused with a message naming it,
//! and the leader stays; asking for the current leader changes nothing.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::cluster::{json, ok_json, request, Cluster};
use common::{kiln, text};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn transfer(cluster: &Cluster, via: u64, to: u64) -> std::process::Output {
    let url = format!("http://127.0.0.1:{}", cluster.ports[&via]);
    kiln(&[
        "cluster",
        "transfer-leader",
        "--url",
        &url,
        "--to",
        &to.to_string(),
    ])
}

#[test]
fn leadership_moves_to_the_named_voter_and_no_acknowledged_write_is_lost() {
    let root = tempfile::tempdir().unwrap();
    let cluster = Cluster::new(root.path());
    let leader = cluster.leader();
    ok_json(cluster.ports[&leader], "PUT", "/dbs/t", "");
    let target = *cluster.ports.keys().find(|id| **id != leader).unwrap();
    let other = *cluster
        .ports
        .keys()
        .find(|id| **id != leader && **id != target)
        .unwrap();

    // A writer that follows the leader, through the hand-over.
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let writer = {
        let (stop, acknowledged) = (stop.clone(), acknowledged.clone());
        let ports: Vec<u16> = cluster.ports.values().copied().collect();
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                for port in &ports {
                    n += 1;
                    let id = format!("d{n}");
                    if let Ok((201, body)) =
                        request(*port, "PUT", &format!("/dbs/t/docs/{id}"), None, "{}")
                    {
                        let etag = json(&body)["etag"].as_str().unwrap().to_string();
                        acknowledged.lock().unwrap().push((id, etag));
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));

    // Asked through a node that does not lead: the CLI finds the leader.
    let out = transfer(&cluster, other, target);
    assert!(out.status.success(), "{}", text(&out));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["leader"].as_u64(), Some(target), "{}", text(&out));
    assert_eq!(cluster.leader(), target);

    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 10,
        "{} acknowledged writes",
        acknowledged.len()
    );
    // Once the leader has them all applied, so has every node shortly after.
    for (id, port) in &cluster.ports {
        for (doc, etag) in &acknowledged {
            let mut tries = 0;
            loop {
                let got = request(*port, "GET", &format!("/dbs/t/docs/{doc}"), None, "")
                    .ok()
                    .filter(|(status, _)| *status == 200)
                    .and_then(|(_, body)| {
                        json(&body)["@metadata"]["@etag"].as_str().map(String::from)
                    });
                if got.as_deref() == Some(etag.as_str()) {
                    break;
                }
                tries += 1;
                assert!(
                    tries < 500,
                    "node {id} has {doc} at {got:?}, acknowledged {etag}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    // To the leader itself: nothing to do.
    let out = transfer(&cluster, target, target);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(cluster.leader(), target);

    // To a node that is not a member: refused, naming it; the leader stays.
    let out = transfer(&cluster, target, 9);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("node 9 is not a voter"),
        "{}",
        text(&out)
    );
    assert_eq!(cluster.leader(), target);
}
