//! Partitions, by cutting links between the nodes (a fault seam in the network:
//! a cut link is unreachable both ways). The leader cut off from the others
//! refuses writes within an election timeout; the majority elects a leader and
//! goes on; after the heal, the old leader's writes that were never acknowledged
//! are gone, and every acknowledged write is on every node with its etag. Then a
//! follower is cut off and healed: the cluster never stops taking writes.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::*;
use kiln_cluster::{ClusterConfig, ClusterError};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The links cut, as unordered pairs of node ids.
#[derive(Clone, Default)]
struct Cuts(Arc<Mutex<BTreeSet<(u64, u64)>>>);

impl Cuts {
    fn isolate(&self, node: u64, others: impl IntoIterator<Item = u64>) {
        let mut cut = self.0.lock();
        for o in others {
            cut.insert((node.min(o), node.max(o)));
        }
    }
    fn heal(&self) {
        self.0.lock().clear();
    }
    fn filter(&self) -> kiln_cluster::network::LinkFilter {
        let cuts = self.0.clone();
        Arc::new(move |a: u64, b: u64| !cuts.lock().contains(&(a.min(b), a.max(b))))
    }
}

/// A node per member under `root`, each sending through `cuts`' filter, with the
/// given write timeout.
async fn start_nodes(
    root: &Path,
    members: &BTreeMap<u64, String>,
    cuts: &Cuts,
    write_timeout_ms: u64,
) -> BTreeMap<u64, Node> {
    let mut nodes = BTreeMap::new();
    for id in members.keys() {
        let links = cuts.filter();
        let tune = move |c: &mut ClusterConfig| {
            c.links = Some(links);
            c.write_timeout_ms = write_timeout_ms;
        };
        let dir = root.join(format!("node{id}"));
        nodes.insert(*id, start_with(*id, &dir, members, tune).await);
    }
    nodes
}

