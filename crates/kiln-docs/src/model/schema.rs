//! The names of a database's trees and of its `meta` keys, and how their keys are
//! encoded: one leaf that every module writing or reading a tree takes them from
//! (the documents, the change log, the backup history, indexes, backups), so that
//! none of them has to import another for a name.
//!
//! Trees of a database's environment:
//! - `doc_ids`: id -> etag sequence of the current version (u64 BE), and
//!   `doc_bodies`: etag sequence -> stored record (see `stored.rs`, `record.rs`);
//!   databases written before them kept `docs` (id -> record), moved at open
//! - `by_collection`: collection, 0x00, etag sequence (u64 BE) -> id; a collection
//!   listed in etag order is a range scan (`collection_key`)
//! - `counts`: collection -> number of documents (u64 BE)
//! - `meta`: `incarnation` (u32 BE), `last_etag` (u64 BE), `backup_chain` (JSON,
//!   while a backup chain is active), `next_index_id` (u64 BE), `revisions_config`
//!   (JSON, once revisions were configured)
//! - `changes` (sequence -> entry) and `tombstones` (id -> sequence): the change
//!   log (see `changes/log.rs`)
//! - `consumers`: reader of the change log -> the sequence it has read up to
//!   (`index:<name>` for an index, `backup-chain` for the backup chain)
//! - `backup_history`: sequence -> entry, every write while a backup chain is
//!   active (see `database/history.rs`)
//! - `expirations` (expiry time in ms, u64 BE, then id -> etag sequence, u64 BE)
//!   and `expiration_ids` (id -> expiry time): the documents that expire (see
//!   `expiration/mod.rs`)
//! - `revisions` (id, 0x00, etag sequence u64 BE -> a previous version) and
//!   `revision_heads` (id -> the current version's revision bookkeeping): the
//!   document revisions of the configured collections (see `revisions/mod.rs`;
//!   made when a database is first given a revisions configuration)
//! - `attachment_refs`: SHA-256 of an attachment's bytes -> how many documents'
//!   entries name it, its size, until when a staged blob is kept (u64 BE each; see
//!   `attachments/mod.rs`)
//! - `subscriptions`: data subscription name -> its query and position (JSON; see
//!   `subscriptions/mod.rs`; made with the first subscription)
//! - `index_defs`, `index_state` and per index `ix.<id>.e`, `ix.<id>.d`,
//!   `ix.<id>.x` (see `index/mod.rs`)
//!
//! Every number in a key or a small value is big-endian, so that keys sort as
//! their numbers do.

use super::error::DocumentError;

pub(crate) const DOC_IDS: &str = "doc_ids";
pub(crate) const DOC_BODIES: &str = "doc_bodies";
/// The one id-keyed tree of records that databases written before `doc_ids` and
/// `doc_bodies` had (`stored::migrate`); read only by the upgrades that run first.
pub(crate) const LEGACY_DOCS: &str = "docs";
pub(crate) const BY_COLLECTION: &str = "by_collection";
pub(crate) const COUNTS: &str = "counts";
pub(crate) const META: &str = "meta";
pub(crate) const CHANGES: &str = "changes";
pub(crate) const TOMBSTONES: &str = "tombstones";
/// Consumers of the change log (indexes, backups, replication) record how far they
/// read here; tombstones they have not read yet are never purged.
pub(crate) const CONSUMERS: &str = "consumers";
pub(crate) const HISTORY: &str = "backup_history";
pub(crate) const EXPIRATIONS: &str = "expirations";
pub(crate) const EXPIRATION_IDS: &str = "expiration_ids";
pub(crate) const REVISIONS: &str = "revisions";
pub(crate) const REVISION_HEADS: &str = "revision_heads";
pub(crate) const INDEX_DEFS: &str = "index_defs";
pub(crate) const INDEX_STATE: &str = "index_state";
/// Data subscriptions: name -> definition and position (JSON; `subscriptions/`),
/// made with the first subscription.
pub(crate) const SUBSCRIPTIONS: &str = "subscriptions";
/// Attachments: SHA-256 (32 bytes) -> reference count, size, staged-until time
/// (`attachments/`), made when a database opens.
pub(crate) const ATTACHMENT_REFS: &str = "attachment_refs";

/// The trees a new database is created with (indexes make theirs when defined).
pub(crate) const DATABASE_TREES: [&str; 11] = [
    DOC_IDS,
    DOC_BODIES,
    BY_COLLECTION,
    COUNTS,
    META,
    CHANGES,
    TOMBSTONES,
    CONSUMERS,
    HISTORY,
    EXPIRATIONS,
    EXPIRATION_IDS,
];

