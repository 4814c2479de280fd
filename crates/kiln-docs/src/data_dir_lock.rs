//! The data directory's lock: one process at a time owns a data directory as a
//! whole. Each database's environment has a lock of its own, but a second server
//! on the same directory would still start (with no database open yet, or with the
//! others failing one by one), see a different set of databases and remove the
//! first one's `trash/`. So the store takes an exclusive lock on
//! `<dir>/kiln-data.lock` before it touches anything, and writes into the file who
//! holds it, so that the process turned away can name the holder.

use crate::DatabaseError;
use crate::{DocError, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside a data directory.
pub const DATA_DIR_LOCK_FILE: &str = "kiln-data.lock";

/// Held for as long as the data directory is in use; released when dropped (and
/// by the kernel when the process dies, kill -9 included: `flock` locks are not
/// left behind).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Takes the lock of `dir` (created if needed) for `purpose` (what the holder
    /// does, e.g. "kiln serve"), or fails with [`DocError::Database(DatabaseError::DataDirLocked)`] naming
    /// the process that holds it.
    pub fn acquire(dir: &Path, purpose: &str) -> Result<DataDirLock> {
        std::fs::create_dir_all(dir).map_err(|e| DocError::io(dir, e))?;
        let path = dir.join(DATA_DIR_LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| DocError::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(DocError::Database(DatabaseError::DataDirLocked {
                    dir: dir.to_path_buf(),
                    holder: if holder.is_empty() {
                        "another process".to_string()
                    } else {
                        holder.to_string()
                    },
                }));
            }
            Err(TryLockError::Error(e)) => return Err(DocError::io(&path, e)),
        }
        // Who holds it, for the next process that is turned away. Not synced: a
        // stale text after a crash is harmless (the lock itself is the kernel's).
        let holder = format!("process {} ({purpose})\n", std::process::id());
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(holder.as_bytes()))
            .map_err(|e| DocError::io(&path, e))?;
        Ok(DataDirLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What this process is, for the lock file: the program's name and its first
/// argument (`kiln serve`, `kiln restore`).
pub(crate) fn this_process() -> String {
    let mut args = std::env::args_os();
    let program = args
        .next()
        .map(|p| {
            Path::new(&p)
                .file_name()
                .unwrap_or(p.as_os_str())
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    match args.next() {
        Some(first) => format!("{program} {}", first.to_string_lossy()),
        None => program,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_and_told_who_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path(), "kiln serve").unwrap();
        // flock locks belong to an open file: a second open in this process is
        // refused as another process would be.
        match DataDirLock::acquire(dir.path(), "kiln restore") {
            Err(DocError::Database(DatabaseError::DataDirLocked { holder, .. })) => {
                assert_eq!(
                    holder,
                    format!("process {} (kiln serve)", std::process::id())
                );
            }
            other => panic!("expected DataDirLocked, got {other:?}"),
        }
        drop(first);
        DataDirLock::acquire(dir.path(), "kiln restore").expect("free again once dropped");
    }
}
