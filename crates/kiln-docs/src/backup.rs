//! Full backups of a database: the engine's backup (`kiln_storage::backup`) of one
//! read snapshot, with a manifest in its header naming the database and the etag the
//! image is consistent at (the last etag committed at the snapshot's transaction).
//!
//! Restoring creates a database directory `<data>/databases/<name>` from a backup,
//! offline (no server may be running on that data directory). It is built under
//! `<data>/trash/` (which `DocStore::open` empties) and renamed into place only
//! once every checksum has passed and the environment is synced and closed: an
//! interrupted restore leaves nothing that opens as a database.

use crate::database::{read_last_sequence, DOCS};
use crate::{validate_database_name, Database, DocError, Etag, Result};
use kiln_storage::backup::{self, BackupOptions, BackupSummary, RestoreOptions};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::Path;

/// The manifest stored in a backup's header.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackupManifest {
    pub database: String,
    /// The last etag committed in the image (`None`: no write yet).
    pub etag: Option<String>,
    /// The engine transaction the image is consistent at.
    pub txn_id: u64,
    pub documents: u64,
    pub kiln_version: String,
    /// When the snapshot was taken (RFC 3339, UTC).
    pub created_at: String,
}

/// A manifest with the sizes known once the whole backup is written or read.
#[derive(Debug, Clone, Serialize)]
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
}

impl BackupReport {
    fn new(manifest: BackupManifest, s: &BackupSummary) -> Self {
        BackupReport {
            manifest,
            format_version: s.format_version,
            trees: s.trees,
            entries: s.entries,
            data_bytes: s.kv_bytes,
            file_bytes: s.file_bytes,
            chunks: s.frames,
        }
    }
}

fn manifest_of(s: &BackupSummary) -> Result<BackupManifest> {
    serde_json::from_slice(&s.meta).map_err(|e| {
        DocError::Backup(kiln_storage::BackupError::Corrupt {
            part: "the header".into(),
            offset: 28,
            what: format!("not a Kiln database backup (manifest: {e})"),
        })
    })
}

impl Database {
    /// Writes a full backup of the database as of one snapshot; writes go on
    /// meanwhile. `progress` gets the bytes written so far.
    pub fn backup_to<W: Write>(
        &self,
        out: W,
        opts: BackupOptions,
        progress: impl FnMut(u64),
    ) -> Result<BackupReport> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let last = read_last_sequence(&r)?;
        let manifest = BackupManifest {
            database: self.name().to_string(),
            etag: (last > 0).then(|| {
                Etag {
                    incarnation: self.incarnation,
                    sequence: last,
                }
                .to_string()
            }),
            txn_id: r.txn_id(),
            documents: r.tree_len(DOCS)?,
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            created_at: crate::format_rfc3339_ms(crate::document::now_ms()),
        };
        let meta = serde_json::to_vec(&manifest).map_err(|e| DocError::Internal(e.to_string()))?;
        let sum = r.backup_to(out, &meta, opts, progress)?;
        Ok(BackupReport::new(manifest, &sum))
    }
}

/// Checks a database backup without restoring it.
pub fn verify_backup<R: Read>(input: R, progress: impl FnMut(u64)) -> Result<BackupReport> {
    let sum = backup::verify(input, progress)?;
    Ok(BackupReport::new(manifest_of(&sum)?, &sum))
}

/// Restores a backup as database `name` of the (offline) data directory `data_dir`.
/// Refuses an existing database unless `force`; the existing one is replaced only
/// after the restored one is complete and verified.
pub fn restore_database<R: Read>(
    input: R,
    data_dir: &Path,
    name: &str,
    storage: kiln_storage::Options,
    force: bool,
    progress: impl FnMut(u64),
) -> Result<BackupReport> {
    validate_database_name(name)?;
    let dbs = data_dir.join(crate::store::DATABASES_DIR);
    let trash = data_dir.join(crate::store::TRASH_DIR);
    for d in [&dbs, &trash] {
        std::fs::create_dir_all(d).map_err(|e| DocError::io(d, e))?;
    }
    let target = dbs.join(name);
    if target.exists() && !force {
        return Err(DocError::DatabaseExists(name.to_string()));
    }
    let suffix = crate::store::unique_suffix();
    let built = trash.join(format!("restored-{name}-{suffix}"));
    let opts = RestoreOptions {
        storage,
        staging_dir: Some(trash.join(format!("restoring-{name}-{suffix}"))),
    };
    let sum = backup::restore_from(input, &built, opts, progress)?;
    let manifest = match manifest_of(&sum) {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&built);
            return Err(e);
        }
    };
    if target.exists() {
        let old = trash.join(format!("replaced-{name}-{suffix}"));
        std::fs::rename(&target, &old).map_err(|e| DocError::io(&target, e))?;
        std::fs::rename(&built, &target).map_err(|e| DocError::io(&target, e))?;
        crate::store::sync_dir(&dbs)?;
        std::fs::remove_dir_all(&old).map_err(|e| DocError::io(&old, e))?;
    } else {
        std::fs::rename(&built, &target).map_err(|e| DocError::io(&target, e))?;
        crate::store::sync_dir(&dbs)?;
    }
    Ok(BackupReport::new(manifest, &sum))
}
