//! The state machine: log entries applied to a [`DocStore`].
//!
//! A document write records its log index in the database's own transaction
//! (`Database::apply_logged`), so an entry is never applied twice to a database.
//! The last applied log id and the membership are kept beside the log (meta
//! tree `raft_state`): after a batch of document writes they are left for the
//! log's next append to carry (`log_store::Piggyback`), after any other entry
//! saved in a commit of their own. After a crash they may lag behind the
//! databases, and the entries in between are applied again as no-ops. That also
//! makes a snapshot exact although it is taken while entries are applied (one
//! database after another, each a consistent backup): it may hold more than its
//! last log id says, and what it holds twice is skipped.
//!
//! A snapshot is the databases' backup containers in a file (see [`crate::snapshot`]);
//! the current one's description is kept in `raft_state` too.

use crate::command::{default_classifier, Answer, ClassifyError, Command, LoggedOp, WriteAnswer};
use crate::log_store::{LogStore, Piggyback, PurgeLimit};
use crate::snapshot::{snapshot_err, SnapshotDir, SnapshotFile};
use crate::uploads;
use crate::{LogId, NodeId, StorageError, TypeConfig};
use kiln_docs::DatabaseError;
use kiln_docs::{Atomicity, BatchOutcome, DocError, DocId, DocStore, LoggedOutcome, WriteOp};
use kiln_storage::Env;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

const STATE: &str = "raft_state";
const APPLIED: &[u8] = b"applied";
/// The current snapshot's `SnapshotMeta` (JSON); its file is named by its id.
const SNAPSHOT: &[u8] = b"snapshot";

/// What the state machine keeps beside the databases.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, BasicNode>,
}

type Meta = SnapshotMeta<NodeId, BasicNode>;

struct Shared {
    store: Arc<DocStore>,
    env: Arc<Env>,
    classify: ClassifyError,
    snapshots: SnapshotDir,
    /// Raised once a snapshot is durable: the log store purges no further.
    purge_limit: PurgeLimit,
    /// The log's next append carries the applied state after document writes.
    piggyback: Piggyback,
    /// The last snapshot built or installed (the newest of both: a build runs
    /// beside the applying, so an install may finish first).
    snapshot: Mutex<Option<Meta>>,
    /// Where the cluster's API keys are kept on this node (`api_keys`).
    api_keys: Option<Arc<dyn crate::ApiKeyStore>>,
    /// Where a restore's upload waits while its database is replaced
    /// (`restoring` beside the snapshot directory).
    restoring_dir: std::path::PathBuf,
    /// Applying, saving and building that meet a full disk wait for space.
    disk_wait: crate::disk_wait::DiskWait,
}

/// The state machine; a clone shares it (the snapshot builder is one).
#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
    applied: Applied,
}

fn sm_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    crate::disk_wait::note(e);
    StorageIOError::write_state_machine(AnyError::new(e)).into()
}

/// Runs blocking document-store work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| sm_err(&e))?
}

impl StateMachine {
    /// The state machine over `store`, keeping its own state in the environment
    /// of `log` (one journal for both) and its snapshots in `snapshot_dir`.
    pub fn open(
        store: Arc<DocStore>,
        log: &LogStore,
        snapshot_dir: &Path,
        classify: Option<ClassifyError>,
        api_keys: Option<Arc<dyn crate::ApiKeyStore>>,
    ) -> Result<StateMachine, StorageError> {
        let env = log.env();
        let mut w = env.begin_write().map_err(|e| sm_err(&e))?;
        w.ensure_tree(STATE).map_err(|e| sm_err(&e))?;
        w.commit().map_err(|e| sm_err(&e))?;
        let (applied, mut snapshot) = {
            let r = env.begin_read().map_err(|e| sm_err(&e))?;
            let applied = match r.get(STATE, APPLIED).map_err(|e| sm_err(&e))? {
                None => Applied::default(),
                Some(raw) => serde_json::from_slice(raw).map_err(|e| sm_err(&e))?,
            };
            let snapshot: Option<Meta> = match r.get(STATE, SNAPSHOT).map_err(|e| sm_err(&e))? {
                None => None,
                Some(raw) => Some(serde_json::from_slice(raw).map_err(|e| sm_err(&e))?),
            };
            (applied, snapshot)
        };
        let snapshots = SnapshotDir::open(snapshot_dir)?;
        if let Some(meta) = &snapshot {
            if !snapshots.path_of(&meta.snapshot_id).exists() {
                tracing::warn!(snapshot = %meta.snapshot_id, "the current snapshot's file is missing: a new one will be built");
                snapshot = None;
            }
        }
        snapshots.remove_others(snapshot.as_ref().map(|m| m.snapshot_id.as_str()), true);
        let purge_limit = PurgeLimit::default();
        purge_limit.raise_to(snapshot.as_ref().and_then(|m| m.last_log_id));
        Ok(StateMachine {
            shared: Arc::new(Shared {
                store,
                env,
                classify: classify.unwrap_or_else(default_classifier),
                snapshots,
                purge_limit,
                piggyback: log.piggyback(),
                snapshot: Mutex::new(snapshot),
                api_keys,
                restoring_dir: snapshot_dir.with_file_name("restoring"),
                disk_wait: crate::disk_wait::DiskWait::default(),
            }),
            applied,
        })
    }

