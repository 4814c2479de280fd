//! Registers kept linearizable through every fault at once: three `kiln serve`
//! nodes of one cluster behind the test's fault proxy (common/relay.rs), each
//! under libfaketime (common/fake_clock.rs), each with its data directory on a
//! tmpfs of its own; 8 clients read, write and compare-and-set five documents on
//! the node they believe leads (common/registers.rs). The faults take turns,
//! one per cycle:
//!
//! 1. kill -9 of the leader, then its restart;
//! 2. the leader cut off from both followers (connections closed, or held on
//!    alternate rounds) until the other two elect a leader, then healed;
//! 3. a follower cut off (held, or closed on alternate rounds), then healed;
//! 4. every node's clock jumps (offsets of -10, 0 and +10 s, each node's changing
//!    by 10 or 20 s, back too), and documents that expire in seconds are written;
//! 5. a node's disk full (its tmpfs filled: a follower's, or on alternate rounds
//!    the leader's, and large documents written until it says it waits for
//!    space), then room again, until it says it goes on.
//!
//! After each fault the clients must make progress. At the end, with the faults
//! healed and every expiring document gone: every document's history is
//! linearizable (tests/common/linearizability.rs); every node holds the same
//! changes feed (bodies and `@last-modified` included) and the same revisions
//! (kept with a maximum age, so trimmed by the time each entry carries), with
//! times never going back; `kiln export` is identical on every node; and `kiln
//! check` passes on every node's data directory once the nodes are stopped.
//!
//! Slow tier (`--ignored`): needs libfaketime (apt-get install faketime) and the
//! right to mount a tmpfs. Cycles: KILN_CLUSTER_FAULT_CYCLES (default 5, one of
//! each fault; .ci/run runs 40); the clients' random choices:
//! KILN_CLUSTER_LIN_SEED (default random, printed).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;
#[path = "common/linearizability.rs"]
mod linearizability;
#[path = "common/registers.rs"]
mod registers;

use common::cluster::{find_leader, request, request_within, Cluster, NodeOptions};
use common::fake_clock::{fake_clocks, faketime_or_skip, jump_clocks, real_now_ms};
use common::raw_http::pseudo_random_bytes;
use common::relay::{Fault, Relays};
use common::replicas;
use common::tmpfs::Tmpfs;
use common::{cycles_from_env, kill9};
use kiln_docs::format_rfc3339_ms;
use registers::{create_database, Clients, DB, KEYS};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Each node's data directory is on a tmpfs this large (filled for the disk
/// fault, so memory for one node's at a time): room for a database's and the
/// Raft log's journals, each kept up to about four times the write buffer
/// (32 MiB) when small commits rewrite a few keys.
const TMPFS_MIB: u64 = 768;
/// How long a client waits for an answer: a leader cut off holds a write until
/// it finds a majority silent; the client gives up first (an unknown outcome)
/// and looks for the leader again.
const PATIENCE: Duration = Duration::from_secs(2);
/// A large document's random bytes (as hex, twice as many characters), written
/// until a full disk makes its node wait.
const BALLAST_BYTES: usize = 32 * 1024;
/// The large documents' ids: `ballast/0` to this.
const BALLAST_DOCUMENTS: u64 = 16;
/// Documents that expire written at each clock jump.
const EXPIRING_PER_JUMP: u64 = 4;
/// The registers' revisions: with a maximum age, a write trims by the time its
/// entry carries, so a node applying by its own clock would differ.
const REVISIONS_CONFIG: &str =
    r#"{"collections": {"r": {"max_revisions": 20, "max_age_ms": 15000}}}"#;

/// The faults, in the order they take turns.
#[derive(Clone, Copy, Debug)]
enum Nemesis {
    KillLeader,
    CutLeader,
    CutFollower,
    JumpClocks,
    FillDisk,
}

const NEMESES: [Nemesis; 5] = [
    Nemesis::KillLeader,
    Nemesis::CutLeader,
    Nemesis::CutFollower,
    Nemesis::JumpClocks,
    Nemesis::FillDisk,
];

