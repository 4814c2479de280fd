//! Applying writes inside a commit-queue unit.
//!
//! A `Unit` carries what the writes of one unit share: the etag counter and the
//! per-collection count changes are kept in memory while the writes run and written
//! once when the unit ends (`Unit::finish`), instead of a read and a write of the
//! same two keys per document. Every check of a write comes before its first change
//! to the transaction or to the unit, so a write that fails a check leaves both
//! untouched and the other writes of the unit can still commit.

use super::history::{self, HistoryEntry};
use super::{BatchOutcome, Condition, DeleteOutcome, DocId, Limits, PutOutcome, WriteOp};
// The unit holds the hooks of attachments and expiration (`Hooks`), and checks a
// put's attachment list and expiring id before its first write: circles with
// attachments/ and expiration/, whose operations are `Database` methods that write
// through this module (`apply_attachment`, `WriteOp`). The hooks are what they
// share; neither writes a document's trees.
use crate::attachments::{self, AttachmentsHook, BlobStore};
use crate::changes::{encode_entry, ChangeKind};
use crate::expiration::{self, ExpirationHook};
use crate::model::attachment_list::{
    list_value, stored_list, AttachmentChange, AttachmentInfo, ATTACHMENTS_KEY,
};
use crate::model::document::{stored_expires_at_ms, PreparedDoc};
use crate::model::record;
use crate::model::schema::{
    collection_key, decode_last_sequence, decode_u64, sequence_key, BY_COLLECTION, CHANGES, COUNTS,
    HISTORY, META, META_LAST_ETAG, TOMBSTONES,
};
use crate::DocumentError;
// Revisions are kept in the write's own commit (a circle with revisions/, whose
// restore writes through `Database`: see the note there).
use crate::revisions::UnitConfig as RevisionsHook;
use crate::write_hook::{DocWrite, FreedBlobs, WriteHook, Written};
use crate::{DocError, Etag, Result};
use kiln_storage::WriteTxn;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What a database may hold, as far as its writes need to look (each flag false
/// until the database has one: a write can then skip a lookup).
#[derive(Clone, Default)]
pub(crate) struct Possible {
    pub tombstones: Arc<AtomicBool>,
    pub expirations: Arc<AtomicBool>,
}

/// What a unit needs besides the transaction (moved into the unit's closure).
pub(crate) struct Unit {
    pub incarnation: u32,
    pub limits: Limits,
    /// The unit's time (every write of the unit carries it), taken by `stamp` when
    /// the unit's first write is applied.
    pub now_ms: u64,
    /// `now_ms` as the RFC 3339 text documents carry, formatted once per unit.
    pub now_text: String,
    /// The last etag sequence handed out, once read from `meta`.
    last_sequence: Option<u64>,
    /// The sequence in `meta` when the unit began (to know if it must be written).
    stored_sequence: u64,
    count_deltas: Vec<(String, i64)>,
    /// False while the database has never had a tombstone: a new document then
    /// need not look for one.
    pub tombstones_possible: Arc<AtomicBool>,
    /// True while the database has a backup chain: each write also goes to the
    /// backup history (`history.rs`). Off, it costs one load and a branch.
    pub history_on: Arc<AtomicBool>,
    /// The database's write clock: the latest time a unit took. `None` for a replay,
    /// whose writes keep the times they were made at.
    clock: Option<Arc<AtomicU64>>,
    stamped: bool,
    /// What follows each put and delete: revisions, attachments, expiration.
    pub(crate) hooks: Hooks,
}

/// The concerns that keep state about each document (`crate::write_hook`), called
/// in this order for every put and delete once its checks passed, before the
/// document's own trees are written.
pub(crate) struct Hooks {
    /// Which collections keep revisions, read once per unit (`revisions/`).
    revisions: RevisionsHook,
    pub(crate) attachments: AttachmentsHook,
    pub(crate) expiration: ExpirationHook,
    /// Where blobs whose count reached zero go, to be unlinked after the commit
    /// (`None`: a replay; `gc` at the next open frees them).
    blobs: Option<Arc<BlobStore>>,
}

impl Hooks {
    fn each(&mut self) -> [&mut dyn WriteHook; 3] {
        [
            &mut self.revisions,
            &mut self.attachments,
            &mut self.expiration,
        ]
    }

    fn on_put(
        &mut self,
        txn: &mut WriteTxn<'_>,
        w: &DocWrite<'_>,
        new: &Written<'_>,
    ) -> Result<()> {
        let mut freed = FreedBlobs::new();
        for hook in self.each() {
            hook.on_put(txn, w, new, &mut freed)?;
        }
        self.release(freed);
        Ok(())
    }

    fn on_delete(&mut self, txn: &mut WriteTxn<'_>, w: &DocWrite<'_>) -> Result<()> {
        let mut freed = FreedBlobs::new();
        for hook in self.each() {
            hook.on_delete(txn, w, &mut freed)?;
        }
        self.release(freed);
        Ok(())
    }

    fn release(&self, freed: FreedBlobs) {
        if let (false, Some(blobs)) = (freed.is_empty(), &self.blobs) {
            blobs.freed(freed);
        }
    }
}

impl Unit {
    pub fn new(
        incarnation: u32,
        limits: Limits,
        clock: Option<Arc<AtomicU64>>,
        possible: Possible,
        history_on: Arc<AtomicBool>,
    ) -> Unit {
        Unit {
            incarnation,
            limits,
            clock,
            stamped: false,
            now_ms: 0,
            now_text: crate::model::time::format_rfc3339_ms(0),
            last_sequence: None,
            stored_sequence: 0,
            count_deltas: Vec::new(),
            tombstones_possible: possible.tombstones,
            history_on,
            hooks: Hooks {
                revisions: RevisionsHook::default(),
                attachments: AttachmentsHook::default(),
                expiration: ExpirationHook {
                    possible: possible.expirations,
                },
                blobs: None,
            },
        }
    }

    /// A write of this unit, made at the unit's time, as the hooks see it.
    fn doc_write<'a>(
        &self,
        id: &'a str,
        replaced: Option<(Etag, Option<&'a str>)>,
        old_attachments: &'a [AttachmentInfo],
        key_id: Option<&'a str>,
    ) -> DocWrite<'a> {
        DocWrite {
            id,
            replaced,
            old_attachments,
            key_id,
            at_ms: self.now_ms,
            unit_ms: self.now_ms,
        }
    }

    /// The unit hands hashes whose count reached zero to `blobs`.
    pub fn with_blobs(mut self, blobs: Arc<BlobStore>) -> Unit {
        self.hooks.blobs = Some(blobs);
        self
    }

    /// The unit reads the revisions configuration from the database's copy (a
    /// unit without one reads it from the transaction: a restore's replay).
    pub fn with_revisions(mut self, revisions: RevisionsHook) -> Unit {
        self.hooks.revisions = revisions;
        self
    }

    /// A unit that replays a backup's history into a restored environment (no
    /// limits: the writes were checked when they were made; no history of its own).
    pub fn for_replay(incarnation: u32) -> Unit {
        let limits = Limits {
            max_document_bytes: usize::MAX,
            max_id_bytes: kiln_storage::MAX_KEY_SIZE,
            max_batch_ops: usize::MAX,
            indexing: crate::index::IndexingOptions::default(),
            compression: crate::DocumentCompression::default(),
            expire_staged_at_open: true,
        };
        let possible = Possible {
            tombstones: Arc::new(AtomicBool::new(true)),
            expirations: Arc::new(AtomicBool::new(true)),
        };
        Unit::new(
            incarnation,
            limits,
            None,
            possible,
            Arc::new(AtomicBool::new(false)),
        )
    }

    /// This unit's writes take the time `at_ms` (a cluster's leader stamped it in
    /// its log entry), not the clock's: every node writes the same documents.
    pub fn at_time(mut self, at_ms: u64) -> Unit {
        self.clock = None;
        self.stamped = true;
        self.now_ms = at_ms;
        self.now_text = crate::model::time::format_rfc3339_ms(at_ms);
        self
    }

    /// The time of the writes that follow (an entry of a run applied in one
    /// transaction: each entry has the time its leader stamped).
    pub fn set_time(&mut self, at_ms: u64) {
        if self.now_ms != at_ms {
            self.now_ms = at_ms;
            self.now_text = crate::model::time::format_rfc3339_ms(at_ms);
        }
    }

    /// Takes the unit's time. It runs inside the commit queue's unit, under the
    /// writer lock, where units run in transaction order; and it is never earlier
    /// than the time the unit before took (the wall clock may step back). So times
    /// never decrease along the transactions, and a restore to a time takes a prefix
    /// of the history. (Taken when the unit was built, before it queued, a unit that
    /// waited could commit after one built a millisecond later: a restore to the
    /// later one's time then stopped short of it.)
    fn stamp(&mut self) {
        if self.stamped {
            return;
        }
        self.stamped = true;
        if let Some(clock) = &self.clock {
            let now = crate::model::time::now_ms();
            self.now_ms = now.max(clock.fetch_max(now, Ordering::SeqCst));
            self.now_text = crate::model::time::format_rfc3339_ms(self.now_ms);
        }
    }

    /// The etag the next write gets; taken by `advance` once the write is sure.
    fn peek_next_etag(&mut self, txn: &mut WriteTxn<'_>) -> Result<Etag> {
        let last = match self.last_sequence {
            Some(l) => l,
            None => {
                let l = decode_last_sequence(txn.get(META, META_LAST_ETAG)?)?;
                self.last_sequence = Some(l);
                self.stored_sequence = l;
                l
            }
        };
        Ok(Etag {
            incarnation: self.incarnation,
            sequence: last + 1,
        })
    }

    /// The last sequence handed out (after `peek_next_etag` read it).
    fn last(&self) -> u64 {
        self.last_sequence.unwrap_or(0)
    }

    fn advance(&mut self, to: Etag) {
        debug_assert!(self.last_sequence.is_some_and(|l| to.sequence > l));
        self.last_sequence = Some(to.sequence);
    }

    fn count(&mut self, collection: &str, delta: i64) {
        match self.count_deltas.iter_mut().find(|(c, _)| c == collection) {
            Some((_, d)) => *d += delta,
            None => self.count_deltas.push((collection.to_string(), delta)),
        }
    }

    /// Writes the etag counter and the collection counts the unit changed.
    pub fn finish(&mut self, txn: &mut WriteTxn<'_>) -> Result<()> {
        if let Some(last) = self.last_sequence {
            if last != self.stored_sequence {
                txn.put(META, META_LAST_ETAG, &last.to_be_bytes())?;
                self.stored_sequence = last;
            }
        }
        for (collection, delta) in std::mem::take(&mut self.count_deltas) {
            if delta != 0 {
                add_to_count(txn, &collection, delta)?;
            }
        }
        Ok(())
    }
}

