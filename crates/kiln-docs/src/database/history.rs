//! The backup history: one entry per document write, kept only while the database
//! has an active backup chain (see `backup/chain.rs`), so that an incremental backup
//! can carry every write since the previous backup and a restore can stop at any
//! transaction, not only at backup points (the change log keeps only each document's
//! latest write).
//!
//! Tree `backup_history`: etag sequence of the write (u64 BE) -> entry:
//! ```text
//! [0]      kind: 1 put, 2 delete
//! [1..9]   the engine transaction that committed the write, u64 BE
//! [9..17]  the etag sequence of the write before it in the database, u64 BE
//!          (links the entries: a missing one is seen by the next)
//! [17..25] time of the write (ms since the Unix epoch), u64 BE
//! [25..27] id length, u16 BE
//! id (UTF-8)
//! put:     the document's stored record as written to `docs` (see `record.rs`)
//! delete:  nothing more (the key is the tombstone's sequence)
//! ```
//! Entries are written in the same transaction as the document write, so the history
//! and the documents never disagree; the writes of one engine transaction have
//! consecutive keys with the same transaction id.
//!
//! `meta` key `backup_chain` holds the chain (`ChainState`, JSON) while one is
//! active; `Database::history_on` caches "there is one" for the write path. The
//! tree's name, the meta key and the key encoding are in `schema.rs`.

use crate::changes::ChangeKind;
use crate::DocumentError;
use crate::{DocError, Result};
use serde::{Deserialize, Serialize};

const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;
const HEADER_LEN: usize = 1 + 8 + 8 + 8 + 2;

/// An active backup chain, as stored in `meta`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ChainState {
    /// Random id naming the chain; every backup of it carries it.
    pub chain_id: String,
    /// The history holds every write after this sequence (older entries may have
    /// been trimmed): an increment can start at any backup of the chain at or after
    /// it.
    pub retained_after: u64,
    /// The sequence when the chain started (its full backup is at or after it).
    pub started_after: u64,
}

impl ChainState {
    pub fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(DocError::encode_json("the backup chain state"))
    }

    pub fn decode(b: &[u8]) -> Result<ChainState> {
        serde_json::from_slice(b).map_err(|e| {
            DocError::Document(DocumentError::Corrupt {
                id: "(meta backup_chain)".into(),
                why: e.to_string(),
            })
        })
    }
}

/// One decoded history entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HistoryEntry<'a> {
    pub sequence: u64,
    pub kind: ChangeKind,
    pub txn: u64,
    /// The sequence of the database's write before this one.
    pub prev: u64,
    pub at_ms: u64,
    pub id: &'a str,
    /// The stored record of a put (empty for a delete).
    pub record: &'a [u8],
}

fn header(kind: u8, txn: u64, prev: u64, at_ms: u64, id: &str, extra: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + id.len() + extra);
    out.push(kind);
    out.extend_from_slice(&txn.to_be_bytes());
    out.extend_from_slice(&prev.to_be_bytes());
    out.extend_from_slice(&at_ms.to_be_bytes());
    // Ids are at most the engine's key size (1 KiB), checked before any write.
    out.extend_from_slice(&(id.len() as u16).to_be_bytes());
    out.extend_from_slice(id.as_bytes());
    out
}

pub(crate) fn encode_put(txn: u64, prev: u64, at_ms: u64, id: &str, record: &[u8]) -> Vec<u8> {
    let mut out = header(KIND_PUT, txn, prev, at_ms, id, record.len());
    out.extend_from_slice(record);
    out
}

pub(crate) fn encode_delete(txn: u64, prev: u64, at_ms: u64, id: &str) -> Vec<u8> {
    header(KIND_DELETE, txn, prev, at_ms, id, 0)
}

/// What is malformed in a history entry (the caller names where it was found).
#[derive(Debug, thiserror::Error)]
pub(crate) enum MalformedHistoryEntry {
    #[error("history key of {key_len} bytes, expected 8")]
    KeyLength { key_len: usize },
    #[error("history entry {sequence} of {len} bytes is too short")]
    TooShort { sequence: u64, len: usize },
    #[error("history entry {sequence} has unknown kind {kind}")]
    UnknownKind { sequence: u64, kind: u8 },
    #[error("history entry {sequence}: id of {id_len} bytes overruns it")]
    IdOverruns { sequence: u64, id_len: usize },
    #[error("history entry {sequence}: id is not UTF-8")]
    IdNotUtf8 { sequence: u64 },
    #[error("history entry {sequence}: a delete with a body")]
    DeleteWithBody { sequence: u64 },
    #[error("history entry {sequence}: a put without a record")]
    PutWithoutRecord { sequence: u64 },
}

/// Decodes an entry, refusing what is malformed.
pub(crate) fn decode<'a>(
    k: &[u8],
    v: &'a [u8],
) -> std::result::Result<HistoryEntry<'a>, MalformedHistoryEntry> {
    use MalformedHistoryEntry as Malformed;
    let sequence = u64::from_be_bytes(
        k.try_into()
            .map_err(|_| Malformed::KeyLength { key_len: k.len() })?,
    );
    let (h, rest) = v.split_at_checked(HEADER_LEN).ok_or(Malformed::TooShort {
        sequence,
        len: v.len(),
    })?;
    let kind = match h[0] {
        KIND_PUT => ChangeKind::Put,
        KIND_DELETE => ChangeKind::Delete,
        kind => return Err(Malformed::UnknownKind { sequence, kind }),
    };
    let u64_at = |at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&h[at..at + 8]);
        u64::from_be_bytes(a)
    };
    let id_len = u16::from_be_bytes([h[25], h[26]]) as usize;
    let (id, record) = rest
        .split_at_checked(id_len)
        .ok_or(Malformed::IdOverruns { sequence, id_len })?;
    let id = std::str::from_utf8(id).map_err(|_| Malformed::IdNotUtf8 { sequence })?;
    if kind == ChangeKind::Delete && !record.is_empty() {
        return Err(Malformed::DeleteWithBody { sequence });
    }
    if kind == ChangeKind::Put && record.is_empty() {
        return Err(Malformed::PutWithoutRecord { sequence });
    }
    Ok(HistoryEntry {
        sequence,
        kind,
        txn: u64_at(1),
        prev: u64_at(9),
        at_ms: u64_at(17),
        id,
        record,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::schema::sequence_key;

    #[test]
    fn entries_round_trip_and_damage_is_refused() {
        let p = encode_put(7, 40, 1234, "users/ada", b"record");
        let e = decode(&sequence_key(42), &p).unwrap();
        assert_eq!(
            (e.sequence, e.kind, e.txn, e.prev, e.at_ms, e.id, e.record),
            (
                42,
                ChangeKind::Put,
                7,
                40,
                1234,
                "users/ada",
                &b"record"[..]
            )
        );
        let d = encode_delete(8, 42, 99, "x");
        let e = decode(&sequence_key(43), &d).unwrap();
        assert_eq!((e.kind, e.id, e.record.len()), (ChangeKind::Delete, "x", 0));
        for cut in 0..HEADER_LEN + 9 {
            assert!(decode(&sequence_key(1), &p[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = p.clone();
        bad[0] = 3;
        assert!(decode(&sequence_key(1), &bad).is_err());
        assert!(decode(b"short", &p).is_err());
    }
}
