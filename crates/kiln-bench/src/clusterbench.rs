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
//! W15C: catch-up. A fresh three-node cluster that snapshots every half of the
//! entries to write; one follower stopped (SIGTERM, a clean stop), then the
//! scale's documents written to the leader in batches of 256 (one Raft entry
//! each), then single documents until the leader has a snapshot of every batch
//! (its log then purged past the follower); the
//! follower restarted and timed from its start until it has applied the leader's
//! index: from a snapshot (built on the leader during the writes, sent in chunks,
//! installed by restoring), then the entries after it from the log. Then again with
//! fewer entries behind than the leader keeps below a snapshot, of 8 documents
//! each: from the log alone. Both against the disk's sequential write measured in the same run, as
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
    let w8 = single_node_w8(dir, load)?;
    let mut cluster = Cluster::start(&dir.join("cluster"), &[])?;
    let mut run = cluster_w8(dir, &cluster, load)?;
    let rate = run.ops_per_sec();
    let extra = &mut run.extra;
    extra.insert("w8_requests_per_sec".into(), json!(w8.ops_per_sec()));
    for (k, v) in &w8.extra {
        if W8_FIGURES.contains(&k.as_str()) {
            extra.insert(format!("w8_{k}"), v.clone());
        }
    }
    extra.insert("ratio_to_w8".into(), json!(rate / w8.ops_per_sec()));

    let (failover_ms, rejoin_ms) = failovers(&mut cluster, scale.failovers)?;
    report_failovers(failover_ms, &rejoin_ms, &mut run.extra);
    Ok(run)
}

/// A three-node cluster for another workload (W18's cluster leg): started under
/// `root`, steady, its `bench` database on every node; stopped when dropped.
pub struct BenchCluster {
    cluster: Cluster,
    leader: u64,
}

impl BenchCluster {
    pub fn start(root: &Path) -> BenchResult<BenchCluster> {
        let cluster = Cluster::start(root, &[])?;
        let leader = cluster.steady()?;
        cluster.create_bench_db(leader)?;
        Ok(BenchCluster { cluster, leader })
    }

    /// The leader's `kiln serve`, which takes the workload's requests.
    pub fn leader(&self) -> &ServerProcess {
        &self.cluster.nodes[&self.leader]
    }
}

/// W8 beside W15: one server, the same client, the same load, with what it spent
/// per request; its data directory removed afterwards.
fn single_node_w8(dir: &Path, load: ServerLoad) -> BenchResult<Run> {
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
    Ok(w8)
}

/// W8's load against the leader of `cluster` once it is steady, with what the
/// three nodes spent per request and each node's database journal writes per
/// request (the followers' averaged).
fn cluster_w8(dir: &Path, cluster: &Cluster, load: ServerLoad) -> BenchResult<Run> {
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
    Ok(run)
}

/// The failovers' and rejoins' times (ms) into `extra`: their count, p50 and max,
/// and every failover's time.
fn report_failovers(failover_ms: Vec<f64>, rejoin_ms: &[f64], extra: &mut Map<String, Value>) {
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
        extra.insert("rejoin_p50_ms".into(), json!(median(rejoin_ms)));
        extra.insert(
            "rejoin_max_ms".into(),
            json!(rejoin_ms.iter().copied().fold(f64::NAN, f64::max)),
        );
    }
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

/// Documents (~1 KiB each) per batch of the snapshot path, one Raft entry each
/// (~256 KiB).
const DOCS_PER_ENTRY: u64 = 256;

/// Documents per batch of the log path (~8 KiB entries). A leader sends a follower
/// up to 300 entries per append (openraft's `max_payload_entries`), and an append
/// not answered within the heartbeat interval (100 ms) fails and is sent again
/// whole: a follower 54 entries of 1 MiB behind never caught up (985 timeouts in
/// 3.5 minutes). Entries of 8 KiB make appends of 2.4 MiB at most.
const LOG_DOCS_PER_ENTRY: u64 = 8;

/// Connections the batches are written over (entry counts are multiples of it);
/// few, so that the surviving follower's appends stay small too.
const WRITE_CONNECTIONS: usize = 4;

/// How often the follower's applied index and snapshot directory are read.
const CATCH_UP_POLL: Duration = Duration::from_millis(20);

/// How long a catch-up may take before the run fails.
const CATCH_UP_GIVE_UP: Duration = Duration::from_secs(600);

/// How long no snapshot may be under construction on any node before the
/// follower is restarted (a build started by the last writes would compete).
const SNAPSHOTS_QUIET: Duration = Duration::from_secs(1);

