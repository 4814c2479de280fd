//! A database's attachment operations: upload, read, delete, list, stage, check.

use super::{
    hash_hex, parse_hash, read_ref, stored_list, validate_attachment_name, validate_content_type,
    AttachmentCheck, AttachmentInfo, BlobReader, BlobWriter, Fresh, RefEntry, StagedBlob,
    STAGED_TTL_MS,
};
use crate::database::apply_attachment;
use crate::model::attachment_list::AttachmentChange;
use crate::model::schema::{ATTACHMENT_REFS, REVISIONS};
use crate::{AttachmentError, DocumentError};
use crate::{BatchOutcome, Condition, Database, DocError, PutOutcome, Result};
use std::collections::HashMap;

/// An attachment opened for reading: its entry and its bytes, read (and seeked)
/// through its blob's file, which stays readable even if the attachment is
/// deleted while it is read (sealed in an encrypted database: the reader gives
/// the plaintext, `BlobReader`).
pub struct AttachmentReader {
    pub info: AttachmentInfo,
    pub file: BlobReader,
}

impl Database {
    /// A writer for an upload's bytes (then `put_attachment` or `stage_attachment`).
    pub fn attachment_writer(&self) -> Result<BlobWriter> {
        self.live()?;
        self.blobs.writer()
    }

    /// Attaches the uploaded bytes to the document `id` under `name` (replacing an
    /// attachment of that name) in one transaction with the document's new
    /// version; `condition` is checked against the document. Durable when it
    /// returns.
    pub fn put_attachment(
        &self,
        id: &str,
        name: &str,
        content_type: &str,
        blob: StagedBlob,
        condition: Condition,
    ) -> Result<PutOutcome> {
        let env = self.live()?;
        self.check_document_id(id)?;
        validate_attachment_name(name)?;
        validate_content_type(content_type)?;
        let hash = blob.hash;
        let mut unit = self.unit();
        unit.hooks.attachments.fresh = Some(Fresh {
            hash,
            size_bytes: blob.size_bytes,
        });
        let change = AttachmentChange::Put {
            name: name.to_string(),
            content_type: content_type.to_string(),
            hash,
        };
        let id = id.to_string();
        let result = {
            // The blob is in place before the commit naming it; no unlink runs
            // between the two (`blobs.rs`).
            let _guard = self.blobs.lock();
            self.blobs.place(blob)?;
            env.submit_with(move |txn| {
                let out = apply_attachment(txn, &mut unit, &id, &change, condition)?;
                unit.finish(txn)?;
                Ok::<_, DocError>(out)
            })
        };
        match result {
            Ok(out) => {
                self.published([&BatchOutcome::Put(out.clone())]);
                Ok(out)
            }
            Err(e) => {
                // A new blob nobody names (a conflict, a missing document).
                if let Err(re) = self.blobs.release(env, &[hash]) {
                    tracing::warn!(error = %re, "attachments: could not unlink an unused upload");
                }
                Err(e)
            }
        }
    }

    /// Removes the attachment `name` of the document `id` (a new version of the
    /// document); its bytes are freed if no other document names them.
    pub fn delete_attachment(
        &self,
        id: &str,
        name: &str,
        condition: Condition,
    ) -> Result<PutOutcome> {
        let env = self.live()?;
        self.check_document_id(id)?;
        validate_attachment_name(name)?;
        let mut unit = self.unit();
        let change = AttachmentChange::Delete {
            name: name.to_string(),
        };
        let id = id.to_string();
        let out = env.submit_with(move |txn| {
            let out = apply_attachment(txn, &mut unit, &id, &change, condition)?;
            unit.finish(txn)?;
            Ok::<_, DocError>(out)
        })?;
        self.published([&BatchOutcome::Put(out.clone())]);
        Ok(out)
    }

    /// The attachments of the document `id`, by name; `None` if there is no such
    /// document.
    pub fn attachments(&self, id: &str) -> Result<Option<Vec<AttachmentInfo>>> {
        self.get_with(id, |view| stored_list(view.json))
    }

