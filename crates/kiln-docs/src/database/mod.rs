//! One database: a storage environment holding documents, the collection index,
//! per-collection counts and the etag counter, the change log, the backup history
//! and the indexes (its trees: `schema.rs`).

mod apply;
mod logged;
pub(crate) use logged::{claim_log_index, set_applied_log_index_at};
pub use logged::{Atomicity, LoggedEntry, LoggedOutcome};
pub(crate) mod history;

pub(crate) use apply::{apply_attachment, replay, Unit as ReplayUnit};

use crate::changes::CommitNotifier;
use crate::model::document::PreparedDoc;
use crate::model::limits::{check_id, IdRule};
use crate::model::schema::{
    collection_key, decode_u64, ATTACHMENT_REFS, BY_COLLECTION, COUNTS, DATABASE_TREES,
    EXPIRATION_IDS, HISTORY, META, META_CHAIN, META_INCARNATION, META_LAST_ETAG, TOMBSTONES,
};
use crate::stored::read_last_sequence;
use crate::{DatabaseError, DocumentError};
use crate::{DocError, Document, Etag, Result};
use apply::{apply_op, Possible, Unit};
use kiln_storage::{Env, ReadTxn};
use serde_json::Value;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A precondition on the current state of a document, checked inside the write's
/// transaction (so two writers with the same `IfMatch` cannot both win).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    None,
    /// The document exists and has this etag (HTTP `If-Match: "<etag>"`).
    IfMatch(Etag),
    /// The document exists (HTTP `If-Match: *`).
    IfExists,
    /// The document does not exist (HTTP `If-None-Match: *` on a write).
    IfNotExists,
}

