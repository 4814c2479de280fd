//! Where a document's record lives: two trees, so that a database larger than
//! memory writes new documents without reading from the disk (design §13.4).
//!
//! - `doc_ids`: document id -> the etag sequence of its current version (u64 BE);
//!   an id and 8 bytes per document, small enough to stay cached past RAM.
//! - `doc_bodies`: etag sequence (u64 BE) -> the record (`record.rs`). Every write
//!   takes a new sequence, so records are appended at the tree's right edge (full
//!   leaves, pages that stay cached), and a replaced version is deleted where it was.
//!
//! A lookup by id is the small tree's descent plus one body leaf, as the single
//! id-keyed tree of format 1 (`docs`, migrated at open by `migrate`) cost.
//! Every module reads and writes documents through here; none names the trees.

use crate::model::schema::{self, decode_u64, sequence_key, DOC_BODIES, DOC_IDS, LEGACY_DOCS};
use crate::DocumentError;
use crate::{DocError, Result};
use kiln_storage::{Env, ReadTxn, WriteTxn};
use std::ops::Bound;

/// The record of the document `id` in a read snapshot.
pub(crate) fn get<'r>(r: &'r ReadTxn<'_>, id: &str) -> Result<Option<&'r [u8]>> {
    let Some(raw) = r.get(DOC_IDS, id.as_bytes())? else {
        return Ok(None);
    };
    let sequence = decode_sequence(id, raw)?;
    body(id, sequence, r.get(DOC_BODIES, &sequence_key(sequence))?).map(Some)
}

/// The record written at etag `sequence` (listed by `by_collection` or the change
/// log, which know the sequence): one body lookup, no id lookup.
pub(crate) fn get_at<'r>(r: &'r ReadTxn<'_>, id: &str, sequence: u64) -> Result<&'r [u8]> {
    body(id, sequence, r.get(DOC_BODIES, &sequence_key(sequence))?)
}

/// The etag sequence of the document `id`'s current version.
pub(crate) fn sequence_of(r: &ReadTxn<'_>, id: &str) -> Result<Option<u64>> {
    r.get(DOC_IDS, id.as_bytes())?
        .map(|raw| decode_sequence(id, raw))
        .transpose()
}

/// `get` inside the write transaction (it sees the transaction's own writes).
pub(crate) fn get_mut<'t>(txn: &'t mut WriteTxn<'_>, id: &str) -> Result<Option<&'t [u8]>> {
    let sequence = match txn.get(DOC_IDS, id.as_bytes())? {
        None => return Ok(None),
        Some(raw) => decode_sequence(id, raw)?,
    };
    body(id, sequence, txn.get(DOC_BODIES, &sequence_key(sequence))?).map(Some)
}

/// Whether the document `id` exists, as the write transaction sees it (the id tree
/// only: no body is read).
pub(crate) fn exists_mut(txn: &mut WriteTxn<'_>, id: &str) -> Result<bool> {
    Ok(txn.get(DOC_IDS, id.as_bytes())?.is_some())
}

/// Stores `record` as the document `id`'s version at `sequence`, replacing the one
/// at `replaced` (the sequence the transaction read it at).
pub(crate) fn put(
    txn: &mut WriteTxn<'_>,
    id: &str,
    replaced: Option<u64>,
    sequence: u64,
    record: &[u8],
) -> Result<()> {
    debug_assert_eq!(
        record.get(1..9),
        Some(&sequence.to_be_bytes()[..]),
        "a record is stored under its own etag sequence"
    );
    if let Some(old) = replaced {
        assert!(
            old < sequence,
            "a write's sequence {sequence} follows the version it replaces ({old})"
        );
        remove_body(txn, id, old)?;
    }
    txn.put(DOC_IDS, id.as_bytes(), &sequence_key(sequence))?;
    txn.put(DOC_BODIES, &sequence_key(sequence), record)?;
    Ok(())
}

/// Removes the document `id`, whose current version is at `sequence`.
pub(crate) fn delete(txn: &mut WriteTxn<'_>, id: &str, sequence: u64) -> Result<()> {
    if !txn.delete(DOC_IDS, id.as_bytes())? {
        return Err(DocError::Document(DocumentError::Corrupt {
            id: id.to_string(),
            why: "deleted but not in the id tree".into(),
        }));
    }
    remove_body(txn, id, sequence)
}

fn remove_body(txn: &mut WriteTxn<'_>, id: &str, sequence: u64) -> Result<()> {
    if txn.delete(DOC_BODIES, &sequence_key(sequence))? {
        Ok(())
    } else {
        Err(missing_body(id, sequence))
    }
}

/// Number of documents.
pub(crate) fn count(r: &ReadTxn<'_>) -> Result<u64> {
    Ok(r.tree_len(DOC_IDS)?)
}

/// Past RAM, reads what writes to `ids` will look up (the id tree's leaves, then
/// the bodies of the documents that exist) before the commit turn, so that the
/// writer holding the turn does not wait on the disk while every other writer of
/// the database waits for it; nothing in memory (`Env::reading_ahead`). One id is
/// looked up here, on the caller's thread (its faults are the caller's own wait);
/// more are asked for all at once (`ReadTxn::read_ahead`), the disk serving them
/// together. Advisory: errors show again where it matters.
pub(crate) fn read_ahead<'k>(env: &Env, ids: impl Iterator<Item = &'k str> + Clone) {
    if !env.reading_ahead() {
        return;
    }
    let Ok(r) = env.begin_read() else { return };
    if let (Some(id), None) = (ids.clone().next(), ids.clone().nth(1)) {
        if let Ok(Some(record)) = get(&r, id) {
            // A body larger than its leaf continues on pages of its own.
            std::hint::black_box(record.last());
        }
        return;
    }
    let _ = r.read_ahead(DOC_IDS, ids.clone().map(str::as_bytes));
    let bodies: Vec<[u8; 8]> = ids
        .filter_map(|id| sequence_of(&r, id).ok().flatten())
        .map(sequence_key)
        .collect();
    let _ = r.read_ahead(DOC_BODIES, bodies.iter().map(|k| &k[..]));
}

