//! Three nodes in one process, each with its own data directory and its own HTTP
//! listener for Raft's messages: writes through the leader reach every node with
//! the same etags; a follower names the leader; when the leader stops, another
//! takes over and no acknowledged write is lost; the old leader, restarted on
//! its directory, catches up.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::*;
use kiln_cluster::{Answer, ClusterConfig, ClusterError, Command};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_survive_the_leader_stopping_and_the_old_leader_catches_up() {
    let root = tempfile::tempdir().unwrap();
    let members = loopback_members(3);
    let dir = |id: u64| -> PathBuf { root.path().join(format!("node{id}")) };
    let mut nodes = BTreeMap::new();
    for id in members.keys() {
        nodes.insert(*id, start(*id, &dir(*id), &members).await);
    }
    let leader = wait_for_leader(&nodes).await;

    // A follower refuses a write and names the leader.
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    match nodes[&follower]
        .node
        .write(Command::CreateDatabase {
            name: "shop".into(),
            incarnation: 7,
        })
        .await
    {
        Err(ClusterError::NotLeader {
            leader: Some((id, addr)),
            entered_log: false,
        }) => {
            assert_eq!((id, &addr), (leader, &members[&leader]));
        }
        other => panic!("a follower answered {other:?}"),
    }

    let created = nodes[&leader]
        .node
        .write(Command::CreateDatabase {
            name: "shop".into(),
            incarnation: 7,
        })
        .await
        .unwrap();
    assert!(
        matches!(created, Answer::DatabaseCreated { .. }),
        "{created:?}"
    );
    let mut acknowledged: Vec<(String, String)> = Vec::new();
    write_orders(&nodes[&leader].node, 0..20, &mut acknowledged).await;
    for n in nodes.values() {
        for (id, etag) in &acknowledged {
            wait_for_document(&n.node, id, etag).await;
        }
    }

    // The leader stops; the other two elect one of them and take writes.
    let old_leader = leader;
    stop(nodes.remove(&old_leader).unwrap()).await;
    let leader = wait_for_leader(&nodes).await;
    assert_ne!(leader, old_leader);
    write_orders(&nodes[&leader].node, 20..30, &mut acknowledged).await;

    // The old leader comes back on its directory and catches up.
    nodes.insert(
        old_leader,
        start(old_leader, &dir(old_leader), &members).await,
    );
    for n in nodes.values() {
        for (id, etag) in &acknowledged {
            wait_for_document(&n.node, id, etag).await;
        }
    }
    // The same documents, bodies and times included, on every node.
    let contents = |n: &Node| -> Vec<String> {
        let db = n.node.store().database("shop").unwrap();
        acknowledged
            .iter()
            .map(|(id, _)| format!("{:?}", db.get(id).unwrap()))
            .collect()
    };
    let first = contents(&nodes[&leader]);
    for n in nodes.values() {
        assert_eq!(contents(n), first);
    }
    for (_, n) in std::mem::take(&mut nodes) {
        stop(n).await;
    }
}

