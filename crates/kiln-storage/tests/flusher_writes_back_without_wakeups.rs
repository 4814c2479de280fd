//! The flusher is not woken per commit: it must still write back and sync on its
//! own timer, on a full write-back window, on request, and under back-pressure.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, Options};
use std::time::{Duration, Instant};

fn opts(sync_interval_ms: u64, sync_after_bytes: u64) -> Options {
    Options {
        journal_file_size_bytes: 4 << 20,
        data_grow_step_bytes: 1 << 20,
        sync_interval_ms,
        sync_after_bytes,
        write_back_window_bytes: 8 << 20,
        ..Options::default()
    }
}

fn wait_until_synced(env: &Env, txn_id: u64, limit: Duration) -> Duration {
    let start = Instant::now();
    while env.stats().synced_txn_id < txn_id {
        assert!(
            start.elapsed() < limit,
            "txn {txn_id} not synced after {limit:?}: {:?}",
            env.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

#[test]
fn a_lone_commit_is_synced_by_the_timer() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts(50, 64 << 20)).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.put("t", b"k", b"v").unwrap();
    let id = w.commit().unwrap();
    // Nothing else happens: only the flusher's timer can sync it.
    wait_until_synced(&env, id, Duration::from_secs(10));
    let s = env.stats();
    assert!(s.pages_written_back > 0, "{s:?}");
    assert_eq!(s.pages_unflushed, 0, "{s:?}");
}

#[test]
fn a_full_window_is_written_back_before_the_timer() {
    let dir = tempfile::tempdir().unwrap();
    // A timer far away and a byte threshold of 16 MiB: only the volume of queued
    // commits can get the flusher going.
    let env = Env::open(dir.path(), opts(3_600_000, 16 << 20)).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    let value = vec![0xA5u8; 256 << 10];
    let mut last = 0;
    for i in 0..96u32 {
        let mut w = env.begin_write().unwrap();
        w.put("t", &i.to_be_bytes(), &value).unwrap();
        last = w.commit().unwrap();
    }
    // 24 MiB of pages were committed: at least one sync by bytes must follow
    // without any further commit or request.
    let start = Instant::now();
    while env.stats().synced_txn_id == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no sync by bytes: {:?}",
            env.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(env.stats().pages_written_back >= (16 << 20) / 8192);
    // An explicit request covers everything queued before it.
    assert_eq!(env.sync().unwrap(), last);
    env.close().unwrap();
    let env = Env::open(dir.path(), opts(3_600_000, 16 << 20)).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), 96);
    assert_eq!(r.get("t", &95u32.to_be_bytes()).unwrap(), Some(&value[..]));
}

#[test]
fn back_pressure_gets_the_flusher_going() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(
        dir.path(),
        Options {
            max_unflushed_bytes: 32 << 20,
            ..opts(3_600_000, 1 << 40)
        },
    )
    .unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    // 96 MiB through a 32 MiB bound, with neither timer nor byte threshold in reach:
    // commits must wait for write-back, never fail and never hang.
    let value = vec![0x5Au8; 1 << 20];
    let start = Instant::now();
    for i in 0..96u32 {
        let mut w = env.begin_write().unwrap();
        w.put("t", &i.to_be_bytes(), &value).unwrap();
        w.commit().unwrap();
    }
    assert!(start.elapsed() < Duration::from_secs(60));
    assert!(env.stats().pages_written_back >= (64 << 20) / 8192);
    env.close().unwrap();
}

#[test]
fn an_old_reader_does_not_pin_superseded_pages_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts(3_600_000, 1 << 40)).unwrap();
    let key = |i: u32| format!("key{i:06}").into_bytes();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    for i in 0..2000u32 {
        w.put("t", &key(i), &[b'a'; 100]).unwrap();
    }
    w.commit().unwrap();
    env.sync().unwrap();
    // A long reader (a backup, say) while the same pages are rewritten again and
    // again: every version it cannot see any more used to stay in memory until it
    // ended. They must go to the data file instead.
    let reader = env.begin_read().unwrap();
    for round in 0..300u32 {
        let mut w = env.begin_write().unwrap();
        for i in (0..2000u32).step_by(40) {
            w.put("t", &key(i), format!("round {round}").as_bytes())
                .unwrap();
        }
        w.commit().unwrap();
    }
    env.sync().unwrap();
    let s = env.stats();
    assert!(
        s.pages_unflushed < 200,
        "superseded pages pinned in memory by the reader: {s:?}"
    );
    // The reader still sees its snapshot, now read from the data file.
    for i in (0..2000u32).step_by(40) {
        assert_eq!(reader.get("t", &key(i)).unwrap(), Some(&[b'a'; 100][..]));
    }
    drop(reader);
    let r = env.begin_read().unwrap();
    assert_eq!(r.get("t", &key(40)).unwrap(), Some(&b"round 299"[..]));
}

#[test]
fn a_window_larger_than_half_the_memory_bound_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = Env::open(
        dir.path(),
        Options {
            max_unflushed_bytes: 64 << 20,
            write_back_window_bytes: 48 << 20,
            ..Options::default()
        },
    )
    .err()
    .expect("a window that cannot fill before back-pressure must be refused");
    assert!(err.to_string().contains("write_back_window_bytes"), "{err}");
}

/// Pages rewritten within one write-back window are written to the data file once:
/// 200 commits each rewriting the same leaf write back far fewer than 200 pages, and
/// every value is there after a reopen.
#[test]
fn pages_rewritten_within_a_window_are_written_back_once() {
    let dir = tempfile::tempdir().unwrap();
    let o = || Options {
        write_back_window_bytes: 64 << 20,
        ..opts(3_600_000, 1 << 40)
    };
    let env = Env::open(dir.path(), o()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    for i in 0..200u32 {
        let mut w = env.begin_write().unwrap();
        w.put("t", &(i % 10).to_be_bytes(), &i.to_be_bytes())
            .unwrap();
        w.commit().unwrap();
    }
    env.sync().unwrap();
    let written = env.stats().pages_written_back;
    assert!(
        written < 20,
        "{written} pages written back for one hot leaf"
    );
    env.close().unwrap();
    let env = Env::open(dir.path(), o()).unwrap();
    let r = env.begin_read().unwrap();
    for k in 0..10u32 {
        assert_eq!(
            r.get("t", &k.to_be_bytes()).unwrap(),
            Some(&(190 + k).to_be_bytes()[..])
        );
    }
}
