//! W15 of shared/BENCHMARKS.md: replicated durable PUTs. W8's load (new 1 KiB JSON
//! documents, one per request, over `connections` keep-alive connections) against
//! the leader of a three-node cluster: three `kiln serve --node-id N --cluster ...`
//! children on loopback, their data directories side by side under the run's
//! directory (one disk and the machine's cores shared by the three). Single-node W8
//! runs right before it, in the same run, with the same client and load, for the
//! ratio.
//!
//! Then failover: kill -9 of the leader, timed from the signal to the first write a
//! new leader acknowledges (a prober PUTs to the two survivors in turn, a fresh
//! connection per try, until one answers 201); the killed node restarts on its
//! directory and catches up before the next kill.
//!
//! Where the time goes, for W15 and for the W8 beside it: each node's database
//! journal writes per request (`GET /dbs/bench` on each node), the bytes each
//! server sent to storage (`/proc/PID/io`), the servers' CPU, and the disk's own
//! write and flush counts (/proc/diskstats: the whole device, whoever wrote).
//!
//! W15C: catch-up. A fresh three-node cluster that snapshots every
//! `CATCH_UP_SNAPSHOT_EVERY_ENTRIES` entries; one follower stopped (SIGTERM, a
//! clean stop), then the scale's documents written to the leader in batches (one
//! Raft entry each) until the leader's log is purged past the follower; the
//! follower restarted and timed from its start until it has applied the leader's
//! index: from a snapshot (built on the leader during the writes, sent in chunks,
//! installed by restoring), then the entries after it from the log. Then again with
//! fewer entries behind than the leader keeps below a snapshot: from the log
//! alone. Both against the disk's sequential write measured in the same run, as
//! W14 measures it; where the time went is read off the follower's snapshot
//! directory and applied index, polled every `CATCH_UP_POLL`.

