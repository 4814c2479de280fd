//! Merges concurrent independent writes into one log entry.
//!
//! openraft 0.9 appends each proposal to the log on its own, a durable commit of
//! the log store each, one after another: a leader would take one write per disk
//! flush however many clients wait. The batcher takes the independent writes
//! (`Command::Write` with `all_or_none: false`, each of whose operations succeeds
//! or fails on its own) that are waiting while earlier proposals are in flight,
//! and proposes the ones to the same database as ONE `Write` entry: its operations
//! in arrival order, the latest time of theirs. Applying it gives each operation
//! the outcome it would have had as an entry of its own right after the ones before
//! it (the state machine applies a `Write` entry's operations in order, each on its
//! own), so each caller gets its slice of the answer.
//!
//! One exception: an entry fails as a whole (`Answer::Failed`, nothing written)
//! when an operation fails in a way that spoils the shared transaction. A merged
//! entry that fails so is proposed again caller by caller, so that one caller's
//! bad write does not fail the others'.

use crate::command::{Answer, Command, LoggedOp};
use crate::node::ClusterError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// The most operations merged into one entry.
const MAX_OPS_PER_ENTRY: usize = 1_024;
/// The most document text (bytes of JSON) merged into one entry.
const MAX_JSON_BYTES_PER_ENTRY: usize = 1 << 20;
/// Proposals in flight at once: while one waits for a majority, the next writes
/// gather into the next entry. One, as a group commit: every entry costs each
/// node a durable log append, an append message, a database commit and its
/// share of the write-back, whatever its size, so fewer and larger entries cost
/// less per write. W15 on 2 cores (`kiln bench --workloads W15`, two rounds
/// alternated): with one in flight 6,500-6,670 PUTs/s at 186 us of server CPU
/// per PUT summed over the three nodes and 0.9 device writes per PUT; with two
/// 5,170-5,910 PUTs/s, 241-259 us, 1.4 writes; four (before) and eight were
/// worse again. A lone writer waits as long either way.
const PROPOSALS_IN_FLIGHT: usize = 1;

type Reply = oneshot::Sender<Result<Answer, ClusterError>>;

/// An independent write waiting to be proposed.
struct Waiting {
    database: String,
    at_ms: u64,
    ops: Vec<LoggedOp>,
    reply: Reply,
}

/// What proposes an entry and waits for its answer (`ClusterNode::propose`).
pub(crate) type Propose = Arc<
    dyn Fn(Command) -> Pin<Box<dyn Future<Output = Result<Answer, ClusterError>> + Send>>
        + Send
        + Sync,
>;

/// The handle writes are sent through.
#[derive(Clone)]
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Waiting>,
}

impl Batcher {
    /// Starts the batching task on the current runtime.
    pub fn start(propose: Propose) -> Batcher {
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(run(waiting, propose));
        Batcher { queue }
    }