/// Free space W15C asks for under `--dir`: this much, for the nodes' preallocated
/// journals (four files of 64 MiB a node: the database's and the Raft log's) ...
const FREE_SPACE_FIXED_BYTES: u64 = 1 << 30;

/// ... and this many times the bytes written: on each node the database, the Raft
/// log, its snapshot and the one being built or received (a node that runs out of
/// space while building a snapshot stops taking part: seen at 32 MiB; the cluster
/// took 16x the bytes written at 512 MiB).
const FREE_SPACE_FACTOR: u64 = 20;

const MB: f64 = 1e6;

/// W15C's scale.
#[derive(Debug, Clone, Copy)]
pub struct CatchUpScale {
    /// Bytes of documents (their JSON) written while the follower is down for the
    /// snapshot path (the log path writes fewer entries than the leader keeps
    /// below a snapshot, of 8 documents each).
    pub behind_bytes: u64,
}

impl CatchUpScale {
    /// `mib` MiB, else 256 MiB (8 MiB with `quick`).
    pub fn new(quick: bool, mib: Option<u64>) -> Self {
        let mib = mib.unwrap_or(if quick { 8 } else { 256 });
        CatchUpScale {
            behind_bytes: mib.max(1) << 20,
        }
    }
}

/// W15C's entry counts for a scale.
#[derive(Debug, Clone, Copy)]
struct CatchUpPlan {
    /// Entries of `DOCS_PER_ENTRY` written for the snapshot path.
    snapshot_path_entries: u64,
    /// The cluster's `--snapshot-every-entries`: half the snapshot path's entries,
    /// so that the leader's second snapshot, which purges its log past the
    /// follower, comes once they are all written (`seal_with_snapshot`).
    snapshot_every_entries: u64,
    /// Entries of `LOG_DOCS_PER_ENTRY` written for the log path: half of those
    /// the leader keeps below a snapshot (`min(1000, snapshot_every_entries)`).
    log_path_entries: u64,
}

impl CatchUpPlan {
    fn new(behind_bytes: u64) -> Self {
        let doc_bytes = doc_1k(&mut SmallRng::seed_from_u64(SEED), 0).len() as u64;
        let whole = |n: u64| n.max(1).next_multiple_of(WRITE_CONNECTIONS as u64);
        let snapshot_path_entries = whole(behind_bytes.div_ceil(DOCS_PER_ENTRY * doc_bytes));
        let snapshot_every_entries = (snapshot_path_entries / 2).max(4);
        CatchUpPlan {
            snapshot_path_entries,
            snapshot_every_entries,
            log_path_entries: whole(snapshot_every_entries.min(1_000) / 2),
        }
    }
}

/// W15C: a follower brought back after falling behind, from a snapshot and from
/// the log, against the disk's sequential write.
pub fn w15c(dir: &Path, scale: CatchUpScale) -> BenchResult<Run> {
    std::fs::create_dir_all(dir)?;
    check_free_space(dir, scale.behind_bytes)?;
    let mut extra = Map::new();
    let disk_file_bytes = scale.behind_bytes.clamp(64 << 20, 1 << 30);
    let disk_before = disk_seq_write_mb_per_s(dir, disk_file_bytes)?;
    let plan = CatchUpPlan::new(scale.behind_bytes);
    let (snap, log) = snapshot_then_log_rounds(&dir.join("cluster"), plan, &mut extra)?;
    let disk_after = disk_seq_write_mb_per_s(dir, disk_file_bytes)?;

    let disk_mb_s = (disk_before + disk_after) / 2.0;
    extra.insert("nodes".into(), json!(NODES));
    extra.insert(
        "snapshot_every_entries".into(),
        json!(plan.snapshot_every_entries),
    );
    extra.insert("docs_per_entry".into(), json!(DOCS_PER_ENTRY));
    extra.insert("log_docs_per_entry".into(), json!(LOG_DOCS_PER_ENTRY));
    extra.insert("disk_file_bytes".into(), json!(disk_file_bytes));
    extra.insert("disk_seq_write_before_mb_per_s".into(), json!(disk_before));
    extra.insert("disk_seq_write_after_mb_per_s".into(), json!(disk_after));
    extra.insert("disk_seq_write_mb_per_s".into(), json!(disk_mb_s));
    snap.insert_figures("", disk_mb_s, &mut extra);
    log.insert_figures("log_", disk_mb_s, &mut extra);
    snap.catch_up.insert_split(&mut extra);
    // What `kiln bench` prints as the row's server memory: the follower's.
    extra.insert(
        "server_peak_rss_bytes".into(),
        json!(snap.catch_up.peak_rss_bytes),
    );
    // The batches that put the follower behind (an HTTP workload's row).
    extra.insert(
        "requests_per_sec".into(),
        json!(snap.written.requests_per_sec),
    );
    Ok(Run {
        ops: snap.written.documents,
        commits: snap.written.entries,
        seconds: snap.catch_up.seconds,
        extra,
    })
}