pub(super) fn apply_op(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    op: &WriteOp,
) -> Result<BatchOutcome> {
    unit.stamp();
    apply_by(txn, unit, op, None)
}

/// `apply_op` of a write made by the API key `key_id`, when known.
fn apply_by(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    op: &WriteOp,
    key_id: Option<&str>,
) -> Result<BatchOutcome> {
    match op {
        WriteOp::Put {
            id,
            document,
            condition,
        } => apply_put(txn, unit, id, &document.0, *condition, key_id).map(BatchOutcome::Put),
        WriteOp::Delete { id, condition } => {
            apply_delete(txn, unit, id, *condition, key_id).map(BatchOutcome::Delete)
        }
        WriteOp::Patch {
            id,
            patch,
            condition,
        } => apply_patch(txn, unit, id, patch, *condition, key_id).map(BatchOutcome::Put),
        WriteOp::Attributed { key_id, op } => apply_by(txn, unit, op, Some(key_id)),
    }
}

/// A merge patch: the document as this transaction sees it, merged, then written
/// as a put conditional on the etag just read (it cannot fail here: the writer is
/// this transaction). Every error comes before the put's first write.
fn apply_patch(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    id: &str,
    patch: &serde_json::Value,
    condition: Condition,
    key_id: Option<&str>,
) -> Result<PutOutcome> {
    let (etag, merged) = match crate::stored::get_mut(txn, id)? {
        None => {
            return Err(DocError::Document(DocumentError::NotFound {
                id: id.to_string(),
            }))
        }
        Some(bytes) => {
            let rec = record::decode(id, bytes)?;
            check_condition(id, condition, Some(rec.etag))?;
            (
                rec.etag,
                crate::model::merge_patch::patch_document(&rec.to_json(id)?, id, patch)?,
            )
        }
    };
    let doc = PreparedDoc::from_value(merged)?;
    let given = DocId::Given(id.to_string());
    apply_put(txn, unit, &given, &doc, Condition::IfMatch(etag), key_id)
}

