//! A full disk is a state to recover from, not a restart (issue 15).
//!
//! Where nothing of a commit is written and nothing acknowledged is at risk — the
//! data file cannot grow, a new journal file cannot be created — only the affected
//! commit fails (or write-back waits), with an error that says "no space" and names
//! the file, and once space is back commits and write-back resume without a reopen.
//! A failed journal write or data-file fsync still latches, and the latch keeps the
//! failure's kind (disk full or I/O error) and its file.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod values;

use kiln_storage::io::{ForwardFile, ForwardVfs, OpenMode, OsVfs, Vfs, VfsFile};
use kiln_storage::{Env, Error, FailureKind, Options};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

#[derive(Default)]
struct Switches {
    /// fallocate of the data file fails with ENOSPC.
    full_for_data_growth: AtomicBool,
    /// Making a new journal file (its temporary file) fails with ENOSPC.
    full_for_new_journal_files: AtomicBool,
    /// Writing a journal record fails with this OS error (0: off).
    journal_write_error: AtomicU64,
    /// fdatasync of the data file fails with this OS error (0: off).
    data_sync_error: AtomicU64,
    /// Failures injected so far (a test that injected nothing proves nothing).
    injected: AtomicU64,
}

struct FaultyVfs {
    switches: Arc<Switches>,
}

struct FaultyFile {
    inner: Box<dyn VfsFile>,
    path: PathBuf,
    switches: Arc<Switches>,
}

fn name_of(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or("")
}
fn is_journal(p: &Path) -> bool {
    name_of(p).starts_with("journal-") && name_of(p).ends_with(".log")
}
fn is_new_journal(p: &Path) -> bool {
    name_of(p).starts_with("journal-") && name_of(p).ends_with(".tmp")
}
fn is_data(p: &Path) -> bool {
    p.ends_with(kiln_storage::DATA_FILE)
}

impl FaultyFile {
    fn fail(&self, code: i32) -> io::Result<()> {
        self.switches.injected.fetch_add(1, SeqCst);
        Err(io::Error::from_raw_os_error(code))
    }
}

impl ForwardFile for FaultyFile {
    fn inner(&self) -> &dyn VfsFile {
        self.inner.as_ref()
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let code = self.switches.journal_write_error.load(SeqCst) as i32;
        if code != 0 && is_journal(&self.path) {
            return self.fail(code);
        }
        if is_new_journal(&self.path) && self.switches.full_for_new_journal_files.load(SeqCst) {
            return self.fail(libc::ENOSPC);
        }
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        let code = self.switches.data_sync_error.load(SeqCst) as i32;
        if code != 0 && is_data(&self.path) {
            return self.fail(code);
        }
        self.inner.sync_data()
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        if is_data(&self.path) && self.switches.full_for_data_growth.load(SeqCst) {
            return self.fail(libc::ENOSPC);
        }
        if is_new_journal(&self.path) && self.switches.full_for_new_journal_files.load(SeqCst) {
            return self.fail(libc::ENOSPC);
        }
        self.inner.allocate(offset, len)
    }
}

impl ForwardVfs for FaultyVfs {
    fn inner(&self) -> &dyn Vfs {
        &OsVfs
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        let inner = OsVfs.open(path, mode)?;
        Ok(Box::new(FaultyFile {
            inner,
            path: path.to_path_buf(),
            switches: self.switches.clone(),
        }))
    }
}

/// Small files; no background checkpoints or prepared journal files, so that the
/// tests decide when the data file grows and when a journal file must be made.
fn opts(sw: &Arc<Switches>) -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 256 << 10,
        sync_interval_ms: 600_000,
        sync_after_bytes: 1 << 40,
        prepare_journal_files_ahead: false,
        write_buffer_bytes: 0,
        vfs: Arc::new(FaultyVfs {
            switches: sw.clone(),
        }),
        ..Options::default()
    }
}

/// A value that does not compress, so that each commit takes its size of journal.
fn value(i: u32, len: usize) -> Vec<u8> {
    values::incompressible(u64::from(i), len)
}

fn put(env: &Env, i: u32, len: usize) -> kiln_storage::Result<u64> {
    let mut w = env.begin_write()?;
    w.ensure_tree("t")?;
    w.put("t", &i.to_be_bytes(), &value(i, len))?;
    w.commit()
}

fn assert_has(env: &Env, keys: &[u32], len: usize) {
    let r = env.begin_read().unwrap();
    for &i in keys {
        assert_eq!(
            r.get("t", &i.to_be_bytes()).unwrap(),
            Some(&value(i, len)[..]),
            "acknowledged key {i} is missing"
        );
    }
}

fn leftover_tmp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

