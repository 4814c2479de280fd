//! The layout of a data directory, shared by the store that runs on it and the
//! offline restore that writes into it:
//!
//! ```text
//! <dir>/databases/<name>/   one storage environment per database
//! <dir>/trash/              databases being created, restored or deleted
//! <dir>/kiln-data.lock      who has the directory open (`data_dir_lock.rs`)
//! ```
//! A database is built in `trash/` and renamed into `databases/` once it is
//! complete, and deleted by renaming it back into `trash/` before its files are
//! removed, so that a crash never leaves half a database that would open at the
//! next start (`DocStore::open` empties `trash/`).

use crate::{DocError, Result};
use kiln_storage::io::Vfs;
use std::path::{Path, PathBuf};

pub(crate) const DATABASES_DIR: &str = "databases";
pub(crate) const TRASH_DIR: &str = "trash";

/// Where database `name` of data directory `dir` lives.
pub(crate) fn database_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(DATABASES_DIR).join(name)
}

/// A new entry of `dir`'s `trash/` for database `name` while it is `what`
/// (creating, restoring, deleted).
pub(crate) fn trash_entry(dir: &Path, what: &str, name: &str) -> PathBuf {
    dir.join(TRASH_DIR)
        .join(format!("{what}-{name}-{}", unique_suffix()))
}

/// A name that no other entry of `trash/` has: the time and a random number.
pub(crate) fn unique_suffix() -> String {
    format!(
        "{}-{:08x}",
        crate::model::time::now_ms(),
        rand::random::<u32>()
    )
}

/// Makes the renames and removals inside `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    sync_dir_in(&kiln_storage::io::OsVfs, dir)
}

/// `sync_dir` through an I/O layer of the caller's (a restore's, so that a
/// simulated disk sees and can fail every step).
pub(crate) fn sync_dir_in(vfs: &dyn Vfs, dir: &Path) -> Result<()> {
    vfs.sync_dir(dir).map_err(|e| DocError::io(dir, e))
}