/// Which id a put writes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocId {
    Given(String),
    /// A new unique id under this prefix, which ends with `/` (`users/` -> `users/17`).
    Generate {
        prefix: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutOutcome {
    pub id: String,
    pub etag: Etag,
    pub collection: Option<String>,
    pub last_modified_ms: u64,
    /// False when an existing document was replaced.
    pub created: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteOutcome {
    pub id: String,
    /// The etag the document had when it was deleted.
    pub etag: Etag,
    /// The etag of the delete itself (its tombstone's place in the change log).
    pub tombstone_etag: Etag,
}

#[derive(Debug, Clone)]
pub enum BatchOp {
    Put {
        id: DocId,
        document: Value,
        condition: Condition,
    },
    Delete {
        id: String,
        condition: Condition,
    },
}

/// A document parsed and checked ahead of its write (e.g. on a server's request
/// thread), so that the write itself only splices in the metadata.
#[derive(Debug, Clone)]
pub struct ParsedDocument(PreparedDoc);

impl ParsedDocument {
    pub fn parse(json: &[u8]) -> Result<ParsedDocument> {
        PreparedDoc::parse(json)
            .map(ParsedDocument)
            .map_err(DocError::from)
    }
}

/// One write of `Database::write_each`.
#[derive(Debug, Clone)]
pub enum WriteOp {
    Put {
        id: DocId,
        document: ParsedDocument,
        condition: Condition,
    },
    Delete {
        id: String,
        condition: Condition,
    },
    /// A JSON merge patch (RFC 7396, `merge_patch.rs`) of an existing document:
    /// read, merged and written inside the write's own transaction, so that two
    /// concurrent patches of one document both land (neither overwrites the
    /// other's change with what it read before). `condition` is checked against the
    /// document as read there; a document that does not exist is `DocumentNotFound`.
    Patch {
        id: String,
        patch: Value,
        condition: Condition,
    },
    /// A write made with an API key: the key's id is kept with the revisions of
    /// the version it writes (`revisions/`). Made by `WriteOp::attributed`.
    Attributed {
        key_id: String,
        op: Box<WriteOp>,
    },
}

impl WriteOp {
    /// The id of the document this write looks up, if given.
    fn looked_up_id(&self) -> Option<&str> {
        match self {
            WriteOp::Put {
                id: DocId::Given(id),
                ..
            }
            | WriteOp::Delete { id, .. }
            | WriteOp::Patch { id, .. } => Some(id),
            WriteOp::Put { .. } => None,
            WriteOp::Attributed { op, .. } => op.looked_up_id(),
        }
    }

    /// This write, made by the API key `key_id` (as it is without one).
    pub fn attributed(self, key_id: Option<String>) -> WriteOp {
        let op = match self {
            WriteOp::Attributed { op, .. } => *op,
            op => op,
        };
        match key_id {
            Some(key_id) => WriteOp::Attributed {
                key_id,
                op: Box::new(op),
            },
            None => op,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    Put(PutOutcome),
    Delete(DeleteOutcome),
}

/// One page of a listing. `next` is given to the same call to get the next page;
/// `None` means this was the last.
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionCount {
    pub name: String,
    pub documents: u64,
}

#[derive(Debug, Clone)]
pub struct DatabaseStats {
    pub name: String,
    pub documents: u64,
    pub last_etag: Option<Etag>,
    pub collections: Vec<CollectionCount>,
    /// The backup chain and its history, if one is active.
    pub backup_chain: Option<crate::BackupChainStats>,
    /// The fingerprint of the master key an encrypted database is under; `None`
    /// when its files are not encrypted.
    pub encryption_key_fingerprint: Option<String>,
    pub engine: kiln_storage::Stats,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_document_bytes: usize,
    pub max_id_bytes: usize,
    pub max_batch_ops: usize,
    pub indexing: crate::index::IndexingOptions,
    /// How new records' bodies are compressed (`record`).
    pub compression: crate::DocumentCompression,
    /// `DocsOptions::expire_staged_at_open`.
    pub expire_staged_at_open: bool,
}

pub struct Database {
    /// `None` only while closing (see `close_env`).
    env: Option<Env>,
    /// The database's directory (its environment; `search/` for full-text indexes).
    dir: std::path::PathBuf,
    name: String,
    pub(crate) incarnation: u32,
    limits: Limits,
    deleted: AtomicBool,
    pub(crate) notifier: CommitNotifier,
    /// Whether the database may have tombstones, expiring documents (see
    /// `apply::Unit`).
    possible: Possible,
    /// The latest time a write unit of this database took (`Unit::stamp`).
    write_clock_ms: Arc<std::sync::atomic::AtomicU64>,
    /// True while a backup chain is active (`meta` has `backup_chain`): writes then
    /// also go to the backup history.
    pub(crate) history_on: Arc<AtomicBool>,
    /// The background indexer and the running indexes (see `index/`).
    indexer: crate::index::Indexer,
    /// Which collections keep revisions, as the write path reads it (`revisions/`).
    pub(crate) revisions: crate::revisions::SharedConfig,
    /// Which worker holds each data subscription (`subscriptions/lease.rs`).
    pub(crate) subscription_leases: Arc<crate::subscriptions::LeaseTable>,
    /// The attachments' bytes (`attachments/`).
    pub(crate) blobs: Arc<crate::attachments::BlobStore>,
}

impl Database {
    /// Opens the environment at `dir`; with `new_incarnation`, first writes the
    /// trees and meta of a new database with that incarnation (the etags' suffix).
    pub(crate) fn open(
        name: &str,
        dir: &std::path::Path,
        opts: kiln_storage::Options,
        limits: Limits,
        new_incarnation: Option<u32>,
    ) -> Result<Database> {
        let env = Env::open(dir, opts)?;
        if let Some(incarnation) = new_incarnation {
            write_new_database(&env, incarnation)?;
        }
        let incarnation = read_incarnation(&env, name)?;
        upgrade_layout(&env, name)?;
        let blobs = open_attachments(&env, dir, name, &limits)?;
        let (last_sequence, last_write_ms, possible, indexes, chain) = {
            let r = env.begin_read()?;
            let last_sequence = read_last_sequence(&r)?;
            let possible = Possible {
                tombstones: Arc::new(AtomicBool::new(r.tree_len(TOMBSTONES)? > 0)),
                expirations: Arc::new(AtomicBool::new(r.tree_len(EXPIRATION_IDS)? > 0)),
            };
            (
                last_sequence,
                logged::resumed_write_clock_ms(
                    &r,
                    crate::changes::last_write_ms(&r, incarnation, last_sequence)?,
                )?,
                possible,
                crate::index::load(&r, &env, dir, incarnation)?,
                r.get(META, META_CHAIN)?.is_some(),
            )
        };
        let revisions = crate::revisions::load_config(&env)?;
        Ok(Database {
            env: Some(env),
            dir: dir.to_path_buf(),
            name: name.to_string(),
            incarnation,
            limits,
            deleted: AtomicBool::new(false),
            notifier: CommitNotifier::new(last_sequence),
            possible,
            // A wall clock that stepped back across a restart must not give the
            // next write an earlier time than the last one (see `Unit::stamp`).
            write_clock_ms: Arc::new(std::sync::atomic::AtomicU64::new(last_write_ms)),
            history_on: Arc::new(AtomicBool::new(chain)),
            indexer: crate::index::Indexer::new(limits.indexing, indexes),
            revisions,
            subscription_leases: Arc::default(),
            blobs: Arc::new(blobs),
        })
    }

    pub(crate) fn indexer(&self) -> &crate::index::Indexer {
        &self.indexer
    }

    pub(crate) fn read_last_sequence(&self, r: &ReadTxn<'_>) -> Result<u64> {
        read_last_sequence(r)
    }

    /// Tells waiting readers about writes that are now durable, and unlinks the
    /// attachments' blobs they freed.
    pub(crate) fn published<'a>(&self, outcomes: impl IntoIterator<Item = &'a BatchOutcome>) {
        if let Some(env) = &self.env {
            if let Err(e) = self.blobs.release_pending(env) {
                // The write stands; the file goes at the next open (`gc`).
                tracing::warn!(database = %self.name, error = %e, "attachments: could not unlink a freed blob");
            }
        }
        let last = outcomes
            .into_iter()
            .map(|o| match o {
                BatchOutcome::Put(p) => p.etag.sequence,
                BatchOutcome::Delete(d) => d.tombstone_etag.sequence,
            })
            .max();
        if let Some(last) = last {
            self.notifier.published(last);
        }
    }

    /// The etags' suffix, chosen when the database was created.
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The storage environment (for stats and maintenance).
    pub fn env(&self) -> &Env {
        self.env
            .as_ref()
            .expect("the environment is only taken when the database closes")
    }

    /// Why the database's storage latched, if it did: it refuses writes until it is
    /// reopened (for the server: until a restart).
    pub fn failure(&self) -> Option<kiln_storage::Failure> {
        self.env.as_ref().and_then(|e| e.failure())
    }

    /// Set while write-back waits for disk space (resumes by itself).
    pub fn write_back_stalled(&self) -> Option<kiln_storage::Failure> {
        self.env.as_ref().and_then(|e| e.write_back_stalled())
    }

    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::SeqCst);
    }

    pub(crate) fn close_env(&mut self) -> Result<()> {
        // Full-text indexes first: their writers' threads and files go before the
        // database's directory may be moved to trash and removed (delete, restore).
        self.indexer.clear();
        match self.env.take() {
            Some(env) => Ok(env.close()?),
            None => Ok(()),
        }
    }

    pub(crate) fn live(&self) -> Result<&Env> {
        if self.deleted.load(Ordering::SeqCst) {
            return Err(DocError::Database(DatabaseError::NotFound(
                self.name.clone(),
            )));
        }
        Ok(self.env())
    }

    /// The state a commit-queue unit of this database's writes starts with.
    pub(crate) fn unit(&self) -> Unit {
        Unit::new(
            self.incarnation,
            self.limits,
            Some(self.write_clock_ms.clone()),
            self.possible.clone(),
            self.history_on.clone(),
        )
        .with_revisions(crate::revisions::UnitConfig::shared(self.revisions.clone()))
        .with_blobs(self.blobs.clone())
    }

    /// Checks a document's id against this database's limit (`DocsOptions::max_id_bytes`).
    pub(crate) fn check_document_id(&self, id: &str) -> Result<()> {
        check_id(
            id,
            IdRule::Configured {
                max_bytes: self.limits.max_id_bytes,
            },
        )
        .map_err(DocError::from)
    }

    /// Checks a given id, or a prefix for a generated one, against this database's
    /// rules; a streaming writer calls it per line so a bad id stops the stream there.
    pub fn check_id(&self, id: &DocId) -> Result<()> {
        match id {
            DocId::Given(id) => self.check_document_id(id),
            DocId::Generate { prefix } => {
                if !prefix.ends_with('/') {
                    return Err(DocError::Document(DocumentError::InvalidId {
                        id: prefix.clone(),
                        why: "a prefix for a generated id must end with '/'".into(),
                    }));
                }
                // Room for the generated number.
                check_id(
                    prefix,
                    IdRule::GeneratedPrefix {
                        max_bytes: self.limits.max_id_bytes,
                    },
                )
                .map_err(DocError::from)
            }
        }
    }

    fn check_body_size(&self, len: usize) -> Result<()> {
        if len > self.limits.max_document_bytes {
            return Err(DocError::Document(DocumentError::TooLarge {
                len,
                max: self.limits.max_document_bytes,
            }));
        }
        Ok(())
    }

    /// Checks a document's size against this database's limit and parses it, ready
    /// for `write_each`.
    pub fn parse_document(&self, json: &[u8]) -> Result<ParsedDocument> {
        self.check_body_size(json.len())?;
        ParsedDocument::parse(json)
    }

    /// Writes a document (JSON text of an object). Durable when it returns.
    pub fn put(&self, id: &str, json: &[u8], condition: Condition) -> Result<PutOutcome> {
        self.put_to(DocId::Given(id.to_string()), json, condition)
    }

    /// Writes a document under a given or a generated id.
    pub fn put_to(&self, id: DocId, json: &[u8], condition: Condition) -> Result<PutOutcome> {
        let env = self.live()?;
        self.check_id(&id)?;
        self.check_body_size(json.len())?;
        let document = ParsedDocument(PreparedDoc::parse(json)?);
        match self.write_one(
            env,
            WriteOp::Put {
                id,
                document,
                condition,
            },
        )? {
            BatchOutcome::Put(p) => Ok(p),
            BatchOutcome::Delete(_) => {
                Err(DocError::Internal("a put came back as a delete".into()))
            }
        }
    }

    /// One write in its own unit; its error comes back as it is.
    fn write_one(&self, env: &Env, op: WriteOp) -> Result<BatchOutcome> {
        read_ahead(env, std::slice::from_ref(&op));
        let mut unit = self.unit();
        let out = env.submit_with(move |txn| {
            let mut run = |txn: &mut kiln_storage::WriteTxn<'_>| -> Result<BatchOutcome> {
                let out = apply_op(txn, &mut unit, &op)?;
                unit.finish(txn)?;
                Ok(out)
            };
            run(txn)
        })?;
        self.published(std::iter::once(&out));
        Ok(out)
    }

    /// Merges `patch` (a JSON merge patch, RFC 7396) into the document `id`, read
    /// and written in one transaction; `DocumentNotFound` if there is none. Durable
    /// when it returns.
    pub fn patch(&self, id: &str, patch: Value, condition: Condition) -> Result<PutOutcome> {
        let env = self.live()?;
        let op = WriteOp::Patch {
            id: id.to_string(),
            patch,
            condition,
        };
        self.check_op(&op)?;
        match self.write_one(env, op)? {
            BatchOutcome::Put(p) => Ok(p),
            BatchOutcome::Delete(_) => {
                Err(DocError::Internal("a patch came back as a delete".into()))
            }
        }
    }

    /// Deletes a document; `DocumentNotFound` if there is none.
    pub fn delete(&self, id: &str, condition: Condition) -> Result<DeleteOutcome> {
        let env = self.live()?;
        self.check_document_id(id)?;
        let op = WriteOp::Delete {
            id: id.to_string(),
            condition,
        };
        match self.write_one(env, op)? {
            BatchOutcome::Delete(d) => Ok(d),
            BatchOutcome::Put(_) => Err(DocError::Internal("a delete came back as a put".into())),
        }
    }

    /// Applies all operations in one transaction: all of them or none.
    pub fn batch(&self, ops: Vec<BatchOp>) -> Result<Vec<BatchOutcome>> {
        self.batch_as(ops, None)
    }

    /// `batch`, made by the API key `key_id` (kept with the revisions it writes).
    pub fn batch_as(&self, ops: Vec<BatchOp>, key_id: Option<String>) -> Result<Vec<BatchOutcome>> {
        self.live()?;
        self.check_batch_len(ops.len())?;
        let mut prepared = Vec::with_capacity(ops.len());
        for (index, op) in ops.into_iter().enumerate() {
            let op = match op {
                BatchOp::Put {
                    id,
                    document,
                    condition,
                } => WriteOp::Put {
                    id,
                    document: ParsedDocument(
                        PreparedDoc::from_value(document).map_err(at_index(index))?,
                    ),
                    condition,
                },
                BatchOp::Delete { id, condition } => WriteOp::Delete { id, condition },
            };
            prepared.push(op.attributed(key_id.clone()));
        }
        self.write_all(prepared)
    }

    /// Writes one batch may hold at most (`DocsOptions::max_batch_ops`).
    pub fn max_batch_ops(&self) -> usize {
        self.limits.max_batch_ops
    }

    fn check_batch_len(&self, len: usize) -> Result<()> {
        if len > self.limits.max_batch_ops {
            return Err(DocError::Database(DatabaseError::BatchTooLong {
                len,
                max: self.limits.max_batch_ops,
            }));
        }
        Ok(())
    }

    /// Applies parsed writes in one transaction: all of them or none (a bulk insert's
    /// batch, a client's batch). The first failing write's error names its index.
    pub fn write_all(&self, ops: Vec<WriteOp>) -> Result<Vec<BatchOutcome>> {
        self.check_all(&ops)?;
        self.submit_all(Arc::new(ops))
    }

    /// `write_all` for a bulk insert's batch: when the commit queue refuses it as
    /// overloaded (a group held past `QueueLimits::max_queue_delay_ms`, as when the
    /// kernel throttles a long load's write-back), the batch, which was not applied,
    /// is submitted again after a pause, for up to `BULK_OVERLOAD_PATIENCE`. A bulk
    /// client is already held back by its stream; failing its load on a stall of a
    /// few seconds would only make it start over. Interactive writes keep failing
    /// fast (`write_all`, `write_each`).
    pub fn write_all_patiently(&self, ops: Vec<WriteOp>) -> Result<Vec<BatchOutcome>> {
        self.check_all(&ops)?;
        let ops = Arc::new(ops);
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            match self.submit_all(ops.clone()) {
                Err(DocError::Storage(e))
                    if e.kind() == kiln_storage::ErrorKind::Overloaded
                        && started.elapsed() < BULK_OVERLOAD_PATIENCE =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                other => return other,
            }
        }
    }

    fn check_all(&self, ops: &[WriteOp]) -> Result<()> {
        self.live()?;
        self.check_batch_len(ops.len())?;
        for (index, op) in ops.iter().enumerate() {
            self.check_op(op).map_err(at_index(index))?;
        }
        Ok(())
    }

    /// One commit-queue unit applying `ops` (checked) all or none.
    fn submit_all(&self, ops: Arc<Vec<WriteOp>>) -> Result<Vec<BatchOutcome>> {
        let env = self.live()?;
        read_ahead(env, &ops);
        let mut unit = self.unit();
        let out = env.submit_with(move |txn| {
            let mut out = Vec::with_capacity(ops.len());
            for (index, op) in ops.iter().enumerate() {
                out.push(apply_op(txn, &mut unit, op).map_err(|e| match e {
                    DocError::Storage(s) => DocError::Storage(s),
                    other => at_index(index)(other),
                })?);
            }
            unit.finish(txn)?;
            Ok::<_, DocError>(out)
        })?;
        self.published(&out);
        Ok(out)
    }

    fn check_op(&self, op: &WriteOp) -> Result<()> {
        match op {
            WriteOp::Put { id, .. } => self.check_id(id),
            WriteOp::Delete { id, .. } => self.check_document_id(id),
            WriteOp::Patch { id, patch, .. } => {
                self.check_document_id(id)?;
                crate::model::merge_patch::check_document_patch(patch).map_err(DocError::from)
            }
            WriteOp::Attributed { op, .. } => self.check_op(op),
        }
    }

    /// Applies independent writes in ONE commit-queue unit, each succeeding or
    /// failing on its own (a conflict fails only its write), and returns one result
    /// per write, in order. A server gathers the writes of concurrent requests into
    /// one call so that they cost one hand-off to the commit queue instead of one
    /// each. A storage failure fails them all.
    pub fn write_each(&self, ops: Vec<WriteOp>) -> Vec<Result<BatchOutcome>> {
        let n = ops.len();
        let env = match self.live() {
            Ok(env) => env,
            Err(_) => {
                return (0..n)
                    .map(|_| {
                        Err(DocError::Database(DatabaseError::NotFound(
                            self.name.clone(),
                        )))
                    })
                    .collect()
            }
        };
        let (checked, early) = self.check_each(ops);
        read_ahead(env, &checked);
        let mut unit = self.unit();
        let applied = env.submit_with(move |txn| {
            let mut out = Vec::with_capacity(checked.len());
            for op in &checked {
                match apply_op(txn, &mut unit, op) {
                    Err(e) if !e.leaves_transaction_untouched() => return Err(e),
                    r => out.push(r),
                }
            }
            unit.finish(txn)?;
            Ok(out)
        });
        match applied {
            Ok(results) => {
                self.published(results.iter().filter_map(|r| r.as_ref().ok()));
                each_result(early, results)
            }
            Err(e) => each_failed(early, e),
        }
    }

    /// The writes of `write_each` that pass their checks, and for each write the
    /// error of its check, if it failed.
    fn check_each(&self, ops: Vec<WriteOp>) -> (Vec<WriteOp>, Vec<Option<DocError>>) {
        let mut checked = Vec::with_capacity(ops.len());
        let mut early: Vec<Option<DocError>> = Vec::with_capacity(ops.len());
        for op in ops {
            match self.check_op(&op) {
                Ok(()) => {
                    checked.push(op);
                    early.push(None);
                }
                Err(e) => early.push(Some(e)),
            }
        }
        (checked, early)
    }

    /// Reads a document from the latest committed snapshot.
    pub fn get(&self, id: &str) -> Result<Option<Document>> {
        self.get_with(id, |view| Document::from_view(id, view))
    }

    /// The document `id` as `read` makes of it, borrowed from the read snapshot
    /// (an answer written straight from it copies the JSON once, not twice; a
    /// record of format 2 has its JSON written out first, `record::Record::to_json`).
    pub fn get_with<R>(
        &self,
        id: &str,
        read: impl FnOnce(crate::DocumentView<'_>) -> R,
    ) -> Result<Option<R>> {
        let env = self.live()?;
        self.check_document_id(id)?;
        let r = env.begin_read()?;
        match crate::stored::get(&r, id)? {
            None => Ok(None),
            Some(bytes) => {
                let rec = crate::model::record::decode(id, bytes)?;
                let json = rec.to_json(id)?;
                Ok(Some(read(rec.view(&json))))
            }
        }
    }

    /// Documents whose id starts with `prefix`, in id order, after `start_after`.
    pub fn list_by_prefix(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Page<Document>> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let start = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after.as_bytes()),
            _ => Bound::Included(prefix.as_bytes()),
        };
        let mut items: Vec<Document> = Vec::new();
        let mut next = None;
        crate::stored::scan_by_id(&r, start, |id, record| {
            if !id.starts_with(prefix) {
                return Ok(false);
            }
            if items.len() == limit {
                next = items.last().map(|d| d.id.clone());
                return Ok(false);
            }
            items.push(Document::from_record(id, record)?);
            Ok(true)
        })?;
        Ok(Page { items, next })
    }

    /// Documents of a collection in etag order (oldest write first), after the
    /// document whose etag is `after` (the `next` of the previous page: an etag of
    /// this database, as every cursor of the document layer is).
    pub fn list_collection(
        &self,
        collection: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<Document>> {
        let env = self.live()?;
        crate::model::id::validate_collection(collection)?;
        let after = match after {
            Some(etag) => Some(self.sequence_of(etag)?),
            None => None,
        };
        let r = env.begin_read()?;
        let start = collection_key(collection, after.map_or(0, |a| a.saturating_add(1)));
        let prefix = &start[..collection.len() + 1];
        let mut cursor = r.cursor(BY_COLLECTION)?;
        let mut entry = cursor.seek(&start)?;
        let mut items: Vec<Document> = Vec::new();
        while let Some((key, id)) = entry {
            if !key.starts_with(prefix) || after == Some(u64::MAX) {
                break;
            }
            if items.len() == limit {
                let next = items.last().map(|d| d.etag.to_string());
                return Ok(Page { items, next });
            }
            let id = String::from_utf8_lossy(id).into_owned();
            let sequence = decode_u64(&key[prefix.len()..], "collection entry")?;
            let bytes = crate::stored::get_at(&r, &id, sequence)?;
            items.push(Document::from_record(&id, bytes)?);
            entry = cursor.next()?;
        }
        Ok(Page { items, next: None })
    }

    /// Named collections and their document counts, by name.
    pub fn collections(&self) -> Result<Vec<CollectionCount>> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let mut cursor = r.cursor(COUNTS)?;
        let mut out = Vec::new();
        let mut entry = cursor.first()?;
        while let Some((name, count)) = entry {
            out.push(CollectionCount {
                name: String::from_utf8_lossy(name).into_owned(),
                documents: decode_u64(count, "collection count")?,
            });
            entry = cursor.next()?;
        }
        Ok(out)
    }

    pub fn document_count(&self) -> Result<u64> {
        let env = self.live()?;
        crate::stored::count(&env.begin_read()?)
    }

    pub fn stats(&self) -> Result<DatabaseStats> {
        let env = self.live()?;
        let (documents, last) = {
            let r = env.begin_read()?;
            (crate::stored::count(&r)?, read_last_sequence(&r)?)
        };
        Ok(DatabaseStats {
            name: self.name.clone(),
            documents,
            last_etag: (last > 0).then_some(Etag {
                incarnation: self.incarnation,
                sequence: last,
            }),
            collections: self.collections()?,
            backup_chain: self.backup_chain_stats()?,
            encryption_key_fingerprint: env.master_key().map(kiln_storage::MasterKey::fingerprint),
            engine: env.stats(),
        })
    }
}

