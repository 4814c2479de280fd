//! Backups of a database: full backups (the engine's backup of one read snapshot,
//! `kiln_storage::backup`), incremental backups (`chain.rs`: every write since the
//! previous backup, from the backup history), and restores of a full backup plus
//! increments up to a chosen point (`restore.rs`). Each backup carries a manifest
//! (JSON, in the container's header) naming the database, the etag its image or
//! its writes end at, and for a chain its links (chain id, its own id, its base).
//!
//! Attachments' bytes travel inside the backup, as the container's extra files
//! named `attachments/<sha256>` after the trees: a full backup carries every blob
//! its snapshot's reference tree names; an increment those that its writes (the
//! put records of its history) name and its snapshot still references (a blob
//! named only by a version overwritten before the increment was taken may be gone:
//! a restore to a point inside the increment can then lack it, and `kiln check`
//! says so; a restore to its end never does). The blobs are pinned from the
//! snapshot to the end of the backup, so that a write freeing one meanwhile cannot
//! unlink it (`attachments/blobs.rs`). A restore streams each into the staged
//! database's blob store, checks its SHA-256 against its name, and drops those
//! the restored reference tree does not name, before the database is put in place.
//!
//! Restoring builds the database under `<data>/trash/` (which `DocStore::open`
//! empties) and renames it into place only once every checksum has passed and the
//! environment is synced and closed: an interrupted restore leaves nothing that
//! opens as a database.
//!
//! An encrypted database's backups (its environment has a master key,
//! `kiln_storage::Options::encryption`) are never written in clear: they are
//! sealed under that key (`kiln_storage::backup`, format version 3: the manifest,
//! every tree, entry and blob encrypted and authenticated). A restore opens them
//! with the key of the store it restores into, which must be the same master key;
//! one into a store without a key is refused. Verifying a sealed backup or reading
//! its manifest takes the key too (`verify_backup_with_key`,
//! `verify_chain_with_key`, `read_manifest_with_key`).

mod chain;
mod restore;

pub use chain::BackupChainStats;
pub(crate) use restore::build as build_restore;
pub use restore::{
    restore_database, restore_database_with_backup_key, verify_chain, verify_chain_with_key,
    ChainReport, ReachedPoint, RestorePoint, RestoreReport, RestoreSource, RestoreTarget,
};

use crate::attachments::Hash;
use crate::model::schema::HISTORY;
use crate::search::backup::{PinnedCommit, Shipped};
use crate::stored::read_last_sequence;
use crate::BackupChainError;
use crate::{Database, DocError, Etag, Result};
use kiln_storage::backup::{self, BackupOptions, BackupSummary};
use kiln_storage::{ContainerWriter, MasterKey, ReadTxn};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// Byte offset of the manifest in a backup file (after the fixed header fields).
pub(crate) const MANIFEST_OFFSET: u64 = 28;

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackupKind {
    /// An image of the whole database at one snapshot.
    #[default]
    Full,
    /// Every write after the base backup's etag up to this backup's etag.
    Incremental,
}

/// The manifest stored in a backup's header. Fields after `created_at` are absent
/// from backups of the first cut (full backups without chains).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackupManifest {
    pub database: String,
    #[serde(default)]
    pub kind: BackupKind,
    /// The last etag committed in the image (`None`: no write yet): where this
    /// backup ends, for a full backup as for an increment.
    pub etag: Option<String>,
    /// The engine transaction the backup is consistent at (its read snapshot).
    pub txn_id: u64,
    /// Documents in the database at the snapshot.
    pub documents: u64,
    pub kiln_version: String,
    /// When the snapshot was taken (RFC 3339, UTC).
    pub created_at: String,
    /// The database's incarnation (part of every etag it hands out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u32>,
    /// This backup's own random id (a later increment names it as its base).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    /// The chain this backup belongs to (`None`: a full backup without a chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_id: Option<String>,
    /// Increment: the backup it follows (its id and the etag it ended at).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_backup_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_etag: Option<String>,
    /// Time of the last write in the image (ms since the Unix epoch), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_write_ms: Option<u64>,
}

impl BackupManifest {
    /// The etag sequence this backup ends at (0: before any write).
    pub(crate) fn end_sequence(&self) -> Result<u64> {
        etag_sequence(self.etag.as_deref())
    }

    pub(crate) fn base_sequence(&self) -> Result<u64> {
        etag_sequence(self.base_etag.as_deref())
    }

    /// The manifest as a backup's header carries it.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(DocError::encode_json("a backup manifest"))
    }
}

pub(crate) fn etag_sequence(etag: Option<&str>) -> Result<u64> {
    match etag {
        None | Some("") | Some("0") => Ok(0),
        Some(e) => Ok(Etag::parse(e)?.sequence),
    }
}

