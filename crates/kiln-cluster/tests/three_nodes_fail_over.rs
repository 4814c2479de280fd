//! Three nodes in one process, each with its own data directory and its own HTTP
//! listener for Raft's messages: writes through the leader reach every node with
//! the same etags; a follower names the leader; when the leader stops, another
//! takes over and no acknowledged write is lost; the old leader, restarted on
//! its directory, catches up.

use axum::extract::{Path as UrlPath, State};
use axum::routing::post;
use axum::Router;
use kiln_cluster::{
    Answer, ClusterConfig, ClusterError, ClusterNode, Command, LoggedCondition, LoggedOp,
    WriteAnswer,
};
use kiln_docs::{DocStore, DocsOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn docs_options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o
}

struct Node {
    node: Arc<ClusterNode>,
    server: tokio::task::JoinHandle<()>,
}

async fn raft_route(
    State(node): State<Arc<ClusterNode>>,
    UrlPath(kind): UrlPath<String>,
    body: axum::body::Bytes,
) -> Result<Vec<u8>, (axum::http::StatusCode, String)> {
    kiln_cluster::network::handle_rpc(node.raft(), &kind, &body)
        .await
        .map_err(|e| (axum::http::StatusCode::BAD_REQUEST, e.to_string()))
}

async fn start(id: u64, dir: &Path, members: &BTreeMap<u64, String>) -> Node {
    start_with(id, dir, members, |_| {}).await
}

async fn start_with(
    id: u64,
    dir: &Path,
    members: &BTreeMap<u64, String>,
    tune: impl FnOnce(&mut ClusterConfig),
) -> Node {
    let address = &members[&id];
    let listener = loop {
        // A restarted node takes its port back; the old socket may linger a moment.
        match tokio::net::TcpListener::bind(address).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let store = Arc::new(DocStore::open(dir.join("data"), docs_options()).unwrap());
    let mut config = ClusterConfig::new(id, members.clone(), dir.join("raft"));
    config.storage = docs_options().storage;
    config.write_timeout_ms = 3_000;
    tune(&mut config);
    let node = Arc::new(ClusterNode::start(store, config, None).await.unwrap());
    let app = Router::new()
        .route("/cluster/raft/{kind}", post(raft_route))
        .with_state(node.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Node { node, server }
}

async fn stop(n: Node) {
    n.node.shutdown().await;
    n.server.abort();
    let _ = n.server.await;
    let store = n.node.store().clone();
    drop(n.node);
    // Raft's tasks end after the shutdown and let go of the store; only then is
    // the data directory free for a restart (its lock goes with the last handle).
    let deadline = Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&store) > 1 {
        assert!(
            Instant::now() < deadline,
            "the store is still held after the shutdown"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(store);
}

/// The node every live node agrees leads, once there is one.
async fn wait_for_leader(nodes: &BTreeMap<u64, Node>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let leaders: Vec<Option<u64>> = nodes.values().map(|n| n.node.status().leader).collect();
        if let Some(Some(l)) = leaders.first() {
            if nodes.contains_key(l) && leaders.iter().all(|x| x == &Some(*l)) {
                return *l;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader agreed on: {leaders:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn put(database: &str, id: &str, json: &str, at_ms: u64) -> Command {
    Command::Write {
        database: database.into(),
        at_ms,
        all_or_none: false,
        ops: vec![LoggedOp::Put {
            id: id.into(),
            json: json.into(),
            condition: LoggedCondition::None,
        }],
    }
}

fn etag_of(answer: &Answer) -> String {
    match answer {
        Answer::Writes(w) => match &w[..] {
            [WriteAnswer::Put { etag, .. }] => etag.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// Waits until `node` holds `id` with `etag`.
async fn wait_for_document(node: &ClusterNode, id: &str, etag: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let got = node
            .store()
            .database("shop")
            .ok()
            .and_then(|db| db.get(id).ok().flatten())
            .map(|d| d.etag.to_string());
        if got.as_deref() == Some(etag) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {} has {id} at {got:?}, not {etag}",
            node.node_id()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_survive_the_leader_stopping_and_the_old_leader_catches_up() {
    let root = tempfile::tempdir().unwrap();
    let members: BTreeMap<u64, String> = free_ports(3)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}")))
        .collect();
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
    for i in 0..20 {
        let id = format!("orders/{i}");
        let answer = nodes[&leader]
            .node
            .write(put(
                "shop",
                &id,
                &format!(r#"{{"n":{i}}}"#),
                1_790_000_000_000 + i,
            ))
            .await
            .unwrap();
        acknowledged.push((id, etag_of(&answer)));
    }
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
    for i in 20..30 {
        let id = format!("orders/{i}");
        let answer = nodes[&leader]
            .node
            .write(put(
                "shop",
                &id,
                &format!(r#"{{"n":{i}}}"#),
                1_790_000_000_000 + i,
            ))
            .await
            .unwrap();
        acknowledged.push((id, etag_of(&answer)));
    }

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
    let members: BTreeMap<u64, String> = free_ports(3)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}")))
        .collect();
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
