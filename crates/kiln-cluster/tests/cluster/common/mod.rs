//! Shared by the cluster tests: nodes in one process, each with its own data
//! directory and HTTP listener for Raft's messages.
#![allow(dead_code)] // each test binary uses its own part of this module
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use axum::extract::{Path as UrlPath, State};
use axum::routing::post;
use axum::Router;
use kiln_cluster::{
    Answer, ClusterConfig, ClusterNode, Command, LoggedCondition, LoggedOp, WriteAnswer,
};
use kiln_docs::{DocStore, DocsOptions};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn docs_options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o
}

pub struct Node {
    pub node: Arc<ClusterNode>,
    pub server: tokio::task::JoinHandle<()>,
}

pub async fn raft_route(
    State(node): State<std::sync::Weak<ClusterNode>>,
    UrlPath(kind): UrlPath<String>,
    body: axum::body::Bytes,
) -> Result<Vec<u8>, (axum::http::StatusCode, String)> {
    // Weak: a connection another node keeps open must not keep a stopped node
    // (and its store) alive.
    let Some(node) = node.upgrade() else {
        return Err((
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "stopped".into(),
        ));
    };
    node.handle_rpc(&kind, &body)
        .await
        .map_err(|e| (axum::http::StatusCode::BAD_REQUEST, e.to_string()))
}

pub async fn start(id: u64, dir: &Path, members: &BTreeMap<u64, String>) -> Node {
    start_with(id, dir, members, |_| {}).await
}

pub async fn start_with(
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
        .with_state(Arc::downgrade(&node));
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Node { node, server }
}

pub async fn stop(n: Node) {
    let id = n.node.node_id();
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
            "node {id}: the store is still held ({} handles) after the shutdown",
            Arc::strong_count(&store)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(store);
}

/// The node every live node agrees leads, once there is one.
pub async fn wait_for_leader(nodes: &BTreeMap<u64, Node>) -> u64 {
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

pub fn put(database: &str, id: &str, json: &str, at_ms: u64) -> Command {
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

pub fn etag_of(answer: &Answer) -> String {
    match answer {
        Answer::Writes(w) => match &w[..] {
            [WriteAnswer::Put { etag, .. }] => etag.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// Waits until `node` holds `id` with `etag`.
pub async fn wait_for_document(node: &ClusterNode, id: &str, etag: &str) {
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

pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// Ids 1..=n and a free loopback address for each.
pub fn loopback_members(n: usize) -> BTreeMap<u64, String> {
    free_ports(n)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}")))
        .collect()
}

/// Writes `{"n": i}` to `orders/{i}` for each `i` through `node` (the leader) and
/// records each acknowledged etag.
pub async fn write_orders(
    node: &ClusterNode,
    range: std::ops::Range<u64>,
    acknowledged: &mut Vec<(String, String)>,
) {
    for i in range {
        let id = format!("orders/{i}");
        let json = format!(r#"{{"n":{i}}}"#);
        let answer = node
            .write(put("shop", &id, &json, 1_790_000_000_000 + i))
            .await
            .unwrap();
        acknowledged.push((id, etag_of(&answer)));
    }
}