#[test]
fn no_space_to_grow_the_data_file_stalls_write_back_without_latching() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    let mut acked = Vec::new();
    for i in 0..10 {
        put(&env, i, 3000).unwrap();
        acked.push(i);
    }
    env.sync().unwrap();
    let grown_before = env.stats().data_file_bytes;

    sw.full_for_data_growth.store(true, SeqCst);
    // About 1.5 MiB of new pages: more than the data file has room for.
    for i in 10..500 {
        put(&env, i, 3000).unwrap_or_else(|e| panic!("commit {i}: {e}"));
        acked.push(i);
    }
    let err = env.sync().unwrap_err();
    assert!(sw.injected.load(SeqCst) > 0, "no failure was injected");
    assert!(err.is_disk_full(), "expected a disk-full error, got {err}");
    assert!(
        err.to_string().contains(kiln_storage::DATA_FILE),
        "the error should name the data file: {err}"
    );
    assert!(
        env.failure().is_none(),
        "a data file that cannot grow must not latch: {:?}",
        env.failure()
    );
    let stall = env
        .write_back_stalled()
        .expect("write-back waits for space");
    assert!(stall.is_disk_full(), "{stall}");
    assert_eq!(env.stats().data_file_bytes, grown_before);
    // Commits go on meanwhile (the journal has room), and everything is readable.
    for i in 500..520 {
        put(&env, i, 3000).unwrap_or_else(|e| panic!("commit {i} while stalled: {e}"));
        acked.push(i);
    }
    assert_has(&env, &acked, 3000);

    // Space is back: write-back resumes, no reopen needed.
    sw.full_for_data_growth.store(false, SeqCst);
    env.sync().unwrap();
    assert!(env.write_back_stalled().is_none());
    assert!(env.stats().data_file_bytes > grown_before);
    put(&env, 1000, 7).unwrap();
    acked.push(1000);
    assert!(env.check().unwrap().is_clean());
    env.close().unwrap();

    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(
        r.get("t", &1000u32.to_be_bytes()).unwrap(),
        Some(&value(1000, 7)[..])
    );
    drop(r);
    acked.pop();
    assert_has(&env, &acked, 3000);
    assert!(env.check().unwrap().is_clean());
}

#[test]
fn no_space_for_a_new_journal_file_fails_only_the_commits_that_need_it() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    sw.full_for_new_journal_files.store(true, SeqCst);
    let mut acked = Vec::new();
    let mut failed = Vec::new();
    // 20 KiB records: the first 1 MiB journal file is full after about 50.
    for i in 0..80u32 {
        match put(&env, i, 20_000) {
            Ok(_) => {
                assert!(failed.is_empty(), "commit {i} succeeded after one failed");
                acked.push(i);
            }
            Err(e) => {
                assert!(e.is_disk_full(), "commit {i}: expected disk full, got {e}");
                assert!(
                    e.to_string().contains("journal-"),
                    "the error should name the journal file: {e}"
                );
                assert!(
                    e.latched().is_none(),
                    "commit {i}: a journal file that cannot be made must not latch: {e}"
                );
                failed.push(i);
            }
        }
    }
    assert!(sw.injected.load(SeqCst) > 0, "no failure was injected");
    assert!(
        acked.len() >= 30 && !failed.is_empty(),
        "{} acknowledged, {} failed",
        acked.len(),
        failed.len()
    );
    assert!(env.failure().is_none(), "{:?}", env.failure());
    assert!(
        leftover_tmp_files(dir.path()).is_empty(),
        "a half-made journal file must not keep its space: {:?}",
        leftover_tmp_files(dir.path())
    );
    // Units of the commit queue fail alike, with the kind kept.
    let big = value(9999, 20_000);
    let e = env
        .submit(move |txn| txn.put("t", b"queued", &big))
        .unwrap_err();
    assert!(e.is_disk_full(), "{e}");
    // Nothing of the failed commits is visible; the acknowledged ones are.
    {
        let r = env.begin_read().unwrap();
        for i in &failed {
            assert_eq!(r.get("t", &i.to_be_bytes()).unwrap(), None, "failed {i}");
        }
        assert_eq!(r.get("t", b"queued").unwrap(), None);
    }
    assert_has(&env, &acked, 20_000);

    // Space is back: the next commits succeed without a reopen.
    sw.full_for_new_journal_files.store(false, SeqCst);
    for &i in &failed {
        put(&env, i, 20_000).unwrap_or_else(|e| panic!("commit {i} after space came back: {e}"));
    }
    let big = value(9999, 20_000);
    env.submit(move |txn| txn.put("t", b"queued", &big))
        .unwrap();
    acked.extend_from_slice(&failed);
    assert_has(&env, &acked, 20_000);
    assert!(env.check().unwrap().is_clean());
    drop(env);

    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    assert_has(&env, &acked, 20_000);
    assert_eq!(
        env.begin_read().unwrap().get("t", b"queued").unwrap(),
        Some(&value(9999, 20_000)[..])
    );
    assert!(env.check().unwrap().is_clean());
}