/// An attachment put or delete: the document as this transaction sees it, with
/// its list changed, written as a put conditional on the etag just read (so the
/// reference counts move in `apply_put`, as for any put). `condition` is the
/// client's, checked against the document as read here.
pub(crate) fn apply_attachment(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    id: &str,
    change: &AttachmentChange,
    condition: Condition,
) -> Result<PutOutcome> {
    unit.stamp();
    let Some(bytes) = crate::stored::get_mut(txn, id)? else {
        return Err(DocError::Document(DocumentError::NotFound {
            id: id.to_string(),
        }));
    };
    let rec = record::decode(id, bytes)?;
    check_condition(id, condition, Some(rec.etag))?;
    let etag = rec.etag;
    let mut list = stored_list(rec.json);
    let mut value: serde_json::Value = serde_json::from_slice(&rec.to_json(id)?).map_err(|e| {
        DocError::Document(DocumentError::Corrupt {
            id: id.to_string(),
            why: format!("stored JSON does not parse: {e}"),
        })
    })?;
    change.apply_to(&mut list, id)?;
    let metadata = value
        .as_object_mut()
        .and_then(|o| o.get_mut("@metadata"))
        .and_then(serde_json::Value::as_object_mut)
        .ok_or_else(|| {
            DocError::Document(DocumentError::Corrupt {
                id: id.to_string(),
                why: "stored document has no @metadata object".into(),
            })
        })?;
    metadata.insert(ATTACHMENTS_KEY.to_string(), list_value(&list));
    let doc = PreparedDoc::from_value(value)?;
    let given = DocId::Given(id.to_string());
    apply_put(txn, unit, &given, &doc, Condition::IfMatch(etag), None)
}

