//! Attachments: named binary files of a document, stored once per content.
//!
//! - A document lists its attachments in `@metadata.@attachments`, an array sorted
//!   by name of `{"name", "hash", "size", "content_type"}` (`hash`: SHA-256 of the
//!   bytes, lower-case hex). The list is part of the document: writing it is writing
//!   the document (new etag, change log entry, backup history entry, revisions).
//! - The bytes live in the blob store (`blobs.rs`), one file per hash under the
//!   database's directory (sealed in an encrypted database: `sealed.rs`). The `attachment_refs` tree counts, per hash, the
//!   documents' entries naming it; the count changes in the same transaction as
//!   the documents (`adjust`). A hash whose count reaches zero has its entry
//!   deleted in that transaction and its file unlinked after the commit.
//! - A document put that has no `@attachments` key keeps the attachments the
//!   document had (a client writing a body need not know about them); an explicit
//!   list (`[]` included) replaces them. Entries of a client's list must name a hash
//!   the database holds (attached to some document, or staged by
//!   `Database::stage_attachment` for a batch): the size is taken from the store,
//!   not from the client.
//! - A revision that names attachments holds a reference on each of their blobs,
//!   like a document: taken in the transaction that archives it, given back in
//!   the one that drops it (trimmed by `max_revisions`/`max_age_ms`, or purged).
//!   So an attachment removed from the current version stays while a revision
//!   names it, and a revert gives back working attachments (`revisions/keep.rs`).
//!   Revisions archived before revisions held references (their kind byte's
//!   flag clear) hold none and give none back.

mod blobs;
mod logged;
mod ops;

pub(crate) use blobs::BlobStore;
pub use blobs::{AttachmentCheck, BlobReader, BlobWriter, StagedBlob, UploadDecoder};
pub use ops::{check_attachments_at, AttachmentReader};

pub(crate) use crate::model::attachment_list::{
    hash_hex, parse_hash, parse_list, stored_list, Hash, ATTACHMENTS_KEY,
};
pub use crate::model::attachment_list::{
    validate_attachment_name, validate_content_type, AttachmentInfo, MAX_ATTACHMENTS_PER_DOCUMENT,
    MAX_ATTACHMENT_NAME_BYTES,
};
use crate::model::schema::ATTACHMENT_REFS;
use crate::write_hook::{DocWrite, FreedBlobs, WriteHook, Written};
use crate::{AttachmentError, DocumentError};
use crate::{DocError, Result};
use kiln_storage::WriteTxn;
use serde_json::{Map, Value};

/// How long a blob staged for a batch (`Database::stage_attachment`) waits for a
/// document to name it before it is freed.
pub const STAGED_TTL_MS: u64 = 3_600_000;

/// A reference count entry: documents' entries naming the hash, the blob's size,
/// and until when a staged blob (count 0) is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RefEntry {
    pub refs: u64,
    pub size_bytes: u64,
    pub staged_until_ms: u64,
}

impl RefEntry {
    pub fn encode(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&self.refs.to_be_bytes());
        out[8..16].copy_from_slice(&self.size_bytes.to_be_bytes());
        out[16..].copy_from_slice(&self.staged_until_ms.to_be_bytes());
        out
    }

    pub fn decode(hash: &[u8], raw: &[u8]) -> Result<RefEntry> {
        let n = |at: usize| -> Result<u64> {
            raw.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| {
                    DocError::Document(DocumentError::Corrupt {
                        id: format!("(attachment ref {})", hex::encode(hash)),
                        why: format!("entry of {} bytes, expected 24", raw.len()),
                    })
                })
        };
        Ok(RefEntry {
            refs: n(0)?,
            size_bytes: n(8)?,
            staged_until_ms: n(16)?,
        })
    }
}

pub(crate) fn read_ref(txn: &mut WriteTxn<'_>, hash: &Hash) -> Result<Option<RefEntry>> {
    match txn.get(ATTACHMENT_REFS, hash)? {
        Some(raw) => Ok(Some(RefEntry::decode(hash, raw)?)),
        None => Ok(None),
    }
}

