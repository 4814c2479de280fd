//! Three `kiln serve` nodes of one cluster on loopback, for the cluster tests
//! that run real processes: requests on their own connections (telling a request
//! never sent from one whose answer was lost), the nodes, their leader.
#![allow(dead_code)] // each test binary uses its own part of this module
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use super::{free_port, wait_until_healthy, TEST_JOURNAL_FILE_SIZE_MIB};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a request has no answer.
#[derive(Debug)]
pub enum Failed {
    /// The connection was refused: the server never saw the request.
    NotSent,
    /// Sent (or partly sent), then no full answer: it may have been done.
    Lost(String),
}

/// One request on its own connection: the status and the body.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    if_match: Option<&str>,
    body: &str,
) -> Result<(u16, String), Failed> {
    request_within(port, method, path, if_match, body, Duration::from_secs(10))
}

/// [`request`], giving up on an answer after `patience` (then `Lost`: a write may
/// still be done).
pub fn request_within(
    port: u16,
    method: &str,
    path: &str,
    if_match: Option<&str>,
    body: &str,
    patience: Duration,
) -> Result<(u16, String), Failed> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|_| Failed::NotSent)?;
    let lost = |what: &str| Failed::Lost(what.to_string());
    s.set_read_timeout(Some(patience))
        .map_err(|_| lost("setting the timeout"))?;
    let condition = if_match.map_or(String::new(), |etag| format!("if-match: \"{etag}\"\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{condition}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| lost(&format!("sending: {e}")))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| lost(&format!("reading the answer: {e}")))?;
    let status = out
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| lost("no status line"))?;
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_string()))
}

pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::Null)
}

/// The JSON of a request that must succeed (2xx); panics with the request and the
/// answer otherwise.
pub fn ok_json(port: u16, method: &str, path: &str, body: &str) -> serde_json::Value {
    let (status, text) = request(port, method, path, None, body).unwrap();
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {text}"
    );
    json(&text)
}

pub struct Cluster {
    pub dirs: BTreeMap<u64, PathBuf>,
    pub ports: BTreeMap<u64, u16>,
    pub members: String,
    pub children: BTreeMap<u64, Child>,
    pub options: NodeOptions,
}

/// How the nodes are started, beyond what every cluster test needs.
#[derive(Default, Clone)]
pub struct NodeOptions {
    /// More `kiln serve` arguments, for every node.
    pub extra_args: Vec<String>,
    /// Environment variables of node `id`'s process (a fake clock, say).
    pub env: BTreeMap<u64, Vec<(String, String)>>,
    /// Another `kiln` binary for node `id` (an older build); this build's otherwise.
    pub binary: BTreeMap<u64, PathBuf>,
    /// Where the nodes' logs go (`node{id}.stderr`); beside each data directory
    /// otherwise (a file system the test fills would cut them short).
    pub log_dir: Option<PathBuf>,
}

impl NodeOptions {
    /// Every node with `extra_args`.
    pub fn args(extra_args: &[&str]) -> NodeOptions {
        NodeOptions {
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            ..NodeOptions::default()
        }
    }
}

/// `--election-timeout-ms` of the nodes: quicker failovers than the default 400 ms.
pub const ELECTION_TIMEOUT_MS: u64 = 200;

