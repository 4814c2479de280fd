//! Elections with a pre-vote (Raft thesis §9.6), in front of openraft 0.9, which
//! has none. Without it, a follower cut off from the others stands for election
//! again and again, each time with a higher term; when the link heals, its answers
//! carry that term and the healthy leader steps down: writes pause for an
//! election, though nothing was wrong with the leader.
//!
//! So openraft's own election timer is off (`RuntimeConfig::elect(false)`) and
//! this module's timer stands in for it. A voter that has heard from no leader for
//! the leader's lease (the election timeout's maximum, which openraft's voters
//! wait out before they vote) and a random part of the timeout's spread first
//! asks the other voters whether they would vote for it (`prevote`, a message
//! that changes nothing on the receiver). A voter says yes only if it has not
//! heard from a leader for the lease itself, is not the leader, is at a lower
//! term than the one the candidate would take, and holds no log the candidate
//! lacks. Only with a majority of yeses (its own included) does
//! the node start a real election (`Trigger::elect`). A node cut off gets no
//! majority, so its term stays where it was and the healed link disturbs nothing.
//!
//! "Heard from a leader" is an append or a snapshot chunk this node took from the
//! leader of its term, or a vote it granted (a vote given restarts the timer, as
//! in Raft). A leadership hand-over (`hold`) and a wait for disk space hold
//! elections off, and count as heard from a leader while they last. Nodes of a build without this answer `prevote` with an error, which
//! counts as a no: during a rolling upgrade, upgraded nodes elect only with a
//! majority of upgraded nodes, and older nodes elect as they did.

use crate::log_store::LogStore;
use crate::network::Network;
use crate::{LogId, NodeId, Raft};
use openraft::ServerState;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a candidate asks before it stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVoteRequest {
    pub candidate: NodeId,
    /// The term it would stand at (its current term plus one).
    pub term: u64,
    pub last_log_id: Option<LogId>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVoteResponse {
    pub granted: bool,
    /// Why not, for the logs.
    pub reason: Option<String>,
}

struct State {
    last_leader_contact: Mutex<Instant>,
    /// Holds on elections (a hand-over, a wait for disk space).
    holds: AtomicUsize,
    stopped: AtomicBool,
    timeout_min: Duration,
    timeout_max: Duration,
}

/// A node's elections: its timer, and its answers to other candidates.
#[derive(Clone)]
pub struct Elections {
    state: Arc<State>,
    /// Let go of at `stop`: the log's environment (and its directory's lock)
    /// must not outlive the node, which a restart in the same process reopens.
    log: Arc<Mutex<Option<LogStore>>>,
    /// A node waiting for disk space hears nothing from the leader (its Raft route
    /// refuses messages meanwhile): it stands for no election then, nor for a
    /// whole timeout after.
    disk_wait: crate::disk_wait::DiskWait,
}

/// Elections held off while it lives.
pub struct Hold(Elections);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.state.holds.fetch_sub(1, Ordering::SeqCst);
        // The time held counts as heard from: the node waits a whole timeout more.
        self.0.heard_from_leader();
    }
}

impl Elections {
    pub(crate) fn new(
        log: LogStore,
        disk_wait: crate::disk_wait::DiskWait,
        timeout_min: Duration,
        timeout_max: Duration,
    ) -> Elections {
        Elections {
            state: Arc::new(State {
                last_leader_contact: Mutex::new(Instant::now()),
                holds: AtomicUsize::new(0),
                stopped: AtomicBool::new(false),
                timeout_min,
                timeout_max,
            }),
            log: Arc::new(Mutex::new(Some(log))),
            disk_wait,
        }
    }

    /// This node heard from the leader of its term (or granted a vote).
    pub fn heard_from_leader(&self) {
        *self.state.last_leader_contact.lock() = Instant::now();
    }

    /// How long since this node last heard from a leader.
    pub fn since_leader_contact(&self) -> Duration {
        self.state.last_leader_contact.lock().elapsed()
    }

    /// Whether this node has not heard from a leader for the election timeout's
    /// maximum: it does not know of one that leads now.
    pub fn leader_is_stale(&self) -> bool {
        self.since_leader_contact() > self.state.timeout_max
    }

    /// Holds elections off until the returned value is dropped.
    pub fn hold(&self) -> Hold {
        self.state.holds.fetch_add(1, Ordering::SeqCst);
        Hold(self.clone())
    }

    pub(crate) fn stop(&self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.log.lock().take();
    }

    /// This node's last log id (an error once the node stopped).
    fn last_log_id(&self) -> Result<Option<LogId>, String> {
        match &*self.log.lock() {
            Some(log) => log.last_log_id().map_err(|e| e.to_string()),
            None => Err("the node stopped".into()),
        }
    }

