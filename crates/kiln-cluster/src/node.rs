//! One node of a cluster: its Raft (log store, state machine, network), how the
//! cluster forms, and the calls the server makes: propose a write, check a read
//! is not stale, report the cluster's state, change its members.

use crate::batcher::Batcher;
use crate::command::{Answer, ClassifyError, Command};
use crate::log_store::LogStore;
use crate::network::Network;
use crate::state_machine::StateMachine;
use crate::{NodeId, Raft};
use kiln_docs::DocStore;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, Config, ServerState, SnapshotPolicy};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a node needs to join its cluster.
#[derive(Clone)]
pub struct ClusterConfig {
    pub node_id: NodeId,
    /// Every voter of a new cluster: id and HTTP address (`host:port`). A node
    /// whose log is empty proposes this membership; one with a log ignores it.
    pub members: BTreeMap<NodeId, String>,
    /// Where the Raft log lives (a kiln-storage environment).
    pub raft_dir: PathBuf,
    /// Where snapshots are built and received (default: `snapshots` beside
    /// `raft_dir`).
    pub snapshot_dir: PathBuf,
    /// Options of that environment (its durability: the log must be synced).
    pub storage: kiln_storage::Options,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// A snapshot every this many applied entries; the log before it is purged.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log below the last snapshot (a follower that far behind
    /// catches up from the log, not a snapshot).
    pub entries_kept_after_snapshot: u64,
    /// How long a write waits to be committed before it is answered `no_quorum`.
    pub write_timeout_ms: u64,
    /// A node that joins an existing cluster (added with `add_learner`) must not
    /// propose a membership of its own.
    pub joining: bool,
    /// Tests of partitions: which links this node may use (all when `None`).
    pub links: Option<crate::network::LinkFilter>,
    /// TLS and the cluster key for the messages to the other nodes.
    pub security: crate::network::PeerSecurity,
    /// Where this node keeps the cluster's API keys (the server's key file);
    /// without one, key changes in the log are applied nowhere.
    pub api_keys: Option<std::sync::Arc<dyn crate::ApiKeyStore>>,
}

impl ClusterConfig {
    pub fn new(node_id: NodeId, members: BTreeMap<NodeId, String>, raft_dir: PathBuf) -> Self {
        ClusterConfig {
            node_id,
            members,
            snapshot_dir: raft_dir.with_file_name("snapshots"),
            raft_dir,
            storage: kiln_storage::Options::default(),
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 400,
            election_timeout_max_ms: 800,
            snapshot_every_entries: 5_000,
            entries_kept_after_snapshot: 1_000,
            write_timeout_ms: 5_000,
            joining: false,
            links: None,
            security: Default::default(),
            api_keys: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// This node is not the leader; the leader, when known. A write refused so
    /// after it `entered_log` (this node led when it logged it, then a new leader's
    /// log cut it off) may still be applied, if another node holds it and comes to
    /// lead; one refused before it entered the log never will be.
    #[error("this node is not the leader{}", leader.as_ref().map(|(id, a)| format!("; node {id} at {a} is")).unwrap_or_default())]
    NotLeader {
        leader: Option<(NodeId, String)>,
        entered_log: bool,
    },
    /// No majority answered in time: the write was not acknowledged. One that
    /// `entered_log` may still be applied later, if this node's log reaches a
    /// majority; one refused before it entered the log never will be.
    #[error(
        "no quorum: a majority of the cluster did not acknowledge the write within {waited_ms} ms"
    )]
    NoQuorum { waited_ms: u64, entered_log: bool },
    #[error("the cluster is not usable: {0}")]
    Raft(String),
    #[error("opening the Raft log at {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: kiln_storage::Error,
    },
    #[error("the Raft state: {0}")]
    State(#[from] crate::StorageError),
    #[error("invalid cluster settings: {0}")]
    Config(String),
    /// Leadership could not be handed over (the node named is not a voter, did not
    /// catch up, or did not win); the leader is unchanged or the election's winner.
    #[error("leadership transfer: {0}")]
    Transfer(String),
}