/// The cluster, its proxy, its file systems and the clients at work.
struct Run {
    cluster: Cluster,
    relays: Relays,
    disks: BTreeMap<u64, Tmpfs>,
    clients: Clients,
    clock_root: PathBuf,
    /// Expiring documents written so far.
    expiring: Vec<String>,
    /// How many of each fault were done.
    done: BTreeMap<&'static str, u64>,
    /// Large documents written to fill disks so far.
    ballast: u64,
}

impl Run {
    fn start(root: &Path, lib: &Path) -> Run {
        let disks: BTreeMap<u64, Tmpfs> = (1..=3)
            .map(|id| {
                let fs = Tmpfs::mount(TMPFS_MIB)
                    .unwrap_or_else(|e| panic!("this test needs the right to mount a tmpfs: {e}"));
                (id, fs)
            })
            .collect();
        let dirs = disks
            .iter()
            .map(|(id, fs)| (*id, fs.path().join(format!("node{id}"))))
            .collect();
        let options = NodeOptions {
            env: fake_clocks(root, lib),
            log_dir: Some(root.to_path_buf()),
            ..NodeOptions::args(&["--expiration-check-ms", "200"])
        };
        let (cluster, relays) = Cluster::behind_relays_with(dirs, options);
        let leader = cluster.ports[&cluster.leader()];
        create_database(leader);
        let config_path = format!("/dbs/{DB}/revisions/config");
        let (status, body) = request(leader, "PUT", &config_path, None, REVISIONS_CONFIG).unwrap();
        assert_eq!(status, 200, "{body}");
        let clients = Clients::start(&cluster.ports, PATIENCE);
        Run {
            cluster,
            relays,
            disks,
            clients,
            clock_root: root.to_path_buf(),
            expiring: Vec::new(),
            done: BTreeMap::new(),
            ballast: 0,
        }
    }

    fn cycle(&mut self, cycle: u64) {
        let nemesis = NEMESES[(cycle % NEMESES.len() as u64) as usize];
        // Alternate rounds of the five vary how a fault is done.
        let round = cycle / NEMESES.len() as u64;
        let what = format!("cycle {cycle} ({nemesis:?})");
        self.clients.progress(100, 25, &format!("{what}, before"));
        let leader = self.cluster.leader();
        match nemesis {
            Nemesis::KillLeader => self.kill_leader(leader, cycle, &what),
            Nemesis::CutLeader => self.cut_leader(leader, round, &what),
            Nemesis::CutFollower => self.cut_follower(leader, round, &what),
            Nemesis::JumpClocks => self.jump_clocks(leader, round, &what),
            Nemesis::FillDisk => self.fill_disk(leader, round, &what),
        }
        *self.done.entry(name(nemesis)).or_default() += 1;
        self.clients.progress(60, 15, &format!("{what}, after"));
    }

    fn kill_leader(&mut self, leader: u64, cycle: u64, what: &str) {
        let mut child = self.cluster.children.remove(&leader).unwrap();
        self.clients
            .note(format!("kill -9 of node {leader} (the leader)"));
        kill9(&mut child, cycle);
        let new_leader = self.cluster.leader();
        assert_ne!(new_leader, leader, "{what}");
        self.clients.note(format!("node {new_leader} leads"));
        self.clients
            .progress(60, 15, &format!("{what}, after the failover"));
        self.cluster.start(leader);
        self.clients.note(format!("node {leader} restarted"));
    }

    fn cut_leader(&mut self, leader: u64, round: u64, what: &str) {
        let fault = if round.is_multiple_of(2) {
            Fault::Cut
        } else {
            Fault::Hold
        };
        self.relays.isolate(leader, fault);
        self.clients
            .note(format!("node {leader} (the leader) cut off ({fault:?})"));
        let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
        let new_leader = self.cluster.leader_among(&others);
        self.clients.note(format!("node {new_leader} leads"));
        self.clients
            .progress(60, 15, &format!("{what}, with the old leader cut off"));
        self.relays.heal_all();
        self.clients.note("healed");
    }