    /// Proposes the independent writes `ops` to `database`, merged with others
    /// waiting; their answer (`Answer::Writes` with one answer per op, or a failure).
    pub async fn write(
        &self,
        database: String,
        at_ms: u64,
        ops: Vec<LoggedOp>,
    ) -> Result<Answer, ClusterError> {
        let (reply, answer) = oneshot::channel();
        let waiting = Waiting {
            database,
            at_ms,
            ops,
            reply,
        };
        if self.queue.send(waiting).is_err() {
            return Err(ClusterError::Raft("the node is shutting down".into()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(ClusterError::Raft("the node is shutting down".into())))
    }
}

async fn run(mut waiting: mpsc::UnboundedReceiver<Waiting>, propose: Propose) {
    let in_flight = Arc::new(Semaphore::new(PROPOSALS_IN_FLIGHT));
    while let Some(first) = waiting.recv().await {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        // Everything that arrived while we waited for a free slot joins.
        let mut batch = vec![first];
        while let Ok(more) = waiting.try_recv() {
            batch.push(more);
        }
        let mut free = Some(permit);
        for group in into_entries(batch) {
            let permit = match free.take() {
                Some(p) => p,
                None => match in_flight.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let propose = propose.clone();
            tokio::spawn(async move {
                propose_group(group, &propose).await;
                drop(permit);
            });
        }
    }
}

/// Splits waiting writes into entries: per database, in arrival order, within the
/// limits of one entry.
fn into_entries(batch: Vec<Waiting>) -> Vec<Vec<Waiting>> {
    let mut entries: Vec<Vec<Waiting>> = Vec::new();
    let mut sizes: Vec<(usize, usize)> = Vec::new();
    for w in batch {
        let ops = w.ops.len();
        let bytes = json_bytes(&w.ops);
        let fits = entries.iter().zip(&sizes).rposition(|(e, (n, b))| {
            e[0].database == w.database
                && n + ops <= MAX_OPS_PER_ENTRY
                && b + bytes <= MAX_JSON_BYTES_PER_ENTRY
        });
        // Only the database's last entry may take it (order within a database).
        let last_of_db = entries.iter().rposition(|e| e[0].database == w.database);
        match fits.filter(|i| Some(*i) == last_of_db) {
            Some(i) => {
                sizes[i].0 += ops;
                sizes[i].1 += bytes;
                entries[i].push(w);
            }
            None => {
                sizes.push((ops, bytes));
                entries.push(vec![w]);
            }
        }
    }
    entries
}

fn json_bytes(ops: &[LoggedOp]) -> usize {
    ops.iter()
        .map(|op| match op {
            LoggedOp::Put { id, json, .. } => id.len() + json.len(),
            LoggedOp::Delete { id, .. } => id.len(),
            LoggedOp::Attributed { key_id, op } => {
                key_id.len() + json_bytes(std::slice::from_ref(op))
            }
        })
        .sum()
}

/// Proposes one merged entry and answers each caller its part.
async fn propose_group(group: Vec<Waiting>, propose: &Propose) {
    let merged = Command::Write {
        database: group[0].database.clone(),
        at_ms: group.iter().map(|w| w.at_ms).max().unwrap_or(0),
        all_or_none: false,
        ops: group.iter().flat_map(|w| w.ops.iter().cloned()).collect(),
    };
    let answer = propose(merged).await;
    match answer {
        Ok(Answer::Writes(mut answers)) if answers.len() == op_count(&group) => {
            for w in group {
                let rest = answers.split_off(w.ops.len());
                let mine = std::mem::replace(&mut answers, rest);
                let _ = w.reply.send(Ok(Answer::Writes(mine)));
            }
        }
        Ok(Answer::Failed(_)) if group.len() > 1 => {
            // Nothing was written: each caller's writes again, as an entry alone.
            for w in group {
                let command = Command::Write {
                    database: w.database,
                    at_ms: w.at_ms,
                    all_or_none: false,
                    ops: w.ops,
                };
                let _ = w.reply.send(propose(command).await);
            }
        }
        Ok(Answer::Writes(answers)) => {
            let e = ClusterError::Raft(format!(
                "an entry of {} writes was answered with {} outcomes",
                op_count(&group),
                answers.len()
            ));
            for w in group {
                let _ = w.reply.send(Err(e.shared()));
            }
        }
        Ok(other) => {
            for w in group {
                let _ = w.reply.send(Ok(other.clone()));
            }
        }
        Err(e) => {
            for w in group {
                let _ = w.reply.send(Err(e.shared()));
            }
        }
    }
}

fn op_count(group: &[Waiting]) -> usize {
    group.iter().map(|w| w.ops.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::LoggedCondition;

    fn waiting(
        database: &str,
        ids: &[&str],
    ) -> (Waiting, oneshot::Receiver<Result<Answer, ClusterError>>) {
        let (reply, answer) = oneshot::channel();
        let ops = ids
            .iter()
            .map(|id| LoggedOp::Put {
                id: id.to_string(),
                json: "{}".into(),
                condition: LoggedCondition::None,
            })
            .collect();
        let w = Waiting {
            database: database.into(),
            at_ms: 0,
            ops,
            reply,
        };
        (w, answer)
    }

    fn ids(entry: &[Waiting]) -> Vec<String> {
        entry
            .iter()
            .flat_map(|w| &w.ops)
            .map(|op| op.id().to_string())
            .collect()
    }

    #[test]
    fn writes_merge_per_database_in_arrival_order() {
        let batch = vec![
            waiting("a", &["1"]).0,
            waiting("b", &["2"]).0,
            waiting("a", &["3", "4"]).0,
            waiting("b", &["5"]).0,
        ];
        let entries = into_entries(batch);
        assert_eq!(entries.len(), 2);
        assert_eq!(ids(&entries[0]), ["1", "3", "4"]);
        assert_eq!(ids(&entries[1]), ["2", "5"]);
    }

    #[test]
    fn a_full_entry_starts_another_and_later_writes_never_join_an_earlier_one() {
        let many: Vec<String> = (0..MAX_OPS_PER_ENTRY - 1).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let batch = vec![
            waiting("a", &many).0,
            waiting("a", &["x", "y"]).0, // does not fit: a new entry
            waiting("a", &["z"]).0,      // fits the first, but must follow x and y
        ];
        let entries = into_entries(batch);
        assert_eq!(entries.len(), 2);
        assert_eq!(ids(&entries[0]).len(), MAX_OPS_PER_ENTRY - 1);
        assert_eq!(ids(&entries[1]), ["x", "y", "z"]);
    }
}
