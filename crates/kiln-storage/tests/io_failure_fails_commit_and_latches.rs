//! A failed journal write or data-file sync must fail the commit (or latch the
//! environment) with an error that names the file, never acknowledge, and never lose
//! what was acknowledged before: after reopening, the journal decides. And a slow
//! data file must not stretch buffered durability's journal-sync interval; write-back
//! reaches the disk in bounded chunks.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod crash_copy;

use kiln_storage::io::{ForwardFile, ForwardVfs, OpenMode, OsVfs, Vfs, VfsFile};
use kiln_storage::{Env, Error, Options};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// Fails writes to journal files, or fsyncs of the data file, while a switch is on.
#[derive(Default)]
struct Switches {
    fail_journal_writes: AtomicBool,
    fail_data_sync: AtomicBool,
    /// A bug stand-in: the journal write panics instead of returning an error.
    panic_journal_writes: AtomicBool,
    /// A slow disk: every write to the data file takes this long.
    data_write_delay_ms: AtomicU64,
    /// fdatasyncs of journal files seen so far.
    journal_syncs: AtomicU64,
    /// Buffered mode's sync thread pauses this long before opening a journal file,
    /// so that the writer can move on and the file be recycled meanwhile.
    journal_sync_open_delay_ms: AtomicU64,
    /// Write-back of the data file, in order: started (true) or waited for (false),
    /// with the range (offset, length).
    data_write_backs: std::sync::Mutex<Vec<(bool, u64, u64)>>,
}

struct FaultyVfs {
    inner: OsVfs,
    switches: Arc<Switches>,
}

struct FaultyFile {
    inner: Box<dyn VfsFile>,
    path: PathBuf,
    switches: Arc<Switches>,
}

fn is_journal(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("journal-") && n.ends_with(".log"))
}

impl ForwardFile for FaultyFile {
    fn inner(&self) -> &dyn VfsFile {
        self.inner.as_ref()
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if is_journal(&self.path) && self.switches.fail_journal_writes.load(SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if is_journal(&self.path) && self.switches.panic_journal_writes.load(SeqCst) {
            panic!("injected panic in a journal write");
        }
        let delay_ms = self.switches.data_write_delay_ms.load(SeqCst);
        if delay_ms > 0 && self.path.ends_with(kiln_storage::DATA_FILE) {
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        }
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        if is_journal(&self.path) {
            self.switches.journal_syncs.fetch_add(1, SeqCst);
        }
        if self.path.ends_with(kiln_storage::DATA_FILE) && self.switches.fail_data_sync.load(SeqCst)
        {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.sync_data()
    }
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        self.note_write_back(true, offset, len);
        self.inner.write_back(offset, len)
    }
    fn wait_written_back(&self, offset: u64, len: u64) -> io::Result<()> {
        self.note_write_back(false, offset, len);
        self.inner.wait_written_back(offset, len)
    }
}

impl FaultyFile {
    fn note_write_back(&self, started: bool, offset: u64, len: u64) {
        if self.path.ends_with(kiln_storage::DATA_FILE) {
            let mut seen = self.switches.data_write_backs.lock().unwrap();
            seen.push((started, offset, len));
        }
    }
}

impl ForwardVfs for FaultyVfs {
    fn inner(&self) -> &dyn Vfs {
        &self.inner
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        let delay_ms = self.switches.journal_sync_open_delay_ms.load(SeqCst);
        if delay_ms > 0
            && is_journal(path)
            && std::thread::current().name() == Some("kiln-journal-sync")
        {
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        }
        let inner = self.inner.open(path, mode)?;
        Ok(Box::new(FaultyFile {
            inner,
            path: path.to_path_buf(),
            switches: self.switches.clone(),
        }))
    }
}

fn opts(switches: &Arc<Switches>) -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        vfs: Arc::new(FaultyVfs {
            inner: OsVfs,
            switches: switches.clone(),
        }),
        ..Options::default()
    }
}