/// A fresh cluster under `root` (removed after), one follower brought back from a
/// snapshot, then from the log; the leader's database size and the cluster's
/// after the first go into `extra`.
fn snapshot_then_log_rounds(
    root: &Path,
    plan: CatchUpPlan,
    extra: &mut Map<String, Value>,
) -> BenchResult<(Round, Round)> {
    let every = plan.snapshot_every_entries.to_string();
    let mut cluster = Cluster::start(root, &["--snapshot-every-entries", &every])?;
    cluster.create_bench_db(cluster.steady()?)?;
    let (leader, follower) = cluster.leader_and_follower()?;
    let snap = behind_and_back(
        &mut cluster,
        leader,
        follower,
        plan.snapshot_path_entries,
        DOCS_PER_ENTRY,
    )?;
    if snap.catch_up.snapshot.is_none() {
        return Err(format!(
            "the follower caught up from the log after {} entries: the leader had not \
             purged its log past it (a snapshot every {} entries)",
            plan.snapshot_path_entries, plan.snapshot_every_entries
        )
        .into());
    }
    let databases = cluster.dirs[&leader].join("databases");
    extra.insert(
        "leader_database_disk_bytes".into(),
        json!(allocated_bytes(&databases)?),
    );
    extra.insert(
        "leader_database_disk_bytes_without_journal".into(),
        json!(databases_bytes(&databases)?),
    );
    extra.insert("cluster_disk_bytes".into(), json!(allocated_bytes(root)?));
    // The same nodes, unless leadership moved meanwhile.
    let (leader, follower) = cluster.leader_and_follower()?;
    let log = behind_and_back(
        &mut cluster,
        leader,
        follower,
        plan.log_path_entries,
        LOG_DOCS_PER_ENTRY,
    )?;
    if let Some(s) = &log.catch_up.snapshot {
        return Err(format!(
            "the follower {} entries behind was sent a snapshot ({})",
            plan.log_path_entries, s.name
        )
        .into());
    }
    drop(cluster);
    std::fs::remove_dir_all(root)?;
    Ok((snap, log))
}

/// Refuses to start unless the disk under `dir` has `FREE_SPACE_FIXED_BYTES` and
/// `FREE_SPACE_FACTOR` times the bytes to write free (a full disk would fail the
/// run part way, and others' work).
fn check_free_space(dir: &Path, behind_bytes: u64) -> BenchResult<()> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: statvfs writes into the struct we pass; all-zero is a valid statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(format!("statvfs {}: {}", dir.display(), io::Error::last_os_error()).into());
    }
    let free_bytes = st.f_bavail as u64 * st.f_frsize as u64;
    let needed_bytes = FREE_SPACE_FIXED_BYTES + behind_bytes * FREE_SPACE_FACTOR;
    if free_bytes < needed_bytes {
        return Err(format!(
            "W15C writes {} MiB behind a follower and needs about {} MiB free under {}; {} MiB \
             are: give a smaller --w15c-mib or another --dir",
            behind_bytes >> 20,
            needed_bytes >> 20,
            dir.display(),
            free_bytes >> 20
        )
        .into());
    }
    Ok(())
}

/// The disk's sequential write in MB/s as W14 measures it (`disk_seq_write_mb_per_s`
/// there): 4 MiB buffered writes into a new file of `bytes`, then a sync, timed
/// together; the file is removed after.
fn disk_seq_write_mb_per_s(dir: &Path, bytes: u64) -> BenchResult<f64> {
    let path = dir.join("seq-write.bin");
    let _remove = rawdisk::RemoveOnDrop(path.clone());
    std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let wf = rawdisk::open_for_writes(&path, WriteMode::Buffered)?;
    let block = 4u64 << 20;
    let mut buf = AlignedBuf::new(block as usize);
    let writes = bytes.div_ceil(block);
    let start = Instant::now();
    let run = rawdisk::timed_writes(
        &wf,
        &mut buf,
        0,
        writes * block,
        writes,
        Duration::MAX,
        &mut |_| true,
    )?;
    wf.sync_all()?;
    let seconds = start.elapsed().as_secs_f64();
    Ok((run.writes * block) as f64 / MB / seconds.max(1e-9))
}

/// Bytes allocated on disk by every file under `dir`.
fn allocated_bytes(dir: &Path) -> BenchResult<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry?;
        let t = entry.file_type()?;
        if t.is_dir() {
            total += allocated_bytes(&entry.path())?;
        } else if t.is_file() {
            total += entry.metadata()?.blocks() * 512;
        }
    }
    Ok(total)
}

