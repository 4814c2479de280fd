//! The Raft log and vote in a kiln-storage environment of their own
//! (`<data>/cluster/raft`). An entry is stored under its index (big-endian, so
//! the tree's order is the log's) in the binary form (`codec`); the vote and the
//! last purged log id are JSON values in a meta tree. Every change is one commit,
//! durable when it returns (the environment's default durability): Raft is told
//! an append is flushed only then, and a node votes only once its vote is on disk.

use crate::{LogId, NodeId, StorageError, TypeConfig};
use kiln_storage::{Env, Options};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, RaftLogReader, StorageIOError, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const LOG: &str = "raft_log";
const META: &str = "raft_meta";
const VOTE: &[u8] = b"vote";
const LAST_PURGED: &[u8] = b"last_purged";

/// The most bytes of entries (as stored) one append to a follower carries, beyond
/// its first entry. openraft gives an append one heartbeat interval (100 ms at the
/// default election timeout) and sends it again whole when that runs out: a
/// follower behind by hundreds of large entries (bulk batches, merged writes) was
/// sent them all at once, again and again, and never caught up.
const MAX_APPEND_BYTES: usize = 4 << 20;

/// The log store; cheap to clone (a clone is a reader of the same log).
#[derive(Clone)]
pub struct LogStore {
    env: Arc<Env>,
    purge_limit: Option<PurgeLimit>,
    /// How many times entries were cut off the log's end (`truncate`: a new
    /// leader's log disagreed). A proposal refused as "forward to the leader" when
    /// this moved may have entered the log before it was cut (`node::propose`).
    truncations: Arc<AtomicU64>,
    /// The state machine's applied state, left for this log's next commit.
    piggyback: Piggyback,
    /// An append or a vote that meets a full disk waits for space (`disk_wait`).
    disk_wait: crate::disk_wait::DiskWait,
}

/// A value the state machine leaves for the log's next commit to carry: its
/// applied state after a batch of document writes. Saving it in a commit of its
/// own cost every node a durable journal write per batch (W15: a third of the
/// cluster's journal writes); carried by the next append, it is durable as soon
/// as the next entry is, and a node that crashes before that applies the entries
/// in between again, which a document write makes a no-op (its database holds
/// its log index). Taken and replaced only while holding the environment's
/// writer (`begin_write`), so the state machine's own saves (which carry it
/// first, then write a newer value if they have one) and an append that
/// carries it cannot pass each other.
#[derive(Clone, Default)]
pub struct Piggyback(Arc<parking_lot::Mutex<Option<PendingPut>>>);

struct PendingPut {
    tree: &'static str,
    key: &'static [u8],
    value: Vec<u8>,
}

impl Piggyback {
    /// Leaves `value` for `key` of `tree` (replacing what was left before).
    pub(crate) fn leave(&self, tree: &'static str, key: &'static [u8], value: Vec<u8>) {
        *self.0.lock() = Some(PendingPut { tree, key, value });
    }

    /// Puts what was left into `txn` (which holds the writer).
    pub(crate) fn carry(
        &self,
        txn: &mut kiln_storage::WriteTxn<'_>,
    ) -> Result<(), kiln_storage::Error> {
        match self.0.lock().take() {
            Some(put) => txn.put(put.tree, put.key, &put.value),
            None => Ok(()),
        }
    }
}

/// How far the log may be purged: up to the state machine's last snapshot that is
/// durable, and no further. openraft purges a follower's log as soon as it hands
/// it a snapshot to install, before the install is done; a crash in between would
/// leave a log purged past anything the node holds (openraft then refuses to
/// start). So a purge past the limit is deferred: the state machine does it in
/// the same commit that records the installed snapshot ([`purge_within`]), and a
/// node killed before that restarts with its old log and is sent the snapshot
/// again. (The leader sends the entries after a snapshot only once the follower
/// answered that it installed it, so no entry lands beyond a deferred purge.)
#[derive(Clone, Default)]
pub struct PurgeLimit(Arc<parking_lot::Mutex<PurgeState>>);

#[derive(Default)]
struct PurgeState {
    /// The last durable snapshot's last log id.
    limit: Option<LogId>,
    /// The furthest purge asked for and not done.
    deferred: Option<LogId>,
}