    pub fn store(&self) -> &Arc<DocStore> {
        &self.shared.store
    }

    /// How this state machine waits for disk space (give it to
    /// `LogStore::with_disk_wait`, and to the node's Raft route).
    pub fn disk_wait(&self) -> crate::disk_wait::DiskWait {
        self.shared.disk_wait.clone()
    }

    /// What the log store may purge up to (give it to `LogStore::with_purge_limit`).
    pub fn purge_limit(&self) -> PurgeLimit {
        self.shared.purge_limit.clone()
    }

    fn save_applied(&self) -> Result<(), StorageError> {
        self.save_state(Some(&self.applied), None)
    }

    /// Saves the applied state, a new current snapshot, or both in one commit.
    fn save_state(
        &self,
        applied: Option<&Applied>,
        snapshot: Option<&Meta>,
    ) -> Result<(), StorageError> {
        let env = &self.shared.env;
        let mut w = env.begin_write().map_err(|e| sm_err(&e))?;
        // What was left for the log's next append goes in this commit (which holds
        // the writer): a snapshot's commit purges the log up to its last log id,
        // and the applied state on disk must not stay behind that. An explicit
        // `applied` is newer and replaces it below.
        self.shared
            .piggyback
            .carry(&mut w)
            .map_err(|e| sm_err(&e))?;
        if let Some(applied) = applied {
            let raw = serde_json::to_vec(applied).map_err(|e| sm_err(&e))?;
            w.put(STATE, APPLIED, &raw).map_err(|e| sm_err(&e))?;
        }
        if let Some(meta) = snapshot {
            let raw = serde_json::to_vec(meta).map_err(|e| sm_err(&e))?;
            w.put(STATE, SNAPSHOT, &raw).map_err(|e| sm_err(&e))?;
            self.shared
                .purge_limit
                .raise_within(&mut w, meta.last_log_id)?;
        }
        w.commit().map_err(|e| sm_err(&e))?;
        Ok(())
    }

    /// Makes the promoted snapshot `meta` the current one, unless a newer one
    /// is (an install that finished while this was built); removes the others.
    fn set_current_snapshot(&self, meta: &Meta) -> Result<(), StorageError> {
        self.set_current_snapshot_with(meta, None)
    }

    /// `set_current_snapshot`, saving `applied` in the same commit (an install).
    fn set_current_snapshot_with(
        &self,
        meta: &Meta,
        applied: Option<&Applied>,
    ) -> Result<(), StorageError> {
        let mut current = self.shared.snapshot.lock();
        let newer_exists = current
            .as_ref()
            .is_some_and(|c| c.last_log_id > meta.last_log_id);
        if newer_exists {
            // Its file goes with the next cleanup; whoever opened it keeps reading.
            return match applied {
                Some(applied) => self.save_state(Some(applied), None),
                None => Ok(()),
            };
        }
        self.save_state(applied, Some(meta))?;
        *current = Some(meta.clone());
        self.shared
            .snapshots
            .remove_others(Some(&meta.snapshot_id), false);
        Ok(())
    }
}

/// Runs `step` (a delete, or a restore's replacement, of `database`) again for as
/// long as the database is busy on this node (a request of its own still holds
/// it after `delete_wait_ms`): the entry must apply here as on every other node,
/// and answering `database_busy` would leave this node with a database the
/// others no longer have. Each try waits `delete_wait_ms` itself.
fn until_not_busy<T>(
    what: &str,
    database: &str,
    mut step: impl FnMut() -> Result<T, DocError>,
) -> Result<T, DocError> {
    loop {
        match step() {
            Err(DocError::Database(DatabaseError::Busy { waited_ms, .. })) => {
                tracing::warn!(
                    database,
                    waited_ms,
                    "{what} the database as the log says: a request on this node still holds it; trying again"
                );
            }
            other => return other,
        }
    }
}

/// Applies one command to the store (blocking): a function per command, those
/// of attachments and their uploads through `execute_attachment`.
/// Borrows the command, so that trying it again on a full disk copies nothing.
fn execute(shared: &Shared, log_id: &LogId, command: &Command) -> Result<Answer, StorageError> {
    match command {
        Command::CreateDatabase { name, incarnation } => {
            shared.create_database(name.clone(), *incarnation)
        }
        Command::DeleteDatabase { name } => shared.delete_database(name.clone()),
        Command::DefineIndex {
            database,
            definition,
        } => shared.define_index(database, definition.clone()),
        Command::DeleteIndex { database, name } => shared.delete_index(database, name),
        Command::Write {
            database,
            at_ms,
            all_or_none,
            ops,
        } => shared.write(log_id, database, *at_ms, *all_or_none, ops),
        Command::SetRevisionsConfig { database, config } => {
            shared.set_revisions_config(log_id, database, config.clone())
        }
        Command::PurgeTombstones {
            database,
            incarnation,
            at_ms,
            below_sequence,
            older_than_ms,
        } => shared.purge_tombstones(
            database,
            *incarnation,
            *at_ms,
            *below_sequence,
            *older_than_ms,
        ),
        Command::PurgeRevisions { database, id } => shared.purge_revisions(log_id, database, id),
        Command::PutApiKey { record_json } => shared.put_api_key(record_json),
        Command::RestoreDatabase {
            database,
            at_ms,
            upload_id,
            size_bytes,
            hash,
            until,
        } => shared.restore_database(
            log_id,
            database,
            *at_ms,
            (*upload_id, *size_bytes, hash),
            until.as_deref(),
        ),
        Command::RevokeApiKey { id } => shared.revoke_api_key(id),
        command @ (Command::CreateSubscription { .. }
        | Command::DeleteSubscription { .. }
        | Command::AcknowledgeSubscription { .. }) => execute_subscription(shared, log_id, command),
        command @ (Command::AttachmentChunk { .. }
        | Command::DropUpload { .. }
        | Command::PutAttachment { .. }
        | Command::DeleteAttachment { .. }
        | Command::StageAttachment { .. }) => execute_attachment(shared, log_id, command),
    }
}