/// One member as `GET /cluster` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct MemberStatus {
    pub id: NodeId,
    pub address: String,
    /// `leader`, `follower` or `learner`.
    pub role: &'static str,
    /// The last log index the member is known to hold (the leader knows all).
    pub applied: Option<u64>,
    /// How many entries it is behind the leader's log, when known.
    pub lag: Option<u64>,
}

/// The cluster as this node sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    pub node_id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    /// This node's role: `leader`, `follower`, `candidate` or `learner`.
    pub state: &'static str,
    pub last_log_index: Option<u64>,
    pub last_applied: Option<u64>,
    /// The last log index this node's latest snapshot covers.
    pub snapshot_index: Option<u64>,
    /// The last log index this node has purged: a member further behind can only
    /// catch up from a snapshot.
    pub purged_index: Option<u64>,
    /// On a leader: whether a majority acknowledged it within the election
    /// timeout (a leader cut off from the others still calls itself leader until
    /// it hears of a newer term, but refuses writes); `None` on other nodes.
    pub has_quorum: Option<bool>,
    /// On a leader: how long ago a majority last acknowledged it.
    pub quorum_ack_age_ms: Option<u64>,
    /// Whether this node's storage waits for disk space (`disk_wait`): it takes
    /// no part in the cluster meanwhile, and names no leader.
    pub waiting_for_disk: bool,
    pub members: Vec<MemberStatus>,
}

impl ClusterError {
    /// The same error again, for another caller (an I/O error as its message).
    pub fn shared(&self) -> ClusterError {
        match self {
            ClusterError::NotLeader {
                leader,
                entered_log,
            } => ClusterError::NotLeader {
                leader: leader.clone(),
                entered_log: *entered_log,
            },
            ClusterError::NoQuorum {
                waited_ms,
                entered_log,
            } => ClusterError::NoQuorum {
                waited_ms: *waited_ms,
                entered_log: *entered_log,
            },
            other => ClusterError::Raft(other.to_string()),
        }
    }

    /// Whether a refused write may still be committed: it entered the leader's
    /// log, then no majority acknowledged it in time, or the node stopped leading
    /// before it was committed. A leader that knew itself cut off, or a node that
    /// did not lead, refused it before logging it.
    pub fn may_have_been_written(&self) -> bool {
        matches!(
            self,
            ClusterError::NoQuorum {
                entered_log: true,
                ..
            } | ClusterError::NotLeader {
                entered_log: true,
                ..
            }
        )
    }
}

/// Proposes one entry and waits until a majority has it and this node applied it.
///
/// openraft answers "forward to the leader" both to a proposal it refused before
/// logging it (this node does not lead) and to one it logged as leader whose entry
/// a new leader's log then cut off (`truncate`). Only the first is surely not
/// written: the second's entry may be held by a node that comes to lead. Every
/// cut of this log moves `truncations` before openraft answers, so a refusal that
/// saw it move is answered as possibly written (a concurrent cut of another
/// proposal's entry makes it so too: "unknown" is always a safe answer).
///
/// A leadership transfer holds `handover` for writing: proposals wait (within their
/// timeout) until it ends, so that the target's log can catch up with a log that
/// stops growing; those that then find another leader are refused before the log.
async fn propose(
    raft: &Raft,
    write_timeout: Duration,
    truncations: &AtomicU64,
    handover: &tokio::sync::RwLock<()>,
    command: Command,
) -> Result<Answer, ClusterError> {
    let Ok(_proposing) = tokio::time::timeout(write_timeout, handover.read()).await else {
        return Err(ClusterError::NoQuorum {
            waited_ms: write_timeout.as_millis() as u64,
            entered_log: false,
        });
    };
    let truncations_before = truncations.load(Ordering::SeqCst);
    let proposed = tokio::time::timeout(write_timeout, raft.client_write(command));
    match proposed.await {
        Err(_) => Err(ClusterError::NoQuorum {
            waited_ms: write_timeout.as_millis() as u64,
            entered_log: true,
        }),
        Ok(Ok(response)) => Ok(response.data),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
            Err(ClusterError::NotLeader {
                leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
                entered_log: truncations.load(Ordering::SeqCst) != truncations_before,
            })
        }
        Ok(Err(e)) => Err(ClusterError::Raft(e.to_string())),
    }
}