type Existing = (Etag, Option<String>);

/// `current`, with the attachments the document lists.
fn current_full(
    txn: &mut WriteTxn<'_>,
    id: &str,
) -> Result<Option<(Existing, Vec<AttachmentInfo>)>> {
    match crate::stored::get_mut(txn, id)? {
        None => Ok(None),
        Some(bytes) => {
            let rec = record::decode(id, bytes)?;
            Ok(Some((
                (rec.etag, rec.collection.map(str::to_string)),
                stored_list(rec.json),
            )))
        }
    }
}

fn check_condition(id: &str, condition: Condition, current: Option<Etag>) -> Result<()> {
    let conflict = |why: String| {
        Err(DocError::Document(DocumentError::Conflict {
            id: id.to_string(),
            current,
            why,
        }))
    };
    match (condition, current) {
        (Condition::None, _) => Ok(()),
        (Condition::IfMatch(want), Some(have)) if want == have => Ok(()),
        (Condition::IfMatch(want), Some(have)) => {
            conflict(format!("expected etag {want}, the document has {have}"))
        }
        (Condition::IfMatch(want), None) => {
            conflict(format!("expected etag {want}, the document does not exist"))
        }
        (Condition::IfExists, Some(_)) => Ok(()),
        (Condition::IfExists, None) => conflict("the document does not exist".into()),
        (Condition::IfNotExists, None) => Ok(()),
        (Condition::IfNotExists, Some(have)) => {
            conflict(format!("the document already exists (etag {have})"))
        }
    }
}

