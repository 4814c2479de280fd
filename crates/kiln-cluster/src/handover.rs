//! Handing leadership to another voter: asked for by an operator
//! ([`crate::ClusterNode::transfer_leadership`]), or done by a leader whose disk
//! is full (`step_down_while_disk_waits`).
//!
//! Why a leader with a full disk must hand over: applying entries runs apart
//! from openraft's core, so a leader whose apply waits for space
//! (`disk_wait`) still sends heartbeats and replicates. The followers keep
//! hearing from it and never elect another, while it answers no write (a write
//! is answered once the leader applied it): the whole cluster stops on one
//! node's disk. (A leader whose log append waits stops its core, and with it the
//! heartbeats: the others elect on their own; asking them changes nothing.)

use crate::network::Network;
use crate::prevote::Elections;
use crate::{NodeId, Raft};
use openraft::{BasicNode, RaftMetrics, ServerState};
use std::time::Duration;

/// Why a hand-over did not happen.
pub(crate) type Refused = String;

/// How long a leader's disk wait lasts before it hands leadership over: long
/// enough that a short stall (a background sync freeing space) does not move it.
const DISK_WAIT_BEFORE_HANDOVER: Duration = Duration::from_secs(1);

/// How long after a hand-over that did not happen the next is tried.
const RETRY_HANDOVER: Duration = Duration::from_secs(10);

/// What a hand-over uses of its node.
#[derive(Clone)]
pub(crate) struct Handover {
    pub raft: Raft,
    pub network: Network,
    pub elections: Elections,
    pub node_id: NodeId,
}

impl Handover {
    /// Waits (until `deadline`) for voter `to` to hold every entry of this
    /// leader's log, asks it to stand for election, and waits until this node
    /// follows another. The caller keeps the log from growing meanwhile (a log
    /// that keeps growing could stay ahead of the target, and the other voters
    /// would refuse it). The new leader's id.
    pub async fn to(
        &self,
        to: NodeId,
        address: &str,
        deadline: tokio::time::Instant,
    ) -> Result<NodeId, Refused> {
        let mut metrics = self.raft.metrics();
        let waited = |what: &str| format!("{what} by the deadline");
        loop {
            let caught_up = {
                let m = metrics.borrow();
                matched(&m, to).is_some() && matched(&m, to) == m.last_log_index
            };
            if caught_up {
                break;
            }
            if tokio::time::timeout_at(deadline, metrics.changed())
                .await
                .is_err()
            {
                return Err(waited(&format!(
                    "node {to} did not catch up with the leader's log"
                )));
            }
        }
        // This node must not stand again while the hand-over runs: once the
        // target's higher term makes it step down, its own election timer could
        // otherwise win the next round (openraft's leader lease makes the target's
        // first try fail, so there is a next round), and leadership would stay.
        let _not_standing = self.elections.hold();
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.network
            .ask_to_elect(to, address, remaining.max(Duration::from_millis(100)))
            .await
            .map_err(|e| format!("asking node {to} to stand: {e}"))?;
        loop {
            let leader = metrics.borrow().current_leader;
            match leader {
                Some(leader) if leader != self.node_id => {
                    tracing::info!(node = self.node_id, to = leader, "leadership handed over");
                    return Ok(leader);
                }
                _ => {}
            }
            if tokio::time::timeout_at(deadline, metrics.changed())
                .await
                .is_err()
            {
                return Err(waited(&format!(
                    "node {to} was asked to stand but no other node leads"
                )));
            }
        }
    }

    /// A leader whose storage has waited for disk space for
    /// `DISK_WAIT_BEFORE_HANDOVER` hands leadership to the voter furthest along
    /// its log (the log stops growing: `ClusterNode::write` refuses proposals
    /// while the disk waits). Tried again every election timeout while the wait
    /// and the leadership last.
    pub fn step_down_while_disk_waits(
        self,
        disk_wait: crate::disk_wait::DiskWait,
        election_timeout: Duration,
    ) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            // When to try (again), once a wait is seen.
            let mut next_try: Option<tokio::time::Instant> = None;
            loop {
                tick.tick().await;
                let m = self.raft.metrics().borrow().clone();
                if m.running_state.is_err() || m.state == ServerState::Shutdown {
                    return;
                }
                if m.state != ServerState::Leader || !disk_wait.is_waiting() {
                    next_try = None;
                    continue;
                }
                let at = *next_try
                    .get_or_insert_with(|| tokio::time::Instant::now() + DISK_WAIT_BEFORE_HANDOVER);
                if tokio::time::Instant::now() < at {
                    continue;
                }
                let Some((to, address)) = furthest_voter(&m, self.node_id) else {
                    continue;
                };
                tracing::warn!(
                    node = self.node_id,
                    to,
                    "this leader waits for disk space: handing leadership over"
                );
                let deadline = tokio::time::Instant::now() + election_timeout * 2;
                let handed = self.to(to, &address, deadline).await;
                // Waiting, this node refuses the new leader's messages: it may not
                // learn who won, only that it no longer leads.
                let stepped_down = self.raft.metrics().borrow().state != ServerState::Leader;
                match handed {
                    // Likely its Raft core waits in a log append (its metrics stand
                    // still, its heartbeats stopped): the others elect without it.
                    Err(why) if !stepped_down => {
                        tracing::warn!(
                            node = self.node_id,
                            to,
                            %why,
                            "leadership not handed over: trying again in {} s",
                            RETRY_HANDOVER.as_secs()
                        );
                        next_try = Some(tokio::time::Instant::now() + RETRY_HANDOVER);
                    }
                    _ => {
                        tracing::info!(
                            node = self.node_id,
                            to,
                            "stepped down while the disk waits"
                        );
                        next_try = None;
                    }
                }
            }
        });
    }
}

/// The last log index the leader knows voter `id` holds.
fn matched(m: &RaftMetrics<NodeId, BasicNode>, id: NodeId) -> Option<u64> {
    m.replication
        .as_ref()
        .and_then(|r| r.get(&id).cloned().flatten())
        .map(|log_id| log_id.index)
}

/// The voter other than `me` that holds the most of the leader's log, and its
/// address.
fn furthest_voter(m: &RaftMetrics<NodeId, BasicNode>, me: NodeId) -> Option<(NodeId, String)> {
    let voter = m
        .membership_config
        .voter_ids()
        .filter(|id| *id != me)
        .max_by_key(|id| matched(m, *id))?;
    let address = m
        .membership_config
        .nodes()
        .find(|(n, _)| **n == voter)
        .map(|(_, node)| node.addr.clone())?;
    Some((voter, address))
}