fn proposer(
    raft: Raft,
    write_timeout: Duration,
    truncations: Arc<AtomicU64>,
    handover: Arc<tokio::sync::RwLock<()>>,
) -> crate::batcher::Propose {
    Arc::new(move |command| {
        let raft = raft.clone();
        let truncations = truncations.clone();
        let handover = handover.clone();
        Box::pin(
            async move { propose(&raft, write_timeout, &truncations, &handover, command).await },
        )
    })
}

/// A running node.
pub struct ClusterNode {
    raft: Raft,
    node_id: NodeId,
    store: Arc<DocStore>,
    write_timeout: Duration,
    /// The log's count of truncations (`propose`).
    truncations: Arc<AtomicU64>,
    /// How long a leader may go without a majority's acknowledgment before it
    /// refuses writes.
    quorum_silence_ms: u64,
    security: crate::network::PeerSecurity,
    batcher: Batcher,
    /// Held for writing while leadership is handed over (see `propose`).
    handover: Arc<tokio::sync::RwLock<()>>,
    /// Hands leadership over (`transfer_leadership`, and a leader's full disk).
    leadership: crate::handover::Handover,
    /// Whether the storage waits for disk space (`disk_wait`).
    disk_wait: crate::disk_wait::DiskWait,
    /// The election timer and the answers to pre-votes (`prevote`).
    elections: crate::prevote::Elections,
}

/// The address member `id` is reached at, as the membership records it.
fn member_address(m: &openraft::RaftMetrics<NodeId, BasicNode>, id: NodeId) -> Option<String> {
    m.membership_config
        .nodes()
        .find(|(n, _)| **n == id)
        .map(|(_, node)| node.addr.clone())
}

/// Logs who leads as it changes (INFO), and Raft stopping on a fatal error (ERROR):
/// the cluster's events an operator reads, one line each. openraft's own lines
/// (off by default: `kiln serve`'s log filter) repeat at every retry.
fn log_leader_changes(raft: &Raft, node: NodeId) {
    let mut metrics = raft.metrics();
    tokio::spawn(async move {
        let mut known_leader: Option<Option<NodeId>> = None;
        loop {
            let (leader, term, stopped) = {
                let m = metrics.borrow();
                (
                    m.current_leader,
                    m.current_term,
                    m.running_state.clone().err(),
                )
            };
            if let Some(fatal) = stopped {
                tracing::error!(node, error = %fatal, "Raft stopped: this node no longer takes part in the cluster");
                return;
            }
            if known_leader != Some(leader) {
                match leader {
                    Some(leader) if leader == node => tracing::info!(node, term, "this node leads"),
                    Some(leader) => tracing::info!(node, leader, term, "following the leader"),
                    None => tracing::info!(node, term, "no leader known: an election is under way"),
                }
                known_leader = Some(leader);
            }
            if metrics.changed().await.is_err() {
                return; // Raft shut down
            }
        }
    });
}

/// The Raft log and the state machine over `store`, in `config`'s directories.
fn open_log_and_machine(
    store: &Arc<DocStore>,
    config: &ClusterConfig,
    classify: Option<ClassifyError>,
) -> Result<(LogStore, StateMachine), ClusterError> {
    let log = LogStore::open(&config.raft_dir, config.storage.clone()).map_err(|source| {
        ClusterError::Open {
            path: config.raft_dir.clone(),
            source,
        }
    })?;
    let machine = StateMachine::open(
        store.clone(),
        &log,
        &config.snapshot_dir,
        classify,
        config.api_keys.clone(),
    )?;
    Ok((log, machine))
}