fn add_to_count(txn: &mut WriteTxn<'_>, collection: &str, delta: i64) -> Result<()> {
    let now = match txn.get(COUNTS, collection.as_bytes())? {
        Some(b) => decode_u64(b, "collection count")?,
        None => 0,
    };
    let new = now.checked_add_signed(delta).ok_or_else(|| {
        DocError::Document(DocumentError::Corrupt {
            id: format!("(count of {collection})"),
            why: format!("count {now} {delta:+} goes below zero"),
        })
    })?;
    if new == 0 {
        txn.delete(COUNTS, collection.as_bytes())?;
    } else {
        txn.put(COUNTS, collection.as_bytes(), &new.to_be_bytes())?;
    }
    Ok(())
}

fn apply_put(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    id: &DocId,
    doc: &PreparedDoc,
    condition: Condition,
    key_id: Option<&str>,
) -> Result<PutOutcome> {
    // Every check comes before the first write (see the module comment).
    let mut etag = unit.peek_next_etag(txn)?;
    let (id, existing, old_attachments) = put_target(txn, id, condition, &mut etag)?;
    let expires_at_ms = doc.expires_at_ms();
    if expires_at_ms.is_some() {
        expiration::check_id(&id)?;
    }
    let fresh = unit.hooks.attachments.fresh;
    let settled = attachments::settle(txn, doc.client_metadata(), &old_attachments, fresh)?;
    let with_list;
    let (doc, new_attachments) = match settled {
        None => (doc, Vec::new()),
        Some(list) => {
            with_list = doc.with_attachments(&list);
            (&with_list, list)
        }
    };
    let collection = doc.collection_for(&id).map(str::to_string);
    check_document_size(unit, doc, &id, collection.as_deref(), etag)?;
    let change = encode_entry(ChangeKind::Put, unit.now_ms, collection.as_deref(), &id)?;
    let replaced = existing.as_ref().map(|(old, c)| (*old, c.as_deref()));
    let write = unit.doc_write(&id, replaced, &old_attachments, key_id);
    let written = Written {
        sequence: etag.sequence,
        collection: collection.as_deref(),
        attachments: &new_attachments,
        expires_at_ms,
    };
    unit.hooks.on_put(txn, &write, &written)?;
    let prev = unit.last();
    unit.advance(etag);
    let rec = record::encode(
        etag,
        unit.now_ms,
        collection.as_deref(),
        doc.body_json(),
        &doc.client_metadata_json(),
        unit.limits.compression,
    );
    let look_for_tombstone = unit.tombstones_possible.load(Ordering::SeqCst);
    let created = existing.is_none();
    write_put(
        txn,
        unit,
        &id,
        existing,
        etag,
        collection.as_deref(),
        &rec,
        &change,
        look_for_tombstone,
    )?;
    history_put(txn, unit, prev, &id, etag.sequence, &rec)?;
    Ok(PutOutcome {
        id,
        etag,
        collection,
        last_modified_ms: unit.now_ms,
        created,
    })
}

