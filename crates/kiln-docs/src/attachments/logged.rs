//! Attachment writes decided by a cluster's replicated log: the bytes arrive as an
//! upload file the log's chunks wrote (kiln-cluster), the write takes the time the
//! leader stamped into its entry, and the entry's log index is stored in the same
//! transaction as the document (as `Database::apply_logged` does): an entry
//! applied before a crash is recognised after it and not applied again.

use super::blobs::{hash_file, UploadDecoder};
use super::{hash_hex, parse_hash, validate_attachment_name, validate_content_type};
use super::{Fresh, StagedBlob};
use crate::database::{apply_attachment, claim_log_index};
use crate::model::attachment_list::AttachmentChange;
use crate::AttachmentError;
use crate::{BatchOutcome, Condition, Database, DocError, PutOutcome, Result};
use std::path::Path;

impl Database {
    /// The upload file at `path` (a file of this database's directory, written by
    /// a cluster's log entries) as a blob ready to place, once its bytes are
    /// checked: `size_bytes` long and hashing to `hash_hex`, else
    /// `InvalidAttachment` (the same answer on every node that applied the same
    /// entries). The file itself stays: the blob is a hard link to it (a sealed
    /// copy in an encrypted database), so a crash before the commit that names
    /// the blob still finds the upload for the entry's replay.
    pub fn attachment_from_upload(
        &self,
        path: &Path,
        hash_hex_given: &str,
        size_bytes: u64,
    ) -> Result<StagedBlob> {
        self.attachment_from_upload_through(path, hash_hex_given, size_bytes, None)
    }

    /// `attachment_from_upload` of an upload file whose bytes `decode` reads (a
    /// cluster keeps an encrypted database's uploads encrypted): always a copy.
    pub fn attachment_from_upload_through(
        &self,
        path: &Path,
        hash_hex_given: &str,
        size_bytes: u64,
        decode: Option<&UploadDecoder<'_>>,
    ) -> Result<StagedBlob> {
        self.live()?;
        let want = parse_hash(hash_hex_given)?;
        // Sealed (an encrypted database), or an upload that is not plaintext: the
        // upload's bytes are copied through the store's writer, hashed on the way.
        let copied = if self.blobs.seals() || decode.is_some() {
            Some(self.blobs.stage_copy_through(path, decode))
        } else {
            None
        };
        let got = match copied {
            Some(Ok(staged)) => Ok((staged.hash, staged.size_bytes, Some(staged))),
            Some(Err(e)) => Err(e),
            None => hash_file(path).map(|(hash, size)| (hash, size, None)),
        };
        let (hash, size, staged) = match got {
            Ok(got) => got,
            Err(DocError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(DocError::Attachment(AttachmentError::Invalid(format!(
                    "the upload of {hash_hex_given} is not here (it expired or was never sent)"
                ))))
            }
            Err(e) => return Err(e),
        };
        if size != size_bytes || hash != want {
            return Err(DocError::Attachment(AttachmentError::Invalid(format!(
                "the upload is {size} bytes hashing to {}; the write names {size_bytes} bytes \
                 hashing to {hash_hex_given} (a chunk is missing)",
                hash_hex(&hash)
            ))));
        }
        if let Some(staged) = staged {
            return Ok(staged);
        }
        let tmp = self
            .dir()
            .join("attachments")
            .join("tmp")
            .join(format!("upload-{}", hash_hex(&hash)));
        let _ = std::fs::remove_file(&tmp);
        std::fs::hard_link(path, &tmp).map_err(|source| DocError::Io {
            path: tmp.clone(),
            source,
        })?;
        Ok(StagedBlob {
            tmp,
            hash,
            size_bytes: size,
        })
    }

    /// `put_attachment` for the log entry `log_index`, at the leader's `at_ms`;
    /// `None` if the entry was applied before (the blob is then released, or kept
    /// if that earlier application named it).
    #[allow(clippy::too_many_arguments)]
    pub fn put_attachment_logged(
        &self,
        log_index: u64,
        at_ms: u64,
        id: &str,
        name: &str,
        content_type: &str,
        blob: StagedBlob,
        condition: Condition,
    ) -> Result<Option<PutOutcome>> {
        let env = self.live()?;
        let hash = blob.hash;
        let checked = self
            .check_document_id(id)
            .and_then(|()| validate_attachment_name(name).map_err(DocError::from))
            .and_then(|()| validate_content_type(content_type).map_err(DocError::from));
        let mut unit = self.unit().at_time(at_ms);
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
            // As in `put_attachment`: placed before the commit naming it.
            let _guard = self.blobs.lock();
            self.blobs.place(blob)?;
            env.submit_with(move |txn| {
                if !claim_log_index(txn, log_index)? {
                    return Ok(None);
                }
                checked?;
                let out = apply_attachment(txn, &mut unit, &id, &change, condition)?;
                unit.finish(txn)?;
                Ok::<_, DocError>(Some(out))
            })
        };
        match result {
            Ok(Some(out)) => {
                self.published([&BatchOutcome::Put(out.clone())]);
                Ok(Some(out))
            }
            other => {
                // Named by no document (a conflict, a missing document), or by the
                // earlier application: `release` checks the latest commit.
                if let Err(re) = self.blobs.release(env, &[hash]) {
                    tracing::warn!(error = %re, "attachments: could not unlink an unused upload");
                }
                other
            }
        }
    }

    /// `delete_attachment` for the log entry `log_index`, at the leader's `at_ms`;
    /// `None` if the entry was applied before.
    pub fn delete_attachment_logged(
        &self,
        log_index: u64,
        at_ms: u64,
        id: &str,
        name: &str,
        condition: Condition,
    ) -> Result<Option<PutOutcome>> {
        let env = self.live()?;
        let checked = self
            .check_document_id(id)
            .and_then(|()| validate_attachment_name(name).map_err(DocError::from));
        let mut unit = self.unit().at_time(at_ms);
        let change = AttachmentChange::Delete {
            name: name.to_string(),
        };
        let id = id.to_string();
        let out = env.submit_with(move |txn| {
            if !claim_log_index(txn, log_index)? {
                return Ok(None);
            }
            checked?;
            let out = apply_attachment(txn, &mut unit, &id, &change, condition)?;
            unit.finish(txn)?;
            Ok::<_, DocError>(Some(out))
        })?;
        if let Some(out) = &out {
            self.published([&BatchOutcome::Put(out.clone())]);
        }
        Ok(out)
    }
}