/// A follower that was down while the leader snapshotted and purged its log
/// catches up from the snapshot (the databases' backup containers), and ends with
/// the same documents and etags; the whole cluster restarted applies nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_behind_a_purged_log_catches_up_from_a_snapshot_and_a_restart_applies_nothing_twice(
) {
    let root = tempfile::tempdir().unwrap();
    let members = loopback_members(3);
    let dir = |id: u64| -> PathBuf { root.path().join(format!("node{id}")) };
    let small_log = |c: &mut ClusterConfig| {
        c.snapshot_every_entries = 20;
        c.entries_kept_after_snapshot = 0;
    };
    let mut nodes = BTreeMap::new();
    for id in members.keys() {
        nodes.insert(*id, start_with(*id, &dir(*id), &members, small_log).await);
    }
    let leader = wait_for_leader(&nodes).await;
    nodes[&leader]
        .node
        .write(Command::CreateDatabase {
            name: "shop".into(),
            incarnation: 9,
        })
        .await
        .unwrap();
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    let follower_had = nodes[&follower].node.status().last_log_index.unwrap_or(0);
    stop(nodes.remove(&follower).unwrap()).await;
    let mut acknowledged = Vec::new();
    for i in 0..120u64 {
        let id = format!("orders/{}", i % 90); // some documents written twice
        let answer = nodes[&leader]
            .node
            .write(put(
                "shop",
                &id,
                &format!(r#"{{"i":{i}}}"#),
                1_790_000_000_000 + i,
            ))
            .await
            .unwrap();
        acknowledged.retain(|(d, _)| d != &id);
        acknowledged.push((id, etag_of(&answer)));
    }
    // The leader has snapshotted and purged entries the follower lacks: it can
    // only catch up from a snapshot.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let m = nodes[&leader].node.raft().metrics().borrow().clone();
        if m.purged.is_some_and(|p| p.index > follower_had + 1) {
            break;
        }
        assert!(Instant::now() < deadline, "no purge: {:?}", m.purged);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nodes.insert(
        follower,
        start_with(follower, &dir(follower), &members, small_log).await,
    );
    for n in nodes.values() {
        for (id, etag) in &acknowledged {
            wait_for_document(&n.node, id, etag).await;
        }
    }
    let snapshot_installed = nodes[&follower]
        .node
        .raft()
        .metrics()
        .borrow()
        .snapshot
        .is_some();
    assert!(
        snapshot_installed,
        "the follower caught up without a snapshot"
    );
    let contents = |n: &Node| -> Vec<String> {
        let db = n.node.store().database("shop").unwrap();
        let mut docs: Vec<String> = acknowledged
            .iter()
            .map(|(id, _)| format!("{:?}", db.get(id).unwrap()))
            .collect();
        docs.push(format!("{:?}", db.document_count().unwrap()));
        docs
    };
    let expected = contents(&nodes[&leader]);
    for n in nodes.values() {
        assert_eq!(contents(n), expected);
    }

    // The whole cluster stops and starts again: every committed entry is applied
    // again at most once (the etags and counts stay), and writes continue the
    // sequence.
    for (_, n) in std::mem::take(&mut nodes) {
        stop(n).await;
    }
    for id in members.keys() {
        nodes.insert(*id, start_with(*id, &dir(*id), &members, small_log).await);
    }
    let leader = wait_for_leader(&nodes).await;
    for n in nodes.values() {
        assert_eq!(
            contents(n),
            expected,
            "after a restart of the whole cluster"
        );
    }
    let answer = nodes[&leader]
        .node
        .write(put("shop", "after/restart", "{}", 1_790_000_001_000))
        .await
        .unwrap();
    let last = acknowledged
        .iter()
        .map(|(_, e)| e.split('-').next().unwrap().parse::<u64>().unwrap())
        .max()
        .unwrap();
    let next: u64 = etag_of(&answer).split('-').next().unwrap().parse().unwrap();
    assert_eq!(
        next,
        last + 1,
        "a write after the restart continues the sequence"
    );
    for (_, n) in std::mem::take(&mut nodes) {
        stop(n).await;
    }
}

/// Members change while a writer goes on: a fourth node joins as a learner,
/// catches up and is promoted; then a voter other than the leader is removed. No
/// acknowledged write is lost, and the new member holds them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_change_under_load_without_losing_a_write() {
    let root = tempfile::tempdir().unwrap();
    let ports = free_ports(4);
    let members: BTreeMap<u64, String> = ports[..3]
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}")))
        .collect();
    let dir = |id: u64| -> PathBuf { root.path().join(format!("node{id}")) };
    let mut nodes = BTreeMap::new();
    for id in members.keys() {
        nodes.insert(*id, start(*id, &dir(*id), &members).await);
    }
    let leader = wait_for_leader(&nodes).await;
    let leader_node = nodes[&leader].node.clone();
    leader_node
        .write(Command::CreateDatabase {
            name: "shop".into(),
            incarnation: 5,
        })
        .await
        .unwrap();
    // The writer: one write after another, each acknowledged one recorded.
    let stop_writing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (node, stop_writing) = (leader_node.clone(), stop_writing.clone());
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let mut i = 0u64;
            while !stop_writing.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let id = format!("orders/{i}");
                if let Ok(answer) = node
                    .write(put("shop", &id, "{}", 1_790_000_000_000 + i))
                    .await
                {
                    acknowledged.push((id, etag_of(&answer)));
                }
            }
            acknowledged
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Node 4 joins.
    let new_address = format!("127.0.0.1:{}", ports[3]);
    let mut joining = BTreeMap::new();
    joining.insert(4u64, new_address.clone());
    nodes.insert(
        4,
        start_with(4, &dir(4), &joining, |c| c.joining = true).await,
    );
    leader_node.add_learner(4, new_address).await.unwrap();
    leader_node.promote(4).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A voter other than the leader leaves.
    let leaving = *members.keys().find(|id| **id != leader).unwrap();
    leader_node.remove(leaving).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop_writing.store(true, std::sync::atomic::Ordering::Relaxed);
    let acknowledged = writer.await.unwrap();
    assert!(acknowledged.len() >= 20, "{} writes", acknowledged.len());
    stop(nodes.remove(&leaving).unwrap()).await;
    let voters: Vec<u64> = leader_node
        .status()
        .members
        .iter()
        .filter(|m| m.role != "learner")
        .map(|m| m.id)
        .collect();
    assert!(
        voters.contains(&4) && !voters.contains(&leaving),
        "{voters:?}"
    );
    for n in nodes.values() {
        for (id, etag) in &acknowledged {
            wait_for_document(&n.node, id, etag).await;
        }
    }
    println!(
        "{} writes acknowledged while members changed (leader {leader}, node {leaving} left)",
        acknowledged.len()
    );
    drop(leader_node);
    for (_, n) in std::mem::take(&mut nodes) {
        stop(n).await;
    }
}

