//! A directory of databases (its layout: `data_dir.rs`).
//!
//! A database is created in `trash/` and renamed into `databases/` once its trees
//! and meta are committed, and deleted by renaming it back into `trash/` before
//! removing its files, so that a crash never leaves half a database that would open
//! at the next start.

use crate::data_dir::{database_dir, sync_dir, sync_dir_in, trash_entry, DATABASES_DIR, TRASH_DIR};
use crate::database::Limits;
use crate::DatabaseError;
use crate::{validate_database_name, Database, DocError, Result};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone)]
pub struct DocsOptions {
    /// Options for each database's storage environment. A `journal_dir` here is a
    /// parent: each database journals into `<journal_dir>/<name>`.
    pub storage: kiln_storage::Options,
    pub max_document_bytes: usize,
    pub max_id_bytes: usize,
    pub max_batch_ops: usize,
    /// The write queue every writer of this store shares (see `write_queue.rs`).
    pub write_queue: crate::WriteQueueOptions,
    /// How long deleting a database waits for requests still using it.
    pub delete_wait_ms: u64,
    /// The background indexer and query limits of every database.
    pub indexing: crate::IndexingOptions,
    /// How documents' bodies are stored (LZ4 by default, kept only where it
    /// saves bytes; records of either kind are read whatever this says).
    pub document_compression: crate::DocumentCompression,
    /// Whether opening a database frees its staged attachment blobs whose time
    /// ran out by this machine's clock (true). A cluster's node sets false: there
    /// a staged blob expires at the leader's time carried by a log entry, at the
    /// same entry on every node (kiln-cluster's `uploads::expire`).
    pub expire_staged_at_open: bool,
}

impl Default for DocsOptions {
    fn default() -> Self {
        // A store holds many databases, each an environment: the page copies one
        // busy database may hold for write-back are bounded lower than the engine's
        // own default (512 MiB, 128 MiB windows). Measured with W10 (1M documents in
        // one bulk insert, back to back): server RSS growth 247-252 -> 161-176 MiB,
        // the insert 312-314k -> 343-349k documents/s, W8 unchanged within noise.
        //
        // And a new database's first journal file is 4 MiB, not a full 64 MiB one:
        // a fresh server's two small databases took 257 MiB of disk, now 11 MiB.
        // A database that writes more gets full-size files from its second on.
        let storage = kiln_storage::Options {
            max_unflushed_bytes: 256 << 20,
            write_back_window_bytes: 64 << 20,
            journal_first_file_bytes: Some(4 << 20),
            ..kiln_storage::Options::default()
        };
        DocsOptions {
            storage,
            max_document_bytes: 16 << 20,
            max_id_bytes: crate::model::limits::DEFAULT_MAX_ID_BYTES,
            max_batch_ops: 10_000,
            write_queue: crate::WriteQueueOptions::default(),
            delete_wait_ms: 10_000,
            indexing: crate::IndexingOptions::default(),
            document_compression: crate::DocumentCompression::default(),
            expire_staged_at_open: true,
        }
    }
}

impl DocsOptions {
    fn limits(&self) -> Result<Limits> {
        if self.max_id_bytes == 0 || self.max_id_bytes > crate::model::limits::ENGINE_KEY_BYTES {
            return Err(DocError::Storage(kiln_storage::Error::InvalidOption(
                format!(
                    "max_id_bytes must be 1..={} (the engine's key limit)",
                    crate::model::limits::ENGINE_KEY_BYTES
                ),
            )));
        }
        Ok(Limits {
            max_document_bytes: self.max_document_bytes,
            max_id_bytes: self.max_id_bytes,
            max_batch_ops: self.max_batch_ops,
            indexing: self.indexing,
            compression: self.document_compression,
            expire_staged_at_open: self.expire_staged_at_open,
        })
    }

    fn storage_for(&self, name: &str) -> kiln_storage::Options {
        let mut o = self.storage.clone();
        o.journal_dir = self.storage.journal_dir.as_ref().map(|j| j.join(name));
        o
    }
}