/// Bytes allocated by the databases under `databases` but their journals (their
/// files are preallocated, and a snapshot does not hold them), as W14 counts them.
fn databases_bytes(databases: &Path) -> BenchResult<u64> {
    let mut total = 0;
    for entry in
        std::fs::read_dir(databases).map_err(|e| format!("{}: {e}", databases.display()))?
    {
        let db = entry?.path();
        let journal = db.join("journal");
        let journal_bytes = if journal.is_dir() {
            allocated_bytes(&journal)?
        } else {
            0
        };
        total += allocated_bytes(&db)?.saturating_sub(journal_bytes);
    }
    Ok(total)
}

/// One round of W15C: what was written while the follower was down, and its
/// catch-up.
struct Round {
    written: Written,
    catch_up: CatchUp,
}

/// Stops `follower` (SIGTERM, waited for), writes `entries` batches of
/// `docs_per_entry` documents to `leader` (then, for the snapshot path, single
/// documents until a snapshot holds every batch), waits for the other nodes to
/// apply them and finish their snapshots, restarts the follower and times its
/// catch-up; returns once the three are steady again.
fn behind_and_back(
    cluster: &mut Cluster,
    leader: u64,
    follower: u64,
    entries: u64,
    docs_per_entry: u64,
) -> BenchResult<Round> {
    let node = cluster
        .nodes
        .remove(&follower)
        .ok_or("the follower is not running")?;
    drop(node);
    let mut written = write_batches(cluster, leader, entries, docs_per_entry)?;
    if docs_per_entry == DOCS_PER_ENTRY {
        seal_with_snapshot(cluster, leader, &mut written)?;
    }
    cluster.wait_applied(leader)?;
    cluster.wait_snapshots_quiet()?;
    let catch_up = catch_up(cluster, leader, follower)?;
    cluster.steady()?;
    Ok(Round { written, catch_up })
}

/// After the leader's snapshot of every batch, single-document PUTs, one every
/// `PURGE_NUDGE_EVERY`, `PURGE_NUDGES` times. The
/// leader purges its log once a snapshot is built, but not while an append to the
/// stopped follower is in flight; a failed append (after the replication's back-off
/// of 500 ms) clears it and tries the purge again. Without these writes the
/// leader may keep its log, and the follower catches up from it.
const PURGE_NUDGES: u64 = 20;
const PURGE_NUDGE_EVERY: Duration = Duration::from_millis(100);

/// Makes the leader snapshot everything written so far and purge its log past the
/// stopped follower (see `PURGE_NUDGES`), with single-document PUTs, counted in
/// `written`: until it has begun a snapshot of everything before them (or has
/// one), then until that snapshot is built, then `PURGE_NUDGES` more.
fn seal_with_snapshot(cluster: &Cluster, leader: u64, written: &mut Written) -> BenchResult<()> {
    let sealed = cluster
        .applied(leader)
        .ok_or("the leader does not report its applied index")?;
    let dir = cluster.snapshot_dir(leader);
    let deadline = Instant::now() + STEADY_WITHIN;
    // The builds under way once a write after `sealed` was applied: one begun
    // later holds everything up to `sealed`.
    let mut older_builds: Option<Vec<String>> = None;
    let mut build_seen: Option<Instant> = None;
    loop {
        let seen = snapshot_dir(&dir)?;
        if seen.snapshots.iter().any(|s| s.index >= sealed) {
            written.snapshot_build_s = build_seen.map(|t| t.elapsed().as_secs_f64());
            break;
        }
        let newer_build = older_builds
            .as_ref()
            .is_some_and(|older| seen.building.iter().any(|b| !older.contains(b)));
        if newer_build {
            build_seen.get_or_insert_with(Instant::now);
            std::thread::sleep(CATCH_UP_POLL);
        } else {
            put_one(cluster, leader, sealed, written)?;
            older_builds.get_or_insert(snapshot_dir(&dir)?.building);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the leader had no snapshot of index {sealed} within {} s",
                STEADY_WITHIN.as_secs()
            )
            .into());
        }
    }
    for _ in 0..PURGE_NUDGES {
        put_one(cluster, leader, sealed, written)?;
        std::thread::sleep(PURGE_NUDGE_EVERY);
    }
    Ok(())
}