/// A blob the current write may name although no ref entry has it yet: the one an
/// attachment upload is committing (`put_attachment`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fresh {
    pub hash: Hash,
    pub size_bytes: u64,
}

/// A document's attachments follow its writes: the blobs' reference counts move
/// from the list the replaced version names to the one the new version names.
#[derive(Default)]
pub(crate) struct AttachmentsHook {
    /// The blob an attachment upload commits in this unit, if any.
    pub fresh: Option<Fresh>,
}

impl WriteHook for AttachmentsHook {
    fn on_put(
        &mut self,
        txn: &mut WriteTxn<'_>,
        write: &DocWrite<'_>,
        written: &Written<'_>,
        freed: &mut FreedBlobs,
    ) -> Result<()> {
        let (old, new) = (write.old_attachments, written.attachments);
        adjust(txn, old, new, self.fresh, write.unit_ms, freed)
    }

    fn on_delete(
        &mut self,
        txn: &mut WriteTxn<'_>,
        write: &DocWrite<'_>,
        freed: &mut FreedBlobs,
    ) -> Result<()> {
        adjust(
            txn,
            write.old_attachments,
            &[],
            self.fresh,
            write.unit_ms,
            freed,
        )
    }
}

/// The attachments a put writes, from the client's `@metadata` and the document's
/// current list (`old`): the client's explicit list checked against the store
/// (sizes from the store), or, without the key, `old` kept. `None` when the
/// document has and gets none (nothing to change in the client's metadata).
pub(crate) fn settle(
    txn: &mut WriteTxn<'_>,
    client_metadata: &Map<String, Value>,
    old: &[AttachmentInfo],
    fresh: Option<Fresh>,
) -> Result<Option<Vec<AttachmentInfo>>> {
    let given = match client_metadata.get(ATTACHMENTS_KEY) {
        None | Some(Value::Null) if old.is_empty() => return Ok(None),
        None | Some(Value::Null) => return Ok(Some(old.to_vec())),
        Some(list) => parse_list(list, true)?,
    };
    let mut out = Vec::with_capacity(given.len());
    for mut entry in given {
        let hash = entry.hash_bytes()?;
        entry.size_bytes = match (fresh, read_ref(txn, &hash)?) {
            (Some(f), _) if f.hash == hash => f.size_bytes,
            (_, Some(r)) => r.size_bytes,
            (_, None) => {
                return Err(DocError::Attachment(AttachmentError::Invalid(format!(
                    "attachment {:?} names the hash {}, which this database does not hold \
                     (upload it first: PUT .../attachments/{{name}} or POST /dbs/{{db}}/attachments)",
                    entry.name, entry.hash
                ))))
            }
        };
        out.push(entry);
    }
    Ok(Some(out))
}

