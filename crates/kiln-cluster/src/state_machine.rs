//! The state machine: log entries applied to a [`DocStore`].
//!
//! A document write records its log index in the database's own transaction
//! (`Database::apply_logged`), so an entry is never applied twice to a database.
//! The last applied log id and the membership are kept beside the log (meta
//! tree `raft_state`), written after each batch of entries: after a crash they may
//! lag behind the databases, and the entries in between are applied again as
//! no-ops. That also makes a snapshot exact although it is taken while entries
//! are applied (one database after another, each a consistent backup): it may
//! hold more than its last log id says, and what it holds twice is skipped.
//!
//! A snapshot is the databases' backup containers, one after another:
//! `name length u32 | name | container length u64 | container`, big-endian.

use crate::command::{default_classifier, Answer, ClassifyError, Command, LoggedOp, WriteAnswer};
use crate::{LogId, NodeId, StorageError, TypeConfig};
use kiln_docs::{
    Atomicity, BatchOutcome, DocError, DocId, DocStore, LoggedOutcome, RestorePoint, RestoreSource,
    WriteOp,
};
use kiln_storage::Env;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::sync::Arc;

const STATE: &str = "raft_state";
const APPLIED: &[u8] = b"applied";

/// What the state machine keeps beside the databases.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, BasicNode>,
}

/// A snapshot's description and bytes.
type StoredSnapshot = (SnapshotMeta<NodeId, BasicNode>, Arc<Vec<u8>>);

struct Shared {
    store: Arc<DocStore>,
    env: Arc<Env>,
    classify: ClassifyError,
    /// The last snapshot built or installed.
    snapshot: Mutex<Option<StoredSnapshot>>,
    snapshots_built: std::sync::atomic::AtomicU64,
}

/// The state machine; a clone shares it (the snapshot builder is one).
#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
    applied: Applied,
}

fn sm_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    StorageIOError::write_state_machine(AnyError::new(e)).into()
}

fn snapshot_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    StorageIOError::write_snapshot(None, AnyError::new(e)).into()
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
    /// The state machine over `store`, keeping its own state in `env` (the log
    /// store's environment: one journal for both).
    pub fn open(
        store: Arc<DocStore>,
        env: Arc<Env>,
        classify: Option<ClassifyError>,
    ) -> Result<StateMachine, StorageError> {
        let mut w = env.begin_write().map_err(|e| sm_err(&e))?;
        w.ensure_tree(STATE).map_err(|e| sm_err(&e))?;
        w.commit().map_err(|e| sm_err(&e))?;
        let applied = {
            let r = env.begin_read().map_err(|e| sm_err(&e))?;
            match r.get(STATE, APPLIED).map_err(|e| sm_err(&e))? {
                None => Applied::default(),
                Some(raw) => serde_json::from_slice(raw).map_err(|e| sm_err(&e))?,
            }
        };
        Ok(StateMachine {
            shared: Arc::new(Shared {
                store,
                env,
                classify: classify.unwrap_or_else(default_classifier),
                snapshot: Mutex::new(None),
                snapshots_built: Default::default(),
            }),
            applied,
        })
    }

    pub fn store(&self) -> &Arc<DocStore> {
        &self.shared.store
    }

    fn save_applied(&self) -> Result<(), StorageError> {
        let raw = serde_json::to_vec(&self.applied).map_err(|e| sm_err(&e))?;
        let env = &self.shared.env;
        let mut w = env.begin_write().map_err(|e| sm_err(&e))?;
        w.put(STATE, APPLIED, &raw).map_err(|e| sm_err(&e))?;
        w.commit().map_err(|e| sm_err(&e))?;
        Ok(())
    }
}