/// Writes the trees and meta of a new database with `incarnation` (the etags'
/// suffix).
fn write_new_database(env: &Env, incarnation: u32) -> Result<()> {
    let mut w = env.begin_write()?;
    for tree in DATABASE_TREES {
        w.ensure_tree(tree)?;
    }
    w.put(META, META_INCARNATION, &incarnation.to_be_bytes())?;
    w.put(META, META_LAST_ETAG, &0u64.to_be_bytes())?;
    w.commit()?;
    Ok(())
}

/// The incarnation in database `name`'s meta.
fn read_incarnation(env: &Env, name: &str) -> Result<u32> {
    let r = env.begin_read()?;
    let missing = |what: &str| {
        DocError::Document(DocumentError::Corrupt {
            id: format!("(database {name} meta)"),
            why: format!("{what} is missing or malformed"),
        })
    };
    if !r.tree_exists(META)? {
        return Err(missing("the meta tree"));
    }
    let raw = r
        .get(META, META_INCARNATION)?
        .ok_or_else(|| missing("incarnation"))?;
    Ok(u32::from_be_bytes(
        raw.try_into().map_err(|_| missing("incarnation"))?,
    ))
}

/// Brings a database made by an earlier version to the current layout.
fn upgrade_layout(env: &Env, name: &str) -> Result<()> {
    crate::changes::upgrade::add_change_log(env, name)?;
    crate::expiration::upgrade::add_expiration_index(env, name)?;
    // After the upgrades above, which read the documents where they were.
    crate::stored::migrate(env, name)?;
    // Databases made before backup chains get the (empty) history tree.
    if !env.begin_read()?.tree_exists(HISTORY)? {
        env.submit(|w| w.ensure_tree(HISTORY))?;
    }
    Ok(())
}