/// Applies one command of attachments and their uploads (blocking).
fn execute_attachment(
    shared: &Shared,
    log_id: &LogId,
    command: &Command,
) -> Result<Answer, StorageError> {
    match command {
        Command::AttachmentChunk {
            database,
            at_ms,
            upload_id,
            offset,
            keep_until_ms,
            bytes,
        } => shared.attachment_chunk(database, *at_ms, *upload_id, *offset, *keep_until_ms, bytes),
        Command::DropUpload {
            database,
            upload_id,
        } => shared.drop_upload(database, *upload_id),
        Command::PutAttachment {
            database,
            at_ms,
            upload_id,
            id,
            name,
            content_type,
            size_bytes,
            hash,
            condition,
        } => shared.put_attachment(
            log_id,
            database,
            *at_ms,
            *upload_id,
            (id, name, content_type),
            *size_bytes,
            hash,
            condition,
        ),
        Command::DeleteAttachment {
            database,
            at_ms,
            id,
            name,
            condition,
        } => shared.delete_attachment(log_id, database, *at_ms, id, name, condition),
        Command::StageAttachment {
            database,
            at_ms,
            upload_id,
            size_bytes,
            hash,
        } => shared.stage_attachment(log_id, database, *at_ms, *upload_id, *size_bytes, hash),
        // `execute` passes on only the commands above: a refusal, not a panic in the
        // apply loop, if that ever stops being so.
        _ => Err(StorageIOError::write_state_machine(AnyError::error(
            "a command other than an attachment's was handed to the attachments' commands",
        ))
        .into()),
    }
}

/// Applies one command of data subscriptions (blocking): each claims its log
/// index in its database, so an entry applied before a crash is not applied again.
fn execute_subscription(
    shared: &Shared,
    log_id: &LogId,
    command: &Command,
) -> Result<Answer, StorageError> {
    let index = log_id.index;
    let applied =
        match command {
            Command::CreateSubscription {
                database,
                at_ms,
                name,
                query,
                parameters,
                start,
            } => shared.store.database(database).and_then(|db| {
                let start = kiln_docs::SubscriptionStart::parse(start);
                let parameters = parameters.clone();
                db.create_subscription_logged(index, *at_ms, name, query, parameters, start)
                    .map(|created| created.map(|_| Answer::SubscriptionCreated))
            }),
            Command::DeleteSubscription { database, name } => {
                shared.store.database(database).and_then(|db| {
                    db.delete_subscription_logged(index, name)
                        .map(|deleted| deleted.then_some(Answer::SubscriptionDeleted))
                })
            }
            Command::AcknowledgeSubscription {
                database,
                at_ms,
                name,
                up_to,
            } => shared.store.database(database).and_then(|db| {
                db.acknowledge_subscription_logged(index, *at_ms, name, *up_to)
                    .map(|position| {
                        position.map(|position| Answer::SubscriptionAcknowledged { position })
                    })
            }),
            _ => return Err(StorageIOError::write_state_machine(AnyError::error(
                "a command other than a subscription's was handed to the subscriptions' commands",
            ))
            .into()),
        };
    match applied {
        Ok(answer) => Ok(answer.unwrap_or(Answer::AlreadyApplied)),
        Err(e) => shared.storage_or(e),
    }
}

/// How long a purge of tombstones waits for this node's indexes to read the
/// change log up to its bound before rebuilding one that lags
/// (`Database::purge_tombstones_logged`).
const PURGE_INDEX_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Applying the commands, one function each (blocking).
impl Shared {
    /// The answer to a command that failed, the same on every node.
    fn failed(&self, e: &DocError) -> Answer {
        Answer::Failed((self.classify)(e))
    }

    /// A failure of the disk stops the state machine (Raft then stops the node); any
    /// other error is the command's answer, the same on every node.
    fn storage_or(&self, e: DocError) -> Result<Answer, StorageError> {
        match e {
            DocError::Storage(_) | DocError::Io { .. } => Err(sm_err(&e)),
            e => Ok(self.failed(&e)),
        }
    }