/// Applies one command to the store (blocking).
fn execute(shared: &Shared, log_id: &LogId, command: Command) -> Result<Answer, StorageError> {
    let store = &shared.store;
    let failed = |e: &DocError| Answer::Failed((shared.classify)(e));
    match command {
        Command::CreateDatabase { name, incarnation } => create_database(shared, name, incarnation),
        Command::DeleteDatabase { name } => Ok(match store.delete_database(&name) {
            Ok(()) => Answer::DatabaseDeleted { name },
            Err(e) => storage_or(e, failed)?,
        }),
        Command::DefineIndex {
            database,
            definition,
        } => Ok(
            match store
                .database(&database)
                .and_then(|db| db.define_index(definition))
            {
                Ok(created) => Answer::IndexDefined { created },
                Err(e) => storage_or(e, failed)?,
            },
        ),
        Command::DeleteIndex { database, name } => Ok(
            match store
                .database(&database)
                .and_then(|db| db.delete_index(&name))
            {
                Ok(()) => Answer::IndexDeleted,
                Err(e) => storage_or(e, failed)?,
            },
        ),
        Command::Write {
            database,
            at_ms,
            all_or_none,
            ops,
        } => write(shared, log_id, &database, at_ms, all_or_none, ops),
    }
}

fn create_database(
    shared: &Shared,
    name: String,
    incarnation: u32,
) -> Result<Answer, StorageError> {
    let failed = |e: &DocError| Answer::Failed((shared.classify)(e));
    if let Ok(db) = shared.store.database(&name) {
        // Created by this very entry before a restart, or an error.
        return Ok(if db.incarnation() == incarnation {
            Answer::AlreadyApplied
        } else {
            failed(&DocError::DatabaseExists(name))
        });
    }
    Ok(
        match shared
            .store
            .create_database_with_incarnation(&name, incarnation)
        {
            Ok(_) => Answer::DatabaseCreated { name, incarnation },
            Err(e) => storage_or(e, failed)?,
        },
    )
}

/// The writes of one entry, through `Database::apply_logged` (applied once).
fn write(
    shared: &Shared,
    log_id: &LogId,
    database: &str,
    at_ms: u64,
    all_or_none: bool,
    ops: Vec<LoggedOp>,
) -> Result<Answer, StorageError> {
    let failed = |e: &DocError| Answer::Failed((shared.classify)(e));
    let db = match shared.store.database(database) {
        Ok(db) => db,
        Err(e) => return Ok(failed(&e)),
    };
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
            Err(e) => return Ok(failed(&e)),
        }
    }
    match db.apply_logged(log_id.index, at_ms, parsed, atomicity) {
        Ok(outcome) => Ok(logged_answer(shared, outcome)),
        Err(e) => storage_or(e, failed),
    }
}

/// A failure of the disk stops the state machine (Raft then stops the node); any
/// other error is the command's answer, the same on every node.
fn storage_or(e: DocError, failed: impl Fn(&DocError) -> Answer) -> Result<Answer, StorageError> {
    match e {
        DocError::Storage(_) | DocError::Io { .. } => Err(sm_err(&e)),
        e => Ok(failed(&e)),
    }
}

fn to_write_op(db: &kiln_docs::Database, op: LoggedOp) -> Result<WriteOp, DocError> {
    Ok(match op {
        LoggedOp::Put {
            id,
            json,
            condition,
        } => WriteOp::Put {
            id: if id.ends_with('/') {
                DocId::Generate { prefix: id }
            } else {
                DocId::Given(id)
            },
            document: db.parse_document(json.as_bytes())?,
            condition: condition.to_condition()?,
        },
        LoggedOp::Delete { id, condition } => WriteOp::Delete {
            id,
            condition: condition.to_condition()?,
        },
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
                blocking(move || execute(&shared, &log_id, command)).await?
            }
        })
    }

    async fn apply_run(&mut self, run: Run) -> Result<Vec<Answer>, StorageError> {
        let Some(database) = run.database else {
            return Ok(Vec::new());
        };
        let shared = self.shared.clone();
        blocking(move || execute_run(&shared, &database, run.entries)).await
    }
}