/// A manifest with the sizes known once the whole backup is written or read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupReport {
    #[serde(flatten)]
    pub manifest: BackupManifest,
    pub format_version: u32,
    pub trees: u64,
    pub entries: u64,
    /// Keys and values, before compression.
    pub data_bytes: u64,
    /// The backup file's size.
    pub file_bytes: u64,
    pub chunks: u32,
    /// Attachments' blobs carried (the container's extra files) and their bytes.
    #[serde(default)]
    pub attachment_blobs: u64,
    #[serde(default)]
    pub attachment_bytes: u64,
    /// Files of full-text indexes carried (a full backup: one tantivy commit per
    /// index, `search/backup.rs`) and their bytes.
    #[serde(default)]
    pub search_files: u64,
    #[serde(default)]
    pub search_bytes: u64,
    /// An encrypted backup: the fingerprint of the master key it is sealed under
    /// (never the key). Absent: the backup is in clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key_fingerprint: Option<String>,
}

/// The prefix of an attachment blob's name among a backup's extra files (then its
/// SHA-256, lower-case hex).
pub(crate) const BLOB_FILE_PREFIX: &str = "attachments/";

impl Database {
    /// Writes the blobs `hashes` (pinned by the caller) as extra files of `w`.
    fn write_blobs<W: Write, P: FnMut(u64)>(
        &self,
        w: &mut ContainerWriter<W, P>,
        hashes: &[Hash],
    ) -> Result<()> {
        for h in hashes {
            // The plaintext, whether the file is plain or sealed: a sealed file's
            // key is this database's, never the restoring one's.
            let hex = crate::attachments::hash_hex(h);
            let mut blob = self.blobs.open_blob(h)?;
            let len = blob.len();
            w.file(&format!("{BLOB_FILE_PREFIX}{hex}"), len, &mut blob)?;
        }
        Ok(())
    }
}

impl Database {
    /// The last commit of each full-text index, pinned; an index that cannot be
    /// pinned is left out (a restore rebuilds it) rather than failing the backup.
    fn pin_search_commits(&self) -> Vec<PinnedCommit> {
        let mut out = Vec::new();
        for rt in self.indexer().all() {
            let Some(search) = rt.search.as_ref() else {
                continue;
            };
            match search.pin() {
                Ok(Some(p)) => out.push(p),
                Ok(None) => {}
                Err(e) => tracing::warn!(index = rt.name(), error = %e,
                    "full-text index left out of the backup (a restore rebuilds it)"),
            }
        }
        out
    }
}

impl BackupReport {
    /// The report of a backup whose extra files include `search` (the rest are
    /// attachments' blobs).
    fn new(manifest: BackupManifest, s: &BackupSummary, search: Shipped) -> Self {
        BackupReport {
            manifest,
            format_version: s.format_version,
            trees: s.trees,
            entries: s.entries,
            data_bytes: s.kv_bytes,
            file_bytes: s.file_bytes,
            chunks: s.frames,
            attachment_blobs: s.files.saturating_sub(search.files),
            attachment_bytes: s.file_bytes_total.saturating_sub(search.bytes),
            search_files: search.files,
            search_bytes: search.bytes,
            encryption_key_fingerprint: s.key_fingerprint.clone(),
        }
    }
}

pub(crate) fn manifest_of(s: &BackupSummary) -> Result<BackupManifest> {
    parse_manifest(&s.meta)
}

/// Parses a manifest (the metadata of a backup's header).
pub fn parse_manifest(meta: &[u8]) -> Result<BackupManifest> {
    serde_json::from_slice(meta).map_err(|e| {
        DocError::Backup(kiln_storage::BackupError::Corrupt {
            part: "the header".into(),
            offset: MANIFEST_OFFSET,
            what: format!("not a Kiln database backup (manifest: {e})"),
        })
    })
}

/// Reads only the header of a backup (checked by its own checksum) and its
/// manifest: what an incremental backup needs from its base. An encrypted backup
/// is refused: see `read_manifest_with_key`.
pub fn read_manifest<R: Read>(input: R) -> Result<BackupManifest> {
    read_manifest_with_key(input, None)
}

/// `read_manifest`, opening an encrypted backup's manifest with `encryption`, the
/// master key it is sealed under (a backup in clear reads with or without one).
pub fn read_manifest_with_key<R: Read>(
    input: R,
    encryption: Option<&MasterKey>,
) -> Result<BackupManifest> {
    let sum = backup::read_header_with_key(input, encryption)?;
    manifest_of(&sum)
}

/// An incarnation as etags show it (8 hex digits), or "unknown" (older backups).
pub(crate) fn incarnation_text(i: Option<u32>) -> String {
    i.map_or_else(|| "unknown".into(), |i| format!("{i:08x}"))
}

