//! The write path's half of revisions: every put and delete of a document whose
//! collection keeps revisions archives the version it replaces, in the write's own
//! transaction, then drops what the limits no longer allow (its `WriteHook`, which
//! `database/apply.rs` calls before the write's first tree write). An archived version that
//! names attachments takes a reference on their blobs, and a dropped one gives
//! it back (`attachments::hold`/`unhold`), in the same transaction.

use super::config::{CollectionRevisions, UnitConfig};
use super::entry::{encode_revision, held_attachments_json, replaced_ms, Archived, Head};
use crate::attachments::{self, Hash};
use crate::model::record;
use crate::model::schema::{revision_key, REVISIONS, REVISION_HEADS};
use crate::write_hook::{DocWrite, FreedBlobs, WriteHook, Written};
use crate::{DocError, Etag, Result};
use kiln_storage::WriteTxn;

/// One write, as revisions see it.
pub(crate) struct Change<'a> {
    pub id: &'a str,
    /// The version the write replaces (its etag and collection), if any.
    pub replaced: Option<(Etag, Option<&'a str>)>,
    /// The new version's etag sequence and collection; `None` for a delete.
    pub written: Option<(u64, Option<&'a str>)>,
    /// The API key making the write, when known.
    pub key_id: Option<&'a str>,
    /// The write's time: when the replaced version stopped being current.
    pub at_ms: u64,
}

impl Change<'_> {
    fn policy(&self, config: &super::RevisionsConfig) -> Option<CollectionRevisions> {
        let new = self.written.and_then(|(_, c)| c);
        config.policy_for(new, self.replaced.and_then(|(_, c)| c))
    }
}

/// Archives the version `change` replaces (if its collection keeps revisions) and
/// trims the document's revisions to the limits. Its one check (the id's length)
/// comes before its first write; the caller's checks all come before it. Blobs
/// whose count reached zero (revisions dropped) go to `freed`.
pub(crate) fn keep(
    txn: &mut WriteTxn<'_>,
    config: &mut UnitConfig,
    change: &Change<'_>,
    freed: &mut Vec<Hash>,
) -> Result<()> {
    let config = config.get(txn)?;
    if config.is_empty() {
        return Ok(());
    }
    let Some(policy) = change.policy(&config) else {
        return Ok(());
    };
    check_id(change.id)?;
    let head = read_head(txn, change.id)?;
    let mut count = head.count;
    if let Some((etag, _)) = change.replaced {
        archive(txn, change, etag, head.writer_of(etag.sequence))?;
        count = count.saturating_add(1);
    }
    let count = trim(txn, change.id, &policy, count, change.at_ms, freed)?;
    let new_head = Head {
        current: change.written.map_or(0, |(sequence, _)| sequence),
        count,
        key_id: change.key_id.map(str::to_string),
    };
    write_head(txn, change.id, &new_head)
}

/// A document's revisions follow its writes: the version a write replaces is
/// archived, the document's revisions trimmed and its head moved.
impl WriteHook for UnitConfig {
    fn on_put(
        &mut self,
        txn: &mut WriteTxn<'_>,
        write: &DocWrite<'_>,
        written: &Written<'_>,
        freed: &mut FreedBlobs,
    ) -> Result<()> {
        let change = Change::of(write, Some((written.sequence, written.collection)));
        keep(txn, self, &change, freed)
    }

    fn on_delete(
        &mut self,
        txn: &mut WriteTxn<'_>,
        write: &DocWrite<'_>,
        freed: &mut FreedBlobs,
    ) -> Result<()> {
        keep(txn, self, &Change::of(write, None), freed)
    }
}

impl<'a> Change<'a> {
    fn of(write: &DocWrite<'a>, written: Option<(u64, Option<&'a str>)>) -> Change<'a> {
        Change {
            id: write.id,
            replaced: write.replaced,
            written,
            key_id: write.key_id,
            at_ms: write.at_ms,
        }
    }
}

fn check_id(id: &str) -> Result<()> {
    crate::model::limits::check_id(id, crate::model::limits::IdRule::Revised)
        .map_err(DocError::from)
}