    fn create_database(&self, name: String, incarnation: u32) -> Result<Answer, StorageError> {
        if let Ok(db) = self.store.database(&name) {
            // Created by this very entry before a restart, or an error.
            return Ok(if db.incarnation() == incarnation {
                Answer::AlreadyApplied
            } else {
                self.failed(&DocError::Database(DatabaseError::Exists(name)))
            });
        }
        match self
            .store
            .create_database_with_incarnation(&name, incarnation)
        {
            Ok(_) => Ok(Answer::DatabaseCreated { name, incarnation }),
            Err(e) => self.storage_or(e),
        }
    }

    fn delete_database(&self, name: String) -> Result<Answer, StorageError> {
        match until_not_busy("deleting", &name, || self.store.delete_database(&name)) {
            Ok(()) => Ok(Answer::DatabaseDeleted { name }),
            Err(e) => self.storage_or(e),
        }
    }

    fn define_index(
        &self,
        database: &str,
        definition: kiln_docs::IndexDefinition,
    ) -> Result<Answer, StorageError> {
        match self
            .store
            .database(database)
            .and_then(|db| db.define_index(definition))
        {
            Ok(created) => Ok(Answer::IndexDefined { created }),
            Err(e) => self.storage_or(e),
        }
    }

    fn delete_index(&self, database: &str, name: &str) -> Result<Answer, StorageError> {
        match self
            .store
            .database(database)
            .and_then(|db| db.delete_index(name))
        {
            Ok(()) => Ok(Answer::IndexDeleted),
            Err(e) => self.storage_or(e),
        }
    }

    /// The writes of one entry, through `Database::apply_logged` (applied once).
    fn write(
        &self,
        log_id: &LogId,
        database: &str,
        at_ms: u64,
        all_or_none: bool,
        ops: &[LoggedOp],
    ) -> Result<Answer, StorageError> {
        let db = match self.store.database(database) {
            Ok(db) => db,
            Err(e) => return Ok(self.failed(&e)),
        };
        // Any entry of the database at the leader's time removes the uploads
        // abandoned before it (`uploads`).
        uploads::expire(&db, at_ms).map_err(|e| sm_err(&e))?;
        let atomicity = if all_or_none {
            Atomicity::AllOrNone
        } else {
            Atomicity::Each
        };
        let mut parsed = Vec::with_capacity(ops.len());
        for op in ops {
            match to_write_op(&db, op) {
                Ok(op) => parsed.push(op),
                // The leader parsed the writes before logging them: a write that does
                // not parse here fails the entry on every node.
                Err(e) => return Ok(self.failed(&e)),
            }
        }
        match db.apply_logged(log_id.index, at_ms, parsed, atomicity) {
            Ok(outcome) => Ok(logged_answer(self, outcome)),
            Err(e) => self.storage_or(e),
        }
    }

    fn set_revisions_config(
        &self,
        log_id: &LogId,
        database: &str,
        config: kiln_docs::RevisionsConfig,
    ) -> Result<Answer, StorageError> {
        match self
            .store
            .database(database)
            .and_then(|db| db.set_revisions_config_logged(log_id.index, config))
        {
            Ok(true) => Ok(Answer::RevisionsConfigSet),
            Ok(false) => Ok(Answer::AlreadyApplied),
            Err(e) => self.storage_or(e),
        }
    }

    fn purge_tombstones(
        &self,
        database: &str,
        incarnation: u32,
        at_ms: u64,
        below_sequence: u64,
        older_than_ms: Option<u64>,
    ) -> Result<Answer, StorageError> {
        let purged = self.store.database(database).and_then(|db| {
            uploads::expire(&db, at_ms)?;
            if db.incarnation() != incarnation {
                // Deleted and created again since the leader took the etag.
                return Err(DocError::Database(
                    DatabaseError::EtagFromOtherIncarnation {
                        etag: db.etag_at(below_sequence).to_string(),
                        database: database.to_string(),
                    },
                ));
            }
            let cutoff_ms = older_than_ms.map(|age| at_ms.saturating_sub(age));
            db.purge_tombstones_logged(below_sequence, cutoff_ms, PURGE_INDEX_WAIT)
        });
        match purged {
            // Applied again after a restart it removes nothing more: the same
            // bound and cutoff, and every delete since has a later sequence.
            Ok(out) => Ok(Answer::TombstonesPurged {
                purged: out.purged,
                remaining: out.remaining,
                purged_below_sequence: out.purged_below_sequence,
            }),
            Err(e) => self.storage_or(e),
        }
    }

    fn purge_revisions(
        &self,
        log_id: &LogId,
        database: &str,
        id: &str,
    ) -> Result<Answer, StorageError> {
        match self
            .store
            .database(database)
            .and_then(|db| db.purge_revisions_logged(log_id.index, id))
        {
            Ok(Some(count)) => Ok(Answer::RevisionsPurged { count }),
            Ok(None) => Ok(Answer::AlreadyApplied),
            Err(e) => self.storage_or(e),
        }
    }

