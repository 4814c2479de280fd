//! The journal kept for replay stays bounded when a workload writes the same few
//! keys over and over. Small writes are journaled as logical entries of the write
//! buffer and each commit's record is padded to the direct-I/O block: before, the
//! buffer froze (and so let the journal behind it go) only once its memory reached
//! `write_buffer_bytes`, which a hot key's overwrites fill at ~100 bytes per commit
//! while the journal grows by 4 KiB: ~40x the buffer's size kept on disk and
//! replayed by recovery (a test cluster's node filled 64 MiB of 4 MiB journal files
//! with five registers). The buffer now also freezes once the journal written
//! since its last freeze reaches twice `write_buffer_bytes`, counting at open the
//! journal that recovery replayed (a node killed more often than its buffer froze
//! kept every journal file, crash after crash).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

#[allow(dead_code)] // only its crash copy
mod crash_copy;

use crash_copy::crash_copy;
use kiln_storage::{Env, Options};
use std::path::Path;
use std::time::{Duration, Instant};

const JOURNAL_FILE_BYTES: u64 = 1 << 20;
const WRITE_BUFFER_BYTES: u64 = 1 << 20;

fn opts() -> Options {
    Options {
        journal_file_size_bytes: JOURNAL_FILE_BYTES,
        write_buffer_bytes: WRITE_BUFFER_BYTES,
        data_grow_step_bytes: 1 << 20,
        sync_interval_ms: 20,
        ..Options::default()
    }
}

/// The active and the frozen generation's journal (each at most twice the
/// buffer), the file being written and a spare.
const MAX_JOURNAL_FILES: u64 = 4 * WRITE_BUFFER_BYTES / JOURNAL_FILE_BYTES + 2;

fn journal_files(dir: &Path) -> u64 {
    std::fs::read_dir(dir.join("journal")).unwrap().count() as u64
}

fn rewrite(env: &Env, commits: u64, value: &[u8]) {
    for i in 0..commits {
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        w.put("t", &(i % 4).to_be_bytes(), value).unwrap();
        w.commit().unwrap();
    }
}

#[test]
fn a_hot_key_rewritten_keeps_a_bounded_journal() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    // 12,000 commits of one small put each: ~47 MiB of journal records.
    let value = [0x5au8; 64];
    for i in 0..12_000u64 {
        let mut w = env.begin_write().unwrap();
        w.put("t", &(i % 4).to_be_bytes(), &value).unwrap();
        w.commit().unwrap();
    }
    let written = env.stats().journal_bytes;
    assert!(
        written > 30 * JOURNAL_FILE_BYTES,
        "the test wrote only {written} journal bytes"
    );
    // What was frozen is merged and checkpointed a few commits and syncs later.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut w = env.begin_write().unwrap();
        w.put("t", b"tick", &value).unwrap();
        w.commit().unwrap();
        env.sync().unwrap();
        let s = env.stats();
        if s.journal_files <= MAX_JOURNAL_FILES {
            assert!(s.write_buffer_freezes >= 10, "{s:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} journal files of {JOURNAL_FILE_BYTES} bytes kept for a write buffer of \
             {WRITE_BUFFER_BYTES} bytes after {written} journal bytes written: {s:?}",
            s.journal_files
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(env);
    let env = Env::open(dir.path(), opts()).unwrap();
    let r = env.begin_read().unwrap();
    for k in 0..4u64 {
        assert_eq!(r.get("t", &k.to_be_bytes()).unwrap(), Some(&value[..]));
    }
}

#[test]
fn a_hot_key_rewritten_between_crashes_keeps_a_bounded_journal() {
    let root = tempfile::tempdir().unwrap();
    let value = [0x3cu8; 64];
    // Each life writes ~1.2 MiB of journal, less than a freeze's bound, then the
    // process "crashes" (a copy of its directory, taken while it runs, is what
    // the next life opens: nothing merged or trimmed at close).
    let mut dir = root.path().join("life-0");
    for life in 1..=30 {
        let env = Env::open(&dir, opts()).unwrap();
        rewrite(&env, 300, &value);
        env.sync().unwrap();
        let next = root.path().join(format!("life-{life}"));
        crash_copy(&dir, &next);
        drop(env);
        std::fs::remove_dir_all(&dir).unwrap();
        dir = next;
        // (The buffer's memory, rebuilt by every replay, reaches its bound only
        // after ~20 lives: the journal must not wait for that.)
        let kept = journal_files(&dir);
        assert!(
            kept <= MAX_JOURNAL_FILES + 1,
            "{kept} journal files of {JOURNAL_FILE_BYTES} bytes after {life} crashes, each \
             after 300 small commits, for a write buffer of {WRITE_BUFFER_BYTES} bytes"
        );
    }
    let env = Env::open(&dir, opts()).unwrap();
    let r = env.begin_read().unwrap();
    for k in 0..4u64 {
        assert_eq!(r.get("t", &k.to_be_bytes()).unwrap(), Some(&value[..]));
    }
}