    fn cut_follower(&mut self, leader: u64, round: u64, what: &str) {
        let fault = if round.is_multiple_of(2) {
            Fault::Hold
        } else {
            Fault::Cut
        };
        let follower = (leader + round % 2) % 3 + 1;
        self.relays.isolate(follower, fault);
        self.clients
            .note(format!("node {follower} (a follower) cut off ({fault:?})"));
        self.clients
            .progress(60, 15, &format!("{what}, with a follower cut off"));
        self.relays.heal_all();
        self.clients.note("healed");
    }

    fn jump_clocks(&mut self, leader: u64, round: u64, what: &str) {
        let offsets = jump_clocks(&self.clock_root, round + 1);
        self.clients.note(format!("clocks jump to {offsets:?} s"));
        let port = self.cluster.ports[&leader];
        for i in 0..EXPIRING_PER_JUMP {
            // Expires 1 to 2 s from now, real time: a leader whose clock is 10 s
            // ahead deletes it at once, one 10 s behind only 11 to 12 s from now.
            let id = format!("exp/{round}-{i}");
            let expires = format_rfc3339_ms(real_now_ms() + 1_000 + i * 300);
            let body = format!(r#"{{"n": {i}, "@metadata": {{"@expires": "{expires}"}}}}"#);
            put_until_acknowledged(port, &id, &body, what);
            self.expiring.push(id);
        }
    }

    fn fill_disk(&mut self, leader: u64, round: u64, what: &str) {
        let node = if round.is_multiple_of(2) {
            leader % 3 + 1
        } else {
            leader
        };
        let filler = self.disks[&node].fill(0);
        let role = if node == leader {
            "the leader"
        } else {
            "a follower"
        };
        self.clients
            .note(format!("node {node}'s disk ({role}) full"));
        let written = self.ballast;
        self.ballast_until_waiting(node, what);
        let written = self.ballast - written;
        self.clients.note(format!(
            "node {node} waits for space ({written} large writes)"
        ));
        self.clients
            .progress(60, 15, &format!("{what}, node {node} waiting for space"));
        std::fs::remove_file(&filler).unwrap();
        self.clients.note(format!("node {node}'s disk has room"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while replicas::status(self.cluster.ports[&node])["waiting_for_disk"] != false {
            assert!(
                Instant::now() < deadline,
                "{what}: node {node} still waits for space 20 s after it came back"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Writes large documents through the leader until node `node` says it waits
    /// for space (`GET /cluster`: `waiting_for_disk`): the clients' small writes
    /// alone may take long to use up what its files have left.
    fn ballast_until_waiting(&mut self, node: u64, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while replicas::status(self.cluster.ports[&node])["waiting_for_disk"] != true {
            assert!(
                Instant::now() < deadline,
                "{what}: node {node}'s disk is full, yet it does not wait after {} large writes",
                self.ballast
            );
            let Some((_, port)) = find_leader(&self.cluster.ports) else {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            let bytes = pseudo_random_bytes(BALLAST_BYTES, self.ballast);
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            // A few documents written over and over: the database stays small
            // (each node's tmpfs holds it, its journals, its log and a snapshot).
            let path = format!(
                "/dbs/{DB}/docs/ballast/{}",
                self.ballast % BALLAST_DOCUMENTS
            );
            let body = format!(r#"{{"bytes": "{hex}"}}"#);
            // Whatever the answer: the node's state is what the loop waits for.
            let _ = request_within(port, "PUT", &path, None, &body, PATIENCE);
            self.ballast += 1;
        }
    }

    /// Heals everything, waits for the expiring documents to go, stops the
    /// clients and compares the replicas; then stops the nodes and checks their
    /// data directories.
    fn finish(self, cycles: u64, ran_since: Instant) {
        let Run {
            cluster,
            relays,
            disks,
            clients,
            expiring,
            done,
            ..
        } = self;
        relays.heal_all();
        let history = clients.stop();
        let ran_for = ran_since.elapsed();
        let leader = cluster.leader();
        replicas::expired(cluster.ports[&leader], DB, &expiring);
        replicas::quiet(&cluster, leader);
        let ids: Vec<String> = (0..KEYS).map(|k| format!("r/{k}")).collect();
        let want = replicas::state(cluster.ports[&leader], DB, &ids);
        let exports = tempfile::tempdir().unwrap();
        let mut first_export: Option<String> = None;
        for (id, port) in &cluster.ports {
            let got = replicas::state(*port, DB, &ids);
            replicas::times_never_go_back(*id, got["changes"].as_array().unwrap());
            for r in got["revisions"].as_array().unwrap() {
                replicas::revision_times_never_go_back(*id, r);
            }
            assert!(
                got == want,
                "node {id} differs from the leader {leader}:\n{got}\nleader:\n{want}"
            );
            let out = exports.path().join(format!("node{id}.ndjson"));
            let export = replicas::export(*port, DB, &out);
            match &first_export {
                Some(first) => assert!(*first == export, "node {id}'s export differs"),
                None => first_export = Some(export),
            }
        }
        let changes = want["changes"].as_array().unwrap().len();
        let dirs = cluster.dirs.clone();
        drop(cluster);
        for (id, dir) in &dirs {
            replicas::check_offline(*id, dir);
        }
        drop(disks);
        let faults = done
            .iter()
            .map(|(what, n)| format!("{n} {what}"))
            .collect::<Vec<_>>()
            .join(", ");
        let summary = registers::check(
            history,
            &format!("{cycles} fault cycles ({faults})"),
            ran_for,
        );
        println!(
            "every fault: {summary}; {changes} changes, the revisions and the exports the same on every node, kiln check passed on each"
        );
    }
}

fn name(nemesis: Nemesis) -> &'static str {
    match nemesis {
        Nemesis::KillLeader => "kill -9 of the leader",
        Nemesis::CutLeader => "leader cut off",
        Nemesis::CutFollower => "follower cut off",
        Nemesis::JumpClocks => "clock jumps",
        Nemesis::FillDisk => "full disks",
    }
}

/// PUTs a document through the node at `port` until acknowledged (20 s at most:
/// no fault is active meanwhile, but the machine is shared).
fn put_until_acknowledged(port: u16, id: &str, body: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let path = format!("/dbs/{DB}/docs/{id}");
    loop {
        let answer = request(port, "PUT", &path, None, body);
        match answer {
            Ok((200 | 201, _)) => return,
            other => assert!(Instant::now() < deadline, "{what}: PUT {id}: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Copies the nodes' logs out of the test's directory when the test fails (it
/// is removed as the panic unwinds), and says where.
struct KeepLogsOnFailure(PathBuf);

impl Drop for KeepLogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let kept = std::env::temp_dir().join(format!("kiln-faults-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&kept);
        for id in 1..=3 {
            let name = format!("node{id}.stderr");
            let _ = std::fs::copy(self.0.join(&name), kept.join(&name));
        }
        eprintln!("the nodes' logs are kept in {}", kept.display());
    }
}

#[test]
#[ignore = "slow tier (about 15 s a round of five faults): .ci/run runs it"]
fn registers_stay_linearizable_through_every_fault() {
    let Some(lib) = faketime_or_skip() else {
        return;
    };
    let cycles = cycles_from_env("KILN_CLUSTER_FAULT_CYCLES", 5);
    let root = tempfile::tempdir().unwrap();
    let _logs = KeepLogsOnFailure(root.path().to_path_buf());
    let started = Instant::now();
    let mut run = Run::start(root.path(), &lib);
    for cycle in 0..cycles {
        run.cycle(cycle);
    }
    run.finish(cycles, started);
}