/// One PUT of a new ~1 KiB document to `leader`, counted in `written`.
fn put_one(cluster: &Cluster, leader: u64, tag: u64, written: &mut Written) -> BenchResult<()> {
    let body = doc_1k(&mut SmallRng::seed_from_u64(SEED), written.entries);
    let path = format!("/dbs/bench/docs/catchup/seal-{tag}-{}", written.entries);
    let (status, answer) = cluster.request(leader, "PUT", &path, &body)?;
    if status != 201 {
        let answer = String::from_utf8_lossy(&answer);
        return Err(format!("PUT {path} to the leader: {status} {answer}").into());
    }
    written.entries += 1;
    written.documents += 1;
    written.document_bytes += body.len() as u64;
    Ok(())
}

impl Round {
    /// The round's figures, named `{prefix}...`; `disk_mb_s` is the disk's
    /// sequential write.
    fn insert_figures(&self, prefix: &str, disk_mb_s: f64, extra: &mut Map<String, Value>) {
        let (w, c) = (&self.written, &self.catch_up);
        let mb_s = w.document_bytes as f64 / MB / c.seconds;
        let mut put = |k: &str, v: Value| extra.insert(format!("{prefix}{k}"), v);
        put("behind_entries", json!(w.entries));
        put("behind_documents", json!(w.documents));
        put("behind_document_bytes", json!(w.document_bytes));
        put("write_seconds", json!(w.seconds));
        if let Some(build_s) = w.snapshot_build_s {
            put("leader_snapshot_build_s", json!(build_s));
        }
        put("catch_up_seconds", json!(c.seconds));
        put("catch_up_mb_per_s", json!(mb_s));
        put("catch_up_ratio_to_disk_seq_write", json!(mb_s / disk_mb_s));
        put("catch_up_device_write_bytes", json!(c.device_write_bytes));
        put("follower_start_to_health_s", json!(c.up_s));
        put("follower_peak_rss_bytes", json!(c.peak_rss_bytes));
        put("follower_peak_rss_anon_bytes", json!(c.peak_rss_anon_bytes));
    }
}

/// Documents written while a follower was down.
struct Written {
    /// Batches, each one Raft entry.
    entries: u64,
    documents: u64,
    /// The documents' JSON, as sent.
    document_bytes: u64,
    seconds: f64,
    requests_per_sec: f64,
    /// How long the leader took to build the snapshot of them, as seen from its
    /// snapshot directory (None when the build was not seen under way).
    snapshot_build_s: Option<f64>,
}

/// Writes `entries` batches (`POST /dbs/bench/batch`) of `docs_per_entry` new
/// ~1 KiB documents to `leader` over `WRITE_CONNECTIONS` connections.
fn write_batches(
    cluster: &Cluster,
    leader: u64,
    entries: u64,
    docs_per_entry: u64,
) -> BenchResult<Written> {
    let connections = WRITE_CONNECTIONS.min(entries as usize).max(1);
    let per_connection = entries as usize / connections;
    let pb = progress((connections * per_connection) as u64, "W15C put");
    let document_bytes = Arc::new(AtomicU64::new(0));
    let (bytes, bar) = (document_bytes.clone(), pb.clone());
    // Ids unique across rounds: the round is the leader's log index at the start.
    let round = cluster.applied(leader).unwrap_or(0);
    let make = move |c: usize, i: usize| {
        let (body, doc_bytes) = batch_body(round, c, i, docs_per_entry);
        bytes.fetch_add(doc_bytes, Ordering::Relaxed);
        bar.inc(1);
        let headers = [("content-type", "application/json")];
        request_bytes("POST", "/dbs/bench/batch", &headers, &body)
    };
    let hidden = indicatif::ProgressBar::hidden();
    let r = run_load(
        cluster.addrs[&leader],
        connections,
        per_connection,
        200,
        make,
        &hidden,
    )?;
    pb.finish_and_clear();
    if let Some((status, body)) = r.unexpected.first() {
        return Err(format!("a batch to the leader (node {leader}): {status} {body}").into());
    }
    Ok(Written {
        entries: r.requests,
        documents: r.requests * docs_per_entry,
        document_bytes: document_bytes.load(Ordering::Relaxed),
        seconds: r.seconds,
        requests_per_sec: r.per_sec(),
        snapshot_build_s: None,
    })
}

