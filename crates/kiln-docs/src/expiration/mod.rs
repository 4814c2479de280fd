//! Document expiration: a document whose `@metadata.@expires` (an RFC 3339 time)
//! has passed is deleted like any other delete (a tombstone, a change log entry,
//! a backup history entry) by whoever calls [`Database::expire`]: the server, every
//! `--expiration-check-ms`; a cluster's leader proposes the same deletes through
//! its log instead.
//!
//! Trees (names and key encoding in `schema.rs`):
//! - `expirations`: expiry time (ms since the epoch, u64 BE) ++ id -> the etag
//!   sequence of the document's latest write (u64 BE). Ordered by time, so what
//!   is due at T is one seek to the first key and a scan that stops at the first
//!   key after T: a check when nothing is due reads one entry (or none).
//! - `expiration_ids`: id -> expiry time (u64 BE), so that a write finds the entry
//!   it replaces without parsing the document it replaces.
//!
//! Both are written in the same transaction as the document (`on_put`,
//! `on_delete`, called by `database/apply.rs`), so they never disagree with
//! `docs`. A database that has never had an expiring document skips even the
//! lookup in `expiration_ids` (`Unit::expirations_possible`).
//!
//! Deleting reads what is due with each document's etag (`expired`), then deletes
//! with `Condition::IfMatch(etag)` (`delete_expired`): a document rewritten in
//! between (its etag moved, and maybe its expiry) is left alone.

pub(crate) mod upgrade;

use crate::model::schema::{
    decode_expiration_key, decode_u64, expiration_key, EXPIRATIONS, EXPIRATION_IDS,
};
use crate::write_hook::{DocWrite, FreedBlobs, WriteHook, Written};
use crate::DocumentError;
use crate::{Condition, Database, DocError, Etag, Result, WriteOp};
use kiln_storage::WriteTxn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(crate) use crate::model::limits::MAX_EXPIRING_ID_BYTES;

/// A document whose expiry time has passed, as `Database::expired` found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueDocument {
    pub id: String,
    /// Its etag when it was found: the delete is conditional on it.
    pub etag: Etag,
    pub expires_at_ms: u64,
}

/// What deleting expired documents did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpireReport {
    /// Documents deleted.
    pub deleted: u64,
    /// Documents found due but rewritten or deleted before their delete ran.
    pub skipped: u64,
}

impl ExpireReport {
    fn add(&mut self, other: ExpireReport) {
        self.deleted += other.deleted;
        self.skipped += other.skipped;
    }
}