impl PurgeLimit {
    /// A durable snapshot now covers the log up to `last_log_id` (at start).
    pub fn raise_to(&self, last_log_id: Option<LogId>) {
        let mut state = self.0.lock();
        state.limit = state.limit.max(last_log_id);
    }

    /// The snapshot up to `last_log_id` is being made durable in `txn`: raises the
    /// limit and does the deferred purge it allows, in the same commit. The limit
    /// is raised before the commit: a failed commit fails the state machine, and
    /// Raft stops.
    pub(crate) fn raise_within(
        &self,
        txn: &mut kiln_storage::WriteTxn<'_>,
        last_log_id: Option<LogId>,
    ) -> Result<(), StorageError> {
        let deferred = {
            let mut state = self.0.lock();
            state.limit = state.limit.max(last_log_id);
            let now = state.deferred.filter(|d| Some(*d) <= state.limit);
            if now.is_some() {
                state.deferred = None;
            }
            now
        };
        match deferred {
            Some(upto) => purge_within(txn, upto),
            None => Ok(()),
        }
    }

    /// How far a purge asked up to `asked` may go now; the rest is deferred.
    fn allow(&self, asked: LogId) -> Option<LogId> {
        let mut state = self.0.lock();
        if Some(asked) <= state.limit {
            return Some(asked);
        }
        state.deferred = state.deferred.max(Some(asked));
        state.limit
    }
}

/// Purges the log up to `upto` in `txn`: the purge point, and the entries at or
/// below it deleted.
pub(crate) fn purge_within(
    txn: &mut kiln_storage::WriteTxn<'_>,
    upto: LogId,
) -> Result<(), StorageError> {
    let purged: Option<LogId> = match txn.get(META, LAST_PURGED).map_err(|e| read_err(&e))? {
        None => None,
        Some(raw) => Some(serde_json::from_slice(raw).map_err(|e| read_err(&e))?),
    };
    if purged >= Some(upto) {
        return Ok(());
    }
    let keys: Vec<Vec<u8>> = {
        let mut c = txn.cursor(LOG).map_err(|e| read_err(&e))?;
        let mut keys = Vec::new();
        let mut item = c.first().map_err(|e| read_err(&e))?;
        while let Some((k, _)) = item {
            if index_of(k) > upto.index {
                break;
            }
            keys.push(k.to_vec());
            item = c.next().map_err(|e| read_err(&e))?;
        }
        keys
    };
    for k in keys {
        txn.delete(LOG, &k).map_err(|e| write_err(&e))?;
    }
    let raw = serde_json::to_vec(&upto).map_err(|e| write_err(&e))?;
    txn.put(META, LAST_PURGED, &raw).map_err(|e| write_err(&e))
}

impl LogStore {
    /// Opens (or creates) the log at `dir`.
    pub fn open(dir: &Path, storage: Options) -> Result<LogStore, kiln_storage::Error> {
        let env = Env::open(dir, storage)?;
        let mut w = env.begin_write()?;
        w.ensure_tree(LOG)?;
        w.ensure_tree(META)?;
        w.commit()?;
        Ok(LogStore {
            env: Arc::new(env),
            purge_limit: None,
            truncations: Arc::new(AtomicU64::new(0)),
            piggyback: Piggyback::default(),
            disk_wait: crate::disk_wait::DiskWait::default(),
        })
    }

    /// Purges go no further than `limit` (see [`PurgeLimit`]); without one, as far
    /// as asked.
    /// The count of truncations of this log (shared: it goes on counting after the
    /// store is handed to openraft).
    pub fn truncations(&self) -> Arc<AtomicU64> {
        self.truncations.clone()
    }

    /// Waits for disk space with `wait` (shared with the state machine and the
    /// node's Raft route) instead of failing.
    pub fn with_disk_wait(mut self, wait: crate::disk_wait::DiskWait) -> LogStore {
        self.disk_wait = wait;
        self
    }

    pub fn with_purge_limit(mut self, limit: PurgeLimit) -> LogStore {
        self.purge_limit = Some(limit);
        self
    }

    /// The environment, shared with the state machine (one journal for both).
    pub fn env(&self) -> Arc<Env> {
        self.env.clone()
    }