pub(crate) fn read_head(txn: &mut WriteTxn<'_>, id: &str) -> Result<Head> {
    match txn.get(REVISION_HEADS, id.as_bytes())? {
        Some(raw) => Head::decode(id, raw),
        None => Ok(Head::default()),
    }
}

pub(crate) fn write_head(txn: &mut WriteTxn<'_>, id: &str, head: &Head) -> Result<()> {
    if head.is_empty() {
        txn.delete(REVISION_HEADS, id.as_bytes())?;
    } else {
        txn.put(REVISION_HEADS, id.as_bytes(), &head.encode())?;
    }
    Ok(())
}

/// Copies the stored version `etag` of the document into `revisions`.
fn archive(
    txn: &mut WriteTxn<'_>,
    change: &Change<'_>,
    etag: Etag,
    writer: Option<&str>,
) -> Result<()> {
    let stored = crate::stored::get_mut(txn, change.id)?.ok_or_else(|| {
        DocError::Internal(format!(
            "{:?}: the version a write replaces is gone",
            change.id
        ))
    })?;
    let rec = record::decode(change.id, stored)?;
    if rec.etag != etag {
        return Err(DocError::Internal(format!(
            "{:?}: the stored version is {}, the write replaces {etag}",
            change.id, rec.etag
        )));
    }
    let json = rec.to_json(change.id)?;
    let (incarnation, last_modified_ms) = (rec.etag.incarnation, rec.last_modified_ms);
    let encode = |json: &[u8], holds_attachments: bool| {
        encode_revision(&Archived {
            incarnation,
            last_modified_ms,
            replaced_ms: change.at_ms,
            deleted: change.written.is_none(),
            key_id: writer,
            json,
            holds_attachments,
        })
    };
    // Most documents name no attachment (`stored_list` then parses nothing).
    // One that does takes a reference on each blob: its JSON, which may borrow
    // the transaction's page, is copied out first.
    let list = attachments::stored_list(&json);
    let value = if list.is_empty() {
        encode(&json, false)
    } else {
        let json = json.into_owned();
        let holds = attachments::hold(txn, &list, change.at_ms)?;
        encode(&json, holds)
    };
    txn.put(REVISIONS, &revision_key(change.id, etag.sequence), &value)?;
    Ok(())
}

/// Drops the document's oldest revisions while it has more than `max_revisions`
/// or they were replaced more than `max_age_ms` before `now_ms`; returns how many
/// are left. Revisions are in etag order, which is the order they were replaced
/// in, so it stops at the first one kept.
fn trim(
    txn: &mut WriteTxn<'_>,
    id: &str,
    policy: &CollectionRevisions,
    count: u32,
    now_ms: u64,
    freed: &mut Vec<Hash>,
) -> Result<u32> {
    let excess = count.saturating_sub(policy.max_revisions) as usize;
    if count == 0 || (excess == 0 && policy.max_age_ms.is_none()) {
        return Ok(count);
    }
    let prefix = revision_key(id, 0);
    let prefix = &prefix[..id.len() + 1];
    let mut doomed: Vec<(Vec<u8>, Vec<attachments::AttachmentInfo>)> = Vec::new();
    {
        let mut cursor = txn.cursor(REVISIONS)?;
        let mut entry = cursor.seek(prefix)?;
        while let Some((key, value)) = entry {
            if !key.starts_with(prefix) {
                break;
            }
            let too_old = match policy.max_age_ms {
                Some(max_age_ms) => now_ms.saturating_sub(replaced_ms(id, value)?) > max_age_ms,
                None => false,
            };
            if doomed.len() >= excess && !too_old {
                break;
            }
            doomed.push((key.to_vec(), held_list(id, value)?));
            entry = cursor.next()?;
        }
    }
    for (key, held) in &doomed {
        txn.delete(REVISIONS, key)?;
        attachments::unhold(txn, held, now_ms, freed)?;
    }
    Ok(count.saturating_sub(doomed.len() as u32))
}

/// The attachments a stored revision holds references on (none for most).
pub(crate) fn held_list(id: &str, value: &[u8]) -> Result<Vec<attachments::AttachmentInfo>> {
    Ok(held_attachments_json(id, value)?.map_or_else(Vec::new, attachments::stored_list))
}