    /// Restores `database` from a backup sent through the log (see
    /// `Command::RestoreDatabase`). The upload is first moved out of the database's
    /// directory, which the restore replaces, so that a crash anywhere finds it
    /// again: before the restore is in place the entry is applied again from it;
    /// after, the restored database's recorded log index says it was applied.
    fn restore_database(
        &self,
        log_id: &LogId,
        database: &str,
        at_ms: u64,
        (upload_id, size_bytes, hash): (u64, u64, &str),
        until: Option<&str>,
    ) -> Result<Answer, StorageError> {
        let staged = self.restoring_dir.join(format!("{upload_id:016x}"));
        if let Ok(db) = self.store.database(database) {
            if db.applied_log_index().map_err(|e| sm_err(&e))? >= log_id.index {
                let _ = std::fs::remove_file(&staged);
                return Ok(Answer::AlreadyApplied);
            }
            let taken =
                uploads::expire(&db, at_ms).and_then(|_| uploads::take(&db, upload_id, &staged));
            taken.map_err(|e| sm_err(&e))?;
        }
        let result = self.restore_from(&staged, log_id, database, (size_bytes, hash), until);
        if let Err(e) = std::fs::remove_file(&staged) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(sm_err(&e));
            }
        }
        match result {
            Ok(report) => Ok(Answer::Restored {
                report_json: serde_json::to_string(&report).unwrap_or_default(),
            }),
            Err(e) => self.storage_or(e),
        }
    }

    /// The restore of `restore_database` from the upload at `staged`, checked first.
    fn restore_from(
        &self,
        staged: &Path,
        log_id: &LogId,
        database: &str,
        (size_bytes, hash): (u64, &str),
        until: Option<&str>,
    ) -> Result<kiln_docs::RestoreReport, DocError> {
        use sha2::Digest;
        let invalid = |what: String| {
            DocError::Backup(kiln_storage::BackupError::Corrupt {
                part: "the restore's upload".into(),
                offset: 0,
                what,
            })
        };
        if !staged.exists() {
            return Err(invalid("not here (it expired or was never sent)".into()));
        }
        let point = match until {
            Some(text) => kiln_docs::RestorePoint::parse(text)?,
            None => kiln_docs::RestorePoint::Latest,
        };
        let decode = uploads::decoder_under(self.env.master_key());
        let mut hasher = sha2::Sha256::new();
        let mut reader = uploads::open_plain(staged, decode.as_deref())?;
        let got_size = std::io::copy(&mut reader, &mut hasher).map_err(|source| DocError::Io {
            path: staged.to_path_buf(),
            source,
        })?;
        let got_hash = hex::encode(hasher.finalize());
        if got_size != size_bytes || got_hash != hash {
            return Err(invalid(format!(
                "{got_size} bytes hashing to {got_hash}; the entry names {size_bytes} bytes \
                 hashing to {hash} (a chunk is missing)"
            )));
        }
        until_not_busy("restoring", database, || {
            let source =
                kiln_docs::RestoreSource::Stream(uploads::open_plain(staged, decode.as_deref())?);
            self.store
                .restore_database_logged(source, database, point.clone(), log_id.index)
        })
    }

    /// The key store, or the answer of a node without one.
    fn key_store(&self) -> Result<&dyn crate::ApiKeyStore, Answer> {
        self.api_keys.as_deref().ok_or_else(|| {
            Answer::Failed(crate::ErrorAnswer {
                code: "internal_error".into(),
                message: "this node keeps no API keys (it runs without a key store)".into(),
                current_etag: None,
            })
        })
    }

    /// Saves an API key's record. A key file that cannot be read or written (an
    /// operator's edit that broke its JSON, a full disk) is waited out: the entry
    /// is tried again every `disk_wait::RETRY_INTERVAL` until the file is mended,
    /// with the error in the log (`disk_wait::note_mendable`), instead of stopping
    /// this node's Raft for good.
    fn put_api_key(&self, record_json: &str) -> Result<Answer, StorageError> {
        let keys = match self.key_store() {
            Ok(keys) => keys,
            Err(answer) => return Ok(answer),
        };
        keys.put(record_json).map_err(|e| {
            crate::disk_wait::note_mendable(KEY_FILE_WAIT);
            sm_err(&std::io::Error::other(format!("saving an API key: {e}")))
        })?;
        Ok(Answer::ApiKeySaved)
    }

    fn revoke_api_key(&self, id: &str) -> Result<Answer, StorageError> {
        let keys = match self.key_store() {
            Ok(keys) => keys,
            Err(answer) => return Ok(answer),
        };
        let existed = keys.revoke(id).map_err(|e| {
            crate::disk_wait::note_mendable(KEY_FILE_WAIT);
            sm_err(&std::io::Error::other(format!(
                "revoking API key {id}: {e}"
            )))
        })?;
        Ok(Answer::ApiKeyRevoked { existed })
    }

    fn attachment_chunk(
        &self,
        database: &str,
        at_ms: u64,
        upload_id: u64,
        offset: u64,
        keep_until_ms: u64,
        bytes: &[u8],
    ) -> Result<Answer, StorageError> {
        let written = self.store.database(database).and_then(|db| {
            uploads::expire(&db, at_ms)?;
            uploads::write_chunk(&db, upload_id, offset, keep_until_ms, bytes)
        });
        match written {
            Ok(()) => Ok(Answer::UploadWritten),
            Err(e) => self.storage_or(e),
        }
    }

    fn drop_upload(&self, database: &str, upload_id: u64) -> Result<Answer, StorageError> {
        match self
            .store
            .database(database)
            .and_then(|db| uploads::remove(&db, upload_id))
        {
            Ok(()) => Ok(Answer::UploadWritten),
            Err(e) => self.storage_or(e),
        }
    }

    /// An attachment put of the log: the upload checked and attached (the
    /// attachment's `id`, `name` and `content_type`), then removed.
    #[allow(clippy::too_many_arguments)]
    fn put_attachment(
        &self,
        log_id: &LogId,
        database: &str,
        at_ms: u64,
        upload_id: u64,
        (id, name, content_type): (&str, &str, &str),
        size_bytes: u64,
        hash: &str,
        condition: &crate::command::LoggedCondition,
    ) -> Result<Answer, StorageError> {
        let log_index = log_id.index;
        let attach = |db: &kiln_docs::Database| {
            uploads::expire(db, at_ms)?;
            // Applied before a restart: the upload may be gone or partial by now, and
            // must not be checked (its check would fail where it once succeeded).
            if db.applied_log_index()? >= log_index {
                return Ok(None);
            }
            let condition = condition.to_condition()?;
            let blob = finished_upload(db, upload_id, size_bytes, hash)?;
            db.put_attachment_logged(log_index, at_ms, id, name, content_type, blob, condition)
        };
        self.consuming_upload(database, upload_id, attach, |result| {
            attachment_answer(self, result)
        })
    }

    fn delete_attachment(
        &self,
        log_id: &LogId,
        database: &str,
        at_ms: u64,
        id: &str,
        name: &str,
        condition: &crate::command::LoggedCondition,
    ) -> Result<Answer, StorageError> {
        let result = self.store.database(database).and_then(|db| {
            uploads::expire(&db, at_ms)?;
            let condition = condition.to_condition()?;
            db.delete_attachment_logged(log_id.index, at_ms, id, name, condition)
        });
        attachment_answer(self, result)
    }

    /// An upload of the log staged for a batch, then removed.
    fn stage_attachment(
        &self,
        log_id: &LogId,
        database: &str,
        at_ms: u64,
        upload_id: u64,
        size_bytes: u64,
        hash: &str,
    ) -> Result<Answer, StorageError> {
        let log_index = log_id.index;
        let stage = |db: &kiln_docs::Database| {
            uploads::expire(db, at_ms)?;
            // As in `put_attachment`: an entry applied before is not checked again.
            if db.applied_log_index()? >= log_index {
                return Ok(None);
            }
            let blob = finished_upload(db, upload_id, size_bytes, hash)?;
            db.stage_attachment_logged(log_index, at_ms, blob)
        };
        self.consuming_upload(database, upload_id, stage, |result| match result {
            Ok(Some((hash, size_bytes))) => Ok(Answer::AttachmentStaged { hash, size_bytes }),
            Ok(None) => Ok(Answer::AlreadyApplied),
            Err(e) => self.storage_or(e),
        })
    }

    /// An entry that consumes the upload `upload_id`: `step` on its database, the
    /// upload removed, then the answer to the step's result.
    fn consuming_upload<T>(
        &self,
        database: &str,
        upload_id: u64,
        step: impl FnOnce(&kiln_docs::Database) -> T,
        answer: impl FnOnce(T) -> Result<Answer, StorageError>,
    ) -> Result<Answer, StorageError> {
        let db = match self.store.database(database) {
            Ok(db) => db,
            Err(e) => return Ok(self.failed(&e)),
        };
        let result = step(&db);
        // Consumed whatever the outcome (after the commit: a crash before it
        // finds the upload for the entry's replay).
        uploads::remove(&db, upload_id).map_err(|e| sm_err(&e))?;
        answer(result)
    }
}