fn commit_one(env: &Env, k: &str) -> kiln_storage::Result<u64> {
    let mut w = env.begin_write()?;
    w.ensure_tree("t")?;
    w.put("t", k.as_bytes(), b"v")?;
    w.commit()
}

#[test]
fn journal_eio_fails_the_commit_latches_and_reopen_keeps_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    commit_one(&env, "a").unwrap();
    sw.fail_journal_writes.store(true, SeqCst);
    let err = commit_one(&env, "b").unwrap_err();
    // The failed commit itself reports the latch, which keeps the I/O error's file,
    // offset and kind.
    match &err {
        Error::Poisoned(f) => {
            assert!(
                f.path().is_some_and(is_journal),
                "error should name the journal file: {err}"
            );
            assert!(f.offset().is_some(), "error should carry the offset: {err}");
            assert_eq!(f.kind(), kiln_storage::FailureKind::Io, "{err}");
        }
        other => panic!("expected the latch, got {other}"),
    }
    sw.fail_journal_writes.store(false, SeqCst);
    // Latched: what reached the disk is unknown, so no more writes until reopen.
    assert!(matches!(commit_one(&env, "c"), Err(Error::Poisoned(_))));
    // Reads still work and do not show the failed commit.
    assert_eq!(env.begin_read().unwrap().get("t", b"b").unwrap(), None);
    drop(env);
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.get("t", b"a").unwrap(), Some(&b"v"[..]));
    assert_eq!(r.get("t", b"b").unwrap(), None);
    drop(r);
    commit_one(&env, "d").unwrap();
    assert!(env.check().unwrap().is_clean());
}

#[test]
fn data_file_fsync_eio_latches_and_journal_replay_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    for i in 0..20 {
        commit_one(&env, &format!("k{i}")).unwrap();
    }
    sw.fail_data_sync.store(true, SeqCst);
    let err = env.sync().unwrap_err();
    assert!(err.to_string().contains(kiln_storage::DATA_FILE), "{err}");
    assert!(matches!(commit_one(&env, "after"), Err(Error::Poisoned(_))));
    sw.fail_data_sync.store(false, SeqCst);
    drop(env);
    let (env, report) = Env::open_with_report(dir.path(), opts(&sw)).unwrap();
    assert!(
        report.records_replayed > 0,
        "the journal should have been replayed: {report:?}"
    );
    let r = env.begin_read().unwrap();
    for i in 0..20 {
        assert_eq!(
            r.get("t", format!("k{i}").as_bytes()).unwrap(),
            Some(&b"v"[..]),
            "k{i}"
        );
    }
    drop(r);
    assert!(env.check().unwrap().is_clean());
}

/// The data file's sync at open (which makes the header recovery trusts durable)
/// runs beside the journal's replay. If it fails, the open must fail with it, even
/// though the replay has written pages meanwhile; the next open replays again and
/// finds every acknowledged commit.
#[test]
fn a_failed_data_sync_at_open_fails_the_open_and_the_next_one_recovers() {
    let live = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let opts = || Options {
        vfs: Arc::new(FaultyVfs {
            inner: OsVfs,
            switches: sw.clone(),
        }),
        ..crash_copy::without_checkpoints()
    };
    let env = Env::open(live.path(), opts()).unwrap();
    // Values above the write buffer's bound: their pages are in the records, so the
    // open replays page images into the data file while its sync fails.
    let value = vec![7u8; 6000];
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    for i in 0..200u32 {
        let mut w = env.begin_write().unwrap();
        w.put("t", &i.to_be_bytes(), &value).unwrap();
        w.commit().unwrap();
    }
    let crashed = tempfile::tempdir().unwrap();
    crash_copy::crash_copy(live.path(), crashed.path());
    drop(env);

    sw.fail_data_sync.store(true, SeqCst);
    let err = match Env::open(crashed.path(), opts()) {
        Err(e) => e,
        Ok(_) => panic!("the open succeeded although the data file's sync failed"),
    };
    assert!(err.to_string().contains(kiln_storage::DATA_FILE), "{err}");
    sw.fail_data_sync.store(false, SeqCst);

    let (env, report) = Env::open_with_report(crashed.path(), opts()).unwrap();
    assert!(
        report.records_replayed >= 200,
        "the journal should have been replayed again: {report:?}"
    );
    let r = env.begin_read().unwrap();
    for i in 0..200u32 {
        assert_eq!(
            r.get("t", &i.to_be_bytes()).unwrap(),
            Some(&value[..]),
            "key {i}"
        );
    }
    drop(r);
    assert!(env.check().unwrap().is_clean());
}