/// The leader among `ids`, as those nodes see it (each may see another).
async fn leader_among(nodes: &BTreeMap<u64, Node>, ids: &[u64]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen: Vec<Option<u64>> = ids
            .iter()
            .map(|id| nodes[id].node.status().leader)
            .collect();
        if let Some(Some(l)) = seen.first() {
            if ids.contains(l) && seen.iter().all(|s| s == &Some(*l)) {
                return *l;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader among {ids:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "slow tier (.ci/run): the fast tier covers partitions with real processes (kiln-cli cluster_partitions)"]
async fn a_cut_off_leader_refuses_writes_and_nothing_acknowledged_is_lost() {
    let root = tempfile::tempdir().unwrap();
    let members = loopback_members(3);
    let cuts = Cuts::default();
    let mut nodes = start_nodes(root.path(), &members, &cuts, 2_000).await;
    let all: Vec<u64> = members.keys().copied().collect();
    let leader = leader_among(&nodes, &all).await;
    nodes[&leader]
        .node
        .write(kiln_cluster::Command::CreateDatabase {
            name: "shop".into(),
            incarnation: 3,
        })
        .await
        .unwrap();
    let mut acknowledged: Vec<(String, String)> = Vec::new();
    let mut n = 0u64;
    let mut write_to = |node: u64, nodes: &BTreeMap<u64, Node>| {
        n += 1;
        let id = format!("orders/{n}");
        let node = nodes[&node].node.clone();
        async move {
            let answer = node
                .write(put("shop", &id, "{}", 1_790_000_000_000 + n))
                .await;
            (id, answer)
        }
    };
    for _ in 0..10 {
        let (id, answer) = write_to(leader, &nodes).await;
        acknowledged.push((id, etag_of(&answer.unwrap())));
    }

    // The leader is cut off. Writes sent to it are not acknowledged: refused
    // before they enter its log (no_quorum, not written) once a majority has been
    // silent for an election timeout and stays silent for a write's timeout, or,
    // for one already logged, refused when its time is up.
    cuts.isolate(leader, all.iter().copied().filter(|id| *id != leader));
    let cut_at = Instant::now();
    let mut refused_ids = Vec::new();
    let refused_within = loop {
        let (id, answer) = write_to(leader, &nodes).await;
        match answer {
            Err(ClusterError::NoQuorum {
                entered_log: false, ..
            }) => {
                refused_ids.push(id);
                break cut_at.elapsed();
            }
            Err(ClusterError::NoQuorum { .. }) | Err(ClusterError::NotLeader { .. }) => {
                refused_ids.push(id)
            }
            Ok(a) => panic!("a cut-off leader acknowledged {id}: {a:?}"),
            Err(e) => panic!("{e}"),
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(15),
            "still not refusing before the log"
        );
    };
    assert!(
        refused_within < Duration::from_secs(8),
        "the cut-off leader took {refused_within:?} to refuse writes"
    );
    let majority: Vec<u64> = all.iter().copied().filter(|id| *id != leader).collect();
    let new_leader = leader_among(&nodes, &majority).await;
    for _ in 0..10 {
        let (id, answer) = write_to(new_leader, &nodes).await;
        acknowledged.push((id, etag_of(&answer.unwrap())));
    }

    // Healed: the old leader follows, its unacknowledged entries are gone, and it
    // has every acknowledged write.
    cuts.heal();
    let leader = leader_among(&nodes, &all).await;
    for n in nodes.values() {
        for (id, etag) in &acknowledged {
            wait_for_document(&n.node, id, etag).await;
        }
        let db = n.node.store().database("shop").unwrap();
        for id in &refused_ids {
            assert!(
                db.get(id).unwrap().is_none(),
                "node {}: {id}, refused while its leader was cut off, is there",
                n.node.node_id()
            );
        }
    }

    // A follower cut off: the leader goes on with the other one.
    let follower = *all.iter().find(|id| **id != leader).unwrap();
    cuts.isolate(follower, all.iter().copied().filter(|id| *id != follower));
    for _ in 0..10 {
        let (id, answer) = write_to(leader, &nodes).await;
        acknowledged.push((id, etag_of(&answer.unwrap())));
    }
    cuts.heal();
    for n in nodes.values() {
        for (id, etag) in &acknowledged {
            wait_for_document(&n.node, id, etag).await;
        }
    }
    println!(
        "{} writes acknowledged, {} refused by the cut-off leader (refusing before its log after {refused_within:?})",
        acknowledged.len(),
        refused_ids.len()
    );
    for (_, n) in std::mem::take(&mut nodes) {
        stop(n).await;
    }
}

/// A write the leader logged, then lost to a new leader's log: openraft answers it
/// "forward to the leader", as it answers a write it refused before logging it.
/// Only the second is surely not written (a client may resend it); the first must be
/// answered as possibly written (`"unknown"` over HTTP), since a node holding its
/// entry could have come to lead. With every refusal called unwritten, this fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "slow tier (.ci/run): about 5 s"]
async fn a_logged_write_cut_off_by_a_new_leader_is_not_answered_as_unwritten() {
    let root = tempfile::tempdir().unwrap();
    let members = loopback_members(3);
    let cuts = Cuts::default();
    // Long enough that the old leader's write is still waiting at the heal.
    let mut nodes = start_nodes(root.path(), &members, &cuts, 30_000).await;
    let all: Vec<u64> = members.keys().copied().collect();
    let leader = leader_among(&nodes, &all).await;
    let create = kiln_cluster::Command::CreateDatabase {
        name: "shop".into(),
        incarnation: 3,
    };
    nodes[&leader].node.write(create).await.unwrap();
    let before_cut = nodes[&leader]
        .node
        .write(put("shop", "orders/before", "{}", 1_790_000_000_000))
        .await
        .unwrap();

    // Cut off at once: the next write enters its log before it notices the
    // silence of the others, and is never replicated.
    cuts.isolate(leader, all.iter().copied().filter(|id| *id != leader));
    let old_leader = nodes[&leader].node.clone();
    let lost = tokio::spawn(async move {
        old_leader
            .write(put("shop", "orders/lost", "{}", 1_790_000_000_001))
            .await
    });
    let majority: Vec<u64> = all.iter().copied().filter(|id| *id != leader).collect();
    let new_leader = leader_among(&nodes, &majority).await;
    let after = nodes[&new_leader]
        .node
        .write(put("shop", "orders/after", "{}", 1_790_000_000_002))
        .await
        .unwrap();
    cuts.heal();

    match lost.await.unwrap() {
        Ok(answer) => panic!("the cut-off leader acknowledged a write: {answer:?}"),
        Err(e) => assert!(
            e.may_have_been_written(),
            "a write the old leader had logged was answered as surely not written: {e:?}"
        ),
    }
    // The new leader's log won: the logged write is on no node, the others on all.
    for n in nodes.values() {
        wait_for_document(&n.node, "orders/before", &etag_of(&before_cut)).await;
        wait_for_document(&n.node, "orders/after", &etag_of(&after)).await;
        let db = n.node.store().database("shop").unwrap();
        assert!(db.get("orders/lost").unwrap().is_none());
    }
    // A node that does not lead refuses before logging: that refusal is sure.
    let follower = *all.iter().find(|id| **id != new_leader).unwrap();
    let refused = nodes[&follower]
        .node
        .write(put("shop", "orders/elsewhere", "{}", 1_790_000_000_003))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ClusterError::NotLeader { .. }) && !refused.may_have_been_written(),
        "{refused:?}"
    );
    for (_, n) in std::mem::take(&mut nodes) {
        stop(n).await;
    }
}