/// The body of batch `i` of connection `c` in round `round`: `docs` puts of new
/// ~1 KiB documents; and the bytes of the documents' JSON.
fn batch_body(round: u64, c: usize, i: usize, docs: u64) -> (Vec<u8>, u64) {
    let mut rng = SmallRng::seed_from_u64(SEED ^ (round << 40) ^ ((c as u64) << 32) ^ i as u64);
    let mut body = Vec::with_capacity(docs as usize * 1100 + 16);
    body.extend_from_slice(b"{\"ops\":[");
    let mut doc_bytes = 0;
    for j in 0..docs {
        if j > 0 {
            body.push(b',');
        }
        let doc = doc_1k(&mut rng, j);
        doc_bytes += doc.len() as u64;
        let id = format!("catchup/{round}-{c}-{i}-{j}");
        body.extend_from_slice(
            format!("{{\"op\":\"put\",\"id\":\"{id}\",\"document\":").as_bytes(),
        );
        body.extend_from_slice(&doc);
        body.push(b'}');
    }
    body.extend_from_slice(b"]}");
    (body, doc_bytes)
}

/// A snapshot file of a node's snapshot directory: `snapshot-<term>-<index>-<ms>.snap`.
struct SnapshotSeen {
    name: String,
    /// The last log index it holds.
    index: u64,
    bytes: u64,
}

/// What a node's snapshot directory holds.
#[derive(Default)]
struct SnapshotDir {
    snapshots: Vec<SnapshotSeen>,
    /// The bytes of the file being received (None when none is).
    receiving_bytes: Option<u64>,
    /// The names of the snapshots being built.
    building: Vec<String>,
}

/// Reads a node's snapshot directory (empty if it does not exist yet).
fn snapshot_dir(dir: &Path) -> BenchResult<SnapshotDir> {
    let mut seen = SnapshotDir::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(seen),
        Err(e) => return Err(format!("{}: {e}", dir.display()).into()),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("receiving-") {
            let bytes = entry.metadata().map_or(0, |m| m.len());
            *seen.receiving_bytes.get_or_insert(0) += bytes;
        } else if name.starts_with("building-") {
            seen.building.push(name);
            continue;
        }
        let Some(id) = name
            .strip_prefix("snapshot-")
            .and_then(|n| n.strip_suffix(".snap"))
        else {
            continue;
        };
        // A file renamed or removed meanwhile is left out.
        let (Some(index), Ok(md)) = (
            id.split('-').nth(1).and_then(|i| i.parse().ok()),
            entry.metadata(),
        ) else {
            continue;
        };
        seen.snapshots.push(SnapshotSeen {
            name,
            index,
            bytes: md.len(),
        });
    }
    Ok(seen)
}

impl Cluster {
    /// Once steady: the leader and the first follower.
    fn leader_and_follower(&self) -> BenchResult<(u64, u64)> {
        let leader = self.steady()?;
        let follower = *self
            .nodes
            .keys()
            .find(|id| **id != leader)
            .ok_or("the cluster has no follower running")?;
        Ok((leader, follower))
    }

    /// Waits until no running node has had a snapshot under construction
    /// (`building-*.tmp`) for `SNAPSHOTS_QUIET`.
    fn wait_snapshots_quiet(&self) -> BenchResult<()> {
        let deadline = Instant::now() + CATCH_UP_GIVE_UP;
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < SNAPSHOTS_QUIET {
            for &id in self.nodes.keys() {
                if !snapshot_dir(&self.snapshot_dir(id))?.building.is_empty() {
                    quiet_since = Instant::now();
                }
            }
            if Instant::now() > deadline {
                return Err("a node was still building a snapshot after the writes".into());
            }
            std::thread::sleep(CATCH_UP_POLL);
        }
        Ok(())
    }
}

/// One catch-up of a restarted follower, in seconds from its start.
#[derive(Default)]
struct CatchUp {
    /// The leader's applied index at the restart: what the follower had to reach.
    target_index: u64,
    /// Until it had applied the leader's index.
    seconds: f64,
    /// Until it answered /health.
    up_s: f64,
    /// Until a snapshot was first seen being received (the install's time when
    /// the whole transfer fell between two looks).
    first_chunk_s: Option<f64>,
    /// Until the received snapshot was put in place: the transfer's end, the
    /// install's (restore's) start.
    install_start_s: Option<f64>,
    /// Until the follower had applied the snapshot's index: the install's end.
    installed_s: Option<f64>,
    /// The snapshot it was sent, if any.
    snapshot: Option<SnapshotSeen>,
    peak_rss_bytes: u64,
    peak_rss_anon_bytes: u64,
    /// The anonymous RSS's peak until the snapshot was installed (the transfer
    /// and the restore), without the log entries after it.
    peak_rss_anon_until_installed_bytes: u64,
    /// Bytes the whole device wrote meanwhile (whoever wrote them).
    device_write_bytes: Option<u64>,
}

/// How long a catch-up may go without visible progress (the follower's applied
/// index, a snapshot arriving or put in place) before the run fails.
const CATCH_UP_STALL: Duration = Duration::from_secs(120);