/// A panic inside the engine's commit path (here: in the journal write) must not
/// leave anyone waiting: the group's submitters, later submitters and plain commits
/// all get an error, the environment latches, and a reopen keeps what was
/// acknowledged.
#[test]
fn panic_in_journal_write_fails_everyone_and_hangs_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let env = Arc::new(Env::open(dir.path(), opts(&sw)).unwrap());
    commit_one(&env, "before").unwrap();
    sw.panic_journal_writes.store(true, SeqCst);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for t in 0..8 {
        let env = env.clone();
        let done = done_tx.clone();
        handles.push(std::thread::spawn(move || {
            let results: Vec<bool> = (0..10)
                .map(|i| {
                    let key = format!("t{t}-{i}");
                    env.submit(move |txn| txn.put("t", key.as_bytes(), b"v"))
                        .is_ok()
                })
                .collect();
            let _ = done.send(results);
        }));
    }
    drop(done_tx);
    for _ in 0..8 {
        let results = done_rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("a submitter hung after a panic in the commit path");
        assert!(
            results.iter().all(|ok| !ok),
            "no commit may succeed once the journal write panicked"
        );
    }
    assert!(matches!(commit_one(&env, "after"), Err(Error::Poisoned(_))));
    sw.panic_journal_writes.store(false, SeqCst);
    for h in handles {
        h.join()
            .expect("submitter threads return errors, they do not panic");
    }
    let env = Arc::try_unwrap(env).ok().expect("all threads are done");
    drop(env);
    let env = Env::open(dir.path(), opts(&sw)).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.get("t", b"before").unwrap(), Some(&b"v"[..]));
    drop(r);
    commit_one(&env, "again").unwrap();
}