pub(crate) const META_INCARNATION: &[u8] = b"incarnation";
pub(crate) const META_LAST_ETAG: &[u8] = b"last_etag";
/// The index of the last cluster log entry applied to the database (u64 BE).
pub(crate) const META_APPLIED_LOG_INDEX: &[u8] = b"applied_log_index";
/// The time of the last cluster log entry applied to the database, after the
/// write clock (u64 BE, ms): an entry whose writes all failed moves the clock too,
/// and a node that reopens the database must resume from the same time as one
/// that did not (`Database::apply_logged`).
pub(crate) const META_LOGGED_CLOCK_MS: &[u8] = b"logged_clock_ms";
/// The active backup chain (`history::ChainState`, JSON).
pub(crate) const META_CHAIN: &[u8] = b"backup_chain";
pub(crate) const META_NEXT_INDEX_ID: &[u8] = b"next_index_id";
/// Which collections keep revisions (`revisions::RevisionsConfig`, JSON); absent
/// until a configuration is first set.
pub(crate) const META_REVISIONS: &[u8] = b"revisions_config";
/// Present while the expiration trees of a database made before them are being
/// filled from its documents (`expiration/upgrade.rs`): an open that finds it
/// fills them again.
pub(crate) const META_EXPIRATIONS_BUILDING: &[u8] = b"expirations_building";

/// The backup chain's name among the change log's consumers.
pub(crate) const CHAIN_CONSUMER: &str = "backup-chain";

/// An index's name among the change log's consumers.
pub(crate) fn index_consumer(index: &str) -> String {
    format!("index:{index}")
}

/// Index `id`'s entries: encoded values ++ document id -> document id.
pub(crate) fn entries_tree(id: u64) -> String {
    format!("ix.{id}.e")
}

/// Whether `name` is an index's entries tree (`entries_tree`).
pub(crate) fn is_entries_tree(name: &str) -> bool {
    name.strip_prefix("ix.")
        .and_then(|rest| rest.strip_suffix(".e"))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// Index `id`'s documents: document id -> the encoded values of its entries.
pub(crate) fn docs_tree(id: u64) -> String {
    format!("ix.{id}.d")
}

/// Index `id`'s errors: document id -> why it could not be indexed.
pub(crate) fn errors_tree(id: u64) -> String {
    format!("ix.{id}.x")
}

/// The key of an etag sequence (`changes`, `backup_history`): u64 BE.
pub(crate) fn sequence_key(sequence: u64) -> [u8; 8] {
    sequence.to_be_bytes()
}

/// `by_collection` key: collection, 0x00, etag sequence (u64 BE).
pub(crate) fn collection_key(collection: &str, sequence: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(collection.len() + 9);
    k.extend_from_slice(collection.as_bytes());
    k.push(0);
    k.extend_from_slice(&sequence.to_be_bytes());
    k
}

/// `expirations` key: expiry time in ms (u64 BE), then the id: the due documents
/// come first, in time order (then id order).
pub(crate) fn expiration_key(expires_at_ms: u64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + id.len());
    k.extend_from_slice(&expires_at_ms.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// The time and id of an `expirations` key.
pub(crate) fn decode_expiration_key(key: &[u8]) -> Result<(u64, &str), DocumentError> {
    let corrupt = |why: &str| DocumentError::Corrupt {
        id: format!("(expiration entry {key:02x?})"),
        why: why.into(),
    };
    let (at, id) = key
        .split_at_checked(8)
        .ok_or_else(|| corrupt("key shorter than its time"))?;
    let id = std::str::from_utf8(id).map_err(|_| corrupt("id is not UTF-8"))?;
    Ok((decode_u64(at, "expiry time")?, id))
}

/// `revisions` key: the document id, 0x00, the etag sequence of the version
/// (u64 BE). Ids have no control characters, so one document's revisions are
/// one contiguous range, in etag order.
pub(crate) fn revision_key(id: &str, sequence: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 9);
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k.extend_from_slice(&sequence.to_be_bytes());
    k
}

/// A u64 BE key or value; `what` names it in the error.
pub(crate) fn decode_u64(b: &[u8], what: &str) -> Result<u64, DocumentError> {
    let arr: [u8; 8] = b.try_into().map_err(|_| DocumentError::Corrupt {
        id: "(meta)".into(),
        why: format!("{what} has {} bytes, expected 8", b.len()),
    })?;
    Ok(u64::from_be_bytes(arr))
}

/// The last etag sequence handed out, from `meta`'s `last_etag` as read (0 when
/// there is none).
pub(crate) fn decode_last_sequence(raw: Option<&[u8]>) -> Result<u64, DocumentError> {
    raw.map_or(Ok(0), |b| decode_u64(b, "last etag"))
}