/// The finished upload `upload_id`, checked to be `size_bytes` hashing to `hash`.
pub(crate) fn finished_upload(
    db: &kiln_docs::Database,
    upload_id: u64,
    size_bytes: u64,
    hash: &str,
) -> Result<kiln_docs::StagedBlob, DocError> {
    let path = uploads::finished_path(db, upload_id, size_bytes)?;
    match uploads::decoder(db) {
        Some(decode) => db.attachment_from_upload_through(&path, hash, size_bytes, Some(&*decode)),
        None => db.attachment_from_upload(&path, hash, size_bytes),
    }
}

/// The answer to an attachment write: one write's outcome, as a `Write` entry's.
fn attachment_answer(
    shared: &Shared,
    result: Result<Option<kiln_docs::PutOutcome>, DocError>,
) -> Result<Answer, StorageError> {
    Ok(match result {
        Ok(Some(out)) => Answer::Writes(vec![write_answer(BatchOutcome::Put(out))]),
        Ok(None) => Answer::AlreadyApplied,
        Err(DocError::Database(DatabaseError::NotFound(name))) => Answer::Failed(
            (shared.classify)(&DocError::Database(DatabaseError::NotFound(name))),
        ),
        Err(e @ (DocError::Storage(_) | DocError::Io { .. })) => return Err(sm_err(&e)),
        Err(e) => Answer::Writes(vec![WriteAnswer::Failed((shared.classify)(&e))]),
    })
}

