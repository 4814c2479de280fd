//! The stored forms of the `revisions` and `revision_heads` trees' values.
//!
//! A revision (key: `schema::revision_key`, the id and the version's etag
//! sequence):
//! ```text
//! [0]        how the version ended: 1 replaced by a write, 2 deleted; with bit
//!            0x80 (`HOLDS_ATTACHMENTS`) set, the revision holds a reference on
//!            each blob its `@attachments` names (revisions archived before
//!            revisions held them, and those naming none, have it clear)
//! [1..5]     the version's etag incarnation, u32 BE
//! [5..13]    the version's last-modified time, ms since the epoch, u64 BE
//! [13..21]   when it was replaced or deleted (what `max_age_ms` counts from), u64 BE
//! [21..23]   key id length in bytes, u16 BE (0: not known)
//! key id (UTF-8): the API key that wrote the version
//! the version's JSON as it was stored (with its `@metadata`)
//! ```
//!
//! A head (key: the document id), for a document that has revisions or whose
//! current version's writer is known:
//! ```text
//! [0..8]     etag sequence of the current version (0: the document is deleted)
//! [8..12]    revisions the document has, u32 BE
//! [12..14]   key id length, u16 BE, then the key id that wrote the current version
//! ```
//! The head's key id counts only for the version its sequence names: a version
//! written while revisions were off never takes the key of an older one.

use crate::DocumentError;
use crate::{DocError, Etag, Result};

const KIND_REPLACED: u8 = 1;
const KIND_DELETED: u8 = 2;
/// The kind byte's flag: the revision counts in `attachment_refs` for the blobs
/// its JSON names (taken when it was archived, given back when it is dropped).
const HOLDS_ATTACHMENTS: u8 = 0x80;
const REVISION_HEADER_LEN: usize = 23;
const HEAD_HEADER_LEN: usize = 14;

/// One previous version of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    pub etag: Etag,
    pub last_modified_ms: u64,
    /// When a write replaced it, or a delete removed it.
    pub replaced_ms: u64,
    /// True when the version ended by a delete (the document's last version
    /// before it was deleted).
    pub deleted: bool,
    /// The API key that wrote the version, when the server knew it.
    pub key_id: Option<String>,
    /// The version's JSON as it was stored, `@metadata` included.
    pub json: Vec<u8>,
}

/// The version being archived, as `encode_revision` writes it.
pub(crate) struct Archived<'a> {
    pub incarnation: u32,
    pub last_modified_ms: u64,
    pub replaced_ms: u64,
    pub deleted: bool,
    pub key_id: Option<&'a str>,
    pub json: &'a [u8],
    /// The revision took references on the blobs `json` names.
    pub holds_attachments: bool,
}

/// Key ids longer than this are not kept (the server's are short hex names).
const MAX_KEY_ID_BYTES: usize = 256;

fn key_id_bytes(key_id: Option<&str>) -> &[u8] {
    key_id
        .filter(|k| k.len() <= MAX_KEY_ID_BYTES)
        .map_or(&[][..], str::as_bytes)
}

pub(crate) fn encode_revision(a: &Archived<'_>) -> Vec<u8> {
    let key = key_id_bytes(a.key_id);
    let mut out = Vec::with_capacity(REVISION_HEADER_LEN + key.len() + a.json.len());
    let kind = if a.deleted {
        KIND_DELETED
    } else {
        KIND_REPLACED
    };
    out.push(if a.holds_attachments {
        kind | HOLDS_ATTACHMENTS
    } else {
        kind
    });
    out.extend_from_slice(&a.incarnation.to_be_bytes());
    out.extend_from_slice(&a.last_modified_ms.to_be_bytes());
    out.extend_from_slice(&a.replaced_ms.to_be_bytes());
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(a.json);
    out
}

fn corrupt(id: &str, why: String) -> DocError {
    DocError::Document(DocumentError::Corrupt {
        id: format!("(revision of {id:?})"),
        why,
    })
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// When a stored revision was replaced, read from its header alone (trimming by
/// age reads no JSON).
pub(crate) fn replaced_ms(id: &str, value: &[u8]) -> Result<u64> {
    if value.len() < REVISION_HEADER_LEN {
        return Err(corrupt(
            id,
            format!("{} bytes, shorter than its header", value.len()),
        ));
    }
    Ok(u64_at(value, 13))
}

/// The JSON of a stored revision that holds references on its attachments'
/// blobs (`None`: it holds none), for dropping it.
pub(crate) fn held_attachments_json<'v>(id: &str, value: &'v [u8]) -> Result<Option<&'v [u8]>> {
    let header = value.get(..REVISION_HEADER_LEN).ok_or_else(|| {
        corrupt(
            id,
            format!("{} bytes, shorter than its header", value.len()),
        )
    })?;
    if header[0] & HOLDS_ATTACHMENTS == 0 {
        return Ok(None);
    }
    let key_len = u16::from_be_bytes([header[21], header[22]]) as usize;
    value[REVISION_HEADER_LEN..]
        .get(key_len..)
        .map(Some)
        .ok_or_else(|| corrupt(id, format!("key id of {key_len} bytes overruns it")))
}