use crate::httpbench::{request_bytes, run_load, Conn, ServerProcess};
use crate::machine::DiskCounters;
use crate::procstat;
use crate::rawdisk::{self, AlignedBuf, WriteMode};
use crate::run::{progress, BenchResult, Run};
use crate::serverbench::{self, doc_1k, ServerLoad, SERVE_FLAGS};
use crate::stats::{median, quantile};
use crate::workload::SEED;
use rand::{rngs::SmallRng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The cluster's voters.
pub const NODES: u64 = 3;

/// How long the cluster may take to agree on a leader with every member caught up
/// (a node restarted after a kill replays its log and catches up first).
const STEADY_WITHIN: Duration = Duration::from_secs(60);

/// How long after a kill -9 of the leader a write may take to be acknowledged
/// before the run fails (the figure measured is expected around a second).
const FAILOVER_GIVE_UP: Duration = Duration::from_secs(60);

/// One request's limit (a node answers a write it cannot commit `no_quorum` after
/// 5 s of its own).
const REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// The figures of the W8 beside W15 that W15 reports, as `w8_<name>`.
const W8_FIGURES: [&str; 9] = [
    "p50_us",
    "p99_us",
    "server_cpu_us_per_request",
    "requests_per_journal_write",
    "avg_group_size",
    "storage_bytes_per_request",
    "device_writes_per_request",
    "device_flushes_per_request",
    "device_bytes_per_request",
];

/// W15's scale.
#[derive(Debug, Clone, Copy)]
pub struct ClusterLoad {
    /// The PUTs of W15 and of the W8 beside it (`w8_requests`), and their connections.
    pub load: ServerLoad,
    /// Kills of the leader.
    pub failovers: usize,
}

impl ClusterLoad {
    /// PUTs: `requests`, else 50,000 (6,400 with `quick`); kills: `failovers`, else
    /// 20 (5 with `quick`).
    pub fn new(
        quick: bool,
        connections: usize,
        requests: Option<u64>,
        failovers: Option<usize>,
    ) -> Self {
        let requests = requests.unwrap_or(if quick { 6_400 } else { 50_000 });
        ClusterLoad {
            load: ServerLoad::new(quick, connections, Some(requests), false),
            failovers: failovers.unwrap_or(if quick { 5 } else { 20 }),
        }
    }
}

/// What a server (or the three of a cluster) spent during a load: read before it,
/// differences after.
struct Spent {
    disk: Option<DiskCounters>,
    cpu_seconds: f64,
    storage_bytes: u64,
}

impl Spent {
    fn now(disk_dir: &Path, pids: &[u32]) -> BenchResult<Spent> {
        let mut cpu_seconds = 0.0;
        let mut storage_bytes = 0;
        for &pid in pids {
            cpu_seconds += procstat::cpu_seconds(pid)?;
            storage_bytes += procstat::storage_write_bytes(pid)?;
        }
        Ok(Spent {
            disk: DiskCounters::of(disk_dir),
            cpu_seconds,
            storage_bytes,
        })
    }

    /// The figures per request since `before`, named `{prefix}...`: the servers'
    /// CPU and bytes to storage, the device's writes, flushes and bytes.
    fn per_request(
        &self,
        before: &Spent,
        requests: u64,
        prefix: &str,
        extra: &mut Map<String, Value>,
    ) {
        let per = |v: f64| json!(v / requests.max(1) as f64);
        extra.insert(
            format!("{prefix}cpu_us_per_request"),
            per((self.cpu_seconds - before.cpu_seconds) * 1e6),
        );
        extra.insert(
            format!("{prefix}storage_bytes_per_request"),
            per(self.storage_bytes.saturating_sub(before.storage_bytes) as f64),
        );
        if let (Some(after), Some(earlier)) = (self.disk, before.disk) {
            let d = after.since(&earlier);
            extra.insert(
                format!("{prefix}device_writes_per_request"),
                per(d.writes as f64),
            );
            extra.insert(
                format!("{prefix}device_bytes_per_request"),
                per(d.sectors_written as f64 * 512.0),
            );
            if let Some(flushes) = d.flushes {
                extra.insert(
                    format!("{prefix}device_flushes_per_request"),
                    per(flushes as f64),
                );
            }
        }
    }
}

/// W15: single-node W8, then the same load against a three-node cluster's leader,
/// then `failovers` kills of the leader.
pub fn w15(dir: &Path, scale: ClusterLoad) -> BenchResult<Run> {
    let load = scale.load;
    std::fs::create_dir_all(dir)?;

    // W8 beside it: one server, the same client, the same load.
    let single_dir = dir.join("single");
    let w8 = {
        let server = serverbench::fresh_server(&single_dir)?;
        let before = Spent::now(dir, &[server.pid()])?;
        let mut run = serverbench::w8_load(&server, load, "users", "W15 W8")?;
        let after = Spent::now(dir, &[server.pid()])?;
        after.per_request(&before, run.ops, "", &mut run.extra);
        run
    };
    std::fs::remove_dir_all(&single_dir)?;

    let mut cluster = Cluster::start(&dir.join("cluster"), &[])?;
    let leader = cluster.steady()?;
    // Every node has it before the counters are read.
    cluster.create_bench_db(leader)?;
    let journal_before = cluster.db_journal_writes()?;
    let pids = cluster.pids();
    let before = Spent::now(dir, &pids)?;
    let mut run = serverbench::w8_load(&cluster.nodes[&leader], load, "users", "W15")?;
    // The followers apply what the leader acknowledged; their writes count.
    cluster.wait_applied(leader)?;
    let after = Spent::now(dir, &pids)?;
    let journal_after = cluster.db_journal_writes()?;

    let requests = run.ops.max(1) as f64;
    let rate = run.ops_per_sec();
    let extra = &mut run.extra;
    extra.insert("nodes".into(), json!(NODES));
    extra.insert("leader".into(), json!(leader));
    after.per_request(&before, run.ops, "cluster_", extra);
    let journal_writes =
        |id: &u64| journal_after[id].saturating_sub(journal_before[id]) as f64 / requests;
    extra.insert(
        "leader_db_journal_writes_per_request".into(),
        json!(journal_writes(&leader)),
    );
    let followers: Vec<f64> = journal_after
        .keys()
        .filter(|id| **id != leader)
        .map(journal_writes)
        .collect();
    extra.insert(
        "follower_db_journal_writes_per_request".into(),
        json!(followers.iter().sum::<f64>() / followers.len().max(1) as f64),
    );
    extra.insert("w8_requests_per_sec".into(), json!(w8.ops_per_sec()));
    for (k, v) in &w8.extra {
        if W8_FIGURES.contains(&k.as_str()) {
            extra.insert(format!("w8_{k}"), v.clone());
        }
    }
    extra.insert("ratio_to_w8".into(), json!(rate / w8.ops_per_sec()));

    let (failover_ms, rejoin_ms) = failovers(&mut cluster, scale.failovers)?;
    let extra = &mut run.extra;
    extra.insert("failovers".into(), json!(failover_ms.len()));
    if !failover_ms.is_empty() {
        let mut sorted = failover_ms.clone();
        sorted.sort_by(f64::total_cmp);
        extra.insert("failover_p50_ms".into(), json!(median(&sorted)));
        extra.insert(
            "failover_max_ms".into(),
            json!(quantile(&sorted, 1.0).unwrap_or(f64::NAN)),
        );
        extra.insert("failover_ms".into(), json!(failover_ms));
        extra.insert("rejoin_p50_ms".into(), json!(median(&rejoin_ms)));
        extra.insert(
            "rejoin_max_ms".into(),
            json!(rejoin_ms.iter().copied().fold(f64::NAN, f64::max)),
        );
    }
    Ok(run)
}

/// `count` times: kill -9 of the leader, the time to the first write a survivor
/// acknowledges, then the killed node restarted on its directory and the time until
/// it has caught up. Returns both series, in milliseconds.
fn failovers(cluster: &mut Cluster, count: usize) -> BenchResult<(Vec<f64>, Vec<f64>)> {
    let body = doc_1k(&mut SmallRng::seed_from_u64(SEED), 0);
    let pb = progress(count as u64, "W15 kill");
    let (mut failover_ms, mut rejoin_ms) = (Vec::new(), Vec::new());
    let mut n = 0u64;
    let mut put = |cluster: &Cluster, addr: SocketAddr, cycle: usize| {
        n += 1;
        let path = format!("/dbs/bench/docs/failover/{cycle}-{n}");
        cluster.request_at(addr, "PUT", &path, &body).ok()
    };
    for cycle in 0..count {
        let leader = cluster.steady()?;
        // The cluster takes writes right before the kill.
        match put(cluster, cluster.addrs[&leader], cycle) {
            Some((201, _)) => {}
            other => {
                return Err(format!(
                    "cycle {cycle}: a write to the leader (node {leader}) before the kill: {:?}",
                    other.map(|(s, b)| (s, String::from_utf8_lossy(&b).into_owned()))
                )
                .into())
            }
        }
        let survivors: Vec<SocketAddr> = cluster
            .addrs
            .iter()
            .filter(|(id, _)| **id != leader)
            .map(|(_, a)| *a)
            .collect();
        let node = cluster.nodes.remove(&leader).expect("the leader runs");
        let killed_at = Instant::now();
        let status = node.kill9()?;
        if status.signal() != Some(libc::SIGKILL) {
            return Err(format!(
                "cycle {cycle}: node {leader} had exited ({status}) before the kill"
            )
            .into());
        }
        'acknowledged: loop {
            for &addr in &survivors {
                // 307 (a follower naming the dead leader or the new one), 503 (no
                // leader yet) or no answer: try the next one.
                if let Some((201, _)) = put(cluster, addr, cycle) {
                    break 'acknowledged;
                }
            }
            if killed_at.elapsed() > FAILOVER_GIVE_UP {
                return Err(format!(
                    "cycle {cycle}: no write acknowledged within {} s of kill -9 of the \
                     leader (node {leader})",
                    FAILOVER_GIVE_UP.as_secs()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        failover_ms.push(killed_at.elapsed().as_secs_f64() * 1e3);
        let restarted_at = Instant::now();
        cluster.start_node(leader, false)?;
        cluster.steady()?;
        rejoin_ms.push(restarted_at.elapsed().as_secs_f64() * 1e3);
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok((failover_ms, rejoin_ms))
}

/// Three `kiln serve` nodes of one cluster on loopback, stopped when dropped.
struct Cluster {
    addrs: BTreeMap<u64, SocketAddr>,
    dirs: BTreeMap<u64, PathBuf>,
    /// `--cluster`: every node's id and address, the same on every node.
    members: String,
    /// More `kiln serve` flags for every node (after `kiln bench --serve-flag`s).
    extra_args: Vec<String>,
    /// The nodes running.
    nodes: BTreeMap<u64, ServerProcess>,
    /// The client side of the checks and the failover prober.
    rt: tokio::runtime::Runtime,
}

impl Cluster {
    /// Starts the nodes on fresh directories under `root`, `extra_args` added to
    /// every node's command line.
    fn start(root: &Path, extra_args: &[&str]) -> BenchResult<Cluster> {
        if root.exists() {
            std::fs::remove_dir_all(root)?;
        }
        std::fs::create_dir_all(root)?;
        // Three free ports, held together so that they differ.
        let listeners = (0..NODES)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<io::Result<Vec<_>>>()?;
        let addrs: BTreeMap<u64, SocketAddr> = (1..=NODES)
            .zip(&listeners)
            .map(|(id, l)| Ok((id, l.local_addr()?)))
            .collect::<io::Result<_>>()?;
        drop(listeners);
        let members = addrs
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",");
        let dirs = (1..=NODES)
            .map(|id| (id, root.join(format!("node{id}"))))
            .collect();
        let mut cluster = Cluster {
            addrs,
            dirs,
            members,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            nodes: BTreeMap::new(),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        };
        for id in 1..=NODES {
            cluster.start_node(id, true)?;
        }
        Ok(cluster)
    }

    /// Starts node `id` on its address and directory (`kiln bench --serve-flag`s
    /// included, as W8's server gets them); returns once it answers /health.
    fn start_node(&mut self, id: u64, fresh_log: bool) -> BenchResult<()> {
        let mut args: Vec<String> = SERVE_FLAGS.get().cloned().unwrap_or_default();
        args.extend([
            "--node-id".to_string(),
            id.to_string(),
            "--cluster".to_string(),
            self.members.clone(),
        ]);
        args.extend(self.extra_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let node = ServerProcess::start_at(self.addrs[&id], &self.dirs[&id], &args, fresh_log)
            .map_err(|e| format!("cluster node {id}: {e}"))?;
        self.nodes.insert(id, node);
        Ok(())
    }

    /// Creates database `bench` through the leader and waits until every running
    /// node has it.
    fn create_bench_db(&self, leader: u64) -> BenchResult<()> {
        let (status, body) = self.request(leader, "PUT", "/dbs/bench", b"")?;
        if status != 201 {
            return Err(format!(
                "creating the bench database on the leader (node {leader}): {status} {}",
                String::from_utf8_lossy(&body)
            )
            .into());
        }
        self.wait_applied(leader)
    }

    /// Where node `id` keeps its snapshots (`<data>/cluster/snapshots`).
    fn snapshot_dir(&self, id: u64) -> PathBuf {
        self.dirs[&id].join("cluster").join("snapshots")
    }

    /// Node `id`'s applied index, as it reports it (None when it does not answer).
    fn applied(&self, id: u64) -> Option<u64> {
        self.status(id).and_then(|s| s["last_applied"].as_u64())
    }

    fn pids(&self) -> Vec<u32> {
        self.nodes.values().map(ServerProcess::pid).collect()
    }

    /// One request to `addr` on a fresh connection, within `REQUEST_LIMIT`.
    fn request_at(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> io::Result<(u16, Vec<u8>)> {
        let headers: &[(&str, &str)] = if body.is_empty() {
            &[]
        } else {
            &[("content-type", "application/json")]
        };
        let request = request_bytes(method, path, headers, body);
        self.rt.block_on(async {
            let exchange = async {
                let mut conn = Conn::connect(addr).await?;
                conn.send(&request).await
            };
            tokio::time::timeout(REQUEST_LIMIT, exchange)
                .await
                .map_err(|_| io::Error::other(format!("{method} {path}: no answer from {addr}")))?
        })
    }

    fn request(
        &self,
        id: u64,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> io::Result<(u16, Vec<u8>)> {
        self.request_at(self.addrs[&id], method, path, body)
    }

    /// `GET /cluster` of node `id`; None when it does not answer.
    fn status(&self, id: u64) -> Option<Value> {
        match self.request(id, "GET", "/cluster", b"") {
            Ok((200, body)) => serde_json::from_slice(&body).ok(),
            _ => None,
        }
    }

    /// Waits until every running node names the same running leader and that
    /// leader sees every member's log caught up with its own; returns the leader.
    fn steady(&self) -> BenchResult<u64> {
        let deadline = Instant::now() + STEADY_WITHIN;
        loop {
            let seen: Vec<Option<u64>> = self
                .nodes
                .keys()
                .map(|id| self.status(*id).and_then(|s| s["leader"].as_u64()))
                .collect();
            let agreed = match seen.first() {
                Some(Some(l))
                    if self.nodes.contains_key(l) && seen.iter().all(|s| s == &Some(*l)) =>
                {
                    Some(*l)
                }
                _ => None,
            };
            if let Some(leader) = agreed {
                let caught_up = self.status(leader).is_some_and(|s| {
                    let members = s["members"].as_array().cloned().unwrap_or_default();
                    s["state"] == "leader"
                        && members.len() == NODES as usize
                        && members.iter().all(|m| {
                            m["id"].as_u64() == Some(leader) || m["lag"].as_u64() == Some(0)
                        })
                });
                if caught_up {
                    return Ok(leader);
                }
            }
            if Instant::now() > deadline {
                let views: Vec<Option<Value>> =
                    self.nodes.keys().map(|id| self.status(*id)).collect();
                return Err(format!(
                    "the cluster was not steady (one leader, every member caught up) within \
                     {} s: {views:?}",
                    STEADY_WITHIN.as_secs()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every running node has applied what `leader` has applied.
    fn wait_applied(&self, leader: u64) -> BenchResult<()> {
        let target = self
            .applied(leader)
            .ok_or("the leader does not report its applied index")?;
        let deadline = Instant::now() + STEADY_WITHIN;
        for &id in self.nodes.keys() {
            while self.applied(id).is_none_or(|a| a < target) {
                if Instant::now() > deadline {
                    return Err(format!(
                        "node {id} had not applied the leader's index {target} within {} s",
                        STEADY_WITHIN.as_secs()
                    )
                    .into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Each running node's journal writes of its `bench` database so far.
    fn db_journal_writes(&self) -> BenchResult<BTreeMap<u64, u64>> {
        self.nodes
            .keys()
            .map(|&id| {
                let (status, body) = self.request(id, "GET", "/dbs/bench", b"")?;
                let stats: Value = serde_json::from_slice(&body)?;
                let writes = stats["engine"]["journal_writes"].as_u64().ok_or_else(|| {
                    format!(
                        "node {id}: GET /dbs/bench: {status} without engine.journal_writes: \
                         {stats}"
                    )
                })?;
                Ok((id, writes))
            })
            .collect()
    }
}