/// Moves the reference counts from the `old` list of a document to its `new` one
/// (in the write's transaction). Hashes whose count reaches zero are pushed to
/// `freed`: their files go after the commit (`BlobStore::release`).
pub(crate) fn adjust(
    txn: &mut WriteTxn<'_>,
    old: &[AttachmentInfo],
    new: &[AttachmentInfo],
    fresh: Option<Fresh>,
    now_ms: u64,
    freed: &mut Vec<Hash>,
) -> Result<()> {
    if old.is_empty() && new.is_empty() {
        return Ok(());
    }
    let mut deltas: Vec<(Hash, i64, u64)> = Vec::new();
    let mut add = |hash: Hash, d: i64, size: u64| match deltas.iter_mut().find(|x| x.0 == hash) {
        Some(x) => x.1 += d,
        None => deltas.push((hash, d, size)),
    };
    for a in old {
        if let Ok(h) = a.hash_bytes() {
            add(h, -1, a.size_bytes);
        }
    }
    for a in new {
        add(a.hash_bytes()?, 1, a.size_bytes);
    }
    for (hash, delta, size) in deltas {
        if delta == 0 {
            continue;
        }
        let entry = read_ref(txn, &hash)?;
        let now = entry.map_or(0, |e| e.refs);
        let refs = now.checked_add_signed(delta).ok_or_else(|| {
            DocError::Document(DocumentError::Corrupt {
                id: format!("(attachment ref {})", hash_hex(&hash)),
                why: format!("count {now} {delta:+} goes below zero"),
            })
        })?;
        let size_bytes = match (entry, fresh) {
            (Some(e), _) => e.size_bytes,
            (None, Some(f)) if f.hash == hash => f.size_bytes,
            (None, _) => size,
        };
        let staged_until_ms = entry.map_or(0, |e| e.staged_until_ms);
        if refs == 0 && staged_until_ms <= now_ms {
            txn.delete(ATTACHMENT_REFS, &hash)?;
            freed.push(hash);
        } else {
            let e = RefEntry {
                refs,
                size_bytes,
                staged_until_ms,
            };
            txn.put(ATTACHMENT_REFS, &hash, &e.encode())?;
            if refs == 0 {
                // Staged again until its time runs out: `BlobStore::release`
                // keeps the file and tells staged expiry about it.
                freed.push(hash);
            }
        }
    }
    Ok(())
}

/// The entries of `list` whose hash parses (a stored list is read leniently).
fn valid(list: &[AttachmentInfo]) -> Vec<AttachmentInfo> {
    list.iter()
        .filter(|a| a.hash_bytes().is_ok())
        .cloned()
        .collect()
}

/// A revision being archived takes a reference on each blob its `list` names
/// (in the archiving write's transaction). False when it names none.
pub(crate) fn hold(txn: &mut WriteTxn<'_>, list: &[AttachmentInfo], now_ms: u64) -> Result<bool> {
    let list = valid(list);
    if list.is_empty() {
        return Ok(false);
    }
    let mut freed = Vec::new();
    adjust(txn, &[], &list, None, now_ms, &mut freed)?;
    Ok(true)
}

/// A revision being dropped gives back the references `hold` took; hashes whose
/// count reaches zero go to `freed`.
pub(crate) fn unhold(
    txn: &mut WriteTxn<'_>,
    list: &[AttachmentInfo],
    now_ms: u64,
    freed: &mut Vec<Hash>,
) -> Result<()> {
    adjust(txn, &valid(list), &[], None, now_ms, freed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_hashes_are_checked() {
        assert!(validate_attachment_name("photo.jpg").is_ok());
        assert!(validate_attachment_name("").is_err());
        assert!(validate_attachment_name("a/b").is_err());
        assert!(validate_attachment_name("a\nb").is_err());
        assert!(validate_attachment_name(&"x".repeat(256)).is_err());
        let h = hash_hex(&[0xab; 32]);
        assert_eq!(parse_hash(&h).unwrap(), [0xab; 32]);
        assert!(parse_hash(&h.to_uppercase()).is_err());
        assert!(parse_hash("abc").is_err());
    }

    #[test]
    fn a_stored_list_is_read_leniently_and_a_clients_strictly() {
        let h = hash_hex(&[1; 32]);
        let json = format!(
            r#"{{"a":1,"@metadata":{{"@attachments":[{{"name":"b","hash":"{h}","size":3}},{{"name":"a","hash":"{h}","size":3,"content_type":"text/plain"}}]}}}}"#
        );
        let list = stored_list(json.as_bytes());
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].name, "a");
        assert_eq!(list[1].content_type, "application/octet-stream");
        assert!(stored_list(br#"{"@metadata":{"@attachments":5}}"#).is_empty());
        let dup = serde_json::json!([{"name":"a","hash":h},{"name":"a","hash":h}]);
        assert!(parse_list(&dup, true).is_err());
        let bad = serde_json::json!([{"name":"a/b","hash":h}]);
        assert!(parse_list(&bad, true).is_err());
    }
}