/// The documents in id order from `start`, each given to `take` with its record
/// until it answers false. Reads the legacy `docs` tree while it exists: only the
/// upgrades that run at open and `migrate` see one.
pub(crate) fn scan_by_id(
    r: &ReadTxn<'_>,
    start: Bound<&[u8]>,
    mut take: impl FnMut(&str, &[u8]) -> Result<bool>,
) -> Result<()> {
    let legacy = r.tree_exists(LEGACY_DOCS)?;
    let mut cursor = r.cursor(if legacy { LEGACY_DOCS } else { DOC_IDS })?;
    let mut entry = match start {
        Bound::Unbounded => cursor.first()?,
        Bound::Included(from) => cursor.seek(from)?,
        Bound::Excluded(after) => match cursor.seek(after)? {
            Some((key, _)) if key == after => cursor.next()?,
            other => other,
        },
    };
    while let Some((key, raw)) = entry {
        let id = std::str::from_utf8(key).map_err(|_| {
            DocError::Document(DocumentError::Corrupt {
                id: String::from_utf8_lossy(key).into_owned(),
                why: "stored id is not UTF-8".into(),
            })
        })?;
        let record = if legacy {
            raw
        } else {
            get_at(r, id, decode_sequence(id, raw)?)?
        };
        if !take(id, record)? {
            return Ok(());
        }
        entry = cursor.next()?;
    }
    Ok(())
}

fn decode_sequence(id: &str, raw: &[u8]) -> Result<u64> {
    decode_u64(raw, "a document's sequence").map_err(|_| {
        DocError::Document(DocumentError::Corrupt {
            id: id.to_string(),
            why: format!(
                "its id entry holds {} bytes, not an 8-byte sequence",
                raw.len()
            ),
        })
    })
}

/// A body as found under `sequence`, checked against the sequence its record
/// carries (bytes 1..9 in every record format): a body under the wrong key would
/// answer with another document's etag.
fn body<'a>(id: &str, sequence: u64, found: Option<&'a [u8]>) -> Result<&'a [u8]> {
    let bytes = found.ok_or_else(|| missing_body(id, sequence))?;
    if bytes.get(1..9) != Some(&sequence.to_be_bytes()[..]) {
        return Err(DocError::Document(DocumentError::Corrupt {
            id: id.to_string(),
            why: format!("the body stored at sequence {sequence} carries another sequence"),
        }));
    }
    Ok(bytes)
}

fn missing_body(id: &str, sequence: u64) -> DocError {
    DocError::Document(DocumentError::Corrupt {
        id: id.to_string(),
        why: format!("no body at its sequence {sequence}"),
    })
}

/// Documents moved per transaction by `migrate`.
const MIGRATE_CHUNK: usize = 10_000;

/// A database written before the two trees keeps its documents in `docs` (id ->
/// record): moved into `doc_ids` and `doc_bodies` at open, `MIGRATE_CHUNK` per
/// transaction, each chunk deleted from `docs` in the transaction that writes it
/// elsewhere (a crash between chunks resumes where it stopped); `docs` is dropped
/// when empty, so an older binary finds no `docs` tree and fails at its first read
/// rather than answering from a stale one.
pub(crate) fn migrate(env: &Env, database: &str) -> Result<()> {
    let (legacy, new) = {
        let r = env.begin_read()?;
        (r.tree_exists(LEGACY_DOCS)?, r.tree_exists(DOC_IDS)?)
    };
    if !new {
        env.submit(|w| {
            w.ensure_tree(DOC_IDS)?;
            w.ensure_tree(DOC_BODIES)
        })?;
    }
    if !legacy {
        return Ok(());
    }
    let total = env.begin_read()?.tree_len(LEGACY_DOCS)?;
    tracing::info!(
        database,
        documents = total,
        "moving documents into the id and body trees"
    );
    loop {
        // Always the first chunk left: each one moved is gone from `docs`.
        let mut chunk: Vec<(String, u64, Vec<u8>)> = Vec::with_capacity(MIGRATE_CHUNK);
        scan_by_id(&env.begin_read()?, Bound::Unbounded, |id, record| {
            let sequence = crate::model::record::decode(id, record)?.etag.sequence;
            chunk.push((id.to_string(), sequence, record.to_vec()));
            Ok(chunk.len() < MIGRATE_CHUNK)
        })?;
        if chunk.is_empty() {
            break;
        }
        env.submit(move |w| {
            for (id, sequence, record) in &chunk {
                let sequence = *sequence;
                w.put(DOC_IDS, id.as_bytes(), &sequence_key(sequence))?;
                w.put(DOC_BODIES, &sequence_key(sequence), record)?;
                w.delete(LEGACY_DOCS, id.as_bytes())?;
            }
            Ok(())
        })?;
    }
    env.submit(|w| w.drop_tree(LEGACY_DOCS).map(drop))?;
    tracing::info!(database, documents = total, "documents moved");
    Ok(())
}

/// The last etag sequence handed out, as `r` sees it (0 when there is none).
pub(crate) fn read_last_sequence(r: &ReadTxn<'_>) -> Result<u64> {
    let raw = r.get(schema::META, schema::META_LAST_ETAG)?;
    Ok(schema::decode_last_sequence(raw)?)
}