    /// The answer to a candidate's pre-vote.
    pub fn answer(&self, raft: &Raft, req: &PreVoteRequest) -> PreVoteResponse {
        let no = |why: String| PreVoteResponse {
            granted: false,
            reason: Some(why),
        };
        let m = raft.metrics().borrow().clone();
        if m.state == ServerState::Leader {
            return no(format!("node {} leads", m.id));
        }
        let since = self.since_leader_contact();
        // openraft's voters refuse a vote for the leader's lease (the election
        // timeout's maximum) after they last heard from it: a yes before that
        // would start an election bound to fail, at a higher term.
        if since < self.state.timeout_max {
            return no(format!(
                "heard from the leader {} ms ago",
                since.as_millis()
            ));
        }
        if req.term <= m.current_term {
            return no(format!(
                "term {} is not past this node's {}",
                req.term, m.current_term
            ));
        }
        match self.last_log_id() {
            Ok(mine) if req.last_log_id >= mine => PreVoteResponse {
                granted: true,
                reason: None,
            },
            Ok(mine) => no(format!(
                "its log ends at {:?}, this node's at {mine:?}",
                req.last_log_id
            )),
            Err(e) => no(format!("reading this node's log: {e}")),
        }
    }

    /// Runs the election timer: openraft's own is turned off here.
    pub(crate) fn start(&self, raft: Raft, network: Network, id: NodeId) {
        raft.runtime_config().elect(false);
        let me = self.clone();
        tokio::spawn(async move {
            let mut timeout = me.draw_timeout();
            let mut last_try: Option<Instant> = None;
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while !me.state.stopped.load(Ordering::SeqCst) {
                tick.tick().await;
                let m = raft.metrics().borrow().clone();
                if m.running_state.is_err() {
                    return; // Raft stopped
                }
                let voter = m
                    .membership_config
                    .membership()
                    .voter_ids()
                    .any(|v| v == id);
                let held = me.state.holds.load(Ordering::SeqCst) > 0 || me.disk_wait.is_waiting();
                if m.state == ServerState::Leader || !voter || held {
                    me.heard_from_leader();
                    continue;
                }
                let tried_lately = last_try.is_some_and(|t: Instant| t.elapsed() < timeout);
                if me.since_leader_contact() < timeout || tried_lately {
                    continue;
                }
                if me.majority_would_vote(&raft, &network, id, &m).await {
                    if let Err(e) = raft.trigger().elect().await {
                        tracing::warn!(error = %e, "standing for election");
                        return;
                    }
                }
                // Either way, one more timeout before the next try (not a contact
                // with a leader: this node's answers to others stay as they were).
                last_try = Some(Instant::now());
                timeout = me.draw_timeout();
            }
        });
    }

    /// How long this node waits without a leader before it asks: the leader's
    /// lease (the election timeout's maximum), then a random part of the
    /// configured spread, so that two nodes seldom ask at once.
    fn draw_timeout(&self) -> Duration {
        use rand::Rng;
        let (min, max) = (
            self.state.timeout_min,
            self.state.timeout_max.max(self.state.timeout_min),
        );
        max + rand::thread_rng().gen_range(Duration::ZERO..=max - min)
    }

    /// Asks the other voters; true when a majority (this node included) would vote
    /// for it.
    async fn majority_would_vote(
        &self,
        raft: &Raft,
        network: &Network,
        id: NodeId,
        m: &openraft::RaftMetrics<NodeId, openraft::BasicNode>,
    ) -> bool {
        let req = PreVoteRequest {
            candidate: id,
            term: m.current_term + 1,
            last_log_id: match self.last_log_id() {
                Ok(last) => last,
                Err(_) => return false,
            },
        };
        // This node's own answer: it too must not have heard from a leader.
        let mine = self.answer(raft, &req);
        if !mine.granted {
            return false;
        }
        let membership = m.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let asks = membership
            .nodes()
            .filter(|(n, _)| **n != id && voters.contains(n))
            .map(|(n, node)| {
                let req = req.clone();
                let addr = node.addr.clone();
                let target = *n;
                async move {
                    network
                        .pre_vote(target, &addr, &req, self.state.timeout_min)
                        .await
                }
            });
        let answers = futures_util::future::join_all(asks).await;
        let granted = 1 + answers
            .iter()
            .filter(|a| a.as_ref().is_ok_and(|r| r.granted))
            .count();
        let won = granted * 2 > voters.len();
        if !won {
            let why: Vec<String> = answers
                .iter()
                .map(|a| match a {
                    Ok(r) => r.reason.clone().unwrap_or_else(|| "yes".into()),
                    Err(e) => e.clone(),
                })
                .collect();
            tracing::debug!(term = req.term, answers = ?why, "pre-vote lost: not standing for election");
        }
        won
    }
}