impl ClusterNode {
    /// Opens the Raft log, starts Raft over `store`, and, on a node that has
    /// never been part of a cluster, proposes the configured membership.
    pub async fn start(
        store: Arc<DocStore>,
        config: ClusterConfig,
        classify: Option<ClassifyError>,
    ) -> Result<ClusterNode, ClusterError> {
        let raft_config = raft_config(&config)?;
        let (log, machine) = open_log_and_machine(&store, &config, classify)?;
        let disk_wait = machine.disk_wait();
        let log = log
            .with_purge_limit(machine.purge_limit())
            .with_disk_wait(disk_wait.clone());
        let truncations = log.truncations();
        let network = Network::new(
            config.node_id,
            config.links.clone(),
            config.security.clone(),
        );
        let elections = crate::prevote::Elections::new(
            log.clone(),
            disk_wait.clone(),
            Duration::from_millis(config.election_timeout_min_ms),
            Duration::from_millis(config.election_timeout_max_ms),
        );
        let raft = Raft::new(config.node_id, raft_config, network.clone(), log, machine)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        join_or_start_cluster(&raft, &config).await?;
        log_leader_changes(&raft, config.node_id);
        elections.start(raft.clone(), network.clone(), config.node_id);
        let leadership = crate::handover::Handover {
            raft: raft.clone(),
            network: network.clone(),
            elections: elections.clone(),
            node_id: config.node_id,
        };
        leadership.clone().step_down_while_disk_waits(
            disk_wait.clone(),
            Duration::from_millis(config.election_timeout_max_ms),
        );
        let write_timeout = Duration::from_millis(config.write_timeout_ms);
        let handover = Arc::new(tokio::sync::RwLock::new(()));
        Ok(ClusterNode {
            batcher: Batcher::start(proposer(
                raft.clone(),
                write_timeout,
                truncations.clone(),
                handover.clone(),
            )),
            truncations,
            raft,
            node_id: config.node_id,
            store,
            write_timeout,
            quorum_silence_ms: config.election_timeout_max_ms,
            security: config.security,
            handover,
            leadership,
            disk_wait,
            elections,
        })
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Whether a received Raft message may be handed to Raft: it presents the
    /// cluster's key, when the cluster has one (compared in constant time).
    pub fn admits(&self, presented_key: Option<&[u8]>) -> bool {
        let Some(expected) = &self.security.cluster_key else {
            return true;
        };
        let Some(presented) = presented_key else {
            return false;
        };
        let expected = expected.as_bytes();
        presented.len() == expected.len()
            && presented
                .iter()
                .zip(expected)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }

    /// The scheme the nodes (and so the leader a client is sent to) are reached by.
    pub fn scheme(&self) -> &'static str {
        if self.security.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    pub fn store(&self) -> &Arc<DocStore> {
        &self.store
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// Whether this node is the leader now (as its Raft core last published).
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// The leader's id and address, when known.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics().borrow().clone();
        let id = self.known_leader(&m)?;
        Some((id, member_address(&m, id)?))
    }

    /// The leader this node knows of: openraft's, unless this node has not heard
    /// from it for the leader's lease (openraft keeps naming it: with pre-votes a
    /// node cut off no longer stands for election, which is what cleared it).
    fn known_leader(&self, m: &openraft::RaftMetrics<NodeId, BasicNode>) -> Option<NodeId> {
        // A node waiting for disk space may have a Raft core stopped in a log
        // append: what it last published (itself leading, say) can be long stale.
        if self.disk_wait.is_waiting() {
            None
        } else if m.state == ServerState::Leader || !self.elections.leader_is_stale() {
            m.current_leader
        } else {
            None
        }
    }

    /// A leader that has not heard from a majority for an election timeout.
    fn cut_off(&self, m: &openraft::RaftMetrics<NodeId, BasicNode>) -> bool {
        m.state == ServerState::Leader
            && m.millis_since_quorum_ack
                .is_some_and(|ms| ms > self.quorum_silence_ms)
    }

    /// Proposes a command; answers once a majority has it durable and this node
    /// has applied it.
    pub async fn write(&self, command: Command) -> Result<Answer, ClusterError> {
        // A leader whose disk is full would log the entry and then not apply it:
        // the write is refused before the log, and leadership moves
        // (`handover::step_down_while_disk_waits`).
        if self.disk_wait.is_waiting() {
            return Err(ClusterError::NotLeader {
                leader: None,
                entered_log: false,
            });
        }
        self.wait_for_quorum().await?;
        match command {
            // Independent writes: merged with the others waiting (see `batcher`).
            Command::Write {
                database,
                at_ms,
                all_or_none: false,
                ops,
            } => self.batcher.write(database, at_ms, ops).await,
            command => {
                propose(
                    &self.raft,
                    self.write_timeout,
                    &self.truncations,
                    &self.handover,
                    command,
                )
                .await
            }
        }
    }

    /// A leader that has not heard from a majority for an election timeout is
    /// likely cut off: its writes are refused before they enter its log (where
    /// they could still be committed later, after the client was told they
    /// failed). A silence can also be a stall of a loaded machine (a follower's
    /// sync, a starved heartbeat): the leader waits one more election timeout for
    /// a majority to be heard from again before it refuses.
    async fn wait_for_quorum(&self) -> Result<(), ClusterError> {
        let mut metrics = self.raft.metrics();
        // (A leader just elected has no acknowledgment yet: its first heartbeat
        // brings one; the write's timeout covers a leader that never gets one.)
        if !self.cut_off(&metrics.borrow_and_update()) {
            return Ok(());
        }
        let started = tokio::time::Instant::now();
        let patience = Duration::from_millis(self.quorum_silence_ms);
        let heard = tokio::time::timeout(patience, async {
            // The metrics are published at every event of the Raft core, an
            // acknowledgment or a heartbeat's answer among them.
            while metrics.changed().await.is_ok() {
                if !self.cut_off(&metrics.borrow_and_update()) {
                    return true;
                }
            }
            false
        });
        match heard.await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ClusterError::Raft("the Raft core stopped".to_string())),
            Err(_) => Err(ClusterError::NoQuorum {
                waited_ms: started.elapsed().as_millis() as u64,
                entered_log: false,
            }),
        }
    }

    /// Waits until this node has applied everything committed when it was called,
    /// confirmed by a majority (a read after it cannot be stale). Leader only.
    pub async fn ensure_linearizable(&self) -> Result<(), ClusterError> {
        let checked = tokio::time::timeout(self.write_timeout, self.raft.ensure_linearizable());
        match checked.await {
            Err(_) => Err(ClusterError::NoQuorum {
                waited_ms: self.write_timeout.as_millis() as u64,
                entered_log: false,
            }),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(
                f,
            )))) => Err(ClusterError::NotLeader {
                leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
                entered_log: false,
            }),
            Ok(Err(e)) => Err(ClusterError::Raft(e.to_string())),
        }
    }

    /// Adds a node as a learner (it catches up from the log or a snapshot) and
    /// waits until it has caught up.
    pub async fn add_learner(&self, id: NodeId, address: String) -> Result<(), ClusterError> {
        self.change(
            self.raft
                .add_learner(id, BasicNode::new(address), true)
                .await,
        )
    }

    /// Hands leadership to voter `to`: waits (up to `patience`) until its log has
    /// caught up with this leader's, asks it to stand for election, and waits until
    /// this node follows it. Writes pause for the time of that election (about a
    /// round trip: the new leader's log is complete, so every voter grants it).
    /// Returns the new leader's id.
    pub async fn transfer_leadership(
        &self,
        to: NodeId,
        patience: Duration,
    ) -> Result<NodeId, ClusterError> {
        let deadline = tokio::time::Instant::now() + patience;
        let metrics = self.raft.metrics();
        let address = {
            let m = metrics.borrow();
            if m.current_leader != Some(self.node_id) {
                return Err(ClusterError::NotLeader {
                    leader: m
                        .current_leader
                        .and_then(|id| Some((id, member_address(&m, id)?))),
                    entered_log: false,
                });
            }
            if to == self.node_id {
                return Ok(to);
            }
            if !m.membership_config.voter_ids().any(|v| v == to) {
                return Err(ClusterError::Transfer(format!(
                    "node {to} is not a voter of this cluster (voters: {:?})",
                    m.membership_config.voter_ids().collect::<Vec<_>>()
                )));
            }
            member_address(&m, to).unwrap_or_default()
        };
        // No new entries while it catches up and stands: a log that keeps growing
        // could stay ahead of it, and the other voters would refuse it.
        let _paused = tokio::time::timeout_at(deadline, self.handover.write())
            .await
            .map_err(|_| {
                ClusterError::Transfer(format!(
                    "the writes under way did not end in {} ms",
                    patience.as_millis()
                ))
            })?;
        self.leadership
            .to(to, &address, deadline)
            .await
            .map_err(|why| ClusterError::Transfer(format!("{why} ({} ms)", patience.as_millis())))
    }

    /// Makes a learner a voter.
    pub async fn promote(&self, id: NodeId) -> Result<(), ClusterError> {
        let voters = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
        self.change(self.raft.change_membership(voters, false).await)
    }

    /// Removes a voter or learner.
    pub async fn remove(&self, id: NodeId) -> Result<(), ClusterError> {
        let is_voter = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .voter_ids()
            .any(|v| v == id);
        let change = if is_voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.change(self.raft.change_membership(change, false).await)
    }

    fn change<T>(
        &self,
        result: Result<T, RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>>,
    ) -> Result<(), ClusterError> {
        match result {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                // A membership change is retried by its caller as a whole.
                Err(ClusterError::NotLeader {
                    leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
                    entered_log: false,
                })
            }
            Err(e) => Err(ClusterError::Raft(e.to_string())),
        }
    }

    /// The cluster as this node sees it (the leader knows every member's progress).
    pub fn status(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow().clone();
        let leader = self.known_leader(&m);
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let last_log = m.last_log_index;
        let members = membership
            .nodes()
            .map(|(id, node)| {
                let applied = match &m.replication {
                    Some(progress) => progress.get(id).cloned().flatten().map(|l| l.index),
                    None if *id == self.node_id => m.last_applied.map(|l| l.index),
                    None => None,
                };
                MemberStatus {
                    id: *id,
                    address: node.addr.clone(),
                    role: if leader == Some(*id) {
                        "leader"
                    } else if voters.contains(id) {
                        "follower"
                    } else {
                        "learner"
                    },
                    applied,
                    lag: last_log.zip(applied).map(|(l, a)| l.saturating_sub(a)),
                }
            })
            .collect();
        ClusterStatus {
            node_id: self.node_id,
            leader,
            term: m.current_term,
            state: match m.state {
                ServerState::Leader => "leader",
                ServerState::Follower => "follower",
                ServerState::Candidate => "candidate",
                ServerState::Learner => "learner",
                ServerState::Shutdown => "shutdown",
            },
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            has_quorum: (m.state == ServerState::Leader).then(|| !self.cut_off(&m)),
            quorum_ack_age_ms: m.millis_since_quorum_ack,
            waiting_for_disk: self.disk_wait.is_waiting(),
            members,
        }
    }

    /// Handles a message of another node on the Raft route: Raft's own (which
    /// show this node a leader: `prevote`) and the pre-vote.
    pub async fn handle_rpc(
        &self,
        kind: &str,
        body: &[u8],
    ) -> Result<Vec<u8>, crate::network::RpcError> {
        crate::network::handle_rpc_with(&self.raft, Some(&self.elections), kind, body).await
    }

    /// Whether a step of this node's storage waits for disk space (`disk_wait`):
    /// the node then refuses Raft messages rather than queue them.
    pub fn waiting_for_disk(&self) -> bool {
        self.disk_wait.is_waiting()
    }

    /// Stops Raft (the server then closes the store).
    pub async fn shutdown(&self) {
        self.disk_wait.stop();
        self.elections.stop();
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "stopping Raft");
        }
    }
}