    /// Where the state machine leaves what the next append carries.
    pub fn piggyback(&self) -> Piggyback {
        self.piggyback.clone()
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StorageError> {
        let r = self.env.begin_read().map_err(|e| read_err(&e))?;
        match r.get(META, key).map_err(|e| read_err(&e))? {
            None => Ok(None),
            Some(raw) => serde_json::from_slice(raw)
                .map(Some)
                .map_err(|e| read_err(&e)),
        }
    }

    fn write_meta<T: Serialize>(&self, key: &[u8], value: &T) -> Result<(), StorageError> {
        let raw = serde_json::to_vec(value).map_err(|e| write_err(&e))?;
        let mut w = self.env.begin_write().map_err(|e| write_err(&e))?;
        w.put(META, key, &raw).map_err(|e| write_err(&e))?;
        w.commit().map_err(|e| write_err(&e))?;
        Ok(())
    }

    /// The log's last id: its last entry's, or the last purged one's when the
    /// purge took every entry (what `get_log_state` reports).
    pub(crate) fn last_log_id(&self) -> Result<Option<LogId>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.read_meta(LAST_PURGED)?;
        Ok(self.last_entry_id()?.or(last_purged_log_id))
    }

    fn last_entry_id(&self) -> Result<Option<LogId>, StorageError> {
        let r = self.env.begin_read().map_err(|e| read_err(&e))?;
        let mut c = r.cursor(LOG).map_err(|e| read_err(&e))?;
        match c.last().map_err(|e| read_err(&e))? {
            None => Ok(None),
            Some((_, raw)) => Ok(Some(decode_entry(raw)?.log_id)),
        }
    }

    /// Deletes the entries with an index in `[from, to)`, in one commit.
    fn delete_range(&self, from: u64, to: Option<u64>) -> Result<(), StorageError> {
        let keys: Vec<Vec<u8>> = {
            let r = self.env.begin_read().map_err(|e| read_err(&e))?;
            let mut c = r.cursor(LOG).map_err(|e| read_err(&e))?;
            let mut keys = Vec::new();
            let mut item = c.seek(&from.to_be_bytes()).map_err(|e| read_err(&e))?;
            while let Some((k, _)) = item {
                if to.is_some_and(|to| index_of(k) >= to) {
                    break;
                }
                keys.push(k.to_vec());
                item = c.next().map_err(|e| read_err(&e))?;
            }
            keys
        };
        let mut w = self.env.begin_write().map_err(|e| write_err(&e))?;
        for k in keys {
            w.delete(LOG, &k).map_err(|e| write_err(&e))?;
        }
        w.commit().map_err(|e| write_err(&e))?;
        Ok(())
    }
}

fn index_of(key: &[u8]) -> u64 {
    key.try_into().map(u64::from_be_bytes).unwrap_or(u64::MAX)
}

fn decode_entry(raw: &[u8]) -> Result<Entry<TypeConfig>, StorageError> {
    crate::codec::decode(raw).map_err(|e| StorageIOError::read_logs(AnyError::new(&e)).into())
}

fn read_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    StorageIOError::read_logs(AnyError::new(e)).into()
}