/// What the catch-up loop watches on the follower.
struct Watch {
    /// The leader's snapshots when the follower restarted.
    leader_snapshots: Vec<String>,
    /// The follower's own snapshot directory, and the snapshots it held before.
    dir: PathBuf,
    had: Vec<String>,
    started: Instant,
    /// What was seen last (applied index, bytes received, snapshot in place), and
    /// when it last changed.
    seen: (Option<u64>, Option<u64>, bool),
    changed: Instant,
}

impl Watch {
    /// One look at the follower's snapshot directory, then its applied index,
    /// noted in `c`; returns the applied index.
    fn look(
        &mut self,
        cluster: &Cluster,
        follower: u64,
        c: &mut CatchUp,
    ) -> BenchResult<Option<u64>> {
        let seen = snapshot_dir(&self.dir)?;
        let (files, receiving) = (seen.snapshots, seen.receiving_bytes);
        let at = self.started.elapsed().as_secs_f64();
        if receiving.is_some() && c.first_chunk_s.is_none() {
            c.first_chunk_s = Some(at);
        }
        let sent = files
            .into_iter()
            .find(|f| !self.had.contains(&f.name) && self.leader_snapshots.contains(&f.name));
        if let (Some(s), None) = (sent, &c.snapshot) {
            c.install_start_s = Some(at);
            c.first_chunk_s.get_or_insert(at);
            c.snapshot = Some(s);
        }
        let applied = cluster.applied(follower);
        let at = self.started.elapsed().as_secs_f64();
        if let (Some(a), Some(s), None) = (applied, &c.snapshot, c.installed_s) {
            if a >= s.index {
                c.installed_s = Some(at);
            }
        }
        let seen = (applied, receiving, c.snapshot.is_some());
        if seen != self.seen {
            self.seen = seen;
            self.changed = Instant::now();
        }
        Ok(applied)
    }
}

/// Restarts `follower` and polls it until it has applied `leader`'s index: its
/// applied index, its snapshot directory (a snapshot of the leader's arriving and
/// put in place) and its anonymous memory.
fn catch_up(cluster: &mut Cluster, leader: u64, follower: u64) -> BenchResult<CatchUp> {
    let target = cluster
        .applied(leader)
        .ok_or("the leader does not report its applied index")?;
    let names = |dir: &Path| -> BenchResult<Vec<String>> {
        Ok(snapshot_dir(dir)?
            .snapshots
            .into_iter()
            .map(|s| s.name)
            .collect())
    };
    let dir = cluster.snapshot_dir(follower);
    let mut watch = Watch {
        leader_snapshots: names(&cluster.snapshot_dir(leader))?,
        had: names(&dir)?,
        dir,
        started: Instant::now(),
        seen: (None, None, false),
        changed: Instant::now(),
    };
    let device_before = DiskCounters::of(&watch.dir);
    cluster.start_node(follower, false)?;
    let mut c = CatchUp {
        target_index: target,
        up_s: watch.started.elapsed().as_secs_f64(),
        ..CatchUp::default()
    };
    let pid = cluster.nodes[&follower].pid();
    loop {
        let applied = watch.look(cluster, follower, &mut c)?;
        if let Ok(anon) = procstat::status_bytes(pid, "RssAnon:") {
            c.peak_rss_anon_bytes = c.peak_rss_anon_bytes.max(anon);
            if c.installed_s.is_none() {
                c.peak_rss_anon_until_installed_bytes =
                    c.peak_rss_anon_until_installed_bytes.max(anon);
            }
        }
        if applied.is_some_and(|a| a >= target) {
            c.seconds = watch.started.elapsed().as_secs_f64();
            break;
        }
        if watch.changed.elapsed() > CATCH_UP_STALL || watch.started.elapsed() > CATCH_UP_GIVE_UP {
            return Err(stalled(cluster, follower, target, applied, &c));
        }
        std::thread::sleep(CATCH_UP_POLL);
    }
    c.peak_rss_bytes = procstat::peak_rss_bytes(pid)?;
    c.device_write_bytes = DiskCounters::of(&watch.dir)
        .zip(device_before)
        .map(|(after, before)| after.since(&before).sectors_written * 512);
    Ok(c)
}

/// The error of a catch-up that stopped moving or took too long.
fn stalled(
    cluster: &Cluster,
    follower: u64,
    target: u64,
    applied: Option<u64>,
    c: &CatchUp,
) -> Box<dyn std::error::Error> {
    format!(
        "node {follower} had not applied the leader's index {target} (applied: {applied:?}; a \
         snapshot of index {:?} received) with no progress for {} s or within {} s of its \
         restart; the nodes' logs are beside their data directories under {}",
        c.snapshot.as_ref().map(|s| s.index),
        CATCH_UP_STALL.as_secs(),
        CATCH_UP_GIVE_UP.as_secs(),
        cluster.dirs[&follower]
            .parent()
            .unwrap_or(Path::new("."))
            .display(),
    )
    .into()
}