/// The document-layer write a logged one asks for; borrowed, so that a run can
/// fall back to its entries one by one without having copied every document.
fn to_write_op(db: &kiln_docs::Database, op: &LoggedOp) -> Result<WriteOp, DocError> {
    Ok(match op {
        LoggedOp::Put {
            id,
            json,
            condition,
        } => WriteOp::Put {
            id: if id.ends_with('/') {
                DocId::Generate { prefix: id.clone() }
            } else {
                DocId::Given(id.clone())
            },
            document: db.parse_document(json.as_bytes())?,
            condition: condition.to_condition()?,
        },
        LoggedOp::Delete { id, condition } => WriteOp::Delete {
            id: id.clone(),
            condition: condition.to_condition()?,
        },
        LoggedOp::Attributed { key_id, op } => {
            to_write_op(db, op)?.attributed(Some(key_id.clone()))
        }
    })
}

fn write_answer(o: BatchOutcome) -> WriteAnswer {
    match o {
        BatchOutcome::Put(p) => WriteAnswer::Put {
            id: p.id,
            etag: p.etag.to_string(),
            collection: p.collection,
            last_modified_ms: p.last_modified_ms,
            created: p.created,
        },
        BatchOutcome::Delete(d) => WriteAnswer::Delete {
            id: d.id,
            deleted_etag: d.etag.to_string(),
            etag: d.tombstone_etag.to_string(),
        },
    }
}

/// Entries of independent writes to one database, in log order.
#[derive(Default)]
struct Run {
    database: Option<String>,
    entries: Vec<(LogId, u64, Vec<LoggedOp>)>,
}

impl StateMachine {
    async fn apply_one(
        &mut self,
        log_id: LogId,
        payload: EntryPayload<TypeConfig>,
    ) -> Result<Answer, StorageError> {
        Ok(match payload {
            EntryPayload::Blank => Answer::Nothing,
            EntryPayload::Membership(m) => {
                self.applied.membership = StoredMembership::new(Some(log_id), m);
                Answer::Nothing
            }
            EntryPayload::Normal(command) => {
                let shared = self.shared.clone();
                blocking(move || {
                    let wait = &shared.disk_wait;
                    wait.blocking("applying a log entry", || {
                        execute(&shared, &log_id, &command)
                    })
                })
                .await?
            }
        })
    }

    async fn apply_run(&mut self, run: Run) -> Result<Vec<Answer>, StorageError> {
        let Some(database) = run.database else {
            return Ok(Vec::new());
        };
        let shared = self.shared.clone();
        blocking(move || {
            let wait = &shared.disk_wait;
            wait.blocking("applying log entries", || {
                execute_run(&shared, &database, &run.entries)
            })
        })
        .await
    }
}

/// Why an entry that changes API keys waits (the key store's error beside it in
/// the log line).
const KEY_FILE_WAIT: &str =
    "the API key file cannot be read or written (malformed, or the disk is full): waiting until it can";

/// A run of independent-write entries to `database` in one transaction; when the
/// run fails as a whole (a write that spoils the transaction), each entry again on
/// its own, which gives the outcomes applying them one by one gives.
fn execute_run(
    shared: &Shared,
    database: &str,
    entries: &[(LogId, u64, Vec<LoggedOp>)],
) -> Result<Vec<Answer>, StorageError> {
    if entries.len() <= 1 {
        return entries
            .iter()
            .map(|(log_id, at_ms, ops)| shared.write(log_id, database, *at_ms, false, ops))
            .collect();
    }
    let db = match shared.store.database(database) {
        Ok(db) => db,
        Err(e) => return Ok(entries.iter().map(|_| shared.failed(&e)).collect()),
    };
    let latest_ms = entries.iter().map(|e| e.1).max().unwrap_or(0);
    uploads::expire(&db, latest_ms).map_err(|e| sm_err(&e))?;
    let mut answers: Vec<Option<Answer>> = entries.iter().map(|_| None).collect();
    let mut run = Vec::with_capacity(entries.len());
    let mut places = Vec::with_capacity(entries.len());
    for (place, (log_id, at_ms, ops)) in entries.iter().enumerate() {
        // As in `write`: an entry whose write does not parse fails on every node.
        match ops.iter().map(|op| to_write_op(&db, op)).collect() {
            Ok(ops) => {
                run.push(kiln_docs::LoggedEntry {
                    log_index: log_id.index,
                    at_ms: *at_ms,
                    ops,
                });
                places.push(place);
            }
            Err(e) => answers[place] = Some(shared.failed(&e)),
        }
    }
    match db.apply_logged_run(run) {
        Ok(outcomes) => {
            for (place, outcome) in places.into_iter().zip(outcomes) {
                answers[place] = Some(logged_answer(shared, outcome));
            }
            Ok(answers
                .into_iter()
                .map(|a| a.unwrap_or(Answer::Nothing))
                .collect())
        }
        Err(DocError::Storage(e)) => Err(sm_err(&e)),
        // Nothing of the run was written: one entry at a time.
        Err(_) => entries
            .iter()
            .map(|(log_id, at_ms, ops)| shared.write(log_id, database, *at_ms, false, ops))
            .collect(),
    }
}