fn write_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    crate::disk_wait::note(e);
    StorageIOError::write_logs(AnyError::new(e)).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let r = self.env.begin_read().map_err(|e| read_err(&e))?;
        let mut c = r.cursor(LOG).map_err(|e| read_err(&e))?;
        let mut out = Vec::new();
        let mut item = c.seek(&start.to_be_bytes()).map_err(|e| read_err(&e))?;
        while let Some((k, raw)) = item {
            if !range.contains(&index_of(k)) {
                break;
            }
            out.push(decode_entry(raw)?);
            item = c.next().map_err(|e| read_err(&e))?;
        }
        Ok(out)
    }

    /// Entries from `start` up to `end` (excluded), but no more bytes than
    /// `MAX_APPEND_BYTES` after the first: openraft sends the rest in the next
    /// append.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let r = self.env.begin_read().map_err(|e| read_err(&e))?;
        let mut c = r.cursor(LOG).map_err(|e| read_err(&e))?;
        let (mut out, mut bytes) = (Vec::new(), 0usize);
        let mut item = c.seek(&start.to_be_bytes()).map_err(|e| read_err(&e))?;
        while let Some((k, raw)) = item {
            if index_of(k) >= end || (!out.is_empty() && bytes + raw.len() > MAX_APPEND_BYTES) {
                break;
            }
            bytes += raw.len();
            out.push(decode_entry(raw)?);
            item = c.next().map_err(|e| read_err(&e))?;
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.read_meta(LAST_PURGED)?;
        let last_log_id = self.last_log_id()?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let wait = self.disk_wait.clone();
        wait.retry("saving the vote", || self.write_meta(VOTE, vote))
            .await
            .map_err(|e| StorageIOError::write_vote(AnyError::new(&e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(VOTE)
    }

    // The committed log id is not saved (openraft's default): saving it cost a
    // durable commit per batch on every node (W15), and after a restart the
    // leader's next commit tells each node again how far it may apply.

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let wait = self.disk_wait.clone();
        let result = wait
            .retry("appending to the Raft log", || {
                let mut w = self.env.begin_write().map_err(|e| write_err(&e))?;
                self.piggyback.carry(&mut w).map_err(|e| write_err(&e))?;
                for entry in &entries {
                    let raw = crate::codec::encode(entry).map_err(|e| write_err(&e))?;
                    w.put(LOG, &entry.log_id.index.to_be_bytes(), &raw)
                        .map_err(|e| write_err(&e))?;
                }
                w.commit().map_err(|e| write_err(&e))?;
                Ok::<(), StorageError>(())
            })
            .await;
        // Durable (or failed) here: the commit returns after the journal write.
        callback.log_io_completed(
            result
                .as_ref()
                .map(|_| ())
                .map_err(|e| std::io::Error::other(e.to_string())),
        );
        result
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Counted before openraft answers the proposals whose entries go, so that
        // each of them sees the count moved.
        self.truncations.fetch_add(1, Ordering::SeqCst);
        self.delete_range(log_id.index, None)
    }

    async fn purge(&mut self, asked: LogId) -> Result<(), StorageError> {
        let log_id = match &self.purge_limit {
            None => asked,
            Some(limit) => match limit.allow(asked) {
                Some(allowed) if allowed >= asked => asked,
                allowed => {
                    tracing::info!(asked = %asked, allowed = ?allowed, "purge deferred until the snapshot installed is durable");
                    match allowed {
                        Some(allowed) => allowed,
                        None => return Ok(()),
                    }
                }
            },
        };
        if self.read_meta::<LogId>(LAST_PURGED)? >= Some(log_id) {
            return Ok(());
        }
        // The purge point first: a crash between the two leaves entries at or
        // below it, which `get_log_state` and reads treat as gone.
        self.write_meta(LAST_PURGED, &log_id)?;
        self.delete_range(0, Some(log_id.index + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, LoggedCondition, LoggedOp};
    use openraft::{CommittedLeaderId, EntryPayload};

    fn big_entry(index: u64, bytes: usize) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Command::Write {
                database: "d".into(),
                at_ms: 0,
                all_or_none: true,
                ops: vec![LoggedOp::Put {
                    id: format!("x/{index}"),
                    json: format!("{{\"pad\":\"{}\"}}", "x".repeat(bytes)),
                    condition: LoggedCondition::None,
                }],
            }),
        }
    }

    #[tokio::test]
    async fn an_append_to_a_follower_carries_a_bounded_number_of_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Options {
            journal_file_size_bytes: 64 << 20,
            ..Options::default()
        };
        let mut log = LogStore::open(dir.path(), storage).unwrap();
        {
            let mut w = log.env.begin_write().unwrap();
            for i in 1..=20 {
                let raw = serde_json::to_vec(&big_entry(i, 1 << 20)).unwrap();
                w.put(LOG, &i.to_be_bytes(), &raw).unwrap();
            }
            w.commit().unwrap();
        }
        // All 20 entries asked for: at most 4 MiB of them come back, in order.
        let got = log.limited_get_log_entries(1, 21).await.unwrap();
        assert!((3..=4).contains(&got.len()), "{} entries", got.len());
        let indexes: Vec<u64> = got.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indexes, (1..=got.len() as u64).collect::<Vec<_>>());
        // One entry larger than the budget still comes (never an empty answer).
        let mut w = log.env.begin_write().unwrap();
        let raw = serde_json::to_vec(&big_entry(21, 6 << 20)).unwrap();
        w.put(LOG, &21u64.to_be_bytes(), &raw).unwrap();
        w.commit().unwrap();
        assert_eq!(log.limited_get_log_entries(21, 22).await.unwrap().len(), 1);
        // Small entries: the whole range.
        assert_eq!(log.limited_get_log_entries(3, 4).await.unwrap().len(), 1);
    }
}
