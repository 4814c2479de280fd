//! The next journal file is made ready before the writer needs it, so that a commit
//! never waits for a file to be created, zero-filled and synced — including the first
//! switch after open, before any checkpoint has run.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::io::{ForwardFile, ForwardVfs, OpenMode, OsVfs, Vfs, VfsFile};
use kiln_storage::{Env, Options};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const VALUE_BYTES: usize = 16 << 10;
const JOURNAL_FILE_BYTES: u64 = 1 << 20;

/// No checkpoint during the test (checkpoints also prepare files): only the writer's
/// own request can get the next file made.
fn opts(prepare_ahead: bool) -> Options {
    Options {
        journal_file_size_bytes: JOURNAL_FILE_BYTES,
        data_grow_step_bytes: 1 << 20,
        sync_interval_ms: 600_000,
        sync_after_bytes: 1 << 40,
        prepare_journal_files_ahead: prepare_ahead,
        ..Options::default()
    }
}

fn commit_until_journal_bytes(env: &Env, next_key: &mut u64, bytes: u64) {
    let value = vec![0xA5u8; VALUE_BYTES];
    while env.stats().journal_bytes < bytes {
        let mut w = env.begin_write().unwrap();
        w.put("t", &next_key.to_be_bytes(), &value).unwrap();
        w.commit().unwrap();
        *next_key += 1;
    }
}

fn open_with_tree(dir: &std::path::Path, prepare_ahead: bool) -> Env {
    let env = Env::open(dir, opts(prepare_ahead)).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    env
}

#[test]
fn the_first_switch_after_open_finds_its_file_ready() {
    let dir = tempfile::tempdir().unwrap();
    let env = open_with_tree(dir.path(), true);
    assert_eq!(env.stats().journal_files, 1);
    let mut key = 0;
    // Past half of the first file: the flusher is asked for the next one.
    commit_until_journal_bytes(&env, &mut key, JOURNAL_FILE_BYTES * 6 / 10);
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.stats().journal_files < 2 {
        assert!(
            Instant::now() < deadline,
            "the next journal file was not prepared within 20 s of the first file \
             being half used"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Past the end of the first file: the switch uses the prepared file.
    commit_until_journal_bytes(&env, &mut key, JOURNAL_FILE_BYTES * 13 / 10);
    let s = env.stats();
    assert_eq!(s.journal_switch_waits, 0, "{s:?}");
    assert!(s.journal_files >= 2);
    drop(env);
    // Everything committed is there after reopening.
    let env = Env::open(dir.path(), opts(true)).unwrap();
    let r = env.begin_read().unwrap();
    for k in 0..key {
        assert_eq!(
            r.get("t", &k.to_be_bytes()).unwrap().map(<[u8]>::len),
            Some(VALUE_BYTES)
        );
    }
}

#[test]
fn a_switch_to_a_file_nobody_prepared_is_counted_as_a_wait() {
    let dir = tempfile::tempdir().unwrap();
    let env = open_with_tree(dir.path(), false);
    let mut key = 0;
    commit_until_journal_bytes(&env, &mut key, JOURNAL_FILE_BYTES * 13 / 10);
    let s = env.stats();
    assert_eq!(s.journal_switch_waits, 1, "{s:?}");
    assert_eq!(s.journal_files, 2);
}

/// A database that has used little of its first journal file keeps one file through
/// checkpoints: a spare is made only once the file is half used (each is preallocated
/// and zero-filled, 64 MiB by default), not at every checkpoint.
#[test]
fn checkpoints_make_no_spare_while_the_file_is_far_from_half_used() {
    for prepare_ahead in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let env = open_with_tree(dir.path(), prepare_ahead);
        let mut key = 0;
        for _ in 0..3 {
            commit_until_journal_bytes(&env, &mut key, env.stats().journal_bytes + 1);
            env.sync().unwrap();
        }
        let s = env.stats();
        assert!(s.checkpoints >= 3, "{s:?}");
        assert_eq!(s.journal_files, 1, "prepare_ahead={prepare_ahead}: {s:?}");
        // Past half: the next checkpoint (or the flusher before it) makes the spare.
        commit_until_journal_bytes(&env, &mut key, JOURNAL_FILE_BYTES * 6 / 10);
        env.sync().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while env.stats().journal_files < 2 {
            assert!(
                Instant::now() < deadline,
                "prepare_ahead={prepare_ahead}: no spare once the file was half used: {:?}",
                env.stats()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(env.stats().journal_switch_waits, 0);
    }
}

/// A disk on which making a journal file is slow: every write to a file under its
/// temporary name (zero-filling, a MiB at a time) takes 25 ms.
struct SlowZeroFillVfs(OsVfs);

struct SlowZeroFillFile {
    inner: Box<dyn VfsFile>,
    path: PathBuf,
}

impl ForwardFile for SlowZeroFillFile {
    fn inner(&self) -> &dyn VfsFile {
        self.inner.as_ref()
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if self.path.extension().is_some_and(|e| e == "tmp") {
            std::thread::sleep(Duration::from_millis(25));
        }
        self.inner.write_all_at(buf, offset)
    }
}

impl ForwardVfs for SlowZeroFillVfs {
    fn inner(&self) -> &dyn Vfs {
        &self.0
    }
    fn open(&self, path: &Path, mode: OpenMode) -> std::io::Result<Box<dyn VfsFile>> {
        Ok(Box::new(SlowZeroFillFile {
            inner: self.0.open(path, mode)?,
            path: path.to_path_buf(),
        }))
    }
}

/// A writer faster than the zero-filling of its next file (a new database's small
/// first file, then a full-size one) does not wait for all of it: the file being made
/// is cut short where its zeros have reached, and the writer moves into it. Nothing
/// committed is lost across files cut short.
#[test]
fn a_spare_the_writer_overtakes_is_cut_short_rather_than_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || Options {
        journal_first_file_bytes: Some(1 << 20),
        journal_file_size_bytes: 32 << 20,
        vfs: Arc::new(SlowZeroFillVfs(OsVfs)),
        ..opts(true)
    };
    let env = Env::open(dir.path(), opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    let mut key = 0;
    // 32 MiB of zeros take the flusher 0.8 s; the writer crosses the rest of the
    // first file and two more MiB in much less.
    commit_until_journal_bytes(&env, &mut key, 3 << 20);
    let s = env.stats();
    assert!(s.journal_files_cut_short >= 1, "{s:?}");
    let mut sizes: Vec<u64> = std::fs::read_dir(dir.path().join("journal"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| e.metadata().unwrap().len())
        .collect();
    sizes.sort();
    assert!(
        sizes
            .iter()
            .any(|&len| len > 1 << 20 && len < 32 << 20 && len % (1 << 20) == 0),
        "a file cut short to whole MiB: {sizes:?}"
    );
    drop(env);
    let env = Env::open(dir.path(), opts()).unwrap();
    let r = env.begin_read().unwrap();
    for k in 0..key {
        assert_eq!(
            r.get("t", &k.to_be_bytes()).unwrap().map(<[u8]>::len),
            Some(VALUE_BYTES),
            "key {k}"
        );
    }
}