/// openraft's configuration for a node configured as `config` says.
fn raft_config(config: &ClusterConfig) -> Result<Arc<Config>, ClusterError> {
    Ok(Arc::new(
        Config {
            cluster_name: "kiln".into(),
            heartbeat_interval: config.heartbeat_interval_ms,
            election_timeout_min: config.election_timeout_min_ms,
            election_timeout_max: config.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
            max_in_snapshot_log_to_keep: config.entries_kept_after_snapshot,
            purge_batch_size: 1,
            // The last chunk's exchange includes the install, a restore of
            // every database: seconds for a large store, not openraft's 200 ms.
            install_snapshot_timeout: 60_000,
            ..Default::default()
        }
        .validate()
        .map_err(|e| ClusterError::Config(e.to_string()))?,
    ))
}

/// A node joining an existing cluster waits to be added; one with a log (or a
/// vote) keeps it; a member of a new cluster proposes the configured membership
/// (`propose_membership`).
async fn join_or_start_cluster(raft: &Raft, config: &ClusterConfig) -> Result<(), ClusterError> {
    let members: BTreeMap<NodeId, BasicNode> = config
        .members
        .iter()
        .map(|(id, addr)| (*id, BasicNode::new(addr)))
        .collect();
    // Every node of a new cluster proposes the same membership; a node that
    // already has a log (or a vote) keeps it. Asked first, because openraft
    // answers a restarted node's initialize with an ERROR line of its own.
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?;
    if config.joining {
        tracing::info!(
            node = config.node_id,
            "joining: waiting to be added by the cluster's leader"
        );
    } else if initialized {
        tracing::info!(
            node = config.node_id,
            "rejoining the cluster with the log and vote it has"
        );
    } else {
        propose_membership(
            raft.clone(),
            config.node_id,
            members,
            Duration::from_millis(config.election_timeout_max_ms),
        );
    }
    Ok(())
}

/// Proposes the configured membership on a new node. Every node of a new cluster
/// does, but not at once: openraft's `initialize` has the node stand for election
/// at once, and three nodes standing at once at term 1 unseat each other (a vote
/// of a higher node id wins a tie), leaving the cluster without a leader until a
/// timer runs out. So the members take turns, by rank of id, two election
/// timeouts apart; a node that has heard from a leader by its turn (it was given
/// the membership) does nothing, and one whose predecessors are down starts the
/// cluster itself.
fn propose_membership(
    raft: Raft,
    id: NodeId,
    members: BTreeMap<NodeId, BasicNode>,
    election_timeout: Duration,
) {
    let rank = members.keys().position(|m| *m == id).unwrap_or(0) as u32;
    tokio::spawn(async move {
        tokio::time::sleep(election_timeout * 2 * rank).await;
        if raft.is_initialized().await.unwrap_or(true) {
            tracing::debug!("not initializing the cluster: another member did");
            return;
        }
        if let Err(e) = raft.initialize(members).await {
            // Another node's proposal (or a vote for it) arrived first.
            tracing::debug!(error = %e, "not initializing the cluster (it has a state already)");
        }
    });
}