/// The attachments' blob store of the database at `dir`.
fn open_attachments(
    env: &Env,
    dir: &std::path::Path,
    name: &str,
    limits: &Limits,
) -> Result<crate::attachments::BlobStore> {
    // Every database gets the attachments' reference tree (older ones at their
    // first open since), and loses what a crash left of its uploads and frees.
    if !env.begin_read()?.tree_exists(ATTACHMENT_REFS)? {
        env.submit(|w| w.ensure_tree(ATTACHMENT_REFS))?;
    }
    let blobs = crate::attachments::BlobStore::open(dir, env)?;
    // A cluster's staged blobs expire at leader time, by the log: not here.
    let staged_now_ms = if limits.expire_staged_at_open {
        crate::model::time::now_ms()
    } else {
        0
    };
    let removed = blobs.gc(env, staged_now_ms)?;
    if removed > 0 {
        tracing::info!(
            database = name,
            files = removed,
            "attachments: removed unreferenced files at open"
        );
    }
    Ok(blobs)
}

/// The result of each write of `write_each`, in order: the error of its check
/// (`early`), or what applying it gave (`results`, in the order of the writes
/// that passed).
fn each_result(
    early: Vec<Option<DocError>>,
    results: Vec<Result<BatchOutcome>>,
) -> Vec<Result<BatchOutcome>> {
    let mut results = results.into_iter();
    early
        .into_iter()
        .map(|e| match e {
            Some(e) => Err(e),
            None => results
                .next()
                .unwrap_or_else(|| Err(DocError::Internal("a write lost its result".into()))),
        })
        .collect()
}