/// A run of independent-write entries to `database` in one transaction; when the
/// run fails as a whole (a write that spoils the transaction), each entry again on
/// its own, which gives the outcomes applying them one by one gives.
fn execute_run(
    shared: &Shared,
    database: &str,
    entries: Vec<(LogId, u64, Vec<LoggedOp>)>,
) -> Result<Vec<Answer>, StorageError> {
    if entries.len() <= 1 {
        return entries
            .into_iter()
            .map(|(log_id, at_ms, ops)| write(shared, &log_id, database, at_ms, false, ops))
            .collect();
    }
    let failed = |e: &DocError| Answer::Failed((shared.classify)(e));
    let db = match shared.store.database(database) {
        Ok(db) => db,
        Err(e) => return Ok(entries.iter().map(|_| failed(&e)).collect()),
    };
    let mut answers: Vec<Option<Answer>> = entries.iter().map(|_| None).collect();
    let mut run = Vec::with_capacity(entries.len());
    let mut places = Vec::with_capacity(entries.len());
    for (place, (log_id, at_ms, ops)) in entries.iter().enumerate() {
        // As in `write`: an entry whose write does not parse fails on every node.
        match ops.iter().cloned().map(|op| to_write_op(&db, op)).collect() {
            Ok(ops) => {
                run.push(kiln_docs::LoggedEntry {
                    log_index: log_id.index,
                    at_ms: *at_ms,
                    ops,
                });
                places.push(place);
            }
            Err(e) => answers[place] = Some(failed(&e)),
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
            .into_iter()
            .map(|(log_id, at_ms, ops)| write(shared, &log_id, database, at_ms, false, ops))
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
        for entry in entries {
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
        let me = self.clone();
        blocking(move || me.save_applied()).await?;
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = Arc::new(snapshot.into_inner());
        let shared = self.shared.clone();
        let data = bytes.clone();
        blocking(move || install(&shared.store, &data)).await?;
        self.applied = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        let me = self.clone();
        blocking(move || me.save_applied()).await?;
        *self.shared.snapshot.lock() = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self
            .shared
            .snapshot
            .lock()
            .as_ref()
            .map(|(meta, bytes)| Snapshot {
                meta: meta.clone(),
                snapshot: Box::new(Cursor::new(bytes.as_ref().clone())),
            }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // The state as of now is at least this: see the module documentation.
        let applied = self.applied.clone();
        let shared = self.shared.clone();
        let bytes = Arc::new(blocking(move || build(&shared.store)).await?);
        let n = self
            .shared
            .snapshots_built
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership,
            snapshot_id: format!("{}-{n}", applied.last_applied.map_or(0, |l| l.index)),
        };
        *self.shared.snapshot.lock() = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes.as_ref().clone())),
        })
    }
}

/// Every database's backup container, one after another.
fn build(store: &DocStore) -> Result<Vec<u8>, StorageError> {
    let mut out = Vec::new();
    let mut names = store.database_names();
    names.sort();
    for name in names {
        let Ok(db) = store.database(&name) else {
            continue; // deleted meanwhile: its delete entry is applied after this
        };
        let mut container = Vec::new();
        match db.backup_to(&mut container, Default::default(), |_| {}) {
            Ok(_) => {}
            Err(DocError::DatabaseNotFound(_)) => continue,
            Err(e) => return Err(snapshot_err(&e)),
        }
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(container.len() as u64).to_be_bytes());
        out.extend_from_slice(&container);
    }
    Ok(out)
}

/// Replaces the store's databases with a snapshot's: each restored (replacing the
/// one of its name), and any database the snapshot does not hold deleted.
fn install(store: &DocStore, data: &[u8]) -> Result<(), StorageError> {
    let bad = |what: &str| {
        snapshot_err(&std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("snapshot: {what}"),
        ))
    };
    struct Parts<'a>(&'a [u8]);
    impl<'a> Parts<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            (self.0.len() >= n).then(|| {
                let (part, rest) = self.0.split_at(n);
                self.0 = rest;
                part
            })
        }
    }
    let mut parts = Parts(data);
    let mut kept = Vec::new();
    while !parts.0.is_empty() {
        let mut take = |n: usize| parts.take(n).ok_or_else(|| bad("truncated"));
        let name_len = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad("name length"))?);
        let name = std::str::from_utf8(take(name_len as usize)?)
            .map_err(|_| bad("a database name is not UTF-8"))?
            .to_string();
        let len = u64::from_be_bytes(take(8)?.try_into().map_err(|_| bad("length"))?);
        let container = take(usize::try_from(len).map_err(|_| bad("length"))?)?;
        let source = RestoreSource::Stream(Box::new(Cursor::new(container)));
        store
            .restore_database(source, &name, true, RestorePoint::Latest, |_| {})
            .map_err(|e| snapshot_err(&e))?;
        kept.push(name);
    }
    for name in store.database_names() {
        if !kept.contains(&name) {
            store.delete_database(&name).map_err(|e| snapshot_err(&e))?;
        }
    }
    Ok(())
}
