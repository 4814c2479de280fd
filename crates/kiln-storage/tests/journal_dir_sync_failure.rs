//! A journal file renamed for reuse whose directory sync fails: the name may not be
//! durable, so no record may go into that file before a later sync succeeds, and the
//! files' bookkeeping must follow the rename (before, the old name stayed listed and
//! was offered for reuse again, failing a later switch with "no such file").
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::io::{ForwardFile, ForwardVfs, OpenMode, OsVfs, Vfs, VfsFile};
use kiln_storage::{Env, Options};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::sync::Mutex;

#[derive(Default)]
struct Disk {
    /// Fail the next directory sync that follows a rename.
    fail_next_dir_sync: AtomicBool,
    dir_sync_failures: AtomicU64,
    /// Journal files renamed since the last directory sync that succeeded.
    renamed_unsynced: Mutex<Vec<PathBuf>>,
    /// Journal writes made while a rename was not durable.
    writes_behind_unsynced_rename: AtomicU64,
}

fn in_journal_dir(path: &Path) -> bool {
    path.parent().is_some_and(|d| d.ends_with("journal"))
}

/// Tracks renames and syncs of the journal directory only.
struct FaultyVfs {
    inner: OsVfs,
    disk: Arc<Disk>,
}

struct TrackedFile {
    inner: Box<dyn VfsFile>,
    path: PathBuf,
    disk: Arc<Disk>,
}

impl ForwardFile for TrackedFile {
    fn inner(&self) -> &dyn VfsFile {
        self.inner.as_ref()
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self
            .disk
            .renamed_unsynced
            .lock()
            .unwrap()
            .contains(&self.path)
        {
            self.disk.writes_behind_unsynced_rename.fetch_add(1, SeqCst);
        }
        self.inner.write_all_at(buf, offset)
    }
}

impl ForwardVfs for FaultyVfs {
    fn inner(&self) -> &dyn Vfs {
        &self.inner
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        Ok(Box::new(TrackedFile {
            inner: self.inner.open(path, mode)?,
            path: path.to_path_buf(),
            disk: self.disk.clone(),
        }))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)?;
        if in_journal_dir(to) {
            self.disk
                .renamed_unsynced
                .lock()
                .unwrap()
                .push(to.to_path_buf());
        }
        Ok(())
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        if !dir.ends_with("journal") {
            return self.inner.sync_dir(dir);
        }
        if !self.disk.renamed_unsynced.lock().unwrap().is_empty()
            && self.disk.fail_next_dir_sync.swap(false, SeqCst)
        {
            self.disk.dir_sync_failures.fetch_add(1, SeqCst);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.sync_dir(dir)?;
        self.disk.renamed_unsynced.lock().unwrap().clear();
        Ok(())
    }
}

#[test]
fn a_failed_directory_sync_after_a_rename_holds_writes_back_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let disk = Arc::new(Disk::default());
    let opts = Options {
        vfs: Arc::new(FaultyVfs {
            inner: OsVfs,
            disk: disk.clone(),
        }),
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        sync_interval_ms: 600_000,
        sync_after_bytes: 1 << 40,
        ..Options::default()
    };
    let value = vec![0x5Au8; 16 << 10];
    let env = Env::open(dir.path(), opts.clone()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    let mut acknowledged = Vec::new();
    let mut failed = 0;
    for i in 0..1500u64 {
        if i == 400 {
            disk.fail_next_dir_sync.store(true, SeqCst);
        }
        let r = env.begin_write().and_then(|mut w| {
            w.put("t", &i.to_be_bytes(), &value)?;
            w.commit()
        });
        match r {
            Ok(_) => acknowledged.push(i),
            Err(_) => failed += 1,
        }
        if i % 50 == 49 {
            // Checkpoints make older journal files reusable.
            let _ = env.sync();
        }
    }
    assert_eq!(
        disk.dir_sync_failures.load(SeqCst),
        1,
        "the failure was never injected: no rename after commit 400?"
    );
    assert_eq!(
        disk.writes_behind_unsynced_rename.load(SeqCst),
        0,
        "a journal record was written while a rename was not durable"
    );
    // The failed sync may fail the commit or checkpoint that needed it, nothing more.
    assert!(
        failed <= 1,
        "{failed} commits failed after one failed directory sync"
    );
    drop(env);
    let env = Env::open(dir.path(), opts).unwrap();
    let r = env.begin_read().unwrap();
    for i in &acknowledged {
        assert_eq!(
            r.get("t", &i.to_be_bytes()).unwrap(),
            Some(&value[..]),
            "commit {i}"
        );
    }
}
