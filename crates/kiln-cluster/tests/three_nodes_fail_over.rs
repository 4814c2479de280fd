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
    // The store is closed when the last handle goes (Raft's tasks hold some).
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
