//! Reopening after a crash leaves the replayed page images unsynced in the data file
//! (the header on disk keeps its replay start) and lets the flusher's first checkpoint
//! sync them. A second crash before that checkpoint replays the same records again,
//! together with the commits made since, some of them into pages reused from the
//! free list: nothing acknowledged may be lost, nothing freed by a replayed record may
//! be reused before the replayed state is synced, and the trees must check clean.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod crash_copy;

use crash_copy::{crash_copy, without_checkpoints};
use kiln_storage::{Env, Options};
use std::collections::BTreeMap;

/// No checkpoint on its own: each crash copy keeps the journal to replay.
fn opts() -> Options {
    Options {
        // Small write-back windows: pages of new commits reach the data file (not
        // synced) before each crash copy, so reusing a page too early would show.
        write_back_window_bytes: 1 << 20,
        max_unflushed_bytes: 32 << 20,
        write_buffer_bytes: 0,
        ..without_checkpoints()
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

/// Puts (values large enough for many pages) and deletes, so that commits free pages.
fn churn(env: &Env, model: &mut BTreeMap<Vec<u8>, Vec<u8>>, round: u32) {
    for t in 0..20u32 {
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        for i in 0..150u32 {
            let k = key((i * 7 + t * 31 + round * 101) % 2000);
            if (i + t + round).is_multiple_of(5) {
                w.delete("t", &k).unwrap();
                model.remove(&k);
            } else {
                let v = vec![(i + t + round) as u8; 300 + (i as usize % 7) * 400];
                w.put("t", &k, &v).unwrap();
                model.insert(k, v);
            }
        }
        w.commit().unwrap();
    }
}

fn assert_matches(env: &Env, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let report = env.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), model.len() as u64);
    for (k, v) in model {
        assert_eq!(r.get("t", k).unwrap(), Some(&v[..]), "key {k:?}");
    }
}

#[test]
fn a_crash_before_the_first_checkpoint_after_recovery_loses_nothing() {
    let root = tempfile::tempdir().unwrap();
    let (first, second, third) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("c"),
    );
    let mut model = BTreeMap::new();
    let env = Env::open(&first, opts()).unwrap();
    churn(&env, &mut model, 0);
    // A synced state whose pages the next commits copy and free: a replay of those
    // commits reads the freed pages' old bytes from the data file (diff sources).
    env.sync().unwrap();
    churn(&env, &mut model, 1);
    crash_copy(&first, &second);
    drop(env);

    // Recovery replays the journal and does not sync: the header's synced point stays.
    let (env, report) = Env::open_with_report(&second, opts()).unwrap();
    assert!(report.records_replayed >= 20, "{report:?}");
    let s = env.stats();
    assert!(
        s.synced_txn_id < s.last_txn_id,
        "the replayed state should be left to the flusher: synced {} last {}",
        s.synced_txn_id,
        s.last_txn_id
    );
    assert_matches(&env, &model);
    // Commits made now reuse free pages; crash again before any checkpoint.
    churn(&env, &mut model, 2);
    // Let the flusher write the full windows back (without a checkpoint).
    std::thread::sleep(std::time::Duration::from_millis(500));
    crash_copy(&second, &third);
    drop(env);

    let env = Env::open(&third, opts()).unwrap();
    assert_matches(&env, &model);
    // The first checkpoint makes everything the synced point.
    let synced = env.sync().unwrap();
    assert_eq!(synced, env.stats().last_txn_id);
    churn(&env, &mut model, 3);
    env.close().unwrap();
    let env = Env::open(&third, opts()).unwrap();
    assert_matches(&env, &model);
}
