//! Document revisions: the previous versions of the documents of the collections a
//! database is configured to keep them for (`RevisionsConfig`, stored under the
//! `meta` key `revisions_config`).
//!
//! Every put and delete of such a document archives the version it replaces in the
//! SAME transaction as the write (`keep.rs`, called by `database/apply.rs` on every
//! write path: single writes, batches, bulk inserts, a cluster's log entries and a
//! restore's replay), then drops the oldest revisions beyond `max_revisions` and
//! those replaced longer than `max_age_ms` before the write. A delete archives the
//! deleted version (marked `deleted`); a deleted document's revisions stay until
//! they are purged (`purge_revisions`). Nothing else removes them: a collection
//! taken out of the configuration keeps the revisions it has.
//!
//! Trees (their values: `entry.rs`):
//! - `revisions`: id, 0x00, etag sequence (u64 BE) -> a previous version: one
//!   document's revisions are contiguous and in etag order (oldest first).
//! - `revision_heads`: id -> the current version's etag sequence, how many
//!   revisions the document has (trimming needs no count by scan) and the API key
//!   that wrote the current version (so its revision can name it later).
//!
//! Both trees are made with the first configuration; until then the write path's
//! only cost is one look at an empty configuration per write.

mod config;
mod entry;
pub(crate) mod keep;

pub use config::{
    CollectionRevisions, RevisionsConfig, MAX_CONFIGURED_COLLECTIONS, MAX_REVISIONS_LIMIT,
};
pub(crate) use config::{SharedConfig, UnitConfig};
pub use entry::Revision;

use crate::attachments::BlobStore;
use crate::{DocumentError, RevisionError};
// A circle with database/, on purpose: a revision's restore is a document write
// (`Database::put` with its conditions, its log index claimed like any write's), and
// the database's write unit keeps revisions as part of the same commit
// (`database/apply.rs` calls `keep`). Making revisions a hook the write unit calls
// (`on_put`) would remove the second edge, not the first.
use crate::database::claim_log_index;
use crate::model::schema::{revision_key, META, META_REVISIONS, REVISIONS, REVISION_HEADS};
use crate::{Condition, Database, DocError, DocId, Etag, Page, PutOutcome, Result, WriteOp};
use kiln_storage::{Env, ReadTxn, WriteTxn};

/// The stored configuration (`meta` `revisions_config`), empty when none was set.
pub(crate) fn stored_config(raw: Option<&[u8]>) -> Result<RevisionsConfig> {
    raw.map_or(Ok(RevisionsConfig::default()), RevisionsConfig::decode)
}

/// The configuration stored in an environment (a database being opened).
pub(crate) fn load_config(env: &Env) -> Result<SharedConfig> {
    let r = env.begin_read()?;
    Ok(SharedConfig::new(stored_config(
        r.get(META, META_REVISIONS)?,
    )?))
}

impl Database {
    /// Which collections keep revisions (empty until configured).
    pub fn revisions_config(&self) -> Result<RevisionsConfig> {
        let r = self.live()?.begin_read()?;
        stored_config(r.get(META, META_REVISIONS)?)
    }

    /// Replaces the revisions configuration (checked first). Writes that commit
    /// after it follow it; revisions already kept stay.
    pub fn set_revisions_config(&self, config: RevisionsConfig) -> Result<()> {
        config.check()?;
        let shared = self.revisions.clone();
        self.live()?
            .submit_with(move |txn| store_config(txn, &shared, config))
    }

    /// `set_revisions_config` from a cluster's log entry `log_index`, applied once
    /// (the index is stored with it, as `apply_logged` does). False when the entry
    /// was applied before.
    pub fn set_revisions_config_logged(
        &self,
        log_index: u64,
        config: RevisionsConfig,
    ) -> Result<bool> {
        config.check()?;
        let shared = self.revisions.clone();
        self.live()?.submit_with(move |txn| {
            if !claim_log_index(txn, log_index)? {
                return Ok(false);
            }
            store_config(txn, &shared, config).map(|()| true)
        })
    }