/// The result of each write of `write_each` whose unit failed with `e`.
fn each_failed(early: Vec<Option<DocError>>, e: DocError) -> Vec<Result<BatchOutcome>> {
    // Every write of the unit failed as the unit did, with the cause's kind
    // (a full disk stays a full disk for each of them): an engine failure
    // is shared by all the writes, another error goes to the first as it is.
    let writes = early.iter().filter(|pre| pre.is_none()).count();
    let (mut first, cause) = match e {
        DocError::Storage(kiln_storage::Error::GroupFailed(cause)) => (None, cause),
        DocError::Storage(se) if writes > 1 => (None, Arc::new(se)),
        e => {
            let cause = kiln_storage::Error::UnitFailed(e.to_string().into());
            (Some(e), Arc::new(cause))
        }
    };
    early
        .into_iter()
        .map(|pre| match pre {
            Some(pre) => Err(pre),
            None => Err(first.take().unwrap_or_else(|| {
                DocError::Storage(kiln_storage::Error::GroupFailed(cause.clone()))
            })),
        })
        .collect()
}

fn at_index<E: Into<DocError>>(index: usize) -> impl Fn(E) -> DocError {
    move |e: E| {
        DocError::Database(DatabaseError::BatchOpFailed {
            index,
            source: Box::new(e.into()),
        })
    }
}