impl CatchUp {
    /// Where a snapshot catch-up's time went: start to the first chunk (the
    /// node's start, the leader finding it behind), the transfer, the install, the
    /// log entries after the snapshot; and the snapshot's size and index.
    fn insert_split(&self, extra: &mut Map<String, Value>) {
        let (Some(first), Some(start), Some(done), Some(s)) = (
            self.first_chunk_s,
            self.install_start_s,
            self.installed_s,
            &self.snapshot,
        ) else {
            return;
        };
        extra.insert("snapshot_bytes".into(), json!(s.bytes));
        extra.insert(
            "follower_peak_rss_anon_until_installed_bytes".into(),
            json!(self.peak_rss_anon_until_installed_bytes),
        );
        extra.insert("snapshot_index".into(), json!(s.index));
        extra.insert(
            "entries_after_snapshot".into(),
            json!(self.target_index.saturating_sub(s.index)),
        );
        extra.insert("start_to_first_chunk_s".into(), json!(first));
        extra.insert("snapshot_transfer_s".into(), json!(start - first));
        extra.insert("snapshot_install_s".into(), json!(done - start));
        extra.insert("log_after_snapshot_s".into(), json!(self.seconds - done));
        extra.insert(
            "snapshot_transfer_mb_per_s".into(),
            json!(s.bytes as f64 / MB / (start - first).max(CATCH_UP_POLL.as_secs_f64())),
        );
        extra.insert(
            "snapshot_install_mb_per_s".into(),
            json!(s.bytes as f64 / MB / (done - start).max(CATCH_UP_POLL.as_secs_f64())),
        );
    }
}

/// The lines `kiln bench` prints for W15C.
pub fn report_catch_up(label: &str, m: &Run) {
    let f = |k: &str| m.extra.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let mib = |k: &str| f(k) / (1u64 << 20) as f64;
    println!(
        "         {label}: a follower {:.0} MiB of documents behind ({:.0} documents of ~1 KiB in \
         {:.0} entries; the leader's database {:.0} MiB on disk, {:.0} MiB without its journal; \
         the snapshot {:.0} MiB) caught up in {:.2} s: {:.1} MB/s = {:.2}x the disk's sequential \
         write of {:.0} MB/s (target >= 0.5x; {:.0} MB/s before the run, {:.0} after)",
        mib("behind_document_bytes"),
        f("behind_documents"),
        f("behind_entries"),
        mib("leader_database_disk_bytes"),
        mib("leader_database_disk_bytes_without_journal"),
        mib("snapshot_bytes"),
        f("catch_up_seconds"),
        f("catch_up_mb_per_s"),
        f("catch_up_ratio_to_disk_seq_write"),
        f("disk_seq_write_mb_per_s"),
        f("disk_seq_write_before_mb_per_s"),
        f("disk_seq_write_after_mb_per_s"),
    );
    println!(
        "         {label}: the leader built its snapshot in {:.2} s before the restart; from the \
         restart: first snapshot chunk at {:.2} s (up at {:.2} s), \
         transfer {:.2} s ({:.0} MB/s), install {:.2} s ({:.0} MB/s), then {:.0} entries from \
         the log {:.2} s; the disk wrote {:.0} MiB meanwhile; the follower's peak RSS {:.0} MiB \
         (heap {:.0} MiB; {:.0} MiB until the snapshot was installed)",
        f("leader_snapshot_build_s"),
        f("start_to_first_chunk_s"),
        f("follower_start_to_health_s"),
        f("snapshot_transfer_s"),
        f("snapshot_transfer_mb_per_s"),
        f("snapshot_install_s"),
        f("snapshot_install_mb_per_s"),
        f("entries_after_snapshot"),
        f("log_after_snapshot_s"),
        mib("catch_up_device_write_bytes"),
        mib("follower_peak_rss_bytes"),
        mib("follower_peak_rss_anon_bytes"),
        mib("follower_peak_rss_anon_until_installed_bytes"),
    );
    println!(
        "         {label}: from the log alone ({:.0} entries, {:.1} MiB behind): {:.2} s, \
         {:.1} MB/s = {:.2}x the disk's sequential write",
        f("log_behind_entries"),
        mib("log_behind_document_bytes"),
        f("log_catch_up_seconds"),
        f("log_catch_up_mb_per_s"),
        f("log_catch_up_ratio_to_disk_seq_write"),
    );
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
