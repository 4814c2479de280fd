//! The Raft log and vote in a kiln-storage environment of their own
//! (`<data>/cluster/raft`). An entry is stored under its index (big-endian, so
//! the tree's order is the log's); the vote and the last purged log id are JSON
//! values in a meta tree. Every change is one commit,
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
use std::sync::Arc;

const LOG: &str = "raft_log";
const META: &str = "raft_meta";
const VOTE: &[u8] = b"vote";
const LAST_PURGED: &[u8] = b"last_purged";

/// The log store; cheap to clone (a clone is a reader of the same log).
#[derive(Clone)]
pub struct LogStore {
    env: Arc<Env>,
    purge_limit: Option<PurgeLimit>,
}

/// How far the log may be purged: up to the state machine's last snapshot that is
/// durable, and no further. openraft purges a follower's log as soon as it hands
/// it a snapshot to install, before the install is done; a crash in between would
/// leave a log purged past anything the node holds (openraft then refuses to
/// start). Held back, the node restarts where it was and is sent the snapshot
/// again. Entries kept this way are dropped by a later purge.
#[derive(Clone, Default)]
pub struct PurgeLimit(Arc<parking_lot::Mutex<Option<LogId>>>);

impl PurgeLimit {
    /// A durable snapshot now covers the log up to `last_log_id`.
    pub fn raise_to(&self, last_log_id: Option<LogId>) {
        let mut limit = self.0.lock();
        if last_log_id > *limit {
            *limit = last_log_id;
        }
    }

    fn get(&self) -> Option<LogId> {
        *self.0.lock()
    }
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
        })
    }

    /// Purges go no further than `limit` (see [`PurgeLimit`]); without one, as far
    /// as asked.
    pub fn with_purge_limit(mut self, limit: PurgeLimit) -> LogStore {
        self.purge_limit = Some(limit);
        self
    }

    /// The environment, shared with the state machine (one journal for both).
    pub fn env(&self) -> Arc<Env> {
        self.env.clone()
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
    serde_json::from_slice(raw).map_err(|e| StorageIOError::read_logs(AnyError::new(&e)).into())
}

fn read_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    StorageIOError::read_logs(AnyError::new(e)).into()
}

fn write_err(e: &(impl std::error::Error + 'static)) -> StorageError {
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
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.read_meta(LAST_PURGED)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.write_meta(VOTE, vote)
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
        let result = (|| {
            let mut w = self.env.begin_write().map_err(|e| write_err(&e))?;
            for entry in entries {
                let raw = serde_json::to_vec(&entry).map_err(|e| write_err(&e))?;
                w.put(LOG, &entry.log_id.index.to_be_bytes(), &raw)
                    .map_err(|e| write_err(&e))?;
            }
            w.commit().map_err(|e| write_err(&e))?;
            Ok::<(), StorageError>(())
        })();
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
        self.delete_range(log_id.index, None)
    }

    async fn purge(&mut self, asked: LogId) -> Result<(), StorageError> {
        let log_id = match &self.purge_limit {
            None => asked,
            Some(limit) => match limit.get() {
                Some(limit) if limit < asked => {
                    tracing::info!(asked = %asked, limit = %limit, "purging the log only up to the durable snapshot");
                    limit
                }
                Some(_) => asked,
                None => {
                    tracing::info!(asked = %asked, "not purging the log: no durable snapshot yet");
                    return Ok(());
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