#[test]
fn no_space_for_a_journal_record_write_latches_as_disk_full() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    put(&env, 1, 100).unwrap();
    sw.journal_write_error.store(libc::ENOSPC as u64, SeqCst);
    let err = put(&env, 2, 100).unwrap_err();
    assert!(err.is_disk_full(), "{err}");
    sw.journal_write_error.store(0, SeqCst);
    // What reached the journal is unknown: latched, and the latch says why.
    let f = env.failure().expect("a failed journal write latches");
    assert_eq!(f.kind(), FailureKind::DiskFull, "{f}");
    assert!(f.path().is_some_and(is_journal), "{f}");
    assert!(f.offset().is_some(), "{f}");
    match put(&env, 3, 100) {
        Err(Error::Poisoned(f)) => {
            assert!(f.is_disk_full(), "{f}");
            assert!(f.to_string().contains("journal-"), "{f}");
        }
        other => panic!("expected the latch, got {other:?}"),
    }
    let e = env.submit(|txn| txn.put("t", b"q", b"v")).unwrap_err();
    assert!(e.is_disk_full() && e.latched().is_some(), "{e}");
    drop(env);
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    assert_has(&env, &[1], 100);
    assert_eq!(
        env.begin_read()
            .unwrap()
            .get("t", &2u32.to_be_bytes())
            .unwrap(),
        None
    );
    put(&env, 4, 100).unwrap();
}

#[test]
fn an_io_error_on_the_data_file_fsync_latches_as_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    for i in 0..20 {
        put(&env, i, 500).unwrap();
    }
    sw.data_sync_error.store(libc::EIO as u64, SeqCst);
    let err = env.sync().unwrap_err();
    assert!(!err.is_disk_full(), "{err}");
    sw.data_sync_error.store(0, SeqCst);
    let f = env.failure().expect("a failed data-file fsync latches");
    assert_eq!(f.kind(), FailureKind::Io, "{f}");
    assert!(f.path().is_some_and(is_data), "{f}");
    assert_eq!(f.os_error(), Some(libc::EIO));
    match put(&env, 100, 10) {
        Err(Error::Poisoned(f)) => {
            assert!(!f.is_disk_full());
            assert!(f.to_string().contains(kiln_storage::DATA_FILE), "{f}");
        }
        other => panic!("expected the latch, got {other:?}"),
    }
    drop(env);
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    assert_has(&env, &(0..20).collect::<Vec<_>>(), 500);
}

/// An fsync that reports no space (NFS, thin provisioning) after data was written
/// back: the kernel may have dropped those pages, so it latches; with its kind.
#[test]
fn no_space_on_the_data_file_fsync_latches_as_disk_full() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    for i in 0..20 {
        put(&env, i, 500).unwrap();
    }
    sw.data_sync_error.store(libc::ENOSPC as u64, SeqCst);
    let err = env.sync().unwrap_err();
    assert!(err.is_disk_full(), "{err}");
    sw.data_sync_error.store(0, SeqCst);
    let f = env.failure().expect("a failed data-file fsync latches");
    assert_eq!(f.kind(), FailureKind::DiskFull, "{f}");
    assert!(matches!(put(&env, 100, 10), Err(Error::Poisoned(_))));
    drop(env);
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    assert_has(&env, &(0..20).collect::<Vec<_>>(), 500);
}

/// While write-back waits for space, unflushed pages pile up in memory; past
/// `max_unflushed_bytes` a commit used to wait for room that never came. It fails
/// instead (disk full, naming the data file, nothing of it written), and commits
/// resume once the data file can grow.
#[test]
fn past_the_memory_bound_a_stalled_write_back_fails_commits_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let o = Options {
        max_unflushed_bytes: 32 << 20,
        write_back_window_bytes: 1 << 20,
        ..opts(&sw)
    };
    let env = Arc::new(Env::open(dir.path(), o.clone()).unwrap());
    sw.full_for_data_growth.store(true, SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let env = env.clone();
        std::thread::spawn(move || {
            let mut acked = Vec::new();
            for i in 0..4000u32 {
                match put(&env, i, 20_000) {
                    Ok(_) => acked.push(i),
                    Err(e) => {
                        let _ = tx.send((acked, Some((i, e))));
                        return;
                    }
                }
            }
            let _ = tx.send((acked, None));
        })
    };
    let (mut acked, failed) = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("a commit hung waiting for a write-back that cannot happen");
    worker.join().unwrap();
    let (i, e) = failed.expect("80 MB of commits should not fit in 32 MiB of memory");
    assert!(e.is_disk_full(), "commit {i}: {e}");
    assert!(e.to_string().contains(kiln_storage::DATA_FILE), "{e}");
    assert!(env.failure().is_none(), "{:?}", env.failure());
    assert!(acked.len() > 500, "{} acknowledged", acked.len());
    assert_eq!(
        env.begin_read()
            .unwrap()
            .get("t", &i.to_be_bytes())
            .unwrap(),
        None
    );

    sw.full_for_data_growth.store(false, SeqCst);
    put(&env, i, 20_000).unwrap();
    acked.push(i);
    assert!(env.write_back_stalled().is_none());
    let env = Arc::try_unwrap(env).ok().unwrap();
    env.close().unwrap();
    let env = Env::open(dir.path(), o).unwrap();
    assert_has(&env, &acked, 20_000);
}