/// `ID=127.0.0.1:PORT,...`, a `--cluster` list.
pub fn members(ports: &BTreeMap<u64, u16>) -> String {
    ports
        .iter()
        .map(|(id, port)| format!("{id}=127.0.0.1:{port}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl Cluster {
    /// The port of a node other than `leader_id`.
    pub fn follower_of(&self, leader_id: u64) -> u16 {
        *self
            .ports
            .iter()
            .find(|(id, _)| **id != leader_id)
            .unwrap()
            .1
    }

    pub fn new(root: &Path) -> Cluster {
        let ports: BTreeMap<u64, u16> = (1..=3).map(|id| (id, free_port())).collect();
        let members = members(&ports);
        Cluster::with_members(root, ports, members)
    }

    /// Three nodes listening on `ports` that reach each other at `members` (a
    /// `--cluster` list: other addresses than theirs when a proxy sits between them).
    pub fn with_members(root: &Path, ports: BTreeMap<u64, u16>, members: String) -> Cluster {
        let dirs = (1..=3)
            .map(|id| (id, root.join(format!("node{id}"))))
            .collect();
        Cluster::start_all(dirs, ports, members, NodeOptions::default())
    }

    /// Three nodes that reach each other through the test's fault proxy
    /// (`relay.rs`, one relay in front of each node); the test's clients talk to
    /// the nodes' own ports.
    pub fn behind_relays(root: &Path) -> (Cluster, super::relay::Relays) {
        let dirs = (1..=3)
            .map(|id| (id, root.join(format!("node{id}"))))
            .collect();
        Cluster::behind_relays_with(dirs, NodeOptions::default())
    }

    /// [`Cluster::behind_relays`], node `id`'s data directory at `dirs[id]`,
    /// the nodes started as `options` say.
    pub fn behind_relays_with(
        dirs: BTreeMap<u64, PathBuf>,
        options: NodeOptions,
    ) -> (Cluster, super::relay::Relays) {
        let relays = super::relay::Relays::bind(1..=3);
        let ports: BTreeMap<u64, u16> = (1..=3).map(|id| (id, free_port())).collect();
        for (id, port) in &ports {
            relays.forward_to(*id, *port);
        }
        let members = relays.members();
        (Cluster::start_all(dirs, ports, members, options), relays)
    }

    /// Three nodes, node `id`'s data directory at `dir` (on another file system,
    /// say), the others under `root`.
    pub fn with_dir(root: &Path, id: u64, dir: PathBuf) -> Cluster {
        let ports: BTreeMap<u64, u16> = (1..=3).map(|id| (id, free_port())).collect();
        let members = members(&ports);
        let mut dirs: BTreeMap<u64, PathBuf> = (1..=3)
            .map(|id| (id, root.join(format!("node{id}"))))
            .collect();
        dirs.insert(id, dir);
        Cluster::start_all(dirs, ports, members, NodeOptions::default())
    }

    /// Three nodes started as `options` say.
    pub fn with_options(root: &Path, options: NodeOptions) -> Cluster {
        let ports: BTreeMap<u64, u16> = (1..=3).map(|id| (id, free_port())).collect();
        let members = members(&ports);
        let dirs = (1..=3)
            .map(|id| (id, root.join(format!("node{id}"))))
            .collect();
        Cluster::start_all(dirs, ports, members, options)
    }

    fn start_all(
        dirs: BTreeMap<u64, PathBuf>,
        ports: BTreeMap<u64, u16>,
        members: String,
        options: NodeOptions,
    ) -> Cluster {
        let mut c = Cluster {
            dirs,
            ports,
            members,
            children: BTreeMap::new(),
            options,
        };
        c.start_each();
        c
    }

    fn start_each(&mut self) {
        for id in 1..=3 {
            self.start(id);
        }
    }

    #[allow(clippy::zombie_processes)] // `Drop` and `kill9` wait for it
    pub fn start(&mut self, id: u64) {
        let port = self.ports[&id];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .unwrap();
        let binary = self.options.binary.get(&id).cloned();
        let binary = binary.unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kiln")));
        let mut child = Command::new(binary)
            .args([
                "serve",
                "--node-id",
                &id.to_string(),
                "--cluster",
                &self.members,
                // Quicker failovers than the default 400 ms: the tests kill leaders.
                "--election-timeout-ms",
                &ELECTION_TIMEOUT_MS.to_string(),
            ])
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .args([
                "--journal-file-size-mib",
                TEST_JOURNAL_FILE_SIZE_MIB,
                "--data-dir",
            ])
            .arg(&self.dirs[&id])
            .args(&self.options.extra_args)
            .envs(self.options.env.get(&id).cloned().unwrap_or_default())
            // The default log filter, as an operator gets it.
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        wait_until_healthy(&mut child, port, &format!("node {id}"));
        self.children.insert(id, child);
    }

    /// Where node `id`'s stderr goes (appended to across its restarts), beside its
    /// data directory.
    pub fn log_path(&self, id: u64) -> PathBuf {
        match &self.options.log_dir {
            Some(dir) => dir.join(format!("node{id}.stderr")),
            None => self.dirs[&id].with_extension("stderr"),
        }
    }

    /// The last `lines` lines of node `id`'s log, for a failure's message.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let log = std::fs::read_to_string(self.log_path(id)).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Moves leadership to node `to` (asked of the current leader), and waits
    /// until the live nodes agree that it leads.
    pub fn transfer_to(&self, to: u64) {
        let leader = self.leader();
        if leader != to {
            let body = format!(r#"{{"id": {to}}}"#);
            let (status, text) =
                request(self.ports[&leader], "POST", "/cluster/leader", None, &body).unwrap();
            assert_eq!(status, 200, "{text}");
        }
        assert_eq!(self.leader(), to);
    }

    /// The leader the live nodes agree on (waits up to 20 s for one).
    pub fn leader(&self) -> u64 {
        let live: Vec<u64> = self.children.keys().copied().collect();
        self.leader_among(&live)
    }

    /// The leader that the nodes `ids` agree on, one of them (waits up to 20 s).
    pub fn leader_among(&self, ids: &[u64]) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let seen: Vec<Option<u64>> = ids
                .iter()
                .map(|id| {
                    request(self.ports[id], "GET", "/cluster", None, "")
                        .ok()
                        .and_then(|(_, body)| json(&body)["leader"].as_u64())
                })
                .collect();
            if let Some(Some(l)) = seen.first() {
                if ids.contains(l)
                    && self.children.contains_key(l)
                    && seen.iter().all(|s| s == &Some(*l))
                {
                    return *l;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no leader agreed on by {ids:?}: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(30));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, mut child) in std::mem::take(&mut self.children) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A node that says it leads (its own `GET /cluster`: state leader, leader
/// itself, a majority heard from within the election timeout), as the clients
/// choose one: of the highest term when several do (a leader cut off from the
/// others calls itself leader until it hears of a newer term).
pub fn find_leader(ports: &BTreeMap<u64, u16>) -> Option<(u64, u16)> {
    ports
        .iter()
        .filter_map(|(&id, &port)| {
            let (status, body) = request(port, "GET", "/cluster", None, "").ok()?;
            let v = json(&body);
            let leads = status == 200
                && v["state"].as_str() == Some("leader")
                && v["leader"].as_u64() == Some(id)
                && v["has_quorum"] != false;
            leads.then(|| (v["term"].as_u64().unwrap_or(0), id, port))
        })
        .max()
        .map(|(_, id, port)| (id, port))
}