/// The document a put writes, with what it replaces (its etag and collection,
/// and the attachments it lists): the given id, checked against the condition;
/// or a new id under the prefix, made of `etag`'s sequence (moved on past ids a
/// client took by hand).
fn put_target(
    txn: &mut WriteTxn<'_>,
    id: &DocId,
    condition: Condition,
    etag: &mut Etag,
) -> Result<(String, Option<Existing>, Vec<AttachmentInfo>)> {
    match id {
        DocId::Given(id) => {
            let (existing, old_attachments) = match current_full(txn, id)? {
                Some((e, list)) => (Some(e), list),
                None => (None, Vec::new()),
            };
            check_condition(id, condition, existing.as_ref().map(|e| e.0))?;
            Ok((id.clone(), existing, old_attachments))
        }
        DocId::Generate { prefix } => loop {
            // The etag sequence is unique in the database, so it makes a unique id
            // unless a client took that id by hand; then the next one is tried.
            let id = format!("{prefix}{}", etag.sequence);
            if !crate::stored::exists_mut(txn, &id)? {
                check_condition(&id, condition, None)?;
                break Ok((id, None, Vec::new()));
            }
            etag.sequence += 1;
        },
    }
}

/// Refuses a document whose stored JSON would be over the unit's limit.
#[inline]
fn check_document_size(
    unit: &Unit,
    doc: &PreparedDoc,
    id: &str,
    collection: Option<&str>,
    etag: Etag,
) -> Result<()> {
    let json_len = doc.stored_json_len(id, collection, etag, unit.now_ms);
    if json_len > unit.limits.max_document_bytes {
        return Err(DocError::Document(DocumentError::TooLarge {
            len: json_len,
            max: unit.limits.max_document_bytes,
        }));
    }
    Ok(())
}

/// Adds a put to the backup history, when the database keeps one (`prev`: the
/// sequence of the write before it).
#[inline]
fn history_put(
    txn: &mut WriteTxn<'_>,
    unit: &Unit,
    prev: u64,
    id: &str,
    sequence: u64,
    rec: &[u8],
) -> Result<()> {
    if unit.history_on.load(Ordering::SeqCst) {
        let entry = history::encode_put(txn.txn_id(), prev, unit.now_ms, id, rec);
        txn.put(HISTORY, &sequence_key(sequence), &entry)?;
    }
    Ok(())
}

/// The tree writes of a put whose checks passed: the record, the change log (the
/// document's entry moves to its new sequence), the collection index and counts.
#[allow(clippy::too_many_arguments)]
fn write_put(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    id: &str,
    existing: Option<(Etag, Option<String>)>,
    etag: Etag,
    collection: Option<&str>,
    rec: &[u8],
    change: &[u8],
    look_for_tombstone: bool,
) -> Result<()> {
    let replaced = existing.as_ref().map(|(old_etag, _)| old_etag.sequence);
    crate::stored::put(txn, id, replaced, etag.sequence, rec)?;
    match &existing {
        Some((old_etag, _)) => {
            txn.delete(CHANGES, &sequence_key(old_etag.sequence))?;
        }
        None if look_for_tombstone => forget_tombstone(txn, id)?,
        None => {}
    }
    txn.put(CHANGES, &sequence_key(etag.sequence), change)?;
    if let Some((old_etag, old_collection)) = existing {
        if let Some(old) = &old_collection {
            txn.delete(BY_COLLECTION, &collection_key(old, old_etag.sequence))?;
        }
        if old_collection.as_deref() != collection {
            if let Some(old) = &old_collection {
                unit.count(old, -1);
            }
            if let Some(new) = collection {
                unit.count(new, 1);
            }
        }
    } else if let Some(new) = collection {
        unit.count(new, 1);
    }
    if let Some(c) = collection {
        txn.put(
            BY_COLLECTION,
            &collection_key(c, etag.sequence),
            id.as_bytes(),
        )?;
    }
    Ok(())
}

/// A document written again after a delete no longer needs its tombstone: its new
/// change log entry supersedes it.
fn forget_tombstone(txn: &mut WriteTxn<'_>, id: &str) -> Result<()> {
    let Some(raw) = txn.get(TOMBSTONES, id.as_bytes())? else {
        return Ok(());
    };
    let sequence = decode_u64(raw, "tombstone sequence")?;
    txn.delete(TOMBSTONES, id.as_bytes())?;
    txn.delete(CHANGES, &sequence_key(sequence))?;
    Ok(())
}