    /// A page of the document's revisions, newest first, starting before the
    /// revision whose etag is `before` (a page's `next`). A deleted document's
    /// revisions are listed too; a document that never had any gives an empty page.
    pub fn revisions(
        &self,
        id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Page<Revision>> {
        let env = self.live()?;
        self.check_id(&DocId::Given(id.to_string()))?;
        let before = match before {
            // An etag of this database (not the start a changes feed takes).
            Some(etag @ ("" | "0")) => {
                return Err(DocError::Document(DocumentError::InvalidEtag(etag.into())))
            }
            Some(etag) => Some(self.sequence_of(etag)?),
            None => None,
        };
        let r = env.begin_read()?;
        if !r.tree_exists(REVISIONS)? {
            return Ok(Page {
                items: Vec::new(),
                next: None,
            });
        }
        read_page(&r, id, before, limit.max(1))
    }

    /// The revision of `id` with this etag, if the document has it.
    pub fn revision(&self, id: &str, etag: Etag) -> Result<Option<Revision>> {
        let env = self.live()?;
        self.check_id(&DocId::Given(id.to_string()))?;
        let r = env.begin_read()?;
        if !r.tree_exists(REVISIONS)? {
            return Ok(None);
        }
        match r.get(REVISIONS, &revision_key(id, etag.sequence))? {
            None => Ok(None),
            Some(value) => {
                let revision = entry::decode_revision(id, etag.sequence, value)?;
                Ok((revision.etag == etag).then_some(revision))
            }
        }
    }

    /// Writes the content of the revision `etag` of `id` back as a new version
    /// (a put like any other, under `condition`, made by `key_id`; the version it
    /// replaces becomes a revision in turn). `RevisionNotFound` if there is no
    /// such revision.
    pub fn revert(
        &self,
        id: &str,
        etag: Etag,
        condition: Condition,
        key_id: Option<String>,
    ) -> Result<PutOutcome> {
        let revision = self.revision(id, etag)?.ok_or_else(|| {
            DocError::Revision(RevisionError::NotFound {
                id: id.to_string(),
                etag: etag.to_string(),
            })
        })?;
        let op = WriteOp::Put {
            id: DocId::Given(id.to_string()),
            document: self.parse_document(&revision.json)?,
            condition,
        }
        .attributed(key_id);
        match self.write_each(vec![op]).pop() {
            Some(Ok(crate::BatchOutcome::Put(out))) => Ok(out),
            Some(Err(e)) => Err(e),
            _ => Err(DocError::Internal(
                "a revert came back without its put".into(),
            )),
        }
    }

    /// Removes every revision of `id` (a deleted document's included); returns
    /// how many there were.
    pub fn purge_revisions(&self, id: &str) -> Result<u64> {
        self.check_id(&DocId::Given(id.to_string()))?;
        let id = id.to_string();
        let env = self.live()?;
        let blobs = self.blobs.clone();
        let n = env.submit_with(move |txn| purge(txn, &id, &blobs))?;
        self.release_freed_blobs(env);
        Ok(n)
    }

    /// `purge_revisions` from a cluster's log entry `log_index`, applied once;
    /// `None` when the entry was applied before.
    pub fn purge_revisions_logged(&self, log_index: u64, id: &str) -> Result<Option<u64>> {
        self.check_id(&DocId::Given(id.to_string()))?;
        let id = id.to_string();
        let env = self.live()?;
        let blobs = self.blobs.clone();
        let out = env.submit_with(move |txn| {
            if !claim_log_index(txn, log_index)? {
                return Ok(None);
            }
            purge(txn, &id, &blobs).map(Some)
        })?;
        self.release_freed_blobs(env);
        Ok(out)
    }
}

/// Stores `config` (making the trees on first use) and hands it to the writes that
/// follow, inside the unit: see `SharedConfig`.
fn store_config(
    txn: &mut WriteTxn<'_>,
    shared: &SharedConfig,
    config: RevisionsConfig,
) -> Result<()> {
    txn.ensure_tree(REVISIONS)?;
    txn.ensure_tree(REVISION_HEADS)?;
    txn.put(META, META_REVISIONS, &config.encode()?)?;
    shared.replace(config);
    Ok(())
}

fn read_page(
    r: &ReadTxn<'_>,
    id: &str,
    before: Option<u64>,
    limit: usize,
) -> Result<Page<Revision>> {
    let start = match before {
        Some(0) => {
            return Ok(Page {
                items: Vec::new(),
                next: None,
            })
        }
        Some(sequence) => sequence - 1,
        None => u64::MAX,
    };
    let start = revision_key(id, start);
    let prefix = &start[..id.len() + 1];
    let mut cursor = r.cursor(REVISIONS)?;
    let mut entry = cursor.seek_for_prev(&start)?;
    let mut items: Vec<Revision> = Vec::new();
    while let Some((key, value)) = entry {
        if !key.starts_with(prefix) {
            break;
        }
        if items.len() == limit {
            let next = items.last().map(|r| r.etag.to_string());
            return Ok(Page { items, next });
        }
        let sequence = crate::model::schema::decode_u64(&key[prefix.len()..], "revision sequence")?;
        items.push(entry::decode_revision(id, sequence, value)?);
        entry = cursor.prev()?;
    }
    Ok(Page { items, next: None })
}

/// Drops every revision of `id`, giving back the references they held on
/// attachments' blobs (those that reach zero go to `blobs`, unlinked after the
/// commit).
fn purge(txn: &mut WriteTxn<'_>, id: &str, blobs: &BlobStore) -> Result<u64> {
    if !txn.tree_exists(REVISIONS)? {
        return Ok(0);
    }
    let prefix = revision_key(id, 0);
    let prefix = &prefix[..id.len() + 1];
    let mut doomed: Vec<(Vec<u8>, Vec<crate::AttachmentInfo>)> = Vec::new();
    {
        let mut cursor = txn.cursor(REVISIONS)?;
        let mut entry = cursor.seek(prefix)?;
        while let Some((key, value)) = entry {
            if !key.starts_with(prefix) {
                break;
            }
            doomed.push((key.to_vec(), keep::held_list(id, value)?));
            entry = cursor.next()?;
        }
    }
    let now_ms = crate::model::time::now_ms();
    let mut freed = Vec::new();
    for (key, held) in &doomed {
        txn.delete(REVISIONS, key)?;
        crate::attachments::unhold(txn, held, now_ms, &mut freed)?;
    }
    if !freed.is_empty() {
        blobs.freed(freed);
    }
    let head = keep::read_head(txn, id)?;
    keep::write_head(txn, id, &entry::Head { count: 0, ..head })?;
    Ok(doomed.len() as u64)
}