impl Database {
    /// Documents whose expiry time is at or before `now_ms`, soonest first, at
    /// most `limit`, each with its current etag. Reads one snapshot; when nothing
    /// is due it costs one seek.
    pub fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<DueDocument>> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let mut cursor = r.cursor(EXPIRATIONS)?;
        let mut entry = cursor.first()?;
        let mut due = Vec::new();
        while let Some((key, value)) = entry {
            let (expires_at_ms, id) = decode_expiration_key(key)?;
            if due.len() >= limit || expires_at_ms > now_ms {
                break;
            }
            due.push(DueDocument {
                id: id.to_string(),
                etag: Etag {
                    incarnation: self.incarnation,
                    sequence: decode_u64(value, "expiring document's etag")?,
                },
                expires_at_ms,
            });
            entry = cursor.next()?;
        }
        Ok(due)
    }

    /// Deletes documents `expired` found, each only if it still has the etag it
    /// was found with (one commit-queue unit; each delete succeeds or is skipped
    /// on its own). A storage failure is returned as it is.
    pub fn delete_expired(&self, due: Vec<DueDocument>) -> Result<ExpireReport> {
        let ops = due
            .into_iter()
            .map(|d| WriteOp::Delete {
                id: d.id,
                condition: Condition::IfMatch(d.etag),
            })
            .collect();
        let mut report = ExpireReport::default();
        for result in self.write_each(ops) {
            match result {
                Ok(_) => report.deleted += 1,
                // Rewritten or deleted since it was found: its new write decides.
                Err(
                    DocError::Document(DocumentError::Conflict { .. })
                    | DocError::Document(DocumentError::NotFound { .. }),
                ) => report.skipped += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }

    /// Deletes every document due at `now_ms`, `batch_docs` per commit-queue unit,
    /// until none is left.
    pub fn expire(&self, now_ms: u64, batch_docs: usize) -> Result<ExpireReport> {
        let batch_docs = batch_docs.max(1);
        let mut total = ExpireReport::default();
        loop {
            let due = self.expired(now_ms, batch_docs)?;
            let full = due.len() == batch_docs;
            if due.is_empty() {
                return Ok(total);
            }
            let report = self.delete_expired(due)?;
            total.add(report);
            // A batch that deleted nothing would find the same entries again (only
            // an index out of step with the documents could do that: stop there).
            if !full || report.deleted == 0 {
                return Ok(total);
            }
        }
    }
}

/// Refuses an expiring document whose id is too long for its index key (before
/// the write's first tree write, like every check).
pub(crate) fn check_id(id: &str) -> Result<()> {
    crate::model::limits::check_id(id, crate::model::limits::IdRule::Expiring)
        .map_err(DocError::from)
}

/// A document's expiration follows its writes: its entry in `expirations` and
/// `expiration_ids` is replaced by a put (written if the new version expires) and
/// removed by a delete. `possible` is false while the database has never had an
/// expiring document: a write then need not look for an entry to replace.
pub(crate) struct ExpirationHook {
    pub possible: Arc<AtomicBool>,
}

impl WriteHook for ExpirationHook {
    fn on_put(
        &mut self,
        txn: &mut WriteTxn<'_>,
        write: &DocWrite<'_>,
        written: &Written<'_>,
        _freed: &mut FreedBlobs,
    ) -> Result<()> {
        let existed = write.replaced.is_some();
        let (at, sequence) = (written.expires_at_ms, written.sequence);
        on_put(txn, &self.possible, write.id, existed, at, sequence)
    }

    fn on_delete(
        &mut self,
        txn: &mut WriteTxn<'_>,
        write: &DocWrite<'_>,
        _freed: &mut FreedBlobs,
    ) -> Result<()> {
        on_delete(txn, &self.possible, write.id)
    }
}

/// The index writes of a put: the entry the document had (if it existed and any
/// document may have one) goes, its new one (if it expires) comes, at the new
/// etag's `sequence`.
fn on_put(
    txn: &mut WriteTxn<'_>,
    possible: &AtomicBool,
    id: &str,
    existed: bool,
    expires_at_ms: Option<u64>,
    sequence: u64,
) -> Result<()> {
    if existed && possible.load(Ordering::SeqCst) {
        remove(txn, id, expires_at_ms.is_none())?;
    }
    if let Some(at) = expires_at_ms {
        // Set before the unit commits, so every later unit looks for entries.
        possible.store(true, Ordering::SeqCst);
        txn.put(
            EXPIRATIONS,
            &expiration_key(at, id),
            &sequence.to_be_bytes(),
        )?;
        txn.put(EXPIRATION_IDS, id.as_bytes(), &at.to_be_bytes())?;
    }
    Ok(())
}

/// The index writes of a delete: the document's entry goes, if it had one.
fn on_delete(txn: &mut WriteTxn<'_>, possible: &AtomicBool, id: &str) -> Result<()> {
    if possible.load(Ordering::SeqCst) {
        remove(txn, id, true)?;
    }
    Ok(())
}

/// Removes `id`'s `expirations` entry, and with `forget_id` its `expiration_ids`
/// entry too (a put that sets a new time overwrites it instead).
fn remove(txn: &mut WriteTxn<'_>, id: &str, forget_id: bool) -> Result<()> {
    let Some(raw) = txn.get(EXPIRATION_IDS, id.as_bytes())? else {
        return Ok(());
    };
    let at = decode_u64(raw, "expiry time")?;
    txn.delete(EXPIRATIONS, &expiration_key(at, id))?;
    if forget_id {
        txn.delete(EXPIRATION_IDS, id.as_bytes())?;
    }
    Ok(())
}