pub(crate) fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Database {
    /// The manifest of a backup of snapshot `r` of this database, ending at etag
    /// sequence `last`: with a new backup id and no base or last write time (the
    /// caller fills those in where it has them).
    fn new_manifest(
        &self,
        r: &ReadTxn<'_>,
        kind: BackupKind,
        last: u64,
        chain_id: Option<String>,
    ) -> Result<BackupManifest> {
        Ok(BackupManifest {
            database: self.name().to_string(),
            kind,
            etag: (last > 0).then(|| self.etag_at(last).to_string()),
            txn_id: r.txn_id(),
            documents: crate::stored::count(r)?,
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            created_at: crate::format_rfc3339_ms(crate::model::time::now_ms()),
            incarnation: Some(self.incarnation),
            backup_id: Some(new_id()),
            chain_id,
            base_backup_id: None,
            base_etag: None,
            last_write_ms: None,
        })
    }

    /// Writes a full backup of the database as of one snapshot, without a chain;
    /// writes go on meanwhile. `progress` gets the bytes written so far.
    pub fn backup_to<W: Write>(
        &self,
        out: W,
        opts: BackupOptions,
        progress: impl FnMut(u64),
    ) -> Result<BackupReport> {
        self.backup_full_to(out, opts, false, progress)
    }

    /// A full backup; with `chain` it also starts a new backup chain at its
    /// snapshot (replacing any earlier chain), so that incremental backups can
    /// follow it (`backup_incremental_to`).
    pub fn backup_full_to<W: Write>(
        &self,
        out: W,
        opts: BackupOptions,
        chain: bool,
        progress: impl FnMut(u64),
    ) -> Result<BackupReport> {
        let env = self.live()?;
        let chain_id = if chain {
            Some(self.start_backup_chain()?)
        } else {
            None
        };
        // Full-text indexes' commits are pinned first: each covers a sequence at
        // or below the snapshot's (`search/backup.rs`).
        let search = self.pin_search_commits();
        // The snapshot, with its blobs kept on disk until the backup is written.
        let (mut r, pin) = self.blobs.pinned_snapshot(env)?;
        if let Some(id) = &chain_id {
            // The snapshot is after the chain's start; a chain started by another
            // full backup in between replaced it, and this image is not its base.
            let now = chain::read_chain(&r)?.map(|c| c.chain_id);
            if now.as_ref() != Some(id) {
                return Err(DocError::BackupChain(
                    BackupChainError::IncrementNotPossible(
                        "another full backup started a new chain while this one began".into(),
                    ),
                ));
            }
        }
        let last = read_last_sequence(&r)?;
        let last_write_ms = crate::changes::last_write_ms(&r, self.incarnation, last)?;
        let manifest = BackupManifest {
            last_write_ms,
            ..self.new_manifest(&r, BackupKind::Full, last, chain_id)?
        };
        let meta = manifest.encode()?;
        // The history is the chain's bookkeeping, not data: a restored database
        // starts without a chain. Sealed if the database is encrypted.
        let mut w = ContainerWriter::for_snapshot(out, &r, &meta, opts, progress)?;
        w.snapshot_trees(&mut r, |t| t != HISTORY)?;
        self.write_blobs(&mut w, pin.hashes())?;
        let shipped = crate::search::backup::write_pinned(&mut w, search)?;
        let sum = w.finish()?;
        drop(pin);
        Ok(BackupReport::new(manifest, &sum, shipped))
    }
}

/// Checks that manifests (labelled, in the order given) form one chain: a full
/// backup, then its increments in order without gaps. Reads nothing else: a quick
/// check before a long restore (which checks it again, with every checksum).
pub fn check_chain(manifests: &[(String, BackupManifest)]) -> Result<()> {
    let Some((label, first)) = manifests.first() else {
        return Err(DocError::BackupChain(BackupChainError::RestorePoint(
            "no backup given".into(),
        )));
    };
    chain::check_first(first, label)?;
    for (i, w) in manifests.windows(2).enumerate() {
        chain::check_link(&w[0].1, &w[1].1, i + 2, &w[1].0)?;
    }
    Ok(())
}

/// Checks one database backup (full or incremental) without restoring it: every
/// checksum, and for an increment every history entry. To check a chain, see
/// `verify_chain`. An encrypted backup is refused: see `verify_backup_with_key`.
pub fn verify_backup<R: Read>(input: R, progress: impl FnMut(u64)) -> Result<BackupReport> {
    verify_backup_with_key(input, None, progress)
}

/// `verify_backup`, opening an encrypted backup with `encryption`, the master key
/// it is sealed under (every seal is checked too).
pub fn verify_backup_with_key<R: Read>(
    input: R,
    encryption: Option<&MasterKey>,
    progress: impl FnMut(u64),
) -> Result<BackupReport> {
    let source = RestoreSource::Files(vec![("the backup".into(), Box::new(input))]);
    let point = RestorePoint::Latest;
    let done = restore::process(source, None, point, false, encryption, progress)?;
    done.backups
        .into_iter()
        .next()
        .ok_or_else(|| DocError::Internal("verify read no backup".into()))
}