/// A Raft message is answered in the form it came in: JSON (what builds before the
/// binary form send) in JSON, binary in binary; a format byte this build does not
/// know is refused naming it, and the node goes on taking the cluster's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_are_answered_in_their_own_form_and_an_unknown_form_is_refused() {
    use kiln_cluster::network::handle_rpc;
    let root = tempfile::tempdir().unwrap();
    let members = loopback_members(3);
    let mut nodes = BTreeMap::new();
    for id in members.keys() {
        let dir = root.path().join(format!("node{id}"));
        nodes.insert(*id, start(*id, &dir, &members).await);
    }
    let leader = wait_for_leader(&nodes).await;
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    let raft = nodes[&follower].node.raft();

    // A vote request from a stale candidate (term 0): refused, in either form.
    let vote = openraft::raft::VoteRequest::<u64>::new(openraft::Vote::new(0, leader), None);
    let json = serde_json::to_vec(&vote).unwrap();
    let answer = handle_rpc(raft, "vote", &json).await.unwrap();
    assert_eq!(
        answer.first(),
        Some(&b'{'),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(
        kiln_cluster::codec::content_type(&answer),
        "application/json"
    );
    let binary = kiln_cluster::codec::encode(&vote).unwrap();
    let answer = handle_rpc(raft, "vote", &binary).await.unwrap();
    assert_eq!(
        answer.first(),
        Some(&kiln_cluster::codec::FORMAT_POSTCARD_V1)
    );
    let decoded: Result<openraft::raft::VoteResponse<u64>, openraft::error::RaftError<u64>> =
        kiln_cluster::codec::decode(&answer).unwrap();
    assert!(!decoded.unwrap().vote_granted);

    let refused = handle_rpc(raft, "append", &[2, 0, 0, 0]).await.unwrap_err();
    assert!(
        refused.to_string().contains("format byte 2") && refused.to_string().contains("Upgrade"),
        "{refused}"
    );

    // The cluster still takes writes, and the follower has them.
    let answer = nodes[&leader]
        .node
        .write(Command::CreateDatabase {
            name: "shop".into(),
            incarnation: 3,
        })
        .await
        .unwrap();
    assert!(
        matches!(answer, Answer::DatabaseCreated { .. }),
        "{answer:?}"
    );
    let written = nodes[&leader]
        .node
        .write(put("shop", "a", "{\"n\":1}", 1_000))
        .await
        .unwrap();
    wait_for_document(&nodes[&follower].node, "a", &etag_of(&written)).await;
    for (_, n) in nodes {
        stop(n).await;
    }
}