pub struct DocStore {
    dir: PathBuf,
    opts: DocsOptions,
    databases: RwLock<BTreeMap<String, Arc<Database>>>,
    /// Creating and deleting databases take turns.
    admin: Mutex<()>,
    writes: crate::WriteQueue,
    /// Held while the store is open: no other process opens the directory.
    _lock: crate::DataDirLock,
    /// Called with a database's name when it is deleted or replaced (see
    /// `on_database_removed`).
    removed_listeners: RwLock<Vec<RemovedListener>>,
}

/// What `DocStore::on_database_removed` calls.
pub type RemovedListener = Box<dyn Fn(&str) + Send + Sync>;

impl DocStore {
    /// Opens (creating if needed) the store at `dir` and every database in it.
    pub fn open(dir: impl AsRef<Path>, opts: DocsOptions) -> Result<DocStore> {
        let dir = dir.as_ref().to_path_buf();
        let limits = opts.limits()?;
        // First: nothing below (the trash's removal above all) may run beside
        // another process that has the directory open.
        let lock = crate::DataDirLock::acquire(&dir, &crate::data_dir_lock::this_process())?;
        let dbs_dir = dir.join(DATABASES_DIR);
        let trash = dir.join(TRASH_DIR);
        std::fs::create_dir_all(&dbs_dir).map_err(|e| DocError::io(&dbs_dir, e))?;
        if trash.exists() {
            std::fs::remove_dir_all(&trash).map_err(|e| DocError::io(&trash, e))?;
        }
        std::fs::create_dir_all(&trash).map_err(|e| DocError::io(&trash, e))?;
        let mut databases = BTreeMap::new();
        let entries = std::fs::read_dir(&dbs_dir).map_err(|e| DocError::io(&dbs_dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| DocError::io(&dbs_dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if validate_database_name(&name).is_err() {
                tracing::warn!(path = %entry.path().display(), "ignoring a directory that is not a database name");
                continue;
            }
            let db = Arc::new(Database::open(
                &name,
                &entry.path(),
                opts.storage_for(&name),
                limits,
                None,
            )?);
            db.indexer().start(&db)?;
            databases.insert(name, db);
        }
        let writes = crate::WriteQueue::start(opts.write_queue)?;
        Ok(DocStore {
            dir,
            writes,
            opts,
            databases: RwLock::new(databases),
            admin: Mutex::new(()),
            _lock: lock,
            removed_listeners: RwLock::new(Vec::new()),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Calls `listener` with a database's name whenever it is deleted or replaced
    /// (by a restore), as the deletion begins, before it waits for the database's
    /// last users: whoever holds it open for long (a server's changes feeds) lets
    /// go then. Deletions that come from elsewhere than a request (a cluster's
    /// log) need this: nothing else tells the holders.
    pub fn on_database_removed(&self, listener: RemovedListener) {
        self.removed_listeners.write().push(listener);
    }

    /// The write queue: the way every writer of this store's documents commits.
    pub fn writes(&self) -> &crate::WriteQueue {
        &self.writes
    }

    pub fn database(&self, name: &str) -> Result<Arc<Database>> {
        self.databases
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| DocError::Database(DatabaseError::NotFound(name.to_string())))
    }

    pub fn database_names(&self) -> Vec<String> {
        self.databases.read().keys().cloned().collect()
    }

    pub fn databases(&self) -> Vec<Arc<Database>> {
        self.databases.read().values().cloned().collect()
    }

    pub fn create_database(&self, name: &str) -> Result<Arc<Database>> {
        self.create_database_with_incarnation(name, rand::random())
    }

    /// `create_database` with the incarnation (the etags' suffix) given: a cluster
    /// derives it from its log, so that every node gives the same etags.
    pub fn create_database_with_incarnation(
        &self,
        name: &str,
        incarnation: u32,
    ) -> Result<Arc<Database>> {
        validate_database_name(name)?;
        let limits = self.opts.limits()?;
        let _turn = self.admin.lock();
        if self.databases.read().contains_key(name) {
            return Err(DocError::Database(DatabaseError::Exists(name.to_string())));
        }
        let final_dir = database_dir(&self.dir, name);
        if final_dir.exists() {
            return Err(DocError::Database(DatabaseError::Exists(name.to_string())));
        }
        let staging = trash_entry(&self.dir, "creating", name);
        let storage = self.opts.storage_for(name);
        let mut db = Database::open(name, &staging, storage.clone(), limits, Some(incarnation))?;
        db.close_env()?;
        std::fs::rename(&staging, &final_dir).map_err(|e| DocError::io(&final_dir, e))?;
        sync_dir(&self.dir.join(DATABASES_DIR))?;
        let db = Arc::new(Database::open(name, &final_dir, storage, limits, None)?);
        db.indexer().start(&db)?;
        self.databases.write().insert(name.to_string(), db.clone());
        tracing::info!(database = name, "database created");
        Ok(db)
    }

    /// Deletes a database and its files. Requests already using it finish (or fail
    /// with `DatabaseNotFound`); new ones see it gone at once.
    pub fn delete_database(&self, name: &str) -> Result<()> {
        validate_database_name(name)?;
        let _turn = self.admin.lock();
        self.delete_locked(name, None)
    }

    /// Deletes `name` (the caller holds `admin`). With `replace_with`, a complete
    /// database directory is renamed into its place once the old one is closed and
    /// moved to trash (so a crash between leaves no database of that name and the
    /// new one whole in trash).
    fn delete_locked(&self, name: &str, replace_with: Option<&Path>) -> Result<()> {
        let db = self
            .databases
            .write()
            .remove(name)
            .ok_or_else(|| DocError::Database(DatabaseError::NotFound(name.to_string())))?;
        db.mark_deleted();
        for listener in self.removed_listeners.read().iter() {
            listener(name);
        }
        db.indexer().stop();
        // Its environment must be closed before its files go: wait for the requests
        // still holding it.
        let deadline = Instant::now() + Duration::from_millis(self.opts.delete_wait_ms);
        let mut db = db;
        let mut owned = loop {
            match Arc::try_unwrap(db) {
                Ok(owned) => break owned,
                Err(shared) if Instant::now() < deadline => {
                    db = shared;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(shared) => {
                    self.databases.write().insert(name.to_string(), shared);
                    return Err(DocError::Database(DatabaseError::Busy {
                        name: name.to_string(),
                        waited_ms: self.opts.delete_wait_ms,
                    }));
                }
            }
        };
        owned.close_env()?;
        let dir = database_dir(&self.dir, name);
        let doomed = trash_entry(&self.dir, "deleted", name);
        std::fs::rename(&dir, &doomed).map_err(|e| DocError::io(&dir, e))?;
        if let Some(new) = replace_with {
            std::fs::rename(new, &dir).map_err(|e| DocError::io(&dir, e))?;
        }
        sync_dir(&self.dir.join(DATABASES_DIR))?;
        std::fs::remove_dir_all(&doomed).map_err(|e| DocError::io(&doomed, e))?;
        if let Some(journal_parent) = &self.opts.storage.journal_dir {
            let j = journal_parent.join(name);
            if j.exists() {
                std::fs::remove_dir_all(&j).map_err(|e| DocError::io(&j, e))?;
            }
        }
        tracing::info!(
            database = name,
            replaced = replace_with.is_some(),
            "database deleted"
        );
        Ok(())
    }

    /// Restores a full backup and increments (up to `point`) as database `name` of
    /// this running store. The database is built in `trash/` while every checksum
    /// is checked, and only then renamed into place and opened; an existing
    /// database is refused unless `force`, and then replaced only once the new one
    /// is complete. A failed or interrupted restore leaves nothing in `databases/`.
    pub fn restore_database(
        &self,
        source: crate::RestoreSource<'_>,
        name: &str,
        force: bool,
        point: crate::RestorePoint,
        progress: impl FnMut(u64),
    ) -> Result<crate::RestoreReport> {
        self.restore_database_inner(source, name, force, point, None, progress)
    }

    /// `restore_database` (replacing a database of the name) for a cluster's log
    /// entry `log_index`: the restored database records that entry as the last
    /// applied to it, whatever the backup recorded (a backup from another cluster
    /// may hold a higher index, which would make this cluster's next writes look
    /// applied already). Recorded before the database is put in place, so a crash
    /// leaves either the old database or the restored one with its index.
    pub fn restore_database_logged(
        &self,
        source: crate::RestoreSource<'_>,
        name: &str,
        point: crate::RestorePoint,
        log_index: u64,
    ) -> Result<crate::RestoreReport> {
        self.restore_database_inner(source, name, true, point, Some(log_index), |_| {})
    }

    fn restore_database_inner(
        &self,
        source: crate::RestoreSource<'_>,
        name: &str,
        force: bool,
        point: crate::RestorePoint,
        log_index: Option<u64>,
        progress: impl FnMut(u64),
    ) -> Result<crate::RestoreReport> {
        validate_database_name(name)?;
        let limits = self.opts.limits()?;
        let exists =
            || self.databases.read().contains_key(name) || database_dir(&self.dir, name).exists();
        if exists() && !force {
            return Err(DocError::Database(DatabaseError::Exists(name.to_string())));
        }
        let built = trash_entry(&self.dir, "restoring", name);
        let storage = self.opts.storage_for(name);
        let report =
            crate::backup::build_restore(source, &built, storage.clone(), point, progress)?;
        if let Some(index) = log_index {
            if let Err(e) =
                crate::database::set_applied_log_index_at(&built, storage.clone(), index)
            {
                let _ = storage.vfs.remove_dir_all(&built);
                return Err(e);
            }
        }
        let _turn = self.admin.lock();
        let final_dir = database_dir(&self.dir, name);
        let placed = if self.databases.read().contains_key(name) {
            if force {
                self.delete_locked(name, Some(&built))
            } else {
                Err(DocError::Database(DatabaseError::Exists(name.to_string())))
            }
        } else if final_dir.exists() {
            Err(DocError::Database(DatabaseError::Exists(name.to_string())))
        } else {
            storage
                .vfs
                .rename(&built, &final_dir)
                .map_err(|e| DocError::io(&final_dir, e))
                .and_then(|_| sync_dir_in(storage.vfs.as_ref(), &self.dir.join(DATABASES_DIR)))
        };
        if let Err(e) = placed {
            let _ = storage.vfs.remove_dir_all(&built);
            return Err(e);
        }
        let db = Arc::new(Database::open(name, &final_dir, storage, limits, None)?);
        db.indexer().start(&db)?;
        self.databases.write().insert(name.to_string(), db);
        tracing::info!(database = name, reached = ?report.reached.etag, "database restored");
        Ok(crate::RestoreReport::new(name, report))
    }

    /// Closes every database (flushing and syncing each).
    pub fn close(self) -> Result<()> {
        // Queued writes finish first: they hold references to their databases.
        self.writes.close();
        let dbs = std::mem::take(&mut *self.databases.write());
        let mut first_err = None;
        for db in dbs.values() {
            db.indexer().stop();
        }
        for (name, db) in dbs {
            match Arc::try_unwrap(db) {
                Ok(mut db) => {
                    if let Err(e) = db.close_env() {
                        tracing::error!(database = %name, error = %e, "closing failed");
                        first_err.get_or_insert(e);
                    }
                }
                // Still in use somewhere: it closes when its last user drops it.
                Err(_) => {
                    tracing::warn!(database = %name, "still in use at close; it closes when released")
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}