fn apply_delete(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    id: &str,
    condition: Condition,
    key_id: Option<&str>,
) -> Result<DeleteOutcome> {
    let Some(((etag, collection), old_attachments)) = current_full(txn, id)? else {
        if condition == Condition::None {
            return Err(DocError::Document(DocumentError::NotFound {
                id: id.to_string(),
            }));
        }
        check_condition(id, condition, None)?;
        return Err(DocError::Document(DocumentError::NotFound {
            id: id.to_string(),
        }));
    };
    check_condition(id, condition, Some(etag))?;
    let tombstone_etag = unit.peek_next_etag(txn)?;
    let tombstone = encode_entry(ChangeKind::Delete, unit.now_ms, collection.as_deref(), id)?;
    let replaced = Some((etag, collection.as_deref()));
    let write = unit.doc_write(id, replaced, &old_attachments, key_id);
    unit.hooks.on_delete(txn, &write)?;
    let prev = unit.last();
    unit.advance(tombstone_etag);
    // Set before this unit commits, so every later unit looks for tombstones.
    unit.tombstones_possible.store(true, Ordering::SeqCst);
    write_delete(
        txn,
        unit,
        id,
        etag,
        collection.as_deref(),
        tombstone_etag,
        &tombstone,
    )?;
    if unit.history_on.load(Ordering::SeqCst) {
        let entry = history::encode_delete(txn.txn_id(), prev, unit.now_ms, id);
        txn.put(HISTORY, &sequence_key(tombstone_etag.sequence), &entry)?;
    }
    Ok(DeleteOutcome {
        id: id.to_string(),
        etag,
        tombstone_etag,
    })
}

/// The tree writes of a delete whose checks passed.
fn write_delete(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    id: &str,
    etag: Etag,
    collection: Option<&str>,
    tombstone_etag: Etag,
    tombstone: &[u8],
) -> Result<()> {
    crate::stored::delete(txn, id, etag.sequence)?;
    if let Some(c) = collection {
        txn.delete(BY_COLLECTION, &collection_key(c, etag.sequence))?;
        unit.count(c, -1);
    }
    txn.delete(CHANGES, &sequence_key(etag.sequence))?;
    txn.put(CHANGES, &sequence_key(tombstone_etag.sequence), tombstone)?;
    txn.put(
        TOMBSTONES,
        id.as_bytes(),
        &tombstone_etag.sequence.to_be_bytes(),
    )?;
    Ok(())
}

/// Replays one write of a backup's history into a restored environment, keeping
/// its etag, time and body: the same tree writes the original made (restore only).
/// The history must continue the state: sequences only grow, a put's record carries
/// the entry's own etag, a delete finds its document.
pub(crate) fn replay(txn: &mut WriteTxn<'_>, unit: &mut Unit, e: &HistoryEntry<'_>) -> Result<()> {
    let next = unit.peek_next_etag(txn)?;
    if e.sequence < next.sequence || e.prev != unit.last() {
        return Err(corrupt_entry(
            e,
            format!(
                "sequence {} (after {}) does not follow the restored state (at {})",
                e.sequence,
                e.prev,
                unit.last()
            ),
        ));
    }
    let etag = Etag {
        incarnation: unit.incarnation,
        sequence: e.sequence,
    };
    let (existing, old_attachments) = match current_full(txn, e.id)? {
        Some((existing, list)) => (Some(existing), list),
        None => (None, Vec::new()),
    };
    match e.kind {
        ChangeKind::Put => replay_put(txn, unit, e, etag, existing, &old_attachments),
        ChangeKind::Delete => replay_delete(txn, unit, e, etag, existing, &old_attachments),
    }
}

/// The error of a backup history entry that does not continue the restored state.
fn corrupt_entry(e: &HistoryEntry<'_>, why: String) -> DocError {
    DocError::Document(DocumentError::Corrupt {
        id: format!("(backup history entry {} for {:?})", e.sequence, e.id),
        why,
    })
}