fn logged_answer(shared: &Shared, outcome: LoggedOutcome) -> Answer {
    match outcome {
        LoggedOutcome::AlreadyApplied => Answer::AlreadyApplied,
        LoggedOutcome::Applied(results) => Answer::Writes(
            results
                .into_iter()
                .map(|r| match r {
                    Ok(o) => write_answer(o),
                    Err(e) => WriteAnswer::Failed((shared.classify)(&e)),
                })
                .collect(),
        ),
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, BasicNode>), StorageError> {
        Ok((self.applied.last_applied, self.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Answer>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut answers = Vec::new();
        // Consecutive entries of independent writes to one database are applied
        // as one run, in one transaction (`Database::apply_logged_run`).
        let mut run = Run::default();
        // Whether every entry was a document write (or blank): applied again after
        // a crash, each is a no-op, so the applied state need not be durable now.
        let mut only_writes = true;
        for entry in entries {
            only_writes &= matches!(
                entry.payload,
                EntryPayload::Blank | EntryPayload::Normal(Command::Write { .. })
            );
            // openraft applies the entries after the last applied one in order (as
            // `applied_state` reports it after a restart, or an installed snapshot
            // left it): an entry applied twice, or out of order, is a bug.
            if let Some(last) = self.applied.last_applied {
                assert!(
                    entry.log_id.index > last.index,
                    "log entry {} applied after entry {}: entries are applied once each, in increasing log index order",
                    entry.log_id.index,
                    last.index
                );
            }
            self.applied.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Normal(Command::Write {
                    database,
                    at_ms,
                    all_or_none: false,
                    ops,
                }) => {
                    if run.database.as_ref().is_some_and(|d| *d != database) {
                        answers.extend(self.apply_run(std::mem::take(&mut run)).await?);
                    }
                    run.database = Some(database);
                    run.entries.push((entry.log_id, at_ms, ops));
                }
                payload => {
                    answers.extend(self.apply_run(std::mem::take(&mut run)).await?);
                    answers.push(self.apply_one(entry.log_id, payload).await?);
                }
            }
        }
        answers.extend(self.apply_run(run).await?);
        if only_writes {
            let raw = serde_json::to_vec(&self.applied).map_err(|e| sm_err(&e))?;
            self.shared.piggyback.leave(STATE, APPLIED, raw);
        } else {
            let me = self.clone();
            blocking(move || {
                let wait = &me.shared.disk_wait;
                wait.blocking("saving the applied state", || me.save_applied())
            })
            .await?;
        }
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        Ok(Box::new(self.shared.snapshots.receiving().await?))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        mut snapshot: Box<SnapshotFile>,
    ) -> Result<(), StorageError> {
        use tokio::io::AsyncWriteExt;
        snapshot.flush().await.map_err(|e| snapshot_err(&e))?;
        let received = snapshot.path().to_path_buf();
        drop(snapshot);
        tracing::info!(snapshot = %meta.snapshot_id, "installing a snapshot");
        let me = self.clone();
        let id = meta.snapshot_id.clone();
        blocking(move || {
            let path = me.shared.snapshots.promote(&received, &id)?;
            me.shared.disk_wait.blocking("installing a snapshot", || {
                crate::snapshot::install(&me.shared.store, &path, me.shared.api_keys.as_deref())
            })
        })
        .await?;
        self.applied = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        let me = self.clone();
        let meta = meta.clone();
        // The applied state, the snapshot and the log purge it allows: one commit.
        blocking(move || {
            let wait = &me.shared.disk_wait;
            wait.blocking("recording an installed snapshot", || {
                me.set_current_snapshot_with(&meta, Some(&me.applied))
            })
        })
        .await?;
        tracing::info!("snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let current = self.shared.snapshot.lock().clone();
        let Some(meta) = current else {
            return Ok(None);
        };
        let file = self
            .shared
            .snapshots
            .open_snapshot(&meta.snapshot_id)
            .await?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // The state as of now is at least this: see the module documentation.
        let applied = self.applied.clone();
        let me = self.clone();
        let (meta, file) = blocking(move || {
            // A build that meets a full disk removes its file and starts again.
            let (built, size_bytes) =
                me.shared.disk_wait.blocking("building a snapshot", || {
                    me.shared
                        .snapshots
                        .build(&me.shared.store, me.shared.api_keys.as_deref())
                })?;
            let at_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            // Unique: a snapshot of the same point built again (after a restart)
            // is another file, and a follower never mixes chunks of the two.
            let meta = Meta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership,
                snapshot_id: format!(
                    "{}-{}-{at_ms}",
                    applied.last_applied.map_or(0, |l| l.leader_id.term),
                    applied.last_applied.map_or(0, |l| l.index)
                ),
            };
            me.shared.snapshots.promote(&built, &meta.snapshot_id)?;
            // Opened before it can become an older snapshot that a cleanup removes.
            let file = me
                .shared
                .snapshots
                .open_snapshot_blocking(&meta.snapshot_id)?;
            tracing::info!(snapshot = %meta.snapshot_id, size_bytes, "built a snapshot");
            me.set_current_snapshot(&meta)?;
            Ok((meta, file))
        })
        .await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}