/// How long a bulk insert's batch is submitted again while the commit queue is
/// overloaded (`Database::write_all_patiently`).
const BULK_OVERLOAD_PATIENCE: Duration = Duration::from_secs(120);

/// Past RAM, reads the documents these writes will look up before the commit turn
/// (`stored::read_ahead`; nothing in memory): otherwise each lookup is a fault that
/// the committing thread waits for, one after another, while every other writer of
/// the database waits for the turn.
fn read_ahead(env: &Env, ops: &[WriteOp]) {
    crate::stored::read_ahead(env, ops.iter().filter_map(WriteOp::looked_up_id));
}

#[cfg(test)]
mod tests {
    use crate::{Condition, DocStore, DocsOptions};
    use std::sync::atomic::Ordering;

    /// A bulk batch refused as overloaded (a commit held past the queue's delay
    /// limit) is submitted again and lands, where `write_all` fails at once: the
    /// batch was not applied either way.
    #[test]
    fn a_bulk_batch_waits_out_an_overloaded_commit_queue() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = DocsOptions::default();
        opts.storage.queue_limits.max_queue_delay_ms = 20;
        let store = DocStore::open(dir.path(), opts).unwrap();
        let db = store.create_database("d").unwrap();
        let put = |id: &str| super::WriteOp::Put {
            id: super::DocId::Given(id.to_string()),
            document: db.parse_document(b"{}").unwrap(),
            condition: Condition::None,
        };
        let env = db.live().unwrap();
        std::thread::scope(|s| {
            // One unit holds the commit turn for 400 ms; a second waits behind it
            // past the 20 ms limit, so the queue refuses what comes next.
            s.spawn(|| {
                env.submit(|_| {
                    std::thread::sleep(std::time::Duration::from_millis(400));
                    Ok(())
                })
                .unwrap()
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            s.spawn(|| env.submit(|_| Ok(())).unwrap());
            std::thread::sleep(std::time::Duration::from_millis(80));
            let refused = db.write_all(vec![put("a")]).unwrap_err();
            assert!(
                matches!(&refused, crate::DocError::Storage(e)
                    if e.kind() == kiln_storage::ErrorKind::Overloaded),
                "{refused}"
            );
            let landed = db.write_all_patiently(vec![put("b")]).unwrap();
            assert_eq!(landed.len(), 1);
        });
        assert!(db.get("a").unwrap().is_none());
        assert!(db.get("b").unwrap().is_some());
    }

    /// The write clock starts at the last write's time when a database opens, so a
    /// wall clock behind it (stepped back across a restart) cannot give the next write
    /// an earlier time than the last one: restores to a time rely on it.
    #[test]
    fn the_write_clock_resumes_from_the_last_write() {
        let dir = tempfile::tempdir().unwrap();
        let ahead = crate::model::time::now_ms() + 3_600_000;
        {
            let store = DocStore::open(dir.path(), DocsOptions::default()).unwrap();
            let db = store.create_database("d").unwrap();
            // As if the last write had been made before the clock stepped back an hour.
            db.write_clock_ms.store(ahead, Ordering::SeqCst);
            db.put("a", br#"{"n":1}"#, Condition::None).unwrap();
            assert_eq!(db.get("a").unwrap().unwrap().last_modified_ms, ahead);
        }
        let store = DocStore::open(dir.path(), DocsOptions::default()).unwrap();
        let db = store.database("d").unwrap();
        db.put("b", br#"{"n":2}"#, Condition::None).unwrap();
        let b = db.get("b").unwrap().unwrap();
        assert!(
            b.last_modified_ms >= ahead,
            "{} < {ahead}",
            b.last_modified_ms
        );
    }
}