/// `replay` of a put: its record, which must carry the entry's etag, written as
/// the original put wrote it.
fn replay_put(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    e: &HistoryEntry<'_>,
    etag: Etag,
    existing: Option<Existing>,
    old_attachments: &[AttachmentInfo],
) -> Result<()> {
    let rec = record::decode(e.id, e.record)?;
    if rec.etag != etag {
        return Err(corrupt_entry(
            e,
            format!("its record carries etag {}, the entry is {etag}", rec.etag),
        ));
    }
    let collection = rec.collection.map(str::to_string);
    let change = encode_entry(ChangeKind::Put, rec.last_modified_ms, rec.collection, e.id)?;
    let expires_at_ms = stored_expires_at_ms(rec.json);
    // The writer's key is not in the history: the replayed revisions say none.
    let write = DocWrite {
        id: e.id,
        replaced: existing.as_ref().map(|(old, c)| (*old, c.as_deref())),
        old_attachments,
        key_id: None,
        at_ms: rec.last_modified_ms,
        unit_ms: unit.now_ms,
    };
    let written = Written {
        sequence: etag.sequence,
        collection: rec.collection,
        attachments: &stored_list(rec.json),
        expires_at_ms,
    };
    unit.hooks.on_put(txn, &write, &written)?;
    unit.advance(etag);
    write_put(
        txn,
        unit,
        e.id,
        existing,
        etag,
        collection.as_deref(),
        e.record,
        &change,
        true,
    )?;
    Ok(())
}

/// `replay` of a delete, which must find its document.
fn replay_delete(
    txn: &mut WriteTxn<'_>,
    unit: &mut Unit,
    e: &HistoryEntry<'_>,
    etag: Etag,
    existing: Option<Existing>,
    old_attachments: &[AttachmentInfo],
) -> Result<()> {
    let Some((old, collection)) = existing else {
        return Err(corrupt_entry(
            e,
            "deletes a document the restored state does not have".into(),
        ));
    };
    let tombstone = encode_entry(ChangeKind::Delete, e.at_ms, collection.as_deref(), e.id)?;
    let write = DocWrite {
        id: e.id,
        replaced: Some((old, collection.as_deref())),
        old_attachments,
        key_id: None,
        at_ms: e.at_ms,
        unit_ms: unit.now_ms,
    };
    unit.hooks.on_delete(txn, &write)?;
    unit.advance(etag);
    write_delete(
        txn,
        unit,
        e.id,
        old,
        collection.as_deref(),
        etag,
        &tombstone,
    )
}

#[cfg(test)]
mod tests {
    use super::Unit;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    fn unit(clock: &Arc<AtomicU64>) -> Unit {
        let mut u = Unit::for_replay(1);
        u.clock = Some(clock.clone());
        u.tombstones_possible = Arc::new(AtomicBool::new(false));
        u.hooks.expiration.possible = Arc::new(AtomicBool::new(false));
        u
    }

    /// Units stamp their time in transaction order, and a time never goes below the
    /// previous unit's, even when the wall clock is behind it.
    #[test]
    fn a_unit_never_takes_a_time_before_the_previous_units() {
        let clock = Arc::new(AtomicU64::new(0));
        let (mut first, mut second) = (unit(&clock), unit(&clock));
        first.stamp();
        let now = first.now_ms;
        assert!(
            now > 0 && first.now_text.starts_with("20"),
            "{}",
            first.now_text
        );
        // A unit stamped a minute ahead (a wall clock since stepped back).
        clock.store(now + 60_000, Ordering::SeqCst);
        second.stamp();
        assert_eq!(second.now_ms, now + 60_000);
        // A unit's time is taken once, by its first write.
        second.stamp();
        assert_eq!(second.now_ms, now + 60_000);
        let mut third = unit(&clock);
        third.stamp();
        assert!(third.now_ms >= second.now_ms);
        // A replay keeps the times the writes were made at: no clock, no stamp.
        let mut replay = Unit::for_replay(1);
        replay.stamp();
        assert_eq!(replay.now_ms, 0);
    }
}