/// Buffered durability promises to lose at most `sync_interval_ms` of acknowledged
/// commits. The journal syncs used to run between the flusher's tasks, so a slow
/// write-back (here: every data-file write takes 300 ms, and a checkpoint has dozens)
/// silently stretched that interval to seconds. They must keep their pace.
#[test]
fn buffered_journal_syncs_keep_their_interval_while_write_back_is_slow() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let env = Arc::new(
        Env::open(
            dir.path(),
            Options {
                durability: kiln_storage::Durability::Buffered {
                    sync_interval_ms: 20,
                },
                ..opts(&sw)
            },
        )
        .unwrap(),
    );
    // ~15 leaves' worth of distinct pages for the flusher to write back.
    for i in 0..50u32 {
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        w.put("t", &i.to_be_bytes(), &[7u8; 2000]).unwrap();
        w.commit().unwrap();
    }
    sw.data_write_delay_ms.store(300, SeqCst);
    // The flusher now spends seconds writing the pages of those commits back.
    let busy = {
        let env = env.clone();
        std::thread::spawn(move || env.sync())
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    let before = sw.journal_syncs.load(SeqCst);
    for i in 0..10 {
        commit_one(&env, &format!("late{i}")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let synced = sw.journal_syncs.load(SeqCst) - before;
    assert!(
        !busy.is_finished(),
        "the write-back should still be running: the test proves nothing otherwise"
    );
    // 500 ms at a 20 ms interval: ~25 syncs; a generous floor for a loaded machine.
    assert!(
        synced >= 5,
        "only {synced} journal syncs in 500 ms of slow write-back"
    );
    sw.data_write_delay_ms.store(0, SeqCst);
    busy.join().unwrap().unwrap();
    assert!(env.stats().buffered_journal_sync_latency.count > 0);
}

/// The journal sync thread reads which file is current, then opens it. Meanwhile the
/// writer may fill that file, move on (syncing it as it leaves), and a checkpoint let
/// it be recycled under a new name: the open then finds nothing. That is not a failure
/// (it used to latch the environment: every later commit refused).
#[test]
fn a_journal_file_recycled_under_the_buffered_sync_is_not_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    sw.journal_sync_open_delay_ms.store(40, SeqCst);
    let o = Options {
        durability: kiln_storage::Durability::Buffered {
            sync_interval_ms: 1,
        },
        sync_interval_ms: 2,
        sync_after_bytes: 256 << 10,
        write_back_window_bytes: 1 << 20,
        ..opts(&sw)
    };
    let env = Env::open(dir.path(), o.clone()).unwrap();
    let mut value = vec![0u8; 20_000];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..3000u32 {
        // Incompressible bytes, so that every commit fills the journal.
        for b in value.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        w.put("t", &(i % 300).to_be_bytes(), &value).unwrap();
        w.commit()
            .unwrap_or_else(|e| panic!("commit {i} refused: {e}"));
    }
    let s = env.stats();
    assert!(s.journal_files_recycled > 5, "{s:?}");
    env.close().unwrap();
    sw.journal_sync_open_delay_ms.store(0, SeqCst);
    let env = Env::open(dir.path(), o).unwrap();
    assert_eq!(env.begin_read().unwrap().tree_len("t").unwrap(), 300);
}

/// The flusher hands write-back to the disk 4 MiB at a time, with at most two pieces
/// under way: a whole window at once (up to 128 MiB) made every durable journal
/// write behind it wait for all of it (a cache flush waits for every write in
/// flight).
#[test]
fn write_back_goes_to_the_disk_in_chunks_of_at_most_4_mib() {
    let dir = tempfile::tempdir().unwrap();
    let switches = Arc::new(Switches::default());
    let env = Env::open(
        dir.path(),
        Options {
            write_back_window_bytes: 16 << 20,
            ..opts(&switches)
        },
    )
    .unwrap();
    // 8 KiB values skip the write buffer: each puts an overflow run in the tree.
    let value = vec![0x5a_u8; 8 << 10];
    for batch in 0..40 {
        let mut w = env.begin_write().unwrap();
        if batch == 0 {
            w.create_tree("t").unwrap();
        }
        for i in 0..100 {
            w.put("t", format!("k{batch:03}-{i:03}").as_bytes(), &value)
                .unwrap();
        }
        w.commit().unwrap();
    }
    env.sync().unwrap();
    let seen = switches.data_write_backs.lock().unwrap().clone();
    let started: Vec<(u64, u64)> = seen
        .iter()
        .filter(|&&(start, ..)| start)
        .map(|&(_, offset, len)| (offset, len))
        .collect();
    let total: u64 = started.iter().map(|&(_, len)| len).sum();
    assert!(
        total >= 24 << 20,
        "the ~32 MiB written were written back: {total} bytes in {} calls",
        started.len()
    );
    for &(offset, len) in &started {
        assert!(
            len <= 4 << 20,
            "write-back of {len} bytes at {offset} in one piece"
        );
    }
    // Every piece started is waited for, and never more than two are under way.
    let mut under_way: Vec<(u64, u64)> = Vec::new();
    for &(start, offset, len) in &seen {
        if start {
            assert!(under_way.len() < 2, "a third piece started at {offset}");
            under_way.push((offset, len));
        } else {
            let i = under_way.iter().position(|&r| r == (offset, len));
            under_way.remove(i.expect("waits only for a piece it started"));
        }
    }
    assert!(
        under_way.is_empty(),
        "pieces never waited for: {under_way:?}"
    );
    drop(env);
    let env = Env::open(dir.path(), opts(&switches)).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.get("t", b"k039-099").unwrap(), Some(&value[..]));
}