    /// Opens the attachment `name` of the document `id` for reading.
    pub fn open_attachment(&self, id: &str, name: &str) -> Result<AttachmentReader> {
        validate_attachment_name(name)?;
        let list = self
            .attachments(id)?
            .ok_or_else(|| DocError::Document(DocumentError::NotFound { id: id.to_string() }))?;
        let info = list.into_iter().find(|a| a.name == name).ok_or_else(|| {
            DocError::Attachment(AttachmentError::NotFound {
                id: id.to_string(),
                name: name.to_string(),
            })
        })?;
        let file = self
            .blobs
            .open_blob(&parse_hash(&info.hash)?)
            .map_err(|e| match e {
                // Deleted since the read above (or lost: `kiln check` says which).
                DocError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                    DocError::Attachment(AttachmentError::NotFound {
                        id: id.to_string(),
                        name: name.to_string(),
                    })
                }
                other => other,
            })?;
        Ok(AttachmentReader { info, file })
    }

    /// Unlinks the blobs a committed write freed (`BlobStore::release_pending`);
    /// a failure leaves them to the next open's `gc`.
    pub(crate) fn release_freed_blobs(&self, env: &kiln_storage::Env) {
        if let Err(e) = self.blobs.release_pending(env) {
            tracing::warn!(database = %self.name(), error = %e, "attachments: could not unlink a freed blob");
        }
    }

    /// Keeps uploaded bytes, named by no document yet, for `STAGED_TTL_MS`: a
    /// document written in a batch may then list them in `@metadata.@attachments`
    /// by hash. Returns the hash (hex) and size.
    pub fn stage_attachment(&self, blob: StagedBlob) -> Result<(String, u64)> {
        let until_ms = crate::model::time::now_ms() + STAGED_TTL_MS;
        self.stage_until(blob, until_ms, None)?
            .ok_or_else(|| DocError::Internal("a staging without a log entry was skipped".into()))
    }

    /// `stage_attachment` for the cluster log entry `log_index`, at the leader's
    /// `at_ms` (the blob is kept until `at_ms + STAGED_TTL_MS`, leader time);
    /// `None` if the entry was applied before. The entry's index is stored in the
    /// transaction that stages the blob (as `put_attachment_logged` does).
    pub fn stage_attachment_logged(
        &self,
        log_index: u64,
        at_ms: u64,
        blob: StagedBlob,
    ) -> Result<Option<(String, u64)>> {
        self.stage_until(blob, at_ms.saturating_add(STAGED_TTL_MS), Some(log_index))
    }

    fn stage_until(
        &self,
        blob: StagedBlob,
        until_ms: u64,
        log_index: Option<u64>,
    ) -> Result<Option<(String, u64)>> {
        let env = self.live()?;
        let (hash, size_bytes) = (blob.hash, blob.size_bytes);
        let result = {
            let _guard = self.blobs.lock();
            self.blobs.place(blob)?;
            let result = env.submit_with(move |txn| {
                if let Some(log_index) = log_index {
                    if !crate::database::claim_log_index(txn, log_index)? {
                        return Ok(false);
                    }
                }
                let entry = match read_ref(txn, &hash)? {
                    Some(e) => RefEntry {
                        staged_until_ms: e.staged_until_ms.max(until_ms),
                        ..e
                    },
                    None => RefEntry {
                        refs: 0,
                        size_bytes,
                        staged_until_ms: until_ms,
                    },
                };
                txn.put(ATTACHMENT_REFS, &hash, &entry.encode())?;
                Ok::<_, DocError>(true)
            });
            if matches!(result, Ok(true)) {
                self.blobs.note_staged(until_ms);
            }
            result
        };
        match result {
            Ok(true) => Ok(Some((hash_hex(&hash), size_bytes))),
            other => {
                // Placed for nothing (applied before, or the commit failed): the
                // latest commit decides whether the file stays.
                if let Err(re) = self.blobs.release(env, &[hash]) {
                    tracing::warn!(error = %re, "attachments: could not unlink an unused upload");
                }
                other.map(|_| None)
            }
        }
    }

    /// Frees the staged blobs (`stage_attachment`) that no document named before
    /// their time ran out at `now_ms`: their ref entries go in one transaction
    /// (each checked again in it: a batch may have named one meanwhile), their
    /// files after the commit. A server calls it periodically (the open's `gc`
    /// does the same), a cluster's node at each log entry of the database with
    /// the entry's leader time; it costs a scan of the reference tree only when a
    /// staged blob may be due. Returns how many were freed.
    pub fn expire_staged_attachments(&self, now_ms: u64) -> Result<u64> {
        let env = self.live()?;
        if !self.blobs.staged_may_be_due(now_ms) {
            return Ok(0);
        }
        let blobs = self.blobs.clone();
        let freed = {
            // Under the lock: a blob staged meanwhile is in the scan, or lowers
            // the due time after it (`note_staged`).
            let _guard = self.blobs.lock();
            let (candidates, due_ms) = self.blobs.expired_staged_and_due(env, now_ms)?;
            let freed = if candidates.is_empty() {
                0
            } else {
                env.submit_with(move |txn| {
                    let mut freed: Vec<super::Hash> = Vec::new();
                    for hash in candidates {
                        let Ok(hash) = super::Hash::try_from(&hash[..]) else {
                            continue;
                        };
                        match read_ref(txn, &hash)? {
                            Some(e) if e.refs == 0 && e.staged_until_ms <= now_ms => {
                                txn.delete(ATTACHMENT_REFS, &hash)?;
                                freed.push(hash);
                            }
                            _ => {}
                        }
                    }
                    let n = freed.len() as u64;
                    blobs.freed(freed);
                    Ok::<_, DocError>(n)
                })?
            };
            self.blobs.set_staged_due(due_ms);
            freed
        };
        if freed > 0 {
            self.release_freed_blobs(env);
        }
        Ok(freed)
    }

    /// Re-hashes every blob, looks for files no reference names, and counts the
    /// documents' entries against the reference tree (`check_attachments_at`).
    pub fn check_attachments(&self) -> Result<AttachmentCheck> {
        check_attachments_at(self.live()?, self.dir())
    }

    /// The file of a blob, if the store has it. In an encrypted database it is
    /// sealed: read a blob's bytes with `open_attachment_blob`.
    pub fn attachment_blob_path(&self, hash_hex: &str) -> Result<std::path::PathBuf> {
        Ok(self.blobs.blob_path(&parse_hash(hash_hex)?))
    }

    /// The bytes of the blob `hash_hex` (for backups and exports), plain or
    /// sealed; a missing one is `DocError::Io` with `NotFound`.
    pub fn open_attachment_blob(&self, hash_hex: &str) -> Result<BlobReader> {
        self.blobs.open_blob(&parse_hash(hash_hex)?)
    }

    /// Hashes of every blob the reference tree names, with their sizes and how
    /// many documents' (and revisions') entries name them (0: staged only).
    pub fn attachment_blobs(&self) -> Result<Vec<(String, u64, u64)>> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let mut cursor = r.cursor(ATTACHMENT_REFS)?;
        let mut entry = cursor.first()?;
        let mut out = Vec::new();
        while let Some((hash, raw)) = entry {
            let e = RefEntry::decode(hash, raw)?;
            out.push((
                hash.iter().map(|b| format!("{b:02x}")).collect(),
                e.size_bytes,
                e.refs,
            ));
            entry = cursor.next()?;
        }
        Ok(out)
    }

    /// Stores bytes read from `path` (an import, a restore) and returns them staged,
    /// checking that they hash to `expect_hex` when given.
    pub fn attachment_from_file(
        &self,
        path: &std::path::Path,
        expect_hex: Option<&str>,
    ) -> Result<StagedBlob> {
        self.live()?;
        let staged = self.blobs.stage_copy(path)?;
        if let Some(want) = expect_hex {
            if staged.hash_hex() != want {
                return Err(DocError::Attachment(AttachmentError::Invalid(format!(
                    "{} hashes to {}, expected {want}",
                    path.display(),
                    staged.hash_hex()
                ))));
            }
        }
        Ok(staged)
    }
}

