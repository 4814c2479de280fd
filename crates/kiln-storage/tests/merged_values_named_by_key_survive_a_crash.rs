//! A value merged from the write buffer into a leaf is not written into the journal a
//! second time: the record names it by its buffer key (a patched page image), and
//! replay fills it in from the frozen generation it rebuilds from the entries that
//! buffered it (docs/design/storage.md §2.4, "Patched images"). Crash copies taken while
//! generations freeze and merge must reopen to exactly what was committed, with the
//! named values filled in by the replay, not found elsewhere.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod crash_copy;

use crash_copy::{crash_copy, without_checkpoints};
use kiln_storage::{Env, Options};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::BTreeMap;

/// A small write buffer (many freezes and merges) and no checkpoints: every crash
/// copy replays the merges' page images from the journal's start.
fn opts() -> Options {
    Options {
        write_buffer_bytes: 64 << 10,
        ..without_checkpoints()
    }
}

/// As `opts`, with a checkpoint after every 256 KiB of commits: crash copies then
/// replay from a replay start the checkpoints moved past merged generations, and
/// only the merges not yet synced name values to fill.
fn opts_with_checkpoints() -> Options {
    Options {
        sync_after_bytes: 512 << 10,
        ..opts()
    }
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Transactions of random puts (values long enough to be named, and some too short)
/// and deletes into two trees, keys drawn at random so that merges go everywhere.
fn churn(env: &Env, model: &mut BTreeMap<&'static str, Model>, rng: &mut StdRng, txns: u32) {
    for _ in 0..txns {
        let mut w = env.begin_write().unwrap();
        for _ in 0..rng.gen_range(5..40) {
            let tree = ["docs", "other"][rng.gen_range(0..2)];
            w.ensure_tree(tree).unwrap();
            let key = format!("k{:05}", rng.gen_range(0..3_000)).into_bytes();
            let m = model.entry(tree).or_default();
            if rng.gen_range(0..8) == 0 {
                w.delete(tree, &key).unwrap();
                m.remove(&key);
            } else {
                let len = if rng.gen_bool(0.8) {
                    rng.gen_range(256..1_500)
                } else {
                    rng.gen_range(0..256)
                };
                let value: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                w.put(tree, &key, &value).unwrap();
                m.insert(key, value);
            }
        }
        w.commit().unwrap();
    }
}

fn assert_matches(env: &Env, model: &BTreeMap<&'static str, Model>) {
    let report = env.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let r = env.begin_read().unwrap();
    for (tree, m) in model {
        assert_eq!(r.tree_len(tree).unwrap(), m.len() as u64, "tree {tree}");
        for (k, v) in m {
            assert_eq!(r.get(tree, k).unwrap(), Some(&v[..]), "{tree} {k:?}");
        }
    }
}

/// Rounds of commits, each followed by a crash copy that must reopen to the model.
/// Returns the values the replays filled, and those filled by replays that started
/// after a checkpoint (a header whose synced point is past the journal's start).
fn crash_rounds(opts: fn() -> Options) -> (u64, u64) {
    let root = tempfile::tempdir().unwrap();
    let live = root.path().join("live");
    let env = Env::open(&live, opts()).unwrap();
    let mut rng = StdRng::seed_from_u64(42);
    let mut model = BTreeMap::new();
    let (mut filled, mut filled_after_checkpoint) = (0, 0);
    for round in 0..12 {
        churn(&env, &mut model, &mut rng, 20);
        // Crash here: whatever the merge is doing, the copy must reopen to the model.
        let copy = root.path().join(format!("crash-{round}"));
        crash_copy(&live, &copy);
        let (reopened, report) = Env::open_with_report(&copy, opts()).unwrap();
        filled += report.merged_values_filled;
        if report.synced_txn_id > 0 {
            filled_after_checkpoint += report.merged_values_filled;
        }
        assert_matches(&reopened, &model);
        drop(reopened);
    }
    let named = env.stats().journal_referenced_value_bytes;
    assert!(
        named > 100_000,
        "merges should name most long values by key: {named} bytes named"
    );
    // And after a clean close, which merges everything.
    env.close().unwrap();
    let env = Env::open(&live, opts()).unwrap();
    assert_matches(&env, &model);
    (filled, filled_after_checkpoint)
}

#[test]
fn merged_values_named_by_key_come_back_after_crashes() {
    let (filled, _) = crash_rounds(opts);
    assert!(
        filled > 0,
        "no replay filled in a value named by key: the path went untested"
    );
}

#[test]
fn values_named_after_a_checkpoint_come_back_from_a_moved_replay_start() {
    let (_, filled_after_checkpoint) = crash_rounds(opts_with_checkpoints);
    assert!(
        filled_after_checkpoint > 0,
        "no replay after a checkpoint filled in a value named by key: the replay start \
         the checkpoints moved went untested"
    );
}

#[test]
fn a_crash_copy_reopened_twice_fills_the_same_values_again() {
    // Replay leaves its pages unsynced (the flusher syncs them later): a second
    // crash right after the reopen replays the same patched images again, from a
    // write buffer rebuilt again.
    let root = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("c"),
    );
    let env = Env::open(&a, opts()).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut model = BTreeMap::new();
    churn(&env, &mut model, &mut rng, 150);
    crash_copy(&a, &b);
    drop(env);
    let (env, first) = Env::open_with_report(&b, opts()).unwrap();
    assert!(first.merged_values_filled > 0, "{first:?}");
    assert_matches(&env, &model);
    churn(&env, &mut model, &mut rng, 30);
    crash_copy(&b, &c);
    drop(env);
    let (env, second) = Env::open_with_report(&c, opts()).unwrap();
    assert!(second.merged_values_filled > 0, "{second:?}");
    assert_matches(&env, &model);
}