pub(crate) fn decode_revision(id: &str, sequence: u64, value: &[u8]) -> Result<Revision> {
    let header = value.get(..REVISION_HEADER_LEN).ok_or_else(|| {
        corrupt(
            id,
            format!("{} bytes, shorter than its header", value.len()),
        )
    })?;
    let deleted = match header[0] & !HOLDS_ATTACHMENTS {
        KIND_REPLACED => false,
        KIND_DELETED => true,
        other => return Err(corrupt(id, format!("unknown kind {other}"))),
    };
    let key_len = u16::from_be_bytes([header[21], header[22]]) as usize;
    let rest = &value[REVISION_HEADER_LEN..];
    let (key, json) = rest
        .split_at_checked(key_len)
        .ok_or_else(|| corrupt(id, format!("key id of {key_len} bytes overruns it")))?;
    let key_id = match key_len {
        0 => None,
        _ => Some(
            std::str::from_utf8(key)
                .map_err(|_| corrupt(id, "key id is not UTF-8".into()))?
                .to_string(),
        ),
    };
    Ok(Revision {
        etag: Etag {
            incarnation: u32::from_be_bytes([header[1], header[2], header[3], header[4]]),
            sequence,
        },
        last_modified_ms: u64_at(header, 5),
        replaced_ms: u64_at(header, 13),
        deleted,
        key_id,
        json: json.to_vec(),
    })
}

/// A document's revision bookkeeping (`revision_heads`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Head {
    /// The etag sequence of the current version (0: none, the document is deleted).
    pub current: u64,
    pub count: u32,
    /// The key that wrote the current version.
    pub key_id: Option<String>,
}

impl Head {
    /// The key that wrote the version with etag sequence `sequence`, if known.
    pub fn writer_of(&self, sequence: u64) -> Option<&str> {
        (self.current == sequence && sequence != 0)
            .then_some(self.key_id.as_deref())
            .flatten()
    }

    /// Whether the head says anything (else it is not stored).
    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.key_id.is_none()
    }

    pub fn encode(&self) -> Vec<u8> {
        let key = key_id_bytes(self.key_id.as_deref());
        let mut out = Vec::with_capacity(HEAD_HEADER_LEN + key.len());
        out.extend_from_slice(&self.current.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(&(key.len() as u16).to_be_bytes());
        out.extend_from_slice(key);
        out
    }

    pub fn decode(id: &str, value: &[u8]) -> Result<Head> {
        let bad = |why: &str| {
            DocError::Document(DocumentError::Corrupt {
                id: format!("(revision head of {id:?})"),
                why: why.into(),
            })
        };
        let header = value
            .get(..HEAD_HEADER_LEN)
            .ok_or_else(|| bad("shorter than its header"))?;
        let key_len = u16::from_be_bytes([header[12], header[13]]) as usize;
        let key = value
            .get(HEAD_HEADER_LEN..)
            .filter(|k| k.len() == key_len)
            .ok_or_else(|| bad("its key id's length does not match"))?;
        let key_id = match key_len {
            0 => None,
            _ => Some(
                std::str::from_utf8(key)
                    .map_err(|_| bad("key id is not UTF-8"))?
                    .to_string(),
            ),
        };
        Ok(Head {
            current: u64_at(header, 0),
            count: u32::from_be_bytes([header[8], header[9], header[10], header[11]]),
            key_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_and_heads_round_trip_and_damage_is_refused() {
        let a = Archived {
            incarnation: 7,
            last_modified_ms: 1_000,
            replaced_ms: 2_000,
            deleted: true,
            key_id: Some("ops"),
            json: br#"{"a":1}"#,
            holds_attachments: false,
        };
        let v = encode_revision(&a);
        let r = decode_revision("x", 42, &v).unwrap();
        assert_eq!(
            (
                r.etag.to_string(),
                r.last_modified_ms,
                r.replaced_ms,
                r.deleted
            ),
            ("42-00000007".to_string(), 1_000, 2_000, true)
        );
        assert_eq!(
            (r.key_id.as_deref(), &r.json[..]),
            (Some("ops"), &br#"{"a":1}"#[..])
        );
        assert_eq!(replaced_ms("x", &v).unwrap(), 2_000);
        for cut in 0..REVISION_HEADER_LEN + 3 {
            assert!(decode_revision("x", 1, &v[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = v.clone();
        bad[0] = 9;
        assert!(decode_revision("x", 1, &bad).is_err());
        let unknown = encode_revision(&Archived { key_id: None, ..a });
        assert_eq!(decode_revision("x", 1, &unknown).unwrap().key_id, None);
        assert_eq!(held_attachments_json("x", &v).unwrap(), None);
        let holding = encode_revision(&Archived {
            holds_attachments: true,
            ..a
        });
        let r = decode_revision("x", 42, &holding).unwrap();
        assert!(r.deleted && r.json == br#"{"a":1}"#);
        assert_eq!(
            held_attachments_json("x", &holding).unwrap(),
            Some(&br#"{"a":1}"#[..])
        );

        let head = Head {
            current: 9,
            count: 3,
            key_id: Some("k".into()),
        };
        let raw = head.encode();
        assert_eq!(Head::decode("x", &raw).unwrap(), head);
        assert_eq!(head.writer_of(9), Some("k"));
        assert_eq!(head.writer_of(8), None);
        assert!(Head::decode("x", &raw[..raw.len() - 1]).is_err());
        assert!(Head::decode("x", &raw[..5]).is_err());
        assert!(Head::default().is_empty());
    }
}