/// `kiln check` of a database's attachments, offline (nothing is changed: what a
/// crash left stays for the next open's `gc`, and is reported as unreferenced):
/// every blob re-hashed, files no reference names, and the reference counts
/// against the `@attachments` entries of the documents and of the revisions that
/// hold references.
pub fn check_attachments_at(
    env: &kiln_storage::Env,
    db_dir: &std::path::Path,
) -> Result<AttachmentCheck> {
    let r = env.begin_read()?;
    if !r.tree_exists(ATTACHMENT_REFS)? {
        return Ok(AttachmentCheck::default());
    }
    let mut report = super::BlobStore::at(db_dir, env).check(env)?;
    let mut named: HashMap<String, u64> = HashMap::new();
    crate::stored::scan_by_id(&r, std::ops::Bound::Unbounded, |id, value| {
        let rec = crate::model::record::decode(id, value)?;
        for a in stored_list(rec.json) {
            *named.entry(a.hash).or_default() += 1;
        }
        Ok(true)
    })?;
    // Revisions that hold references on their attachments count like documents.
    if r.tree_exists(REVISIONS)? {
        let mut cursor = r.cursor(REVISIONS)?;
        let mut entry = cursor.first()?;
        while let Some((key, value)) = entry {
            let id = String::from_utf8_lossy(key.split(|b| *b == 0).next().unwrap_or(key));
            for a in crate::revisions::keep::held_list(&id, value)? {
                if parse_hash(&a.hash).is_ok() {
                    *named.entry(a.hash).or_default() += 1;
                }
            }
            entry = cursor.next()?;
        }
    }
    let mut cursor = r.cursor(ATTACHMENT_REFS)?;
    let mut entry = cursor.first()?;
    while let Some((hash, raw)) = entry {
        let e = RefEntry::decode(hash, raw)?;
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        let n = named.remove(&hex).unwrap_or(0);
        if n != e.refs {
            report.miscounted.push((hex, e.refs, n));
        }
        entry = cursor.next()?;
    }
    for (hex, n) in named {
        report.miscounted.push((hex, 0, n));
    }
    report.miscounted.sort();
    Ok(report)
}
